import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from instrument import cli
from instrument.snapshot import Snapshot
from snapfactory import cli as run_cli, env, snap, st

MS = 1_000_000

APP = textwrap.dedent("""
    import multiprocessing as mp, os, sys
    import instrument

    def child(n):
        for _ in range(n):
            with instrument.stage("child_work"):
                with instrument.stage("inner"):
                    pass

    if __name__ == "__main__":
        mp.set_start_method(sys.argv[1])
        for _ in range(5):
            with instrument.stage("request"):
                with instrument.stage("tokenize"):
                    pass
                with instrument.stage("model"):
                    pass
        p = mp.Process(target=child, args=(7,))
        p.start()
        p.join()
        print("pids", os.getpid(), p.pid, flush=True)
        sys.exit(3)
""")


def main(capsys, *args):
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("instrument: "), err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------- run
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_run_writes_one_file_per_process_and_the_merge(tmp_path, method):
    (tmp_path / "app.py").write_text(APP)
    r = run_cli("run", "--keep-parts", "-o", tmp_path / "run.json", "--", sys.executable, tmp_path / "app.py", method,
                cwd=tmp_path)
    assert r.returncode == 3, r.stderr                          # the program's exit status
    parent, child = map(int, r.stdout.split()[1:3])
    parts = tmp_path / "run.parts"                              # the parts in their own folder, kept when asked
    assert {f"run.{parent}.json", f"run.{child}.json"} <= set(os.listdir(parts))   # spawn: its resource tracker too
    assert sorted(os.listdir(tmp_path)) == ["app.py", "run.json", "run.parts"]
    p, c = Snapshot.load(parts / f"run.{parent}.json"), Snapshot.load(parts / f"run.{child}.json")
    assert p.meta["pid"] == parent and c.meta["pid"] == child
    assert {s.path for s in p} == {("request",), ("request", "tokenize"), ("request", "model")}
    assert {s.path for s in c} == {("child_work",), ("child_work", "inner")}   # only the child's own work
    assert c["child_work"].calls == 7 and p["request"].calls == 5
    merged = Snapshot.load(tmp_path / "run.json")
    assert merged["request/tokenize"].calls == 5 and merged["child_work/inner"].calls == 7
    assert {m["pid"] for m in merged.meta["merged_from"]} >= {parent, child}
    assert "request" in r.stderr and "child_work" in r.stderr   # the breakdown
    assert {e["pid"] for e in merged.events} == {parent, child}  # trace events on by default, per process


@pytest.mark.parametrize("how", ["module", "entry point"])
def test_run_entry_point_and_no_report(tmp_path, how):
    exe = [sys.executable, "-m", "instrument.cli"] if how == "module" else [shutil.which("instrument")]
    if exe[0] is None:
        pytest.skip("the `instrument` console script is not installed (pip install -e .)")
    (tmp_path / "app.py").write_text(APP)
    r = subprocess.run(exe + ["run", "--no-report", "--trace-events", "0", "-o", str(tmp_path / "x.json"), "--",
                              sys.executable, str(tmp_path / "app.py"), "fork"], capture_output=True, text=True,
                       env=env(), timeout=120)
    assert r.returncode == 3, r.stderr
    assert "tokenize" not in r.stderr
    m = Snapshot.load(tmp_path / "x.json")
    assert m["request"].calls == 5 and not m.events
    assert sorted(os.listdir(tmp_path)) == ["app.py", "x.json"]   # the parts are removed once merged
    assert "parts removed" in r.stderr


