"""Typed interface of the compiled hot path (csrc/).

instrument.live.pure, the small pure-Python fallback, implements a declared subset: everything
here but CounterGroup, memory_status, memory_reset_seen, the nvtx_* functions, the asyncio runners (step_runner, iteration_runner,
ready_runner, stepped) and the _perf_mmap_* decoders.  It reads every call and reports exact sums in
the same rows (estimate rows with var 0 and reads equal to the calls read); configure() takes
every option, and overhead_budget, exemplars, run_queue and helper_cpu change nothing there;
calibrate() gives the same keys, saying what it does not measure.
tests/test_native_interface.py checks that this file names what the module exports, that the
fallback has the declared subset, and that collect() of both backends gives exactly the rows
declared here.
"""
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypedDict, Union

MAX_NAME_LEN: int
HIST_SUB_BITS: int
HIST_BLOCKS: int
HELPERS_MAX: int   # the most threads that run no stage whose CPU clocks a read call reads

class Stage:
    def __init__(self, name: str, color: Optional[int] = ..., *, category: int = ...) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def color(self) -> int: ...         # ARGB of its NVTX range
    @property
    def category(self) -> int: ...      # NVTX category id, 0 for none
    def __enter__(self) -> "Stage": ...
    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool: ...
    def __call__(self, func: Callable[..., Any], /) -> Any: ...   # `@stage`: set_decorator's wrapping of func

class Region:
    def __init__(self, stage: Stage, func: Callable[..., Any], /) -> None: ...
    @property
    def stage(self) -> Stage: ...
    @property
    def __wrapped__(self) -> Callable[..., Any]: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __get__(self, obj: Any, objtype: Any = ..., /) -> Any: ...   # binds like a function

class CounterGroup:
    def __init__(self, events: Sequence[Tuple[int, int]], exclude_kernel: bool = ...) -> None: ...
    @property
    def status(self) -> List[int]: ...          # errno per event, 0 = open
    @property
    def rdpmc(self) -> bool: ...
    @property
    def exclude_kernel(self) -> bool: ...       # after the fallback to user-only
    @property
    def closed(self) -> bool: ...
    @property
    def groups(self) -> int: ...                # perf_event groups, one read each
    def read(self) -> List[Tuple[int, int, int]]: ...   # (value, enabled, running) per event, raw and cumulative
    def close(self) -> None: ...
    def __enter__(self) -> "CounterGroup": ...
    def __exit__(self, *exc: Any) -> bool: ...

class _Configuration(TypedDict):
    """The hot-path options (config.OPTIONS marked hot), as configure() takes them and configuration() gives them."""
    enabled: bool
    cpu_clock: bool
    cpu_split: bool
    nvtx: bool
    max_stages: int
    trace_events: int
    exemplars: int
    overhead_budget: Optional[float]       # None: every call read
    run_queue: bool
    helper_cpu: bool
    gil_wait: bool                         # the GIL sampler runs (it is not started where its GIL is not found)

class _GilStatus(TypedDict):
    """The GIL sampler (csrc/gil.h): meta.gil_wait, doctor."""
    enabled: bool
    mechanism: str                         # "futex sampling of /proc/self/task/<tid>/syscall", or "none"
    reason: str                            # why it is off ("" when on)
    cpu_share_max: float                   # the most of one core its CPU time may take
    sampler_cpu_ns: int                    # its CPU time so far
    period_ns: int                         # its period now
    ticks: int
    reads: int                             # samples taken
    threads: int                           # stage threads sampled now
    seconds: float                         # how long it has run
    tid: int                               # its thread id (0: none)

class _MemoryStatus(TypedDict):
    """A memory source (csrc/memory.h): meta.memory.sources, doctor."""
    name: str                              # host, python, cuda:N, cuda:N:reserved
    active: bool
    peak: str                              # how its peak is measured
    peak_bytes: int                        # the highest mark read: the process's peak since it was configured
    reads: int
    ns_per_read: float                     # what one read of it costs (its gauge, its reset)
    errors: int
    error: Optional[str]                   # why a callable source stopped

