"""Hugging Face transformers without code edits: a Pipeline's steps, a tokenizer's calls and
`generate()` as stages, with tokens as items.

    handle = instrument.transformers.instrument_pipeline(pipe)
    handle = instrument.transformers.instrument_generate(model)    # prefill, decode, TTFT and ITL
"""
from __future__ import annotations

import contextvars
import inspect
from typing import Any, Callable, List, Optional

import instrument

from .auto.patch import Handle, Patch, Wrapper, installed

PIPELINE_STEPS = ("preprocess", "forward", "postprocess")


def count_tokens(batch: Any, real: bool = True) -> Optional[int]:
    """Tokens of a tokenizer's output or a model's inputs: those under the attention mask (real=True, padding
    left out) or every input id (real=False: what the model ran); None where there are none to count."""
    try:
        get = batch.get
    except AttributeError:
        return None
    try:
        mask = get("attention_mask") if real else None
        ids = get("input_ids") if mask is None else mask
        if ids is None:
            return None
        if hasattr(ids, "numel"):
            return int(ids.sum()) if mask is not None else int(ids.numel())
        rows = ids if ids and isinstance(ids[0], (list, tuple)) else [ids]
        return sum(sum(r) for r in rows) if mask is not None else sum(len(r) for r in rows)
    except Exception:   # an output of another shape: nothing counted, the call goes on
        return None


def _add_tokens(batch: Any, real: bool) -> None:
    n = count_tokens(batch, real)
    if n:
        instrument.add("tokens", n)


class Step(Wrapper):
    """A pipeline step or tokenizer call inside its stage, with the tokens of `counted(args, result)` as items."""
    __slots__ = ("stage", "counted")

    def __init__(self, stage: Any, inner: Callable, counted: Optional[Callable[[tuple, Any], None]]) -> None:
        super().__init__(inner)
        self.stage, self.counted = stage, counted

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.stage:
            result = self.inner(*args, **kwargs)
            if self.counted is not None:
                self.counted(args, result)
            return result


class GeneratorStep(Step):
    """A step that is a generator (a ChunkPipeline's preprocess): each resumption inside the stage, the
    tokens of each item it yields counted; the consumer's time between items is not."""
    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        items = self.inner(*args, **kwargs)
        while True:
            with self.stage:
                try:
                    item = next(items)
                except StopIteration:
                    return
                if self.counted is not None:
                    self.counted(args, item)
            yield item


