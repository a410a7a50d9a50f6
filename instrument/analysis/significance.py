"""Is a change between two snapshots beyond noise?  Pure functions of what the
snapshots hold, no third-party packages.

A snapshot merged from several snapshots (`Snapshot.merge`: chunks of a run,
worker processes) keeps each source's sums and median per stage as a *window*.
The time per call is compared on the strongest basis both sides allow:

- **turns**: the windows of the two sides alternate in time (the two variants
  took turns, as `instrument demo` runs them): each window is paired with its
  neighbour of the other side and the Wilcoxon signed-rank test (exact) runs on
  the log ratios of their medians; estimate and interval from the Walsh averages.
  The machine's drift falls on both members of a pair alike and cancels.
- **windows**: each side holds at least `MIN_WINDOWS` windows, not in turns:
  Welch's t-test on the logs of the window medians, with the drift each side
  shows between its first and second halves added to the variance, as a guess
  at the drift between the runs (which no snapshot holds).
- **calls**: otherwise the Mann-Whitney rank test on the two histograms of call
  times (ties within a bucket counted as such), with the Hodges-Lehmann shift of
  log call time and its Moses interval.  It treats calls as independent and
  cannot see drift between the runs.

Every basis estimates the change of the *typical* call (medians and ranks, so a
few preempted calls do not decide it).  CPU time and counters per call are
tested only with windows (Welch's t-test on per-window rates).  A change is
*significant* when p < alpha and its (1 - alpha) interval lies wholly beyond
±`min_change`: unlikely under no change, and no smaller than the smallest change
the comparison claims to tell (drift between runs that no basis sees).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from .. import config
from .. import histogram as _hist

MIN_WINDOWS = 3
MIN_TURNS = 8          # the exact signed-rank test reaches p < 0.01 from 8 pairs on
EXACT_PAIRS = 60       # up to this many pairs the signed-rank test is exact; beyond, the normal approximation
ALPHA = config.BY_NAME["diff_alpha"].default
MIN_CHANGE = config.BY_NAME["diff_min_change"].default


@dataclass(frozen=True)
class Significance:
    significant: bool
    basis: str                                  # "turns", "windows", "calls", or "none" (nothing to test)
    estimate: Optional[float]                   # relative change (+0.1 = 10 % more)
    interval: Optional[Tuple[float, float]]     # its (1 - alpha) interval
    p: Optional[float]                          # two-sided p-value of "no change"
    level: float                                # 1 - alpha
    min_change: float
    n: Tuple[int, int]                          # windows or calls on each side
    reason: str = ""

    @property
    def direction(self) -> int:
        """+1 significantly more (slower), -1 significantly less, 0 within noise."""
        if not self.significant or self.estimate is None:
            return 0
        return 1 if self.estimate > 0 else -1

    def interval_list(self) -> Optional[list]:
        """The interval for JSON: an unbounded end (too few turns for the level) is null."""
        if self.interval is None:
            return None
        return [x if math.isfinite(x) else None for x in self.interval]

    def to_dict(self) -> Dict[str, Any]:
        """Relative values as fractions (+0.1 = 10 % more)."""
        return {"significant": self.significant, "basis": self.basis, "estimate": self.estimate,
                "interval": self.interval_list(), "p": self.p, "level": self.level,
                "min_change": self.min_change, "n": list(self.n), "reason": self.reason}


def untested(reason: str, alpha: float = ALPHA, min_change: float = MIN_CHANGE,
             n: Tuple[int, int] = (0, 0)) -> Significance:
    return Significance(False, "none", None, None, None, 1 - alpha, min_change, n, reason)


def _decide(basis: str, est: float, lo: float, hi: float, p: float, alpha: float, min_change: float,
            n: Tuple[int, int], unit: str) -> Significance:
    sig = (lo > min_change or hi < -min_change) and p < alpha
    level = 1 - alpha
    size = f"{n[0]} {unit}" if n[0] == n[1] and basis == "turns" else f"{n[0]} → {n[1]} {unit}"
    span = f"{_pct(level)} interval {_pct(lo, True)} … {_pct(hi, True)}"
    if sig:
        reason = f"{span} lies beyond ±{_pct(min_change)} ({size}, p={p:.2g})"
    elif p >= alpha:
        reason = f"{span} includes no change ({size}, p={p:.2g})"
    else:
        reason = f"{span} reaches within ±{_pct(min_change)}, the smallest change claimed ({size}, p={p:.2g})"
    return Significance(sig, basis, est, (lo, hi), p, level, min_change, n, reason)


def _pct(x: float, sign: bool = False) -> str:
    if math.isinf(x):
        return "+∞" if x > 0 else "−∞"
    v = 100 * x
    text = f"{abs(v):.1f}".rstrip("0").rstrip(".") if not sign else f"{abs(v):.1f}"
    return (("+" if v >= 0 else "\u2212") if sign else ("\u2212" if v < 0 else "")) + text + "%"


# ------------------------------------------------------------ distributions
def normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def normal_ppf(q: float) -> float:
    """Upper quantile: z with normal_sf(z) == q (0 < q < 1), by bisection."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if normal_sf(mid) > q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1 + aa * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1 + aa * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(ln) * _betacf(a, b, x) / a
    return 1 - math.exp(ln) * _betacf(b, a, 1 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom."""
    if math.isinf(df):
        return normal_sf(t)
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1 - tail


def t_ppf(q: float, df: float) -> float:
    """Upper quantile: t with t_sf(t, df) == q (0 < q < 0.5)."""
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > q and hi < 1e12:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_sf(mid, df) > q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# ------------------------------------------------------------------ windows
def _side(windows: Sequence[Tuple[float, float]]) -> Tuple[float, float, int]:
    """Mean per call over the windows (sum of values / sum of calls) and the
    variance of its log, from the spread between windows."""
    k = len(windows)
    n = sum(c for c, _ in windows)
    w = sum(v for _, v in windows)
    m = w / n
    var = k / (k - 1) * sum((v - m * c) ** 2 for c, v in windows) / (n * n)
    return m, var / (m * m), k


def window_test(before: Sequence[Tuple[float, float]], after: Sequence[Tuple[float, float]], alpha: float = ALPHA,
                min_change: float = MIN_CHANGE, unit: str = "windows") -> Significance:
    """Welch's t-test on log(mean per call); each side a list of (calls, total) per window."""
    b = [(c, v) for c, v in before if c > 0 and v is not None]
    a = [(c, v) for c, v in after if c > 0 and v is not None]
    if len(b) < MIN_WINDOWS or len(a) < MIN_WINDOWS:
        return untested(f"fewer than {MIN_WINDOWS} windows on a side", alpha, min_change, (len(b), len(a)))
    if sum(v for _, v in b) <= 0 or sum(v for _, v in a) <= 0:
        return untested("a side totals 0", alpha, min_change, (len(b), len(a)))
    mb, vb, kb = _side(b)
    ma, va, ka = _side(a)
    d = math.log(ma / mb)
    se = math.sqrt(vb + va)
    if se == 0:
        p = 1.0 if d == 0 else 0.0
        return _decide("windows", ma / mb - 1, ma / mb - 1, ma / mb - 1, p, alpha, min_change, (kb, ka), unit)
    df = (vb + va) ** 2 / ((vb * vb / (kb - 1) if vb else 0) + (va * va / (ka - 1) if va else 0))
    p = min(1.0, 2 * t_sf(abs(d) / se, df))
    half = t_ppf(alpha / 2, df) * se
    return _decide("windows", math.exp(d) - 1, math.exp(d - half) - 1, math.exp(d + half) - 1, p, alpha,
                   min_change, (kb, ka), unit)


def log_window_test(before: Sequence[float], after: Sequence[float], alpha: float = ALPHA,
                    min_change: float = MIN_CHANGE, unit: str = "windows") -> Significance:
    """Welch's t-test on the logs of one positive value per window (each window's median
    call time, in time order): the estimate is the ratio of their geometric means.

    The two sides were recorded at different times, so the machine may have drifted
    between them; the windows of one side show how far it drifts over a run: the
    squared difference between the means of each side's first and second halves is
    added to the variance (a component with 2 degrees of freedom)."""
    b = [math.log(v) for v in before if v is not None and v > 0]
    a = [math.log(v) for v in after if v is not None and v > 0]
    if len(b) < MIN_WINDOWS or len(a) < MIN_WINDOWS:
        return untested(f"fewer than {MIN_WINDOWS} windows on a side", alpha, min_change, (len(b), len(a)))
    mb, ma = sum(b) / len(b), sum(a) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    halves = [_halves(x) for x in (b, a) if len(x) >= 4]
    vd = sum(h * h for h in halves) / len(halves) if halves else 0.0
    d, se = ma - mb, math.sqrt(vb + va + vd)
    if se == 0:
        p = 1.0 if d == 0 else 0.0
        return _decide("windows", math.exp(d) - 1, math.exp(d) - 1, math.exp(d) - 1, p, alpha, min_change,
                       (len(b), len(a)), unit)
    parts = [(vb, len(b) - 1), (va, len(a) - 1), (vd, 2 * len(halves) or 1)]
    df = (vb + va + vd) ** 2 / sum(v * v / k for v, k in parts if v)
    p = min(1.0, 2 * t_sf(abs(d) / se, df))
    half = t_ppf(alpha / 2, df) * se
    return _decide("windows", math.exp(d) - 1, math.exp(d - half) - 1, math.exp(d + half) - 1, p, alpha,
                   min_change, (len(b), len(a)), unit)


def _halves(xs: Sequence[float]) -> float:
    k = len(xs) // 2
    return sum(xs[:k]) / k - sum(xs[-k:]) / k


def signed_rank_distribution(ranks2: Sequence[int]) -> list:
    """Exact null distribution of the signed-rank sum W+ (in doubled ranks, so midranks
    of ties stay integers): counts[w] of the 2**n sign patterns."""
    total = sum(ranks2)
    counts = [0] * (total + 1)
    counts[0] = 1
    for r in ranks2:
        for w in range(total, r - 1, -1):
            counts[w] += counts[w - r]
    return counts


def paired_test(diffs: Sequence[float], alpha: float = ALPHA, min_change: float = MIN_CHANGE,
                unit: str = "turns") -> Significance:
    """Wilcoxon signed-rank test (exact, midranks for ties) on paired log differences;
    estimate and interval from the Walsh averages (Hodges-Lehmann, Tukey)."""
    d = [x for x in diffs if x is not None]
    n = len(d)
    if n < MIN_WINDOWS:
        return untested(f"fewer than {MIN_WINDOWS} turns", alpha, min_change, (n, n))
    nz = sorted((abs(x), x) for x in d if x != 0)
    ranks2: list = []
    k = 0
    while k < len(nz):                       # doubled midranks of |d| among the non-zero differences
        j = k
        while j + 1 < len(nz) and nz[j + 1][0] == nz[k][0]:
            j += 1
        ranks2 += [k + j + 2] * (j - k + 1)
        k = j + 1
    walsh = sorted((d[i] + d[j]) / 2 for i in range(n) for j in range(i, n))
    est = _median(walsh)
    m = len(walsh)
    w_plus = sum(r for r, (_, x) in zip(ranks2, nz) if x > 0) / 2      # in ranks
    total = sum(ranks2) / 2
    if not ranks2:
        p = 1.0
    elif len(ranks2) <= EXACT_PAIRS:
        counts = signed_rank_distribution(ranks2)
        lo_tail = sum(counts[: int(2 * min(w_plus, total - w_plus)) + 1]) / 2 ** len(ranks2)
        p = min(1.0, 2 * lo_tail)
    else:                                  # normal approximation, tie and continuity corrected
        k = len(ranks2)
        ties: Dict[int, int] = {}
        for r in ranks2:
            ties[r] = ties.get(r, 0) + 1
        var = k * (k + 1) * (2 * k + 1) / 24 - sum(t ** 3 - t for t in ties.values()) / 48
        z = max(0.0, abs(w_plus - k * (k + 1) / 4) - 0.5) / math.sqrt(var) if var > 0 else 0.0
        p = min(1.0, 2 * normal_sf(z)) if var > 0 else 1.0
    # the interval: drop c Walsh averages at each end, c the largest count with P(W+ < c) <= alpha / 2
    if n <= EXACT_PAIRS:
        full = signed_rank_distribution([2 * (i + 1) for i in range(n)])
        acc, c = 0, 0
        for w in range(0, len(full), 2):
            acc += full[w]
            if acc / 2 ** n > alpha / 2:
                break
            c = w // 2 + 1
    else:
        c = max(0, int(math.floor(n * (n + 1) / 4 - normal_ppf(alpha / 2) * math.sqrt(n * (n + 1) * (2 * n + 1) / 24))))
    lo, hi = (walsh[c], walsh[m - 1 - c]) if c < m - c else (walsh[0], walsh[-1])
    if c == 0:
        lo, hi = -math.inf, math.inf            # too few turns for this confidence
    return _decide("turns", math.exp(est) - 1, _exp1(lo), _exp1(hi), p, alpha, min_change, (n, n), unit)


def _exp1(x: float) -> float:
    return -1.0 if x == -math.inf else math.inf if x == math.inf else math.exp(x) - 1


def _median(xs: Sequence[float]) -> float:
    k = len(xs)
    return xs[k // 2] if k % 2 else (xs[k // 2 - 1] + xs[k // 2]) / 2


def turns(before: Sequence[Tuple[float, Any]], after: Sequence[Tuple[float, Any]]) -> Optional[list]:
    """Pairs (before value, after value) of windows that took turns: both sides'
    windows sorted by start time, each paired with its next neighbour when that one
    is of the other side.  None unless at least MIN_TURNS pairs take in 80 % of
    each side's windows."""
    seq = sorted([(t, 0, k, v) for k, (t, v) in enumerate(before) if t is not None]
                 + [(t, 1, k, v) for k, (t, v) in enumerate(after) if t is not None])
    pairs, i = [], 0
    while i + 1 < len(seq):
        x, y = seq[i], seq[i + 1]
        if x[1] != y[1]:
            pairs.append((x[3], y[3]) if x[1] == 0 else (y[3], x[3]))
            i += 2
        else:
            i += 1
    if len(pairs) < MIN_TURNS or len(pairs) < 0.8 * max(len(before), len(after)):
        return None
    return pairs


# -------------------------------------------------------------------- calls
def _log_values(hist: Mapping[int, int]):
    return sorted((math.log(max(_hist.midpoint(i), 0.5)), c) for i, c in hist.items() if c > 0)


def mann_whitney(before: Mapping[int, int], after: Mapping[int, int]) -> Tuple[float, float, float]:
    """(U of `after`, its standard deviation under no change with the tie correction,
    two-sided p-value by the normal approximation with continuity correction)."""
    n, m = sum(before.values()), sum(after.values())
    big = n + m
    u, below, ties = 0.0, 0, 0
    for i in sorted(set(before) | set(after)):
        cb, ca = before.get(i, 0), after.get(i, 0)
        u += ca * (below + 0.5 * cb)
        below += cb
        t = cb + ca
        ties += t ** 3 - t
    var = n * m / 12 * ((big + 1) - ties / (big * (big - 1))) if big > 1 else 0.0
    if var <= 0:
        return u, 0.0, 1.0
    sd = math.sqrt(var)
    z = max(0.0, abs(u - n * m / 2) - 0.5) / sd
    return u, sd, min(1.0, 2 * normal_sf(z))


def _pair_quantile(b, a, rank: float) -> float:
    """The smallest d with at least `rank` of the (after - before) pairs of log values <= d."""
    def count_le(d: float) -> float:
        total, i, acc = 0.0, len(b), 0
        for xa, ca in reversed(a):          # thresholds xa - d fall as xa falls
            th = xa - d
            while i > 0 and b[i - 1][0] >= th:
                i -= 1
                acc += b[i][1]
            total += ca * acc
        return total
    lo, hi = a[0][0] - b[-1][0] - 1e-9, a[-1][0] - b[0][0] + 1e-9
    for _ in range(48):
        mid = (lo + hi) / 2
        if count_le(mid) >= rank:
            hi = mid
        else:
            lo = mid
    return hi


def rank_test(before: Mapping[int, int], after: Mapping[int, int], alpha: float = ALPHA,
              min_change: float = MIN_CHANGE) -> Significance:
    """Mann-Whitney on the histograms; the Hodges-Lehmann shift of log time and its Moses interval."""
    n, m = sum(before.values()), sum(after.values())
    if n < 2 or m < 2:
        return untested("fewer than 2 calls on a side", alpha, min_change, (n, m))
    _, sd, p = mann_whitney(before, after)
    b, a = _log_values(before), _log_values(after)
    pairs = n * m
    est = _pair_quantile(b, a, pairs / 2)
    k = max(0.0, pairs / 2 - normal_ppf(alpha / 2) * sd)
    lo = _pair_quantile(b, a, max(k, 0.5))
    hi = _pair_quantile(b, a, min(pairs - k, pairs))
    return _decide("calls", math.exp(est) - 1, math.exp(lo) - 1, math.exp(hi) - 1, p, alpha, min_change,
                   (n, m), "calls")
