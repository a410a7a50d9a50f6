"""Every option of the SDK and its INSTRUMENT_* variable, parsed and validated here.

`instrument.configure(**options)` and the environment are the two ways in.
A bad argument to configure() raises at the call site; a bad environment value
is reported once with the variable's name and what is allowed, and the default
is used, so a typo in the environment never stops the service.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in TRUE + FALSE:
        return v.strip().lower() in TRUE
    raise ValueError(f"{name} must be a boolean (one of {', '.join(TRUE + FALSE)}), got {v!r}")


def _tristate(name: str, v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, str):
        s = v.strip().lower()
        if s == "auto":
            return "auto"
        if s in TRUE:
            return "on"
        if s in FALSE:
            return "off"
    raise ValueError(f"{name} must be auto, on or off (or a boolean), got {v!r}")


def integer(lo: int, hi: Optional[int] = None) -> Callable[[str, Any], int]:
    def parse(name: str, v: Any) -> int:
        if isinstance(v, bool):
            raise ValueError(f"{name} must be an integer, got {v!r}")
        try:
            n = int(v.strip()) if isinstance(v, str) else int(v) if isinstance(v, int) else None
        except ValueError:
            n = None
        if n is None or n < lo or (hi is not None and n > hi):
            rng = f"from {lo} to {hi}" if hi is not None else f"{lo} or more"
            raise ValueError(f"{name} must be an integer {rng}, got {v!r}")
        return n
    return parse


def _optional_int(lo: int) -> Callable[[str, Any], Optional[int]]:
    parse_int = integer(lo)

    def parse(name: str, v: Any) -> Optional[int]:
        return None if v is None or (isinstance(v, str) and not v.strip()) else parse_int(name, v)
    return parse


def number(lo: float, hi: float) -> Callable[[str, Any], float]:
    def parse(name: str, v: Any) -> float:
        try:
            x = float(v) if not isinstance(v, bool) else None
        except (TypeError, ValueError):
            x = None
        if x is None or not lo <= x <= hi:
            raise ValueError(f"{name} must be a number from {lo} to {hi}, got {v!r}")
        return x
    return parse


def _text(name: str, v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{name} must be a non-empty string, got {v!r}")
    return v.strip()


def _path(name: str, v: Any) -> Optional[str]:
    if v is None or (isinstance(v, str) and v == ""):
        return None
    if not isinstance(v, (str, os.PathLike)):
        raise ValueError(f"{name} must be a file path, got {v!r}")
    return os.fspath(v)


def _counters(name: str, v: Any) -> Tuple[str, ...]:
    from . import counters
    try:
        return tuple(counters.parse_counters(v))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: {e}") from None


MEMORY_SOURCES = ("host", "python", "cuda")


def _memory(name: str, v: Any) -> Tuple[str, ...]:
    """A comma list (or a sequence) of memory sources, in MEMORY_SOURCES order; none/off/"" -> ()."""
    items = v.split(",") if isinstance(v, str) else v if isinstance(v, (list, tuple)) else None
    if items is None or not all(isinstance(x, str) for x in items):
        raise ValueError(f"{name} must be a comma list of {', '.join(MEMORY_SOURCES)} (or none), got {v!r}")
    names = {x.strip().lower() for x in items} - {""}
    if names & {"none", "off"}:
        if len(names) > 1:
            raise ValueError(f"{name}: none turns memory off and goes alone, got {v!r}")
        return ()
    bad = sorted(names - set(MEMORY_SOURCES))
    if bad:
        raise ValueError(f"{name}: unknown memory source {bad[0]!r}; the sources are {', '.join(MEMORY_SOURCES)} "
                         f"(or none), got {v!r}")
    return tuple(s for s in MEMORY_SOURCES if s in names)


def _serve(name: str, v: Any) -> Optional[str]:
    """"host:port", ":port" or "port" (host 127.0.0.1; "[::1]:port" for IPv6) -> "host:port"; None or "" -> None."""
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    bad = ValueError(f"{name} must be host:port (port 0 to 65535, host an address or name; 127.0.0.1 if left "
                     f"out), got {v!r}")
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise bad
    text = str(v).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 <= int(port) <= 65535 or (host and (" " in host or "/" in host)):
        raise bad
    host = host or "127.0.0.1"
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


def serve_address(value: str) -> Tuple[str, int]:
    """("host", port) of a `serve` value."""
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_serve(values: Mapping[str, Any]) -> None:
    """The metrics server listens on loopback unless serve_any_host says otherwise."""
    v = values.get("serve")
    if v and not values.get("serve_any_host") and not is_loopback(serve_address(v)[0]):
        raise ValueError(f"INSTRUMENT_SERVE (serve) {v!r} is not a loopback address: the endpoints would be "
                         "reachable from other machines; set INSTRUMENT_SERVE_ANY_HOST=1 (serve_any_host=True) "
                         "to allow it, or use 127.0.0.1")


def _budget(name: str, v: Any) -> Optional[float]:
    """A share of a stage's own time in (0, 1]; None (or none/off/every) reads every call."""
    if v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "off", "every")):
        return None
    try:
        x = float(v) if not isinstance(v, bool) else None
    except (TypeError, ValueError):
        x = None
    if x is None or not 0.0 < x <= 1.0:
        raise ValueError(f"{name} must be a number greater than 0 and at most 1 (the share of a stage's own time its "
                         f"counter and CPU-time reads may cost; 0.01 = 1 %), or None to read every call, got {v!r}")
    return x


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    env: Optional[str]
    default: Any
    parse: Callable[[str, Any], Any]
    doc: str
    hot: bool = False   # read by the hot path: handed to the backend's configure() under this name, on both backends