class _MemorySums(TypedDict):
    """A source's sums over a stage's measured calls (StageStats.memory; w-sums weigh a call by 1 / its chance)."""
    calls: int
    overlapped: int
    marked: int
    fresh: int                             # calls whose peak above their start was 1 MiB or more (MEM_FRESH)
    peak_max: float
    w: float
    w_peak: float
    w_net: float
    peak_sum: float
    peak_sq: float
    net_sum: float
    net_sq: float

class _Calibration(TypedDict):
    read_ns: float                         # one call's reads, both boundaries: the overhead budget's unit
    run_queue: str                         # where run-queue time comes from, or why it does not
    helper_cpu: str                        # how helper threads' CPU time is read, or why it is not
    base_ns: Optional[float]               # a stage call without reads; None while a stage is open on the thread
    cpu_bias_ns: int                       # what an empty read call records as CPU time: taken out of every read call
    inner_bias_ns: int                     # its time between its CPU reads: out of a read call's running time
    wall_bias_ns: int                      # what an empty read call records as wall time: taken out of every read call
    unread_wall_bias_ns: int               # what an empty unread call records as wall time: taken out of the others
    cpu_source: str                        # none, thread-clock or task-clock
    sys: bool                              # system time read with the CPU time
    thread_clock: str                      # how the thread CPU clock is read
    switches: str                          # how a call knows its thread left the CPU, or why it does not

class _EstimateRow(TypedDict):
    """A quantity estimated over a stage's covered calls (csrc/stats.c stats_estimate), with its variance."""
    total: float
    self: float
    var: float            # of the total's estimate (0 when every covered call was read)
    var_self: float
    reads: int            # read calls that measured it

class _CounterRow(_EstimateRow):
    enabled: int          # summed time enabled / running of the read calls (multiplexing)
    running: int
    scaled: int           # read calls whose value was scaled

class _Estimates(TypedDict):
    cpu: Optional[_EstimateRow]        # CPU time, task-relative, the SDK's own share taken out
    sys: Optional[_EstimateRow]        # of it, system time
    vcsw: Optional[_EstimateRow]       # voluntary context switches
    ivcsw: Optional[_EstimateRow]      # involuntary ones
    runqueue: Optional[_EstimateRow]   # time ready in the run queue
    helpers: Optional[_EstimateRow]    # CPU time of the process's threads that run no stage
    off_samples: Optional[_EstimateRow]   # the GIL sampler's samples that found the thread blocked
    gil_samples: Optional[_EstimateRow]   # of them, those that found it waiting for the GIL

class _StatsRow(TypedDict):
    node: int
    calls: int
    errors: int
    wall_total: int
    wall_self: int
    wall_min: int
    wall_max: int
    overlapped: int       # asyncio: calls that overlapped other tasks with no hook to tell them apart
    abandoned: int        # calls whose context died with the stage open
    susp_total: int       # wall time the call's task was suspended
    susp_self: int
    loop_total: int       # of it, woken and waiting for the event loop
    loop_self: int
    covered: int          # calls the estimates stand for: read, and left unread by the budget
    cov_run: int          # their running wall time (wall less suspended)
    cov_run_self: int
    cpu_bound: float      # what their CPU time cannot exceed: their threads' CPU since each one's first call
    hist: List[Tuple[int, int]]                        # (bucket, count)
    estimates: _Estimates
    counters: List[Optional[_CounterRow]]               # one per event given to set_counters
    blockers: List[Tuple[int, int, int]]                # (node, held, waited): stages that held the loop while it was ready
    items: List[Tuple[str, int, float, int, int]]       # (name, int total, float total, adds, float adds)
    memory: Dict[str, _MemorySums]                      # by source; {} where memory was not measured

