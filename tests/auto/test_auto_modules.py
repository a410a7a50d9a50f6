"""instrument.modules: the stage tree against the model's own named_modules(), counts against the calls the
test made, wall time inside what the test timed, and remove() leaving the model as it was."""
import copy
import pickle
import time

import pytest

torch = pytest.importorskip("torch")
import instrument  # noqa: E402
from module_tree import expected_tree  # noqa: E402
from torch import nn  # noqa: E402


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(16, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x):
        return x + self.mlp(torch.tanh(self.attn(x)))


class Net(nn.Module):
    def __init__(self, layers=3):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))   # a container: never called itself
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def module_paths(snap, root):
    return {s.path for s in snap if s.path[0] == root}


@pytest.mark.parametrize("depth", [0, 1, 2, None])
def test_the_stage_tree_is_named_modules_to_the_depth(backend, depth):
    model = Net()
    x = torch.randn(5, 8)
    with instrument.modules(model, depth=depth):
        calls = 7
        for _ in range(calls):
            model(x)
    snap = instrument.snapshot()
    assert module_paths(snap, "Net") == expected_tree(model, depth, "Net")
    assert all(s.calls == calls for s in snap)   # every module here runs once per forward


def test_counts_wall_cpu_and_verdicts(backend):
    model = Net()
    x = torch.randn(64, 8)
    h = instrument.modules(model, depth=1)
    timed = []
    with torch.inference_mode():
        for _ in range(20):
            t0 = time.perf_counter_ns()
            model(x)
            timed.append(time.perf_counter_ns() - t0)
    h.remove()
    snap = instrument.snapshot()
    root = snap["Net"]
    assert root.calls == 20
    assert root.wall_total <= sum(timed)               # inside what the test timed around each call
    assert root.wall_max <= max(timed)
    children = [s for s in snap if len(s.path) == 2]
    assert {s.name for s in children} == {"embed", "blocks.0", "blocks.1", "blocks.2", "head"}
    assert sum(s.wall_total for s in children) + root.wall_self == root.wall_total
    assert root.cpu_total is not None and root.verdict is not None


def test_remove_leaves_no_trace_and_records_nothing():
    model = Net()
    before = {q: dict(m.__dict__) for q, m in model.named_modules()}
    h = instrument.modules(model, depth=None)
    assert all("forward" in m.__dict__ for _, m in model.named_modules() if type(m) is not nn.ModuleList)
    h.remove()
    assert not h.active and "removed" in repr(h)
    after = {q: dict(m.__dict__) for q, m in model.named_modules()}
    assert after == before
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    instrument.reset()
    model(torch.randn(2, 8))
    assert len(instrument.snapshot()) == 0
    h.remove()   # twice: nothing more to do


def test_inference_mode_no_grad_and_grad_give_the_same_results_and_counts():
    model = Net()
    x = torch.randn(3, 8)
    ref = model(x).detach()
    with instrument.modules(model):
        with torch.inference_mode():
            a = model(x)
        with torch.no_grad():
            b = model(x)
        c = model(x)
        c.sum().backward()   # autograd through the wrapped forwards
    assert torch.equal(a, ref) and torch.equal(b, ref) and torch.equal(c.detach(), ref)
    assert model.embed.weight.grad is not None
    assert instrument.snapshot()["Net", "embed"].calls == 3


class Fails(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def forward(self, x):
        self.inner(x)
        raise ValueError("bad input")


def test_an_exception_inside_forward_is_counted_and_propagates(backend):
    model = nn.Sequential(nn.Linear(2, 2), Fails())
    with instrument.modules(model):
        for _ in range(3):
            with pytest.raises(ValueError, match="bad input"):
                model(torch.randn(1, 2))
        with instrument.stage("after"):   # the stack is clean: a new stage is a root again
            pass
    snap = instrument.snapshot()
    assert snap["Sequential"].errors == 3 and snap["Sequential", "1"].errors == 3
    assert snap["Sequential", "1", "1.inner"].errors == 0 and snap["Sequential", "1", "1.inner"].calls == 3
    assert snap["after"].calls == 1


def test_include_names_deeper_modules_and_bad_arguments_say_what_is_allowed():
    model = Net()
    with instrument.modules(model, depth=1, include="blocks.*.mlp.?"):
        model(torch.randn(1, 8))
    names = {s.name for s in instrument.snapshot()}
    assert {"blocks.1.mlp.0", "blocks.1.mlp.2", "blocks.1"} <= names and "blocks.1.mlp" not in names
    with pytest.raises(TypeError, match="torch.nn.Module"):
        instrument.modules(object())
    with pytest.raises(ValueError, match="depth must be"):
        instrument.modules(model, depth=-1)
    with pytest.raises(TypeError, match="include must be"):
        instrument.modules(model, include=[3])
    with instrument.modules(model, name="encoder"):
        with pytest.raises(RuntimeError, match="instrumented already"):
            instrument.modules(model)


def test_a_copy_or_pickle_computes_on_its_own_weights():
    model = Net()
    with instrument.modules(model):
        twin = copy.deepcopy(model)
        loaded = pickle.loads(pickle.dumps(model))
    for other in (twin, loaded):
        with torch.no_grad():
            for p in other.parameters():
                p.add_(1.0)
        x = torch.randn(2, 8)
        assert not torch.allclose(other(x), model(x))
        fresh = Net()
        fresh.load_state_dict(other.state_dict())
        assert torch.equal(other(x), fresh(x))


def test_wrappers_stack_and_come_off_in_any_order():
    model = Net()
    first = instrument.modules(model, depth=0, name="outer")
    second = instrument.modules(model.head, depth=0, name="head")   # another handle over one of its modules
    first.remove()
    model(torch.randn(1, 8))
    assert {s.path for s in instrument.snapshot()} == {("head",)}
    second.remove()
    assert "forward" not in model.__dict__ and "forward" not in model.head.__dict__


def test_torch_compile_sees_plain_forwards_and_the_compiled_call_is_one_stage():
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    model = Net()
    x = torch.randn(4, 8)
    ref = model(x)
    h = instrument.modules(model)                       # instrumented, then compiled
    compiled = torch.compile(model, backend="eager")
    outer = instrument.modules(compiled, depth=0, name="compiled")   # the compiled call as a whole
    instrument.reset()
    for _ in range(3):
        assert torch.allclose(compiled(x), ref)
    snap = instrument.snapshot()
    assert dict(counters["graph_break"]) == {}           # no break: the compiler traced plain forwards
    assert {s.path for s in snap} == {("compiled",)} and snap["compiled"].calls == 3
    outer.remove()
    h.remove()
    torch._dynamo.reset()
