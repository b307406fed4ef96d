"""The reconciler: a short engine that runs one pass through named stages."""