OPTIONS: Tuple[Option, ...] = (
    Option("enabled", None, True, _bool, "record stages at all; INSTRUMENT_DISABLE=1 turns every stage into a no-op", hot=True),
    Option("output", "INSTRUMENT_OUTPUT", None, _path, "save the snapshot to this JSON file at interpreter exit"),
    Option("counters", "INSTRUMENT_COUNTERS", "default", _counters,
           "perf_event counters per stage: default, none, or a comma list of names / r<hex> raw codes"),
    Option("cpu_clock", "INSTRUMENT_CPU_CLOCK", True, _bool,
           "read the thread's CPU time at stage boundaries when no task-clock counter gives it: from its own "
           "task-clock event (CLOCK_THREAD_CPUTIME_ID, which can preempt the thread inside the read, only where "
           "perf_event_open is refused)", hot=True),
    Option("overhead_budget", "INSTRUMENT_OVERHEAD_BUDGET", 0.01, _budget,
           "share of a stage's own time its counter and CPU-time reads may cost: stages too short for a read on "
           "every call are read on a random subset of calls and their CPU time and counters estimated (calls and "
           "wall time stay exact); none: read every call (as the pure-Python fallback does whatever it says)",
           hot=True),
    Option("cpu_split", "INSTRUMENT_CPU_SPLIT", True, _bool,
           "split each stage's CPU time into user and system (kernel) time from the thread's rusage, read with "
           "the CPU time", hot=True),
    Option("run_queue", "INSTRUMENT_RUN_QUEUE", True, _bool,
           "read the thread's run-queue time (/proc/thread-self/schedstat) with the CPU time: the off-CPU time of a "
           "stage split into waiting for a CPU (run queue) and blocked (I/O, locks, sleep)", hot=True),
    Option("helper_cpu", "INSTRUMENT_HELPER_CPU", True, _bool,
           "read the CPU time of the process's threads that run no stage (torch/OpenMP intra-op pools, tokenizer "
           "pools) with the CPU time: parallel compute shows as CPU, not as waiting", hot=True),
    Option("gil_wait", "INSTRUMENT_GIL_WAIT", True, _bool,
           "sample which stage threads wait for the GIL (a native thread reads their /proc syscall files, within "
           "0.5 % of one core): a stage's blocked time split into GIL wait and the rest", hot=True),
    Option("memory", "INSTRUMENT_MEMORY", ("host", "cuda"), _memory,
           "memory per stage, read with the CPU time on the calls the budget reads (peak above the call's start and "
           "net change, per source): host (the resident set; its high-water mark reset through /proc/self/clear_refs, "
           "so the process's own VmHWM and ru_maxrss then tell the peak since the last read, and meta.memory the "
           "process's), python (the traced Python heap: starts tracemalloc, which slows every allocation and resets "
           "its peak), cuda (each device's allocated and reserved bytes, once torch has initialised CUDA; resets "
           "torch's peak statistics); none: off"),
    Option("task_attribution", "INSTRUMENT_TASK_ATTRIBUTION", True, _bool,
           "charge CPU time and counters inside asyncio tasks to each task's own stages (a hook on asyncio's task "
           "steps); off: a call that overlaps other tasks on its thread keeps its wall time, its CPU time and counters "
           "are left out (cpu_ns.overlapped_calls)"),
    Option("machine_probe", "INSTRUMENT_MACHINE_PROBE", True, _bool,
           "time a fixed pure-Python loop on the stages' threads through the recording (after an outermost stage "
           "exits, about every 16 ms, 0.1 % of the time, on the thread's task-clock): the machine's speed through the "
           "run, which `instrument diff` compares (meta.machine.probe)"),
    Option("max_stages", "INSTRUMENT_MAX_STAGES", 10000, integer(1, 10_000_000),
           "distinct stage nodes kept; more are folded into '(other)'", hot=True),
    Option("trace_events", "INSTRUMENT_TRACE_EVENTS", 0, integer(0, 100_000_000),
           "size of the ring of timeline events kept for the Chrome trace export (0 = off)", hot=True),
    Option("exemplars", "INSTRUMENT_EXEMPLARS", 32, integer(0, 1024),
           "calls kept per top-level stage with their per-stage breakdown: the K slowest and a sample of K "
           "typical ones, for `instrument report --tail` (0 = off)", hot=True),
    Option("nvtx", "INSTRUMENT_NVTX", True, _bool, "emit an NVTX range for every stage", hot=True),
    Option("nvtx_domain", "INSTRUMENT_NVTX_DOMAIN", "instrument", _text, "the NVTX domain of the ranges"),
    Option("torch", "INSTRUMENT_TORCH", "auto", _tristate,
           "open torch.profiler ranges for stages while a profiler is active (auto: when torch is imported)"),
    Option("gpu", "INSTRUMENT_GPU", "auto", _tristate,
           "time stages on the GPU with CUDA events (auto: when torch has initialised CUDA)"),
    Option("gpu_events", "INSTRUMENT_GPU_EVENTS", 4096, integer(2, 1_000_000),
           "bound of the pool of unresolved CUDA event pairs; samples beyond it are counted as dropped"),
    Option("collectives", "INSTRUMENT_COLLECTIVES", True, _bool,
           "time torch.distributed collectives and send/recv (all_reduce, barrier, ...) as child stages of their "
           "caller, named dist.<function>, once torch is imported; off: torch.distributed is left as it is"),
    Option("capture", "INSTRUMENT_CAPTURE", "steady", _text,
           "name of the NVTX capture range that instrument.capture()/capture_every() open (nsys -p NAME@domain)"),
    Option("warmup", "INSTRUMENT_WARMUP", None, _optional_int(0),
           "iterations before the capture range opens (unset: 0 for capture(), 20 for capture_every())"),
    Option("serve", "INSTRUMENT_SERVE", None, _serve,
           "serve /metrics and /snapshot on host:port from the moment instrument is imported (127.0.0.1 if no "
           "host; other hosts only with serve_any_host)"),
    Option("serve_any_host", "INSTRUMENT_SERVE_ANY_HOST", False, _bool,
           "allow `serve` to listen on an address other than loopback (reachable from other machines)"),
    Option("verdict_wait_cpu", "INSTRUMENT_VERDICT_WAIT_CPU", 0.5, number(0.0, 1.0),
           "CPU/wall below which a stage is judged waiting"),
    Option("verdict_compute_cpu", "INSTRUMENT_VERDICT_COMPUTE_CPU", 0.85, number(0.0, 1.0),
           "CPU/wall above which a stage is judged compute-bound"),
    Option("verdict_gpu_share", "INSTRUMENT_VERDICT_GPU_SHARE", 0.6, number(0.0, 1.0),
           "GPU time / wall above which a stage is judged gpu-bound"),
    Option("verdict_runqueue_share", "INSTRUMENT_VERDICT_RUNQUEUE_SHARE", 0.3, number(0.0, 1.0),
           "share of a stage's own time ready but waiting for a CPU (run queue) from which it is judged cpu-starved"),
    Option("verdict_loop_share", "INSTRUMENT_VERDICT_LOOP_SHARE", 0.3, number(0.0, 1.0),
           "share of a stage's own time woken but waiting for the event loop from which it is judged loop-blocked"),
    Option("verdict_kernel_share", "INSTRUMENT_VERDICT_KERNEL_SHARE", 0.5, number(0.0, 1.0),
           "system (kernel) time / CPU time above which a busy stage is judged kernel-bound"),
    Option("verdict_miss_ratio", "INSTRUMENT_VERDICT_MISS_RATIO", 0.1, number(0.0, 1.0),
           "cache-miss ratio above which a stage is judged memory-bound"),
    Option("verdict_mpki", "INSTRUMENT_VERDICT_MPKI", 10.0, number(0.0, 1e6),
           "cache misses per 1,000 instructions above which a stage is judged memory-bound"),
    Option("verdict_low_ipc", "INSTRUMENT_VERDICT_LOW_IPC", 1.0, number(0.0, 100.0),
           "IPC below which a memory-bound suspicion is confirmed"),
    Option("diff_alpha", "INSTRUMENT_DIFF_ALPHA", 0.01, number(1e-9, 0.5),
           "diff: the chance of calling noise a change; intervals are at 1 - alpha (0.01: 99 %)"),
    Option("diff_min_change", "INSTRUMENT_DIFF_MIN_CHANGE", 0.03, number(0.0, 10.0),
           "diff: the smallest relative change called beyond noise (0.03 = 3 %): drift between runs that no test "
           "sees stays under it"),
)
BY_NAME: Dict[str, Option] = {o.name: o for o in OPTIONS}
SHARED_FOLDER_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"   # prometheus_client's name for the workers' shared folder
ENV_ONLY = {
    "INSTRUMENT_DISABLE": "1 turns every stage into a no-op (same as configure(enabled=False))",
    "INSTRUMENT_PURE_PYTHON": "1 uses the small pure-Python fallback even when the C extension is built (read at "
                              "import): every call read, exact sums, no budget, estimates, exemplars or task clock",
    "INSTRUMENT_DEBUG": "1 lets the command line show the traceback of an internal error",
    SHARED_FOLDER_VARIABLE: "the folder where each worker of a service keeps its snapshot "
                                "(instrument.start_snapshot_writer); serve_metrics then serves their merge",
}


