# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Comparisons that survive noise: a candidate against a reference measured in interleaved
rounds on the same host, each figure's ratio with a confidence interval, and a verdict.

The rounds come in pairs (reference, candidate), their order alternating from one pair to the
next (ABBA: a drift of the host over the run, another job starting on shared cores, weighs on
both sides alike). For each pair the ratio candidate / reference of a figure is taken; the
estimate is the geometric mean of the pairs' ratios, and its interval is Student's t interval
on the mean of their logarithms (the ratios of a speed are log-normal far better than normal;
pairing removes what the two rounds of a pair share). With fewer than two pairs there is no
interval: the verdict is the point estimate's, and says so. Where the two cannot serve at
once (a tune with one trial slot), rounds are not paired: ``unpaired_interval`` (Welch).

A verdict per figure, ``better`` or ``worse`` when the whole interval is on one side of 1
(no change), else ``no difference within noise``; and against a limit (the performance
gate's 0.90x of output tokens/s, for example): ``below_limit`` only when the whole interval
is beyond it, so that noise alone does not fail a candidate, and a candidate that is slower
beyond noise does.

Pure: standard library only.
"""

from __future__ import annotations

import math
import statistics

# Student's t, two-sided 95 % (the 0.975 quantile), by degrees of freedom; beyond 30, 1.96.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042}
VERDICTS = ("better", "worse", "no difference within noise")


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (the next smaller tabulated df)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df > 30:
        return 1.96
    return T975[max(d for d in T975 if d <= df)]


def order(pairs: int) -> list[tuple[str, str]]:
    """The rounds' order for ``pairs`` pairs: reference first, then candidate first, in turn (ABBA)."""
    return [("reference", "candidate") if i % 2 == 0 else ("candidate", "reference") for i in range(pairs)]


def ratio_interval(reference: list[float], candidate: list[float]) -> dict:
    """Pairs of one figure (the i-th of each list measured in the same pair): ``ratio`` (geometric mean of
    candidate / reference), ``low`` and ``high`` (95 %; None with fewer than two pairs), ``pairs``.
    Pairs where either value is missing or not positive are left out."""
    logs = [math.log(c / r) for r, c in zip(reference, candidate)
            if r is not None and c is not None and r > 0 and c > 0]
    if not logs:
        return {"ratio": None, "low": None, "high": None, "pairs": 0}
    mean = statistics.fmean(logs)
    out = {"ratio": round(math.exp(mean), 4), "low": None, "high": None, "pairs": len(logs)}
    if len(logs) >= 2:
        half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        out.update(low=round(math.exp(mean - half), 4), high=round(math.exp(mean + half), 4))
    return out


def unpaired_interval(reference: list[float], candidate: list[float]) -> dict:
    """Rounds of one figure measured apart (one trial slot: the reference's rounds before and after the
    candidates', each candidate's on its own): ``ratio`` (the ratio of the two geometric means), ``low``
    and ``high`` (95 %, Welch's t interval on the difference of the mean logarithms; None unless each side
    has two rounds), ``pairs`` (the candidate's rounds) and ``reference_rounds``. Nothing pairs away what
    rounds share here, so the same noise gives a wider interval than ``ratio_interval``'s."""
    ref = [math.log(v) for v in reference if v is not None and v > 0]
    cand = [math.log(v) for v in candidate if v is not None and v > 0]
    if not ref or not cand:
        return {"ratio": None, "low": None, "high": None, "pairs": len(cand), "reference_rounds": len(ref)}
    diff = statistics.fmean(cand) - statistics.fmean(ref)
    out = {"ratio": round(math.exp(diff), 4), "low": None, "high": None, "pairs": len(cand), "reference_rounds": len(ref)}
    if len(ref) >= 2 and len(cand) >= 2:
        var_r, var_c = statistics.variance(ref) / len(ref), statistics.variance(cand) / len(cand)
        spread = var_r + var_c
        if spread == 0:
            out.update(low=out["ratio"], high=out["ratio"])
            return out
        # Welch-Satterthwaite degrees of freedom, rounded down
        df = int(spread ** 2 / (var_r ** 2 / (len(ref) - 1) + var_c ** 2 / (len(cand) - 1)))
        half = t975(max(1, df)) * math.sqrt(spread)
        out.update(low=round(math.exp(diff - half), 4), high=round(math.exp(diff + half), 4))
    return out


def verdict(interval: dict, higher_is_better: bool) -> str:
    """better, worse, or no difference within noise (the interval spans 1; or, without one, the ratio is 1)."""
    ratio, low, high = interval.get("ratio"), interval.get("low"), interval.get("high")
    if ratio is None:
        return VERDICTS[2]
    if low is None:
        low = high = ratio
    if low > 1:
        return VERDICTS[0] if higher_is_better else VERDICTS[1]
    if high < 1:
        return VERDICTS[1] if higher_is_better else VERDICTS[0]
    return VERDICTS[2]


def beyond_limit(interval: dict, limit: float, higher_is_better: bool) -> bool:
    """Whether the candidate is past ``limit`` (a ratio: 0.9 for at least 0.9x, 1.2 for at most 1.2x) beyond
    noise: the whole interval on the wrong side of it (without an interval, the ratio)."""
    ratio, low, high = interval.get("ratio"), interval.get("low"), interval.get("high")
    if ratio is None:
        return False
    if low is None:
        low = high = ratio
    return high < limit if higher_is_better else low > limit


def describe(name: str, interval: dict, higher_is_better: bool) -> str:
    """``output_tokens_per_s 0.97x [0.91, 1.03] over 4 pairs: no difference within noise``."""
    if interval.get("ratio") is None:
        return f"{name}: not measured on both sides"
    span = (f" [{interval['low']:g}, {interval['high']:g}]" if interval.get("low") is not None
            else " (no interval: one pair)")
    return (f"{name} {interval['ratio']:g}x{span} over {interval['pairs']} pair(s): "
            f"{verdict(interval, higher_is_better)}")
