"""The kinds: the contract every kind's cloud client keeps, one client per kind, the registry,
shared tag helpers.
"""