def test_run_chains_an_existing_sitecustomize(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    (tmp_path / "app.py").write_text("import os, instrument\nwith instrument.stage('a'): pass\n"
                                     "print(os.environ.get('CHAINED'))\n")
    e = env()
    e["PYTHONPATH"] = os.pathsep.join([e["PYTHONPATH"], str(tmp_path / "site")])
    r = subprocess.run([sys.executable, "-m", "instrument", "run", "-o", str(tmp_path / "r.json"), "--",
                        sys.executable, str(tmp_path / "app.py")], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "yes"
    assert Snapshot.load(tmp_path / "r.json")["a"].calls == 1


LOOP = textwrap.dedent("""
    import os, instrument
    n = 0
    while True:
        with instrument.stage("serve"):
            with instrument.stage("step"):
                n += 1
        if n == 50:
            print("ready", os.getpid(), flush=True)
""")


def test_sigterm_to_run_leaves_a_complete_file_and_the_signal_status(tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    p = subprocess.Popen([sys.executable, "-m", "instrument", "run", "-o", str(tmp_path / "t.json"), "--",
                          sys.executable, str(tmp_path / "loop.py")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env())
    word, pid = p.stdout.readline().split()
    assert word == "ready"
    p.send_signal(signal.SIGTERM)        # forwarded to the program
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    s = Snapshot.load(tmp_path / "t.json")
    assert s["serve/step"].calls >= 50 and s["serve"].calls >= 49
    assert s.meta["pid"] == int(pid) and not (tmp_path / "t.parts").exists()


def test_exit_zero_on_term_makes_a_stop_by_sigterm_a_success(tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    p = subprocess.Popen([sys.executable, "-m", "instrument", "run", "--exit-zero-on-term", "--no-report", "-o",
                          str(tmp_path / "t.json"), "--", sys.executable, str(tmp_path / "loop.py")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    assert p.stdout.readline().split()[0] == "ready"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert Snapshot.load(tmp_path / "t.json")["serve/step"].calls >= 50      # the snapshot as without the flag
    r = run_cli("run", "--exit-zero-on-term", "-o", tmp_path / "u.json", "--", sys.executable, "-c",
                "import sys; sys.exit(3)")
    assert r.returncode == 3, r.stderr                                        # other statuses are passed on


def test_sigterm_to_the_program_keeps_killed_by_sigterm(tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    p = subprocess.Popen([sys.executable, str(tmp_path / "loop.py")], stdout=subprocess.PIPE, text=True,
                         env=cli.run_env(str(tmp_path / "t.json"), environ=env()))
    _, pid = p.stdout.readline().split()
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGTERM
    assert Snapshot.load(tmp_path / "t.parts" / f"t.{pid}.json")["serve/step"].calls >= 50


def test_program_sigterm_handler_is_chained(tmp_path):
    (tmp_path / "app.py").write_text(textwrap.dedent("""
        import os, signal, sys, instrument
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))   # the program's own handler, installed after ours
        with instrument.stage("a"):
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    """))
    r = run_cli("run", "-o", tmp_path / "r.json", "--", sys.executable, tmp_path / "app.py")
    assert r.returncode == 7, r.stderr
    assert Snapshot.load(tmp_path / "r.json")["a"].calls == 1


def test_sigterm_to_a_forked_child_ends_the_child_only(tmp_path):
    """A signal sent to a forked child, even as it is being forked, wakes the child's watcher, never the parent's."""
    (tmp_path / "app.py").write_text(textwrap.dedent("""
        import os, signal, time, instrument
        with instrument.stage("parent"):
            pass
        for i in range(20):       # a worker stopped as it is being forked
            pid = os.fork()
            if pid == 0:
                time.sleep(0.2)
                os._exit(0)
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            with instrument.stage("child"):
                pass
            os.write(w, b"x")
            time.sleep(60)
        os.read(r, 1)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        time.sleep(2)   # a watcher woken in this process by a child's signal would have ended it by now
        print(os.waitstatus_to_exitcode(status), flush=True)
    """))
    r = run_cli("run", "-o", tmp_path / "r.json", "--", sys.executable, tmp_path / "app.py")
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == -signal.SIGTERM
    s = Snapshot.load(tmp_path / "r.json")
    assert s["parent"].calls == 1 and s["child"].calls == 1   # the child's part, saved on its SIGTERM, merged


SPAWNS = textwrap.dedent("""
    import multiprocessing as mp
    import instrument

    def child(q):
        with instrument.stage("child"):
            q.put(1)

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")   # a Queue starts multiprocessing's resource tracker, a Python process too
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        q.get()
        p.join()
        with instrument.stage("parent"):
            pass
""")


def test_run_merges_the_processes_that_recorded_and_leaves_no_part_behind(tmp_path):
    """multiprocessing's resource tracker records nothing and ends after the program: it adds no part, before the
    merge or after it."""
    import time
    (tmp_path / "app.py").write_text(SPAWNS)
    r = run_cli("run", "-o", tmp_path / "r.json", "--", sys.executable, tmp_path / "app.py")
    assert r.returncode == 0, r.stderr
    s = Snapshot.load(tmp_path / "r.json")
    assert s["parent"].calls == s["child"].calls == 1 and len(s.meta["merged_from"]) == 2
    assert "parts removed)" in r.stderr and "holds other files" not in r.stderr
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not (tmp_path / "r.parts").exists():   # the tracker's exit, had it written
        time.sleep(0.1)
    assert not (tmp_path / "r.parts").exists()


def test_run_of_a_program_that_writes_nothing(tmp_path):
    r = run_cli("run", "-o", tmp_path / "r.json", "--", "sh", "-c", "exit 4")
    assert r.returncode == 4
    assert "wrote no snapshot" in one_line_error(r.stderr)
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "r.parts").exists()


def test_run_rejects_a_bad_environment_strictly(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("INSTRUMENT_MAX_STAGES", "lots")
    rc, _, err = main(capsys, "run", "-o", tmp_path / "r.json", "--", "true")
    assert rc == 2 and "INSTRUMENT_MAX_STAGES" in one_line_error(err)


# ------------------------------------------------------------------- report
def files(tmp_path):
    a = snap(st("request", 100, 25 * MS, self_ns=100 * MS, cpu_ns=2000 * MS),
             st("request/tokenize", 100, 3 * MS), st("request/model", 100, 21 * MS,
                                                       ops={"by_self_cpu": [{"name": "aten::addmm", "calls": 300,
                                                                             "self_cpu_ns": 900 * MS,
                                                                             "device_ns": None}],
                                                            "device_total_ns": 0}),
             st("batch", 10, 50 * MS), st("batch/tokenize", 10, 1 * MS), pid=11)
    b = snap(st("request", 50, 25 * MS), st("request/model", 50, 21 * MS), pid=12, start=1_700_000_030.0)
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    a.save(pa)
    b.save(pb)
    return a, b, pa, pb


def test_report_known_numbers(tmp_path, capsys):
    _, _, pa, _ = files(tmp_path)
    rc, out, _ = main(capsys, "report", pa, "--format", "csv")
    assert rc == 0
    rows = {r["path"]: r for r in csv.DictReader(io.StringIO(out))}
    assert rows["request"]["calls"] == "100" and rows["request"]["total_ns"] == str(2500 * MS)
    assert float(rows["request"]["mean_ns"]) == 25 * MS and float(rows["request"]["p99_ns"]) == 25 * MS
    assert rows["request"]["self_ns"] == str(100 * MS) and rows["request"]["cpu_ns"] == str(2000 * MS)
    assert float(rows["request/tokenize"]["root_pct"]) == pytest.approx(12.0)
    rc, out, _ = main(capsys, "report", pa)
    line = next(l for l in out.splitlines() if l.startswith("request"))
    assert out.splitlines()[0].split() == ["stage", "calls", "total", "ms", "%root", "mean", "ms", "p50", "ms", "p99",
                                           "ms", "CPU", "ms", "verdict"]   # 80 columns: the verdict and p50 stay
    assert line.split() == ["request", "100", "2500.0", "100.0", "25.00", "25.00", "25.00", "2000.0", "compute-bound"]
    assert all(len(l) <= 80 for l in out.splitlines())


def test_report_sort_depth_fold_formats_ops(tmp_path, capsys):
    _, _, pa, pb = files(tmp_path)
    _, out, _ = main(capsys, "report", pa, "--sort", "total", "--depth", "1", "--format", "json")
    assert [r["path"] for r in json.loads(out)] == [["request"], ["batch"]]
    _, out, _ = main(capsys, "report", pa, "--sort", "calls", "--format", "json")
    assert [r["path"][-1] for r in json.loads(out)][:3] == ["request", "tokenize", "model"]
    _, out, _ = main(capsys, "report", pa, "--fold", "--format", "json")
    tok = next(r for r in json.loads(out) if r["path"] == ["tokenize"])
    assert tok["calls"] == 110
    _, out, _ = main(capsys, "report", pa, "--format", "markdown")
    assert out.startswith("| stage |")
    _, out, _ = main(capsys, "report", pa, "--ops")
    lines = out.splitlines()
    model = next(i for i, l in enumerate(lines) if l.strip().startswith("model"))
    assert "ops by self CPU" in lines[model + 1] and "aten::addmm" in lines[model + 2] and "900.0" in lines[model + 2]
    _, out, _ = main(capsys, "report", pb, "--ops")            # no ops recorded: nothing extra
    assert "ops by" not in out
    rc, out, _ = main(capsys, "report", pa, pb, "--format", "json")   # several files are merged
    assert rc == 0 and next(r for r in json.loads(out) if r["path"] == ["request"])["calls"] == 150


def test_report_of_a_folder_is_the_report_of_its_snapshots_merged(tmp_path):
    a, b, pa, pb = files(tmp_path)
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copy(pa, folder / "a.json")
    shutil.copy(pb, folder / "b.json")
    r = run_cli("report", folder, "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = {tuple(x["path"]): x for x in json.loads(r.stdout)}
    merged = a.merge(b)
    assert rows[("request",)]["calls"] == merged["request"].calls == 150
    assert rows[("request", "model")]["wall_ns"]["total"] == merged["request/model"].wall_total
    assert json.loads(run_cli("report", pa, pb, "--format", "json").stdout) == json.loads(r.stdout)   # as the files
    r = run_cli("report", folder)
    assert r.returncode == 0 and r.stdout.splitlines()[2].split()[:2] == ["request", "150"], r.stderr
    r = run_cli("advise", folder)
    assert r.returncode == 0 and "Where to look next" in r.stdout, r.stderr
    (tmp_path / "empty").mkdir()
    r = run_cli("report", tmp_path / "empty")
    assert r.returncode == 2 and "a folder with no snapshot files" in one_line_error(r.stderr)


def test_report_since_is_the_window_between_two_files(tmp_path, capsys):
    early = snap(st("request", 0, 0, values=[MS] * 40), pid=7)
    late = snap(st("request", 0, 0, values=[MS] * 40 + [3 * MS] * 60), st("request/model", 60, 2 * MS), pid=7)
    late = Snapshot(late.stages, dict(late.meta, duration_ns=late.meta["duration_ns"] + 10 ** 9))
    early.save(tmp_path / "a.json")
    late.save(tmp_path / "b.json")
    rc, out, _ = main(capsys, "report", "--since", tmp_path / "a.json", tmp_path / "b.json", "--json")
    rows = {tuple(r["path"]): r for r in json.loads(out)}
    assert rc == 0 and rows[("request",)]["calls"] == 60 and rows[("request",)]["wall_ns"]["total"] == 180 * MS
    assert rows[("request",)]["wall_ns"]["p50"] == pytest.approx(3 * MS, rel=0.008)
    rc, out, _ = main(capsys, "report", "--since", tmp_path / "a.json", tmp_path / "b.json")
    assert rc == 0 and "window: 1.000 s between the two snapshots" in out
    rc, _, err = main(capsys, "report", "--since", tmp_path / "b.json", tmp_path / "a.json")
    assert rc == 2 and "a.json was taken after" not in err and "b.json was taken after" in one_line_error(err)
    rc, _, err = main(capsys, "report", "--since", tmp_path / "a.json", tmp_path / "b.json", tmp_path / "a.json")
    assert rc == 2 and "reads those two files only" in one_line_error(err)
    rc, _, err = main(capsys, "report", tmp_path / "a.json", "--quantile", "0.9")
    assert rc == 2 and "--quantile goes with --tail" in one_line_error(err)
    rc, _, err = main(capsys, "report", tmp_path / "a.json", "--tail", "--quantile", "1.5")
    assert rc == 2 and "between 0 and 1" in one_line_error(err)
    rc, out, _ = main(capsys, "report", tmp_path / "a.json", "--tail")
    assert rc == 0 and "No exemplars" in out


# -------------------------------------------------------------------- merge
def test_merge_exact_with_progress(tmp_path, capsys):
    a, b, pa, pb = files(tmp_path)
    rc, _, err = main(capsys, "merge", pa, pb, "-o", tmp_path / "all.json")
    assert rc == 0 and "2 files" in err
    m = Snapshot.load(tmp_path / "all.json")
    assert m["request"].calls == 150 and m["request"].wall_total == 150 * 25 * MS
    assert m["request/model"].wall_total == 150 * 21 * MS and m["batch"].calls == 10
    assert m == a.merge(b)
    many = []
    for i in range(12):
        p = tmp_path / f"w{i}.json"
        snap(st("req", i + 1, MS), pid=100 + i).save(p)
        many.append(p)
    rc, _, err = main(capsys, "merge", *many, "-o", tmp_path / "many.json")
    assert rc == 0 and "merging 12/12" in err
    assert Snapshot.load(tmp_path / "many.json")["req"].calls == sum(range(1, 13))


def test_merge_refuses_different_versions(tmp_path, capsys):
    _, _, pa, _ = files(tmp_path)
    d = json.loads(pa.read_text())
    d["version"] = 2
    (tmp_path / "v2.json").write_text(json.dumps(d))
    rc, _, err = main(capsys, "merge", pa, tmp_path / "v2.json", "-o", tmp_path / "m.json")
    assert rc == 2 and "different schema versions" in one_line_error(err)
    assert not (tmp_path / "m.json").exists()


# ------------------------------------------------------------- bad inputs
BAD = {
    "empty.json": (b"", "empty"),
    "truncated.json": (b'{"format": "instrument-snapshot", "version": 1, "sta', "not valid JSON"),
    "binary.json": (b"\x00\xff\xfe\x00binary", "not UTF-8"),
    "other.json": (b'{"format": "something-else", "version": 1, "stages": []}', "not an instrument snapshot"),
    "future.json": (b'{"format": "instrument-snapshot", "version": 99, "stages": []}', "version 99"),
}


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("command", [["report"], ["diff", "GOOD"], ["merge", "GOOD"], ["export", "--html", "o.html"],
                                     ["export", "--chrome", "o.json"]])
def test_bad_files_exit_2_with_one_line(tmp_path, capsys, name, command):
    content, why = BAD[name]
    (tmp_path / name).write_bytes(content)
    good = tmp_path / "good.json"
    snap(st("a", 1, MS)).save(good)
    args = [str(good) if a == "GOOD" else str(tmp_path / a) if a.startswith("o.") else a for a in command]
    rc, _, err = main(capsys, *args, tmp_path / name)
    assert rc == 2
    line = one_line_error(err)
    assert name in line and why in line


def test_missing_and_oversized_files(tmp_path, capsys):
    rc, _, err = main(capsys, "report", tmp_path / "nope.json")
    assert rc == 2 and "cannot read" in one_line_error(err)
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate((1 << 30) + 1)   # sparse: refused by its size, never read
    rc, _, err = main(capsys, "report", big)
    assert rc == 2 and "limit" in one_line_error(err)


@pytest.mark.parametrize("args", [[], ["frobnicate"], ["report"], ["report", "x.json", "--sort", "bogus"],
                                  ["report", "x.json", "--depth", "0"], ["diff", "a.json"],
                                  ["diff", "a", "b", "--fail-on-regression", "fast"], ["diff", "a", "b", "--basis", "calls"], ["export", "x.json"],
                                  ["export", "--html", "o.html", "--chrome", "o.json", "x.json"],
                                  ["export", "--chrome", "o.json", "a", "b", "--diff"], ["run"],
                                  ["run", "--trace-events", "-3", "--", "true"], ["merge"]])
def test_bad_arguments_exit_2_with_one_line(capsys, args):
    rc, out, err = main(capsys, *args)
    assert rc == 2
    if args:
        one_line_error(err)


def test_bad_arguments_from_a_real_process():
    r = run_cli("report", "--sort", "bogus", "x.json")
    assert r.returncode == 2 and r.stdout == ""
    assert "--sort" in one_line_error(r.stderr)
    assert run_cli("--help").returncode == 0


def test_commands_of_other_modules_are_wired(capsys):
    rc, out, _ = main(capsys, "nsys", "--dry-run", "--capture", "steady", "--warmup", "3", "--", "python", "x.py")
    assert rc == 0 and "nsys" in out and "x.py" in out
    for bad in (["--warmup", "-1"], ["--capture", " "]):   # the warmup and capture options' own parsers
        rc, _, err = main(capsys, "nsys", "--dry-run", *bad, "--", "python", "x.py")
        assert rc == 2 and f"argument {bad[0]}: must be" in one_line_error(err)


def test_import_instrument_stays_light():
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import instrument"], capture_output=True,
                       text=True, env=env(), timeout=60)
    assert r.returncode == 0, r.stderr
    mods = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert "instrument" in mods
    assert not {m for m in mods if m.split(".")[0] in ("prometheus_client", "opentelemetry", "torch")}
    r = subprocess.run([sys.executable, "-c", "import instrument, sys; print('prometheus_client' in sys.modules); "
                        "s = instrument.serve_metrics(0); print('prometheus_client' in sys.modules); s.shutdown()"],
                       capture_output=True, text=True, env=env(), timeout=60)
    assert r.stdout.split() == ["False", "True"], r.stderr   # imported when the server starts, not before


def test_advise_and_report_give_verdicts_and_next_steps(capsys, tmp_path):
    from instrument.snapshot import StageStats
    busy = StageStats(("request", "tokenize"), 10, 0, 60_000_000, 60_000_000, 1, 9_000_000, 59_000_000, 59_000_000, 10, {})
    idle = StageStats(("request", "io"), 10, 0, 30_000_000, 30_000_000, 1, 5_000_000, 300_000, 300_000, 10, {})
    root = StageStats(("request",), 10, 0, 100_000_000, 10_000_000, 1, 11_000_000, 60_000_000, 700_000, 10, {})
    f = Snapshot([root, busy, idle]).save(tmp_path / "s.json")
    rc, out, _ = main(capsys, "advise", f)
    assert rc == 0
    assert "1. request/tokenize: compute-bound" in out and "instrument.profile()" in out
    assert "2. request/io: waiting" in out and "instrument nsys --capture io" in out
    assert "save at most 60%" in out
    rc, out, _ = main(capsys, "advise", f, "--json", "--top", "1")
    assert rc == 0 and json.loads(out)[0]["verdict"] == "compute-bound"
    rc, out, _ = main(capsys, "report", f)
    assert rc == 0 and "Where to look next" in out


@pytest.mark.parametrize("variable, value", [("INSTRUMENT_OVERHEAD_BUDGET", "2"), ("INSTRUMENT_COUNTERS", "bogus")])
def test_a_bad_environment_value_stops_every_command_in_one_line(tmp_path, variable, value):
    """docs/configuration.md: the command line reads the environment strictly and exits 2, in one line naming
    the variable, with no warning beside it."""
    f = tmp_path / "s.json"
    snap(st("request", 3, 1000)).save(f)
    commands = [["report", f], ["doctor"], ["export", "--json", tmp_path / "o.json", f], ["diff", f, f],
                ["run", "-o", tmp_path / "r.json", "--", sys.executable, "-c", "pass"], ["demo", "--requests", "1"],
                ["top", "127.0.0.1:9", "--once"], ["advise", f], ["nsys", "--dry-run", "--", "python", "x.py"]]
    for command in commands:
        r = subprocess.run([sys.executable, "-m", "instrument", *map(str, command)], capture_output=True, text=True,
                           timeout=120, env=dict(env(), **{variable: value}))
        assert r.returncode == 2, (command, r.stderr)
        assert r.stderr.startswith(f"instrument: {command[0]}: {variable}") and len(r.stderr.splitlines()) == 1, \
            (command, r.stderr)
        assert not (tmp_path / "r.json").exists()


def test_the_demo_refuses_a_bad_option_in_one_line():
    r = run_cli("demo", "--device", "bogus")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith("instrument: demo: argument --device: invalid choice: 'bogus'") and "--help" in r.stderr


def test_report_ops_says_where_operators_come_from_when_none_were_recorded(tmp_path, capsys):
    f = tmp_path / "s.json"
    snap(st("request", 3, 1000)).save(f)
    rc, out, _ = main(capsys, "report", f, "--ops")
    assert rc == 0 and "no torch operators in this snapshot" in out and "instrument.profile()" in out
    with_ops = {"by_self_cpu": [{"name": "aten::addmm", "calls": 3, "self_cpu_ns": 9000, "device_ns": 0}],
                "by_device": [], "device_total_ns": 0}
    snap(st("request", 3, 1000, ops=with_ops)).save(f)
    rc, out, _ = main(capsys, "report", f, "--ops")
    assert rc == 0 and "aten::addmm" in out and "no torch operators" not in out
