"""What runs inside the user's process: the backend (C extension or pure-Python fallback), the
collector, hooks, NVTX and capture windows, perf counters and the torch, CUDA-event and
torch.distributed integrations.  Only the facades (instrument, instrument.distributed) and
the command line import from here."""

from . import distributed, integrations, memory, tasks, torchwatch

# the integrations that are always there: asyncio task attribution, the rank of a distributed job (from its launcher
# before torch is imported), and the torch watch (which registers the torch profiler and GPU integrations and times
# collectives once torch is imported)
integrations.register(tasks)
integrations.register(distributed)
integrations.register(torchwatch)
integrations.register(memory)   # memory per stage: the sources the `memory` option names (CUDA's once initialised)
