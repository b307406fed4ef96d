"""The AWS floor: sessions and clients, error classification, the call budget and its turns, role
assumption.
"""