# INSTRUMENT_* variables that are not options: the build's (setup.py) and the test suite's
OTHER_VARIABLES = ("INSTRUMENT_REQUIRE_NATIVE", "INSTRUMENT_CFLAGS", "INSTRUMENT_LDFLAGS", "INSTRUMENT_SOAK_SECONDS")
_warned_unknown: set = set()


def known_variables() -> Tuple[str, ...]:
    """Every INSTRUMENT_* variable instrument reads (the options', the environment-only ones, the build's)."""
    return tuple(o.env for o in OPTIONS if o.env) + tuple(k for k in ENV_ONLY if k.startswith("INSTRUMENT_")) \
        + OTHER_VARIABLES


def unknown_variables(env: Mapping[str, str]) -> List[str]:
    """A line for each INSTRUMENT_* variable of `env` that no option reads, naming the closest known one."""
    import difflib
    known = known_variables()
    out = []
    for k in sorted(env):
        if k.startswith("INSTRUMENT_") and k not in known:   # compared without the prefix every name shares
            close = difflib.get_close_matches(k[11:], [x[11:] for x in known], n=1, cutoff=0.6)
            out.append(f"unknown variable {k} is ignored; " + (f"did you mean INSTRUMENT_{close[0]}?" if close else
                       "the variables are listed in docs/configuration.md"))
    return out


