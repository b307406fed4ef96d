"""provisioner: cloud infrastructure from Kubernetes custom resources."""

GROUP = "cloud.provisioner.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
FINALIZER = f"{GROUP}/finalizer"
__version__ = "0.1.0"
