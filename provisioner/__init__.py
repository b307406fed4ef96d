"""provisioner: cloud infrastructure from Kubernetes custom resources."""

GROUP = "cloud.provisioner.dev"
# The version the operator watches and writes (the storage version); v1alpha1 is served
# beside it through the conversion webhook (provisioner/model/conversion.py).
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
# CloudAccount (cluster-scoped) has one version.
ACCOUNTS_VERSION = "v1alpha1"
ACCOUNTS_API_VERSION = f"{GROUP}/{ACCOUNTS_VERSION}"
FINALIZER = f"{GROUP}/finalizer"
__version__ = "0.1.0"
