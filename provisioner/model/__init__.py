"""The resource model: a custom resource as the operator reads it, its conditions, annotations,
names, versions and connection Secret content.
"""
