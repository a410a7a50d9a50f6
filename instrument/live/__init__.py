"""What runs inside the user's process: the backend (C extension or pure twin), the
collector, hooks, NVTX and capture windows, perf counters and the torch and CUDA-event
integrations.  Only the facade (instrument) and the command line import from here."""

from . import integrations, tasks, torchwatch

# the integrations that are always there: asyncio task attribution, and the torch watch (which registers the torch
# profiler and GPU integrations once torch is imported)
integrations.register(tasks)
integrations.register(torchwatch)
