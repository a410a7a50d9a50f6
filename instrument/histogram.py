"""The histogram scheme shared by both backends and by the Snapshot.

Block 0 holds 0..63 ns exactly; block b >= 1 covers [2**(b+5), 2**(b+6)) ns in
64 linear sub-buckets, so a bucket's midpoint is within 1/128 of any value in
it.  A histogram is stored sparsely as {bucket index: count}.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

SUB_BITS = 6
SUB = 1 << SUB_BITS
BLOCKS = 42
SCHEME = "log2-64"
LAST = BLOCKS * SUB - 1


def index(v: int) -> int:
    if v < SUB:
        return max(int(v), 0)
    e = int(v).bit_length() - 1
    b = e - (SUB_BITS - 1)
    if b >= BLOCKS:
        return LAST
    return (b << SUB_BITS) | ((int(v) >> (e - SUB_BITS)) & (SUB - 1))


def bounds(i: int) -> Tuple[int, int]:
    """[low, high) of bucket i."""
    b, s = i >> SUB_BITS, i & (SUB - 1)
    if b == 0:
        return s, s + 1
    width = 1 << (b - 1)
    low = (SUB + s) * width
    return low, low + width


def midpoint(i: int) -> float:
    low, high = bounds(i)
    return (low + high - 1) / 2.0


def merge(a: Mapping[int, int], b: Mapping[int, int]) -> Dict[int, int]:
    out = dict(a)
    for i, c in b.items():
        out[i] = out.get(i, 0) + c
    return out


def subtract(a: Mapping[int, int], b: Mapping[int, int]) -> Dict[int, int]:
    """a - b bucket by bucket (b recorded earlier than a); ValueError when b has a count a lacks."""
    out = dict(a)
    for i, c in b.items():
        left = out.get(i, 0) - c
        if left < 0:
            raise ValueError(f"bucket {i} holds {c} values before and {out.get(i, 0)} after")
        if left:
            out[i] = left
        else:
            out.pop(i, None)
    return out


def quantiles(hist: Mapping[int, int], qs: Sequence[float], lo: Optional[float] = None,
              hi: Optional[float] = None) -> list:
    """Quantiles as numpy's default ('linear') method would give them on the raw
    values, each order statistic estimated by its bucket's midpoint and clamped
    to the exact [lo, hi] when known."""
    items = sorted((i, c) for i, c in hist.items() if c > 0)
    n = sum(c for _, c in items)
    if n == 0:
        return [None for _ in qs]

    def order_stat(k: int) -> float:
        seen = 0
        for i, c in items:
            seen += c
            if k < seen:
                v = midpoint(i)
                if lo is not None:
                    v = max(v, lo)
                if hi is not None:
                    v = min(v, hi)
                return v
        return float(hi if hi is not None else midpoint(items[-1][0]))

    out = []
    for q in qs:
        h = (n - 1) * q
        k = math.floor(h)
        v = order_stat(k)
        if h > k:
            v = v + (h - k) * (order_stat(k + 1) - v)
        out.append(v)
    return out


def from_pairs(pairs: Iterable) -> Dict[int, int]:
    out: Dict[int, int] = {}
    for i, c in pairs:
        i, c = int(i), int(c)
        if not 0 <= i <= LAST or c < 0:
            raise ValueError(f"histogram bucket {i} with count {c} is outside the {SCHEME} scheme "
                             f"(buckets 0..{LAST}, counts >= 0)")
        out[i] = out.get(i, 0) + c
    return out
