"""_stats: the paired ratio's interval and verdicts that a noisy host cannot turn into a regression."""

from __future__ import annotations

import math
import random

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _stats


def test_the_interval_is_students_t_on_the_pairs_log_ratios():
    reference, candidate = [100.0, 110.0, 90.0, 105.0], [95.0, 100.0, 88.0, 99.0]
    logs = [math.log(c / r) for r, c in zip(reference, candidate)]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    got = _stats.ratio_interval(reference, candidate)
    assert got["pairs"] == 4 and got["ratio"] == round(math.exp(mean), 4)
    assert got["low"] == round(math.exp(mean - 3.182 * sd / 2), 4) and got["high"] == round(math.exp(mean + 3.182 * sd / 2), 4)
    # a pair missing a figure is left out; one pair has no interval
    assert _stats.ratio_interval([100.0, None], [90.0, 80.0]) == {"ratio": 0.9, "low": None, "high": None, "pairs": 1}
    assert _stats.ratio_interval([None], [None])["ratio"] is None


def test_verdicts_and_the_limit_only_beyond_noise():
    noisy = {"ratio": 0.88, "low": 0.78, "high": 0.99, "pairs": 4}
    assert _stats.verdict(noisy, True) == "worse"
    # 0.88x is under the 0.9x limit, but the interval reaches past it: noise could make it so
    assert not _stats.beyond_limit(noisy, 0.90, True)
    slow = {"ratio": 0.7, "low": 0.65, "high": 0.76, "pairs": 4}
    assert _stats.beyond_limit(slow, 0.90, True) and _stats.verdict(slow, True) == "worse"
    same = {"ratio": 1.01, "low": 0.95, "high": 1.07, "pairs": 4}
    assert _stats.verdict(same, True) == "no difference within noise" and not _stats.beyond_limit(same, 0.9, True)
    # a latency: higher is worse, the limit is a ceiling
    later = {"ratio": 1.5, "low": 1.3, "high": 1.7, "pairs": 4}
    assert _stats.verdict(later, False) == "worse" and _stats.beyond_limit(later, 1.2, False)
    assert _stats.verdict({"ratio": 1.0, "low": None, "high": None, "pairs": 1}, True) == "no difference within noise"
    assert "0.88x [0.78, 0.99] over 4 pair(s): worse" in _stats.describe("output_tokens_per_s", noisy, True)


def test_the_order_alternates_and_t_is_tabulated():
    assert _stats.order(4) == [("reference", "candidate"), ("candidate", "reference")] * 2
    assert (_stats.t975(1), _stats.t975(22), _stats.t975(100)) == (12.706, 2.086, 1.96)
    with pytest.raises(ValueError):
        _stats.t975(0)


def test_on_a_noisy_host_the_same_server_rarely_fails_and_a_slow_one_always_does():
    """A/A under the noise the lab's shared cores show (a round's tokens/s moving by +-15 %, drifting between
    rounds): the point ratio of medians fails a 0.9x limit often, the interval almost never; a server 35 %
    slower fails it every time. Seeded: the same draws each run."""
    rng = random.Random(7)

    def rounds(speed: float, n: int, drift: list[float]) -> list[float]:
        return [speed * drift[i] * rng.uniform(0.85, 1.15) for i in range(n)]

    point_fails = interval_fails = slow_caught = 0
    for _trial in range(200):
        drift = [rng.uniform(0.8, 1.2) for _i in range(5)]
        ref, same, slow = rounds(100, 5, drift), rounds(100, 5, drift), rounds(65, 5, drift)
        point_fails += sorted(same)[2] / sorted(ref)[2] < 0.9
        interval_fails += _stats.beyond_limit(_stats.ratio_interval(ref, same), 0.9, True)
        slow_caught += _stats.beyond_limit(_stats.ratio_interval(ref, slow), 0.9, True)
    assert point_fails >= 10 and interval_fails <= 2 and slow_caught >= 190, (point_fails, interval_fails, slow_caught)
