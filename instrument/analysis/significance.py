"""Is a change between two snapshots beyond noise?  Pure functions of the figures the
diff takes from the snapshots (instrument.analysis.diff), no third-party packages.

Each test compares one figure of one stage, on the log scale (its estimate is the ratio
after / before), on one of three bases:

- **turns** (`paired_test`): the windows of the two sides alternated in time; each window
  is paired with its neighbour of the other side and Student's paired t-test runs on the
  log ratios.  The machine's drift falls on both members of a pair and cancels.
- **windows** (`log_window_test`): each side holds `MIN_WINDOWS`+ windows, not in turns:
  Welch's t-test on the logs of the per-window figures, with the drift each side shows
  between its first and second halves added to the variance, as a guess at the drift
  between the sides (which no snapshot holds).
- **runs** (`runs_test`): each side's windows are its runs; the figure of each run comes
  with the variance of its log.  Where a side holds two or more runs the spread between
  runs is measured (a pooled t-test); with one run a side it is not, and each run's own
  variance stands in for it (the diff builds it from the calls' spread and, for time,
  from how far a machine's speed strays over a run and between runs: `machine_variance`).

A change is *significant* when p < alpha and its (1 - alpha) interval lies wholly beyond
±`min_change`: unlikely under no change, and no smaller than the smallest change the
comparison claims to tell.  The diff runs every test of a comparison at alpha / m, m the
number of tests (Bonferroni), so that all its intervals hold together at 1 - alpha.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional, Sequence, Tuple

from .. import config

MIN_WINDOWS = 3
MIN_TURNS = 8          # pairs of windows that make turns
# A machine's speed changes while a run goes on (another tenant of the host, the clock) and from one run to the
# next.  Measured on a shared 2-core VM (benchmarks/RESULTS.md): the log of a fixed loop's CPU time per iteration
# spreads with a standard deviation of 0.27 and stays correlated for about 0.4 s, and the mean of a 30 s run
# still moves by 0.07 from one run to the next, minutes apart (machine_variance).  Two stages of the same calls
# share the machine's speed: their ratio moves from run to run by RELATIVE_SPREAD (what a reference stage leaves).
MACHINE_SPREAD = 0.27
MACHINE_MEMORY_S = 0.4
MACHINE_DRIFT = 0.07
RELATIVE_SPREAD = 0.03
ALPHA = config.BY_NAME["diff_alpha"].default
MIN_CHANGE = config.BY_NAME["diff_min_change"].default


@dataclass(frozen=True)
class Significance:
    significant: bool
    basis: str                                  # "turns", "windows", "runs", or "none" (nothing to test)
    estimate: Optional[float]                   # relative change (+0.1 = 10 % more)
    interval: Optional[Tuple[float, float]]     # its (1 - alpha) interval
    p: Optional[float]                          # two-sided p-value of "no change"
    level: float                                # 1 - alpha (the level this test ran at)
    min_change: float                           # the floor the interval had to clear
    n: Tuple[int, int]                          # turns, windows or runs on each side
    reason: str = ""
    detectable: Optional[float] = None          # the smallest rise this test flags: its interval's half-width
                                                # beyond min_change (+0.1 = 10 % more); None where untested
    calls_share: float = 0.0                    # the share of the estimate's variance that more calls shrink
    df: Optional[float] = None                  # the degrees of freedom of its spread (inf: a model's, known)

    @property
    def direction(self) -> int:
        """+1 significantly more (slower), -1 significantly less, 0 within noise."""
        if not self.significant or self.estimate is None:
            return 0
        return 1 if self.estimate > 0 else -1

    def interval_list(self) -> Optional[list]:
        """The interval for JSON: an unbounded end is null."""
        if self.interval is None:
            return None
        return [x if math.isfinite(x) else None for x in self.interval]

    def to_dict(self) -> Dict[str, Any]:
        """Relative values as fractions (+0.1 = 10 % more)."""
        return {"significant": self.significant, "basis": self.basis, "estimate": self.estimate,
                "interval": self.interval_list(), "p": self.p, "level": self.level,
                "min_change": self.min_change, "n": list(self.n), "reason": self.reason,
                "detectable": self.detectable if self.detectable is None or math.isfinite(self.detectable) else None}

    def half(self) -> Optional[float]:
        """The half-width of the interval on the log scale (None where untested)."""
        return None if self.detectable is None else math.log1p(self.detectable) - math.log1p(self.min_change)


def untested(reason: str, alpha: float = ALPHA, min_change: float = MIN_CHANGE,
             n: Tuple[int, int] = (0, 0)) -> Significance:
    return Significance(False, "none", None, None, None, 1 - alpha, min_change, n, reason)


def machine_variance(seconds: Optional[float]) -> float:
    """The variance of the log of the machine's mean speed over a run of this many seconds (None: unknown), about
    its long-run mean: its wandering averaged over the run, and its drift from run to run."""
    fast = MACHINE_SPREAD ** 2 * min(1.0, MACHINE_MEMORY_S / seconds if seconds else 1.0)
    return fast + MACHINE_DRIFT ** 2


def _decide(basis: str, d: float, half: float, p: float, alpha: float, min_change: float,
            n: Tuple[int, int], unit: str) -> Significance:
    """The decision on a log change `d` with its interval d ± half."""
    lo, hi = _exp1(d - half), _exp1(d + half)
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
    return Significance(sig, basis, math.expm1(d), (lo, hi), p, level, min_change, n, reason,
                        _exp1(half + math.log1p(min_change)))


def _exp1(x: float) -> float:
    return -1.0 if x == -math.inf else math.inf if x == math.inf else math.expm1(x)


def _pct(x: float, sign: bool = False) -> str:
    if math.isinf(x):
        return "+∞" if x > 0 else "−∞"
    v = 100 * x
    if not sign:   # levels and floors: as few digits as they need (99.9%, 3%)
        text = f"{abs(v):.2f}".rstrip("0").rstrip(".")
        return ("\u2212" if v < 0 else "") + text + "%"
    return ("+" if v >= 0 else "\u2212") + f"{abs(v):.1f}%"


def _t_decide(basis: str, d: float, se: float, df: float, alpha: float, min_change: float,
              n: Tuple[int, int], unit: str) -> Significance:
    """Student's t on a log change `d` with standard error `se` and `df` degrees of freedom (inf: normal)."""
    if se == 0:
        return replace(_decide(basis, d, 0.0, 1.0 if d == 0 else 0.0, alpha, min_change, n, unit), df=df)
    p = min(1.0, 2 * t_sf(abs(d) / se, df))
    return replace(_decide(basis, d, t_ppf(alpha / 2, df) * se, p, alpha, min_change, n, unit), df=df)


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


