"""What runs inside the user's process: the backend (C extension or pure twin), the
collector, hooks, NVTX and capture windows, perf counters and the torch and CUDA-event
integrations.  Only the facade (instrument) and the command line import from here."""
