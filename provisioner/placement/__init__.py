"""Accounts and placement: which CloudAccount and region a resource acts in."""
