"""The conversion webhook: its server and its certificates."""
