"""The torch integrations when torch is not imported or not installed: nothing imports it, all else works."""
from conftest import run_python


def test_import_does_not_import_torch():
    r = run_python("import instrument, sys; assert 'torch' not in sys.modules\n"
                   "with instrument.stage('x'): pass\n"
                   "s = instrument.snapshot(); s.merge(s); instrument.configure(gpu='on', torch='on')\n"
                   "assert 'torch' not in sys.modules, 'torch imported'\n"
                   "m = instrument.snapshot().meta; print(m['gpu']['reason']); print(m['torch_profiler']['state'])\n"
                   "assert 'torch' not in sys.modules, 'torch imported by status()'")
    assert r.returncode == 0, r.stderr
    assert "torch is not imported" in r.stdout
    assert "waiting for `import torch`" in r.stdout or "torch is not installed" in r.stdout


def test_everything_works_without_torch(tmp_path):
    r = run_python("import sys; sys.modules['torch'] = None   # as if torch were not installed\n"
                   "import instrument\n"
                   "instrument.configure(gpu='on', torch='on')\n"
                   "with instrument.stage('a'):\n"
                   "    with instrument.stage('b'): pass\n"
                   "s = instrument.snapshot(); b = s['a/b']\n"
                   "assert b.calls == 1 and b.gpu is None and b.ops is None\n"
                   f"back = instrument.Snapshot.load(s.save({str(tmp_path / 's.json')!r})); back.merge(s)\n"
                   "m = s.meta; assert m['torch_profiler']['state'] == 'torch is not installed', m['torch_profiler']\n"
                   "assert m['gpu']['timing'] is False and m['gpu']['reason'] == 'torch is not imported'\n"
                   "try:\n"
                   "    instrument.profile()\n"
                   "except ImportError: pass\n"
                   "else: raise AssertionError('instrument.profile without torch')\n")
    assert r.returncode == 0, r.stderr
