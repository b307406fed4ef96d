"""spec.access: IAM roles and policies that grant workloads access to a resource."""