class _CollectResult(TypedDict, total=False):
    counter_errno: List[Optional[int]]                  # per event: 0 open, an errno, None not opened yet
    counter_open: Dict[str, bool]                       # exclude_kernel, rdpmc (once a thread opened them)
    nodes: List[Tuple[int, int, str, int]]              # (id, parent, name, is the "(other)" node)
    stats: List[_StatsRow]
    events: List[Tuple[int, int, int, int, int, int]]   # trace ring: (node, tid, t0, dur, cpu0, cpu)
    events_dropped: int
    unmatched_exits: int
    out_of_order_exits: int
    cross_thread_exits: int
    internal_failures: int
    folded_calls: int
    max_stages: int
    threads: int
    clock_ns: int
    read_cost_ns: float                                 # what one call's reads cost the thread, through the run
    read_cost_calls: int                                # the read calls timed for it (0: calibrate()'s figure)
    helpers_over_cap: int                               # the most threads seen running no stage beyond the 32
                                                        # whose clocks a read reads (helper CPU then not read); 0
    # (root, seq, slow, sample, wall, t0, tid, [(node, self ns, on CPU, run queue, awaiting, loop-ready, GIL,
    #  the resident set's largest peak above a call's start, -1: not measured)])
    exemplars: List[Tuple[int, int, bool, bool, int, int, int, List[Tuple[int, int, int, int, int, int, int, int]]]]
    exemplar_bytes: Tuple[int, int]                     # stores, open or pooled calls
    tasks: Dict[str, int]                               # steps, switch_reads, unhooked_changes, overlapped, abandoned

def stage(name: str, /) -> Stage: ...
def configure(**options: Any) -> None: ...             # the keys of _Configuration, and memory (a sequence of
                                                        # "host" or (name, get, reset): csrc/memory.h; not in the
                                                        # fallback); unknown ones are refused
def configuration() -> _Configuration: ...
def gil_status() -> _GilStatus: ...
def memory_status() -> List[_MemoryStatus]: ...
def memory_reset_seen(names: Sequence[str], /) -> None: ...   # another party resets these sources' peaks now
def calibrate(n: int = ..., /) -> _Calibration: ...
def set_counters(events: Sequence[Tuple[int, int]], exclude_kernel: bool, taskclock_index: int, /) -> None: ...
def set_hooks(enter: Optional[Callable[[str], Any]], exit: Optional[Callable[[Any], Any]], /) -> None: ...
def collect() -> _CollectResult: ...
def reset() -> None: ...
def after_fork_child() -> None: ...
def now_ns() -> int: ...
def thread_cpu_ns() -> int: ...                         # this thread's CPU time as the hot path reads it (task-clock: preempts nothing)
def hist_index(value: int, /) -> int: ...
def current_path() -> Tuple[str, ...]: ...
def add(name: str, value: Union[int, float] = ...) -> None: ...   # items of the innermost open stage of this context
def set_decorator(decorator: Callable[[Stage, Callable[..., Any]], Any], /) -> None: ...   # `@stage` on a function
def set_root_exit_hook(hook: Optional[Callable[[], Any]], /) -> None: ...   # after every outermost stage exit
def set_probe_hook(hook: Optional[Callable[[], int]], /) -> None: ...   # after an outermost stage exit once due; returns ns to the next
def sigwake_chain(signum: int, fd: int, /) -> bool: ...   # a handler before CPython's writes the signal's number to fd
def sigwake_fd(fd: int, /) -> None: ...   # the pipe the chained handlers write to (a fork's child's own)

# asyncio attribution (csrc/steps.c): stand-ins that instrument.live.tasks installs as
# asyncio.events.Handle._run and asyncio.base_events.BaseEventLoop._run_once
def step_runner(run: Callable[[Any], Any], /) -> Callable[[Any], Any]: ...
def iteration_runner(run: Callable[[Any], Any], /) -> Callable[[Any], Any]: ...
def ready_runner(call_soon: Callable[..., Any], /) -> Callable[..., Any]: ...   # stands in for BaseEventLoop._call_soon
def stepped(coro: Any, /) -> Any: ...   # a task's coroutine whose send/throw time its steps (uvloop); Python 3.10+

def nvtx_init(domain: str, /) -> None: ...
def nvtx_domain() -> str: ...
def nvtx_available() -> bool: ...
def nvtx_color(name: str, /) -> int: ...
def nvtx_push(name: str, color: Optional[int] = ..., category: int = ...) -> None: ...
def nvtx_pop() -> None: ...
def nvtx_range_start(name: str, color: Optional[int] = ..., category: int = ...) -> int: ...
def nvtx_range_end(id: int, /) -> None: ...
def nvtx_name_category(category: int, name: str, /) -> None: ...

def _perf_mmap_decode(page: bytes, rdpmc_value: int, now_tsc: int, /) -> Optional[Tuple[int, int, int, int]]: ...
def _perf_mmap_time_decode(page: bytes, now_tsc: int, /) -> Optional[int]: ...
