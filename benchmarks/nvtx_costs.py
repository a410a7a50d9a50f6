"""Cost of one NVTX range (enter + exit) from Python, in ns: median of repeated runs.

    PYTHONPATH=. python benchmarks/nvtx_costs.py [--iterations N] [--repeats R]

Runs each case in fresh interpreters: with no NVTX tool attached; with the test
recorder (tests/nvtx_tool/recorder.c) attached, which writes and flushes one line per
call, so that column is dominated by the recorder's own write(2) calls; and with the
recorder attached but silent (NVTX_RECORD_PATH=none: a mutex and nothing else), which
shows the cost of the emission path itself when a tool is listening.
Figures exclude the empty-loop cost.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = {
    "nvtx.annotate (inline with)": (
        "import nvtx",
        "with nvtx.annotate('work', domain='bench'):\n        pass"),
    "nvtx Domain.push_range/pop_range (cached)": (
        "import nvtx\ndom = nvtx.get_domain('bench')\nattrs = dom.get_event_attributes(message='work', color=0xFF00FF00)",
        "dom.push_range(attrs)\n    dom.pop_range()"),
    "_native.nvtx_push/nvtx_pop": (
        "from instrument import _native\n_native.nvtx_init('bench')\npush, pop = _native.nvtx_push, _native.nvtx_pop",
        "push('work')\n    pop()"),
    "_native.nvtx_range_start/end": (
        "from instrument import _native\n_native.nvtx_init('bench')\nstart, end = _native.nvtx_range_start, _native.nvtx_range_end",
        "end(start('work'))"),
}


def child(n, repeats):
    """Runs in the measuring interpreter; prints {case: median ns}."""
    import statistics
    results = {}
    for name, (setup, body) in CASES.items():
        ns = {}
        try:
            exec(setup, ns)
        except Exception as e:  # e.g. the extension was built without NVTX
            results[name] = f"n/a ({e!r})"
            continue
        src = f"def loop(n):\n  for _ in range(n):\n    {body}\ndef empty(n):\n  for _ in range(n):\n    pass\n"
        exec(src, ns)
        ns["loop"](1000)  # warm up: registration, tool init
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns(); ns["loop"](n); t1 = time.perf_counter_ns()
            ns["empty"](n); t2 = time.perf_counter_ns()
            samples.append(((t1 - t0) - (t2 - t1)) / n)
        results[name] = round(statistics.median(samples), 1)
    print(json.dumps(results))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.iterations, args.repeats)

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from nvtx_support import build_recorder

    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTX_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    columns = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("no tool", args.iterations, {"NVTX_INJECTION64_PATH": "./."}),
                # the recorder writes a line per call: fewer iterations keep the file small
                ("recorder", max(1, args.iterations // 20), {"NVTX_INJECTION64_PATH": build_recorder(),
                                                            "NVTX_RECORD_PATH": os.path.join(tmp, "rec.tsv")}),
                ("silent tool", args.iterations, {"NVTX_INJECTION64_PATH": build_recorder(),
                                                  "NVTX_RECORD_PATH": "none"})]
        for label, n, extra in runs:
            out = subprocess.run([sys.executable, __file__, "--child", "--iterations", str(n),
                                  "--repeats", str(args.repeats)], env={**env, **extra},
                                 capture_output=True, text=True, check=True).stdout
            columns[label] = json.loads(out)
    width = max(map(len, CASES))
    print(f"{'ns per range (median)':<{width}}" + "".join(f"  {label:>11}" for label in columns))
    for name in CASES:
        print(f"{name:<{width}}" + "".join(f"  {col[name]!s:>11}" for col in columns.values()))


if __name__ == "__main__":
    main()