def _user_stacklevel() -> int:
    """warnings.warn's stacklevel, called from the caller of this, that names the first frame outside this
    package: the user's `import instrument` or call, not the package's own lines (importlib's frames, which warn
    skips itself, are not counted)."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    f, level = sys._getframe(2), 2
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith(here):
            level += 1
        elif not ("importlib" in name and "_bootstrap" in name):
            return level
        f = f.f_back
    return 1


@dataclasses.dataclass(frozen=True)
class Config:
    values: Mapping[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def replace(self, **changes: Any) -> "Config":
        unknown = sorted(set(changes) - set(BY_NAME))
        if unknown:
            raise TypeError(f"unknown option {', '.join(unknown)}; the options are: {', '.join(BY_NAME)}")
        v = dict(self.values)
        for k, x in changes.items():
            v[k] = BY_NAME[k].parse(k, x)
        _check_serve(v)
        return Config(v)

    def to_dict(self) -> Dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.values.items()}


def defaults() -> Config:
    return Config({o.name: o.parse(o.name, o.default) if o.name == "counters" else o.default for o in OPTIONS})


def from_env(environ: Optional[Mapping[str, str]] = None, strict: bool = False) -> Config:
    """The configuration the environment asks for.  strict=True raises on a bad
    value (the CLI's way); otherwise the value is reported and the default kept."""
    env = os.environ if environ is None else environ
    values = dict(defaults().values)
    problems = []
    for o in OPTIONS:
        if o.env and o.env in env:
            try:
                values[o.name] = o.parse(o.env, env[o.env])
            except ValueError as e:
                problems.append(str(e))
    if "INSTRUMENT_DISABLE" in env:
        try:
            values["enabled"] = not _bool("INSTRUMENT_DISABLE", env["INSTRUMENT_DISABLE"])
        except ValueError as e:
            problems.append(str(e))
    try:
        _check_serve(values)
    except ValueError as e:
        problems.append(str(e).replace("; set", ", so nothing is served; set", 1))
        values["serve"] = None
    if "INSTRUMENT_PURE_PYTHON" in env:
        try:
            _bool("INSTRUMENT_PURE_PYTHON", env["INSTRUMENT_PURE_PYTHON"])
        except ValueError as e:
            problems.append(str(e))
    unknown = [u for u in unknown_variables(env) if u not in _warned_unknown]
    if problems and strict:
        raise ValueError("; ".join(problems))
    if unknown or (problems and not command_line()):   # the command reads bad values strictly: exit 2, one line
        level = _user_stacklevel()
        for u in unknown:   # once a process: a typo changes nothing, so it is said, never raised
            _warned_unknown.add(u)
            if command_line():   # no user code to point at: one line, as the command's other messages
                print(f"instrument: warning: {u}", file=sys.stderr)
            else:
                warnings.warn(f"instrument: {u}", RuntimeWarning, stacklevel=level)
        for p in problems if not command_line() else ():
            warnings.warn(f"instrument: {p}; using the default", RuntimeWarning, stacklevel=level)
    return Config(values)


def command_line() -> bool:
    """Whether this process is the `instrument` command (`instrument ...`, `python -m instrument ...`): it reads
    the environment strictly itself, and reads services rather than serving."""
    arg0 = sys.argv[0] if sys.argv else ""
    return os.path.basename(arg0) in ("instrument", "-m") or arg0.endswith(os.path.join("instrument", "__main__.py"))


def hot_values(cfg: Config) -> Dict[str, Any]:
    """The hot-path options of `cfg`, as the backends' configure() takes them."""
    return {o.name: cfg.values[o.name] for o in OPTIONS if o.hot}


def verdict_thresholds(cfg: Optional[Config] = None) -> Dict[str, float]:
    """The verdict_* options of `cfg` (default: the defaults) without their prefix: {"wait_cpu": 0.5, ...}."""
    cfg = defaults() if cfg is None else cfg
    return {k[len("verdict_"):]: v for k, v in cfg.values.items() if k.startswith("verdict_")}


def diff_options(cfg: Optional[Config] = None) -> Dict[str, float]:
    """The diff_* options of `cfg` (default: the environment's) as diff() arguments: {"alpha", "min_change"}."""
    cfg = from_env() if cfg is None else cfg
    return {"alpha": cfg.diff_alpha, "min_change": cfg.diff_min_change}


def env_name(option: str) -> str:
    """The environment variable of an option (`counters` -> INSTRUMENT_COUNTERS)."""
    o = BY_NAME.get(option)
    if o is None or o.env is None:
        raise KeyError(f"option {option!r} has no environment variable")
    return o.env


def set_in_env(option: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the environment asks for this option by name: a valid value other than the default
    (INSTRUMENT_COUNTERS=default asks for no more than leaving it unset does)."""
    env = os.environ if environ is None else environ
    o = BY_NAME.get(option)
    if o is None or not o.env or o.env not in env:
        return False
    try:
        return o.parse(o.env, env[o.env]) != defaults().values[option]
    except ValueError:
        return False


def to_env(**options: Any) -> Dict[str, str]:
    """Variables that give a child process these options (validated first):
    to_env(output="run.json", trace_events=100) -> {"INSTRUMENT_OUTPUT": ..., ...}."""
    out: Dict[str, str] = {}
    for k, v in options.items():
        if k not in BY_NAME or BY_NAME[k].env is None:
            raise TypeError(f"option {k!r} cannot be passed through the environment; those that can: "
                            f"{', '.join(o.name for o in OPTIONS if o.env)}")
        x = BY_NAME[k].parse(k, v)
        out[env_name(k)] = ",".join(x) if isinstance(x, tuple) else "" if x is None else str(x)
    return out


def unset_in_env(option: str, environ: Optional[Dict[str, str]] = None) -> None:
    """Remove an option's variable (the command line does not measure itself)."""
    (os.environ if environ is None else environ).pop(env_name(option), None)


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")   # what torchrun (and torch.distributed.launch) set


def launcher_rank(environ: Optional[Mapping[str, str]] = None) -> Optional[Dict[str, Optional[int]]]:
    """{"rank", "world_size", "local_rank"} a launcher such as torchrun gave this process in RANK, WORLD_SIZE
    and LOCAL_RANK; None outside one (RANK unset or not an integer >= 0; the others None when not integers)."""
    env = os.environ if environ is None else environ
    values = {}
    for key, var in zip(("rank", "world_size", "local_rank"), LAUNCHER_VARIABLES):
        text = env.get(var, "").strip()
        values[key] = int(text) if text.isdigit() else None
    return values if values["rank"] is not None else None


def pure_python_requested(environ: Optional[Mapping[str, str]] = None) -> bool:
    """INSTRUMENT_PURE_PYTHON=1: the backend is the pure-Python fallback even when the C extension is built."""
    env = os.environ if environ is None else environ
    try:
        return _bool("INSTRUMENT_PURE_PYTHON", env.get("INSTRUMENT_PURE_PYTHON", "0") or "0")
    except ValueError:
        return False   # from_env() reports the bad value once


def shared_folder(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """$PROMETHEUS_MULTIPROC_DIR: the folder the workers of a service share their snapshots in; None when unset."""
    env = os.environ if environ is None else environ
    return env.get(SHARED_FOLDER_VARIABLE) or None


PURE_PYTHON_REASON = "INSTRUMENT_PURE_PYTHON=1"
DEBUG_VARIABLE = "INSTRUMENT_DEBUG"


def debug(environ: Optional[Mapping[str, str]] = None) -> bool:
    """INSTRUMENT_DEBUG=1: internal errors of the command line show their traceback."""
    env = os.environ if environ is None else environ
    return env.get("INSTRUMENT_DEBUG", "").strip().lower() in TRUE


def describe() -> str:
    """Markdown table of every option, for the docs."""
    rows = ["| option | variable | default | meaning |", "| --- | --- | --- | --- |"]
    for o in OPTIONS:
        rows.append(f"| `{o.name}` | {'`' + o.env + '`' if o.env else '—'} | `{o.default!r}` | {o.doc} |")
    for k, d in ENV_ONLY.items():
        rows.append(f"| — | `{k}` | unset | {d} |")
    return "\n".join(rows)
