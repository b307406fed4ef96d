"""Operator tools run from the CLI: leak reports, storage migration."""