class Tokenize(Step):
    """A tokenizer's encoding inside the `tokenize` stage; an encoding it makes inside one (the batch
    path of some tokenizers) is not counted twice."""
    __slots__ = ()
    _active: contextvars.ContextVar = contextvars.ContextVar("instrument_tokenizing", default=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._active.get():
            return self.inner(*args, **kwargs)
        token = self._active.set(True)
        try:
            return Step.__call__(self, *args, **kwargs)
        finally:
            self._active.reset(token)


def _real_tokens(args: tuple, result: Any) -> None:
    _add_tokens(result, real=True)


def _fed_tokens(args: tuple, result: Any) -> None:
    _add_tokens(args[0] if args else None, real=False)


def _tokenizer_patches(tokenizer: Any) -> List[Patch]:
    names = [n for n in ("_encode_plus", "_batch_encode_plus") if callable(getattr(tokenizer, n, None))]
    if not names:
        raise TypeError(f"{type(tokenizer).__name__} has no _encode_plus: not a transformers tokenizer this version "
                        "of instrument knows")
    if any(installed(tokenizer, n, Tokenize) for n in names):
        raise RuntimeError(f"this {type(tokenizer).__name__} is instrumented already: call remove() on its handle first")
    stage = instrument.stage("tokenize")
    return [Patch(tokenizer, n, Tokenize(stage, getattr(tokenizer, n), _real_tokens)) for n in names]


def instrument_tokenizer(tokenizer: Any) -> Handle:
    """Every encoding call of a transformers tokenizer (`tokenizer(texts)`, `encode`) as the stage
    `tokenize`, with the real tokens it made (padding left out) as the item `tokens`."""
    return Handle(f"tokenizer {type(tokenizer).__name__}", _tokenizer_patches(tokenizer))


def instrument_pipeline(pipe: Any, tokenizer: bool = True, generate: bool = True) -> Handle:
    """A transformers Pipeline's `preprocess`, `forward` and `postprocess` as stages of those names, nested
    under whatever stage is open when the pipeline is called.  Items `tokens`: in preprocess the real tokens
    it made, in forward every token the model ran (padding included).  tokenizer: its tokenizer's calls too
    (instrument_tokenizer); generate: its model's generate() too, where it has one (instrument_generate)."""
    missing = [s for s in PIPELINE_STEPS if not callable(getattr(pipe, s, None))]
    if missing:
        raise TypeError(f"instrument_pipeline needs a transformers Pipeline (with {', '.join(PIPELINE_STEPS)}); "
                        f"{type(pipe).__name__} has no {', '.join(missing)}")
    if any(installed(pipe, s, Step) for s in PIPELINE_STEPS):
        raise RuntimeError(f"this {type(pipe).__name__} is instrumented already: call remove() on its handle first")
    counted = {"preprocess": _real_tokens, "forward": _fed_tokens, "postprocess": None}
    patches = []
    try:
        for step in PIPELINE_STEPS:
            inner = getattr(pipe, step)
            kind = GeneratorStep if inspect.isgeneratorfunction(inner) else Step
            patches.append(Patch(pipe, step, kind(instrument.stage(step), inner, counted[step])))
        if tokenizer and getattr(pipe, "tokenizer", None) is not None:
            patches += _tokenizer_patches(pipe.tokenizer)
        model = getattr(pipe, "model", None)
        if generate and model is not None and _can_generate(model):
            patches += _generate_patches(model)
    except BaseException:
        Handle("", patches).remove()
        raise
    return Handle(f"pipeline {type(pipe).__name__}", patches)


# ------------------------------------------------------------------ generate()
STEP_CHECK = "_has_unfinished_sequences"   # what every decoding loop of generate() asks before each step


def _can_generate(model: Any) -> bool:
    can = getattr(model, "can_generate", None)
    try:
        return bool(can()) if callable(can) else False
    except Exception:
        return False


class _Generation:
    """One generate() call in progress: the stage of the step now open and the loop checks seen."""
    __slots__ = ("model", "open", "checks")

    def __init__(self, model: Any, first: Any) -> None:
        self.model, self.open, self.checks = model, first, 0


_generation: contextvars.ContextVar = contextvars.ContextVar("instrument_generation", default=None)


class Generate(Wrapper):
    """generate() as the stage `generate`; `time_to_first_token` open from its start until the second loop
    check (the first token chosen); then each later step, from one check to the next, a call of `decode`."""
    __slots__ = ("model", "stages")

    def __init__(self, model: Any, inner: Callable, stages: dict) -> None:
        super().__init__(inner)
        self.model, self.stages = model, stages

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.stages["generate"]:
            first = self.stages["time_to_first_token"]
            call = _Generation(self.model, first)
            token = _generation.set(call)
            first.__enter__()
            try:
                result = self.inner(*args, **kwargs)
            except BaseException as e:
                if call.open is not None:
                    call.open.__exit__(type(e), e, e.__traceback__)
                raise
            finally:
                _generation.reset(token)
            if call.open is not None:   # the loop ended early (no first token): close what is open
                call.open.__exit__(None, None, None)
            sequences = getattr(result, "sequences", result)
            rows = sequences.shape[0] if getattr(sequences, "ndim", 0) == 2 else 1
            steps = max(call.checks - 1, 0)
            if steps:
                instrument.add("tokens", steps * rows)
            return result


class _ModelStep(Wrapper):
    """A method of one model that takes part in its generate() calls, with the stage it opens."""
    __slots__ = ("model", "stage")

    def __init__(self, model: Any, inner: Callable, stage: Any) -> None:
        super().__init__(inner)
        self.model, self.stage = model, stage


class StepCheck(_ModelStep):
    """The loop check of generate(): the step that just ended leaves its stage; a next one enters `decode`."""
    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        more = self.inner(*args, **kwargs)
        call = _generation.get()
        if call is None or call.model is not self.model:
            return more
        call.checks += 1
        if call.checks == 1:   # before the first step: time_to_first_token stays open through it
            return more
        if call.open is not None:
            call.open.__exit__(None, None, None)
            call.open = None
        if more:
            self.stage.__enter__()
            call.open = self.stage
        return more


class Prefill(_ModelStep):
    """The model's forward calls before the first token (the prompt's) as the stage `prefill`."""
    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = _generation.get()
        if call is None or call.model is not self.model or call.checks > 1:
            return self.inner(*args, **kwargs)
        with self.stage:
            tokens = count_tokens(kwargs, real=False)
            if tokens:
                instrument.add("tokens", tokens)
            return self.inner(*args, **kwargs)


def _generate_patches(model: Any) -> List[Patch]:
    if not callable(getattr(model, STEP_CHECK, None)):
        raise TypeError(f"{type(model).__name__}.generate has no per-step check ({STEP_CHECK}): not a transformers "
                        "generation loop this version of instrument knows")
    if installed(model, "generate", Generate):
        raise RuntimeError(f"generate() of this {type(model).__name__} is instrumented already: call remove() on "
                           "its handle first")
    stages = {n: instrument.stage(n) for n in ("generate", "time_to_first_token", "prefill", "decode")}
    return [Patch(model, "forward", Prefill(model, model.forward, stages["prefill"])),
            Patch(model, STEP_CHECK, StepCheck(model, getattr(model, STEP_CHECK), stages["decode"])),
            Patch(model, "generate", Generate(model, model.generate, stages))]


def instrument_generate(model: Any) -> Handle:
    """A transformers model's generate() split per step: stages `generate` > `time_to_first_token` >
    `prefill` (the prompt's forward), then one call of `generate` > `decode` per later token.  A call's wall
    time in `time_to_first_token` is its time to first token (TTFT) and each `decode` call's wall time one
    inter-token latency (ITL), so their percentiles are those of TTFT and ITL.  Items `tokens`: the prompt's
    in prefill, the new ones (steps × sequences) in generate."""
    if not callable(getattr(model, "generate", None)):
        raise TypeError(f"instrument_generate needs a transformers model with generate(), not {type(model).__name__}")
    return Handle(f"generate of {type(model).__name__}", _generate_patches(model))
