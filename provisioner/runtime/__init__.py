"""The runtime: kopf handlers, the resync scheduler, sharding, metrics, the CloudAccount
controller.
"""
