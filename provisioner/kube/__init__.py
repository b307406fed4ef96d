"""The Kubernetes floor: the API client the operator acts with, and how it logs in."""
