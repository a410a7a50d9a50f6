"""instrument: per-stage instrumentation for ML inference services."""