# --------------------------------------------------------------------- turns
def paired_test(diffs: Sequence[float], alpha: float = ALPHA, min_change: float = MIN_CHANGE,
                unit: str = "turns") -> Significance:
    """Student's paired t-test on the log ratios of paired windows (after / before)."""
    d = [x for x in diffs if x is not None]
    n = len(d)
    if n < MIN_WINDOWS:
        return untested(f"fewer than {MIN_WINDOWS} turns", alpha, min_change, (n, n))
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return _t_decide("turns", mean, math.sqrt(var / n), n - 1, alpha, min_change, (n, n), unit)


def turns(before: Sequence[Tuple[float, Any]], after: Sequence[Tuple[float, Any]]) -> Optional[list]:
    """Pairs (before value, after value) of windows that took turns: both sides'
    windows sorted by start time, each paired with its next neighbour when that one
    is of the other side.  None unless at least MIN_TURNS pairs take in 80 % of
    each side's windows."""
    seq = sorted([(t, 0, k, v) for k, (t, v) in enumerate(before) if t is not None]
                 + [(t, 1, k, v) for k, (t, v) in enumerate(after) if t is not None], key=lambda x: x[:3])
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


# ------------------------------------------------------------------- windows
def log_window_test(before: Sequence[float], after: Sequence[float], alpha: float = ALPHA,
                    min_change: float = MIN_CHANGE, unit: str = "windows") -> Significance:
    """Welch's t-test on the logs of one positive value per window (in time order): the
    estimate is the ratio of their geometric means.

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
    parts = [(vb, len(b) - 1), (va, len(a) - 1), (vd, 2 * len(halves) or 1)]
    total = vb + va + vd
    df = total ** 2 / sum(v * v / k for v, k in parts if v) if total else math.inf
    return _t_decide("windows", ma - mb, math.sqrt(total), df, alpha, min_change, (len(b), len(a)), unit)


def _halves(xs: Sequence[float]) -> float:
    k = len(xs) // 2
    return sum(xs[:k]) / k - sum(xs[-k:]) / k


# ---------------------------------------------------------------------- runs
def runs_test(before: Sequence[Tuple[float, float]], after: Sequence[Tuple[float, float]], alpha: float = ALPHA,
              min_change: float = MIN_CHANGE, unit: str = "runs", stray: float = 0.0,
              pooled: Optional[Tuple[float, int]] = None) -> Significance:
    """Each side a list of (figure, variance of its log) per run.  Where a side holds two or
    more runs, the spread between runs is measured: a pooled t-test on the runs' logs (each
    side's mean of logs, the variance pooled over the sides' runs).  With one run a side,
    the normal test on the difference of the two logs with the sum of their variances.
    `stray`: a variance of each run's log known not to be smaller (a model's, not measured):
    where the measured spread's interval is the narrower, the normal test on it decides.
    `pooled`: (sum of squares, degrees of freedom) of figures that share this one's spread between
    runs, itself among them: the spread is estimated from them all (a moderated t-test)."""
    b = [(math.log(v), s) for v, s in before if v is not None and v > 0]
    a = [(math.log(v), s) for v, s in after if v is not None and v > 0]
    n = (len(b), len(a))
    if not b or not a:
        return untested("no figure on a side", alpha, min_change, n)
    mb, ma = sum(x for x, _ in b) / len(b), sum(x for x, _ in a) / len(a)
    df = len(b) + len(a) - 2
    if df == 0:
        return _t_decide("runs", ma - mb, math.sqrt(b[0][1] + a[0][1]), math.inf, alpha, min_change, n, unit)
    spread = (sum((x - mb) ** 2 for x, _ in b) + sum((x - ma) ** 2 for x, _ in a)) / df
    if pooled is not None and pooled[1] > df:
        spread, df = pooled[0] / pooled[1], pooled[1]
    k = 1 / len(b) + 1 / len(a)
    if stray and normal_ppf(alpha / 2) ** 2 * stray > t_ppf(alpha / 2, df) ** 2 * spread:
        return _t_decide("runs", ma - mb, math.sqrt(stray * k), math.inf, alpha, min_change, n, unit)
    return _t_decide("runs", ma - mb, math.sqrt(spread * k), df, alpha, min_change, n, unit)


# ------------------------------------------------------------------- power
MAX_UNITS = 1000      # runs, windows or turns a side beyond which none is suggested


def needed(sig: Significance, target: float) -> Tuple[Optional[int], Optional[float]]:
    """What would let the test flag a rise of `target` (0.1: 10 %), from its own spread (a spread scales as
    1/√n): the turns, windows or runs a side, and how many times the calls (None where more calls cannot: the
    part of the variance they do not shrink is already too large, or the basis does not say).  (None, None)
    where the test is untested or `target` is within its min_change."""
    half, goal = sig.half(), math.log1p(target) - math.log1p(sig.min_change)
    if half is None or goal <= 0:
        return None, None
    if half <= goal:
        return min(sig.n), 1.0
    alpha = 1 - sig.level
    nb, na = max(sig.n[0], 1), max(sig.n[1], 1)
    if sig.basis == "turns":
        unit_var = (half / t_ppf(alpha / 2, max(nb - 1, 1))) ** 2 * nb      # one pair's variance
        width = lambda m: t_ppf(alpha / 2, m - 1) * math.sqrt(unit_var / m)     # noqa: E731
    else:   # one run's (window's) variance; one run a side: its own variance stood in for the spread between runs
        own = nb + na - 2
        df = sig.df if sig.basis == "runs" and sig.df is not None else math.inf if own == 0 else own
        borrowed = max(df - own, 0) if own and math.isfinite(df) else 0   # siblings' degrees of freedom pooled in
        unit_var = (half / t_ppf(alpha / 2, df)) ** 2 / (1 / nb + 1 / na)
        width = lambda m: t_ppf(alpha / 2, 2 * m - 2 + borrowed) * math.sqrt(unit_var * 2 / m)     # noqa: E731
    units = next((m for m in range(max(2, min(nb, na)), MAX_UNITS + 1) if width(m) <= goal), None)
    calls = None
    if sig.calls_share > 0:
        fixed = 1 - sig.calls_share                  # in units of the variance now: what more calls leave
        allowed = (goal / half) ** 2
        calls = sig.calls_share / (allowed - fixed) if allowed > fixed else None
    return units, calls
