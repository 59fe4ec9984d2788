"""The tune's search (_tune.Tune) on a fake host: a planner that refuses some points, trials
whose speed is a function of their settings with seeded noise on each round, compared by the
real statistics (_stats). What it must do: never launch what the planner refuses, find a
configuration that beats the base where one exists and say none does where none does, spend at
most its launches, keep what it measured for the next run, and refuse bad settings before a
server starts."""

from __future__ import annotations

import math
import random
import xml.etree.ElementTree as ET

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _bench, _stats, _tune, _variants

BASE = {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4, "context_length": 32768, "max_running_requests": 4,
        "mem_fraction_static": 0.85, "cuda_graph": False}
GOAL = {"concurrency": 8, "max_tokens": 64}


def planner(params: dict) -> dict:
    """Fits up to mem_fraction_static 0.88 (above it, too little outside the pool, more so with
    CUDA graphs); the KV tokens grow with the static share."""
    mfs = params["mem_fraction_static"]
    limit = 0.88 - (0.03 if params.get("cuda_graph") else 0)
    if mfs > limit:
        return {"fits": False, "binding": "dynamic", "reason": f"too little memory outside the static pool at {mfs}"}
    return {"fits": True, "binding": None, "reason": "fits", "max_total_tokens": int((mfs - 0.6) * 4000),
            "max_running_requests": params.get("max_running_requests") or 48}


def speed(params: dict) -> float:
    """Tokens/s of a server with these settings under the goal's load (the fake's truth)."""
    running = min(8, params.get("max_running_requests") or 48, int((params["mem_fraction_static"] - 0.6) * 4000) // 96)
    rate = 100.0 * running / 8
    if params.get("cuda_graph"):
        rate *= 1.3 if (params.get("cuda_graph_max_bs") or 99) >= running else 1.0
    steps = params.get("speculative_num_steps") or 3
    rate *= {1: 0.8, 2: 0.95, 3: 1.0, 4: 1.04, 5: 1.02}[steps]
    return rate


def ttft(params: dict) -> float:
    """The fake's first-token p95: a request queued behind the running ones waits for them."""
    return 0.05 * 8 / max(1, min(8, params.get("max_running_requests") or 48))


class FakeTrials:
    def __init__(self, noise: float = 0.03, seed: int = 1, truth=speed, dies=lambda p: False, clock_step: float = 30.0) -> None:
        self.rng, self.noise, self.truth, self.dies = random.Random(seed), noise, truth, dies
        self.running: dict[str, dict] = {}
        self.started: list[tuple[str, dict]] = []
        self.now, self.clock_step = 0.0, clock_step
        self.events: list[dict] = []

    def start(self, role, params):
        self.now += self.clock_step
        self.started.append((role, dict(params)))
        if self.dies(params):
            return {"ready": False, "seconds": 0.4, "cause": "CUDA out of memory in cuda_graph capture", "verdict": "oom"}
        self.running[role] = params
        return {"ready": True, "seconds": 12.0, "signals": {}}

    def stop(self, role):
        self.running.pop(role, None)

    def compare(self, load):
        ref, cand = self.truth(self.running["reference"]), self.truth(self.running["candidate"])
        pairs = max(2, load["rounds"])
        r = [ref * (1 + self.rng.gauss(0, self.noise)) for _pair in range(pairs)]
        c = [cand * (1 + self.rng.gauss(0, self.noise)) for _pair in range(pairs)]
        interval = _stats.ratio_interval(r, c)
        check = dict(interval, figure="output_tokens_per_s", verdict=_stats.verdict(interval, True))
        return {"ok": True, "figures": {"output_tokens_per_s": sorted(c)[pairs // 2], "ttft_p95": ttft(self.running["candidate"])},
                "reference": {"figures": {"output_tokens_per_s": sorted(r)[pairs // 2], "ttft_p95": ttft(self.running["reference"])}},
                "comparison": {"checks": [check]}, "seconds": 1.0}

    def time(self):
        return self.now

    def progress(self, event):
        self.events.append(event)

    def signals(self, role):
        """What the fake's log says of a server under the load: a pool full with a queue below 8 running requests."""
        running = min(8, self.running[role].get("max_running_requests") or 48)
        return {"token_usage_max": 0.95 if running < 8 else 0.4, "queue_max": 8 - running, "retractions": 0,
                "reading": ["the KV pool was full"] if running < 8 else []}


class OneSlot(FakeTrials):
    """One trial slot: one server at a time, each measured alone, in rounds whose speed drifts by
    ``drift`` a launch (a host that slows over the tune)."""

    together = False

    def __init__(self, drift: float = 0.0, **kw) -> None:
        super().__init__(**kw)
        self.drift = drift

    def start(self, role, params):
        assert not self.running, f"{role} started while {sorted(self.running)} serves in the one slot"
        return super().start(role, params)

    def compare(self, load):
        raise AssertionError("one slot: nothing is compared side by side")

    def measure(self, role, load):
        params = self.running[role]
        slow = 1 - self.drift * len(self.started)
        rounds = [{"output_tokens_per_s": self.truth(params) * slow * (1 + self.rng.gauss(0, self.noise)),
                   "ttft_p95": ttft(params), "ttft_p50": None, "tpot_p50": None, "itl_p50": None, "accept_length": None}
                  for _round in range(max(1, load["rounds"]))]
        return {"ok": True, "rounds": rounds, "figures": {"output_tokens_per_s": rounds[0]["output_tokens_per_s"],
                                                          "ttft_p95": ttft(params)}, "seconds": 1.0, "msg": "measured"}


def tune(trials, goal=None, space=None, budget=None, store=None, base=None) -> dict:
    return _tune.Tune("nextn", base or BASE, dict(GOAL, **(goal or {})), space, budget or {"trials": 12},
                      planner, trials, store=store).run()


def test_the_planner_drops_what_does_not_fit_and_nothing_dropped_is_launched():
    trials = FakeTrials()
    result = tune(trials)
    dropped = {d["key"] for d in result["dropped"]}
    launched = [p for role, p in trials.started if role == "candidate"]
    assert dropped and launched
    assert all(planner(p)["fits"] for p in launched)
    assert not dropped & {_tune.key_of(p) for p in launched}
    # each dropped point says what binds
    assert all(d["binding"] == "dynamic" and "outside the static pool" in d["why"] for d in result["dropped"])


def test_it_finds_a_better_configuration_within_its_launches_and_close_to_the_grids_best():
    trials = FakeTrials()
    result = tune(trials, budget={"trials": 12})
    assert result["verdict"] == "better", result["msg"]
    assert result["launches"] <= 12 and sum(result["rungs"]) <= 12
    # the exhaustive grid's best, from the fake's truth, over every point the planner lets through
    points = [p for p in _tune.grid(_tune.normalise(BASE), _tune.default_space(_tune.normalise(BASE), _tune.objective(GOAL)))
              if planner(p)["fits"]]
    best = max(speed(p) for p in points)
    winner = result["winner"]["params"]
    assert speed(winner) >= 0.95 * best
    assert result["fit"] > 3 * 12 // 2  # most of the grid never launched
    ratio = result["winner"]["ratio"]
    assert ratio["verdict"] == "better" and ratio["low"] > 1


def test_it_says_none_beats_the_base_where_none_does():
    trials = FakeTrials(truth=lambda p: 100.0)  # every configuration serves alike
    result = tune(trials, budget={"trials": 6})
    assert result["verdict"] == "none" and result["winner"] is None
    assert "nothing beats nextn beyond noise" in result["msg"]
    assert _tune.winner_variant(result, "nextn-tuned", "r1", {}) is None


def test_a_candidate_that_dies_is_recorded_with_its_cause_and_never_wins():
    trials = FakeTrials(dies=lambda p: p.get("cuda_graph") and p.get("speculative_num_steps") == 4)
    result = tune(trials)
    assert result["deaths"] and all("out of memory" in d["cause"] for d in result["deaths"])
    assert result["winner"]["params"].get("speculative_num_steps") != 4 or not result["winner"]["params"]["cuda_graph"]
    died = [c for c in result["candidates"] if c["died"]]
    assert died and all(c["cause"] and c["start_seconds"] == 0.4 for c in died)


def test_a_rerun_reuses_what_was_measured():
    store: dict = {}
    first = tune(FakeTrials(), store=store)
    trials = FakeTrials(seed=2)
    second = tune(trials, store=store)
    assert first["launches"] > 0 and second["launches"] == 0 and second["reused"] == first["launches"]
    assert [role for role, _p in trials.started] == ["reference"]
    assert second["winner"]["key"] == first["winner"]["key"]


def test_the_service_level_decides_before_the_throughput():
    # a TTFT limit only candidates that run all 8 requests at once meet; the base (4) misses it
    result = tune(FakeTrials(), goal={"ttft_p95_ms": 60})
    assert result["verdict"] == "better"
    assert not result["winner"]["missed"]
    assert (result["winner"]["params"].get("max_running_requests") or 48) >= 8
    # a limit nobody meets: none, naming what the best missed
    result = tune(FakeTrials(), goal={"ttft_p95_ms": 10})
    assert result["verdict"] == "none" and "no candidate meets the service level" in result["msg"]


def test_the_time_budget_ends_the_search_with_what_was_measured():
    trials = FakeTrials(clock_step=300.0)  # five minutes a launch
    result = tune(trials, budget={"trials": 12, "minutes": 16})
    assert result["launches"] <= 3 and "ran out" in result["note"]


def test_a_base_that_does_not_start_ends_the_tune_before_any_candidate():
    trials = FakeTrials(dies=lambda p: p == _tune.normalise(BASE))
    result = tune(trials)
    assert result["verdict"] == "none" and "did not start in the trial slot" in result["msg"]
    assert [role for role, _p in trials.started] == ["reference"]


@pytest.mark.parametrize("kw,error", [
    ({"goal": {"concurrency": 0}}, "objective.concurrency"),
    ({"goal": {"ttft_p95_ms": -1}}, "objective.ttft_p95_ms"),
    ({"goal": {"latency": 1}}, "unknown objective field"),
    ({"space": {"tensor_parallel": [1, 2]}}, "not a setting a tune moves"),
    ({"space": {"mem_fraction_static": [1.2]}}, "between 0 and 1"),
    ({"space": {"cuda_graph": ["yes"]}}, "true and false"),
    ({"space": {"max_running_requests": []}}, "non-empty list"),
    ({"budget": {"trials": 0}}, "budget.trials"),
])
def test_bad_settings_are_refused_before_any_server_starts(kw, error):
    trials = FakeTrials()
    with pytest.raises(_tune.TuneError, match=error):
        tune(trials, **kw)
    assert trials.started == []


def test_a_required_context_length_drops_shorter_points_before_the_planner():
    result = tune(FakeTrials(), space={"context_length": [8192, 32768], "max_running_requests": [4, 8]},
                  goal={"context_length": 16384})
    short = [d for d in result["dropped"] if d["binding"] == "context_length"]
    assert len(short) == 2 and all("below the 16384 tokens" in d["why"] for d in short)


def test_the_grid_normalises_and_counts_each_configuration_once():
    space = {"cuda_graph": [True, False], "cuda_graph_max_bs": [8, 16], "speculative_num_steps": [2, 3]}
    points = _tune.grid(_tune.normalise(BASE), space)
    # without graphs the graph batch means nothing: 2 x 2 with graphs, 2 without, the base among them
    assert len(points) == 6
    assert all(p["speculative_num_draft_tokens"] == p["speculative_num_steps"] + 1 for p in points)
    assert all(p["cuda_graph_max_bs"] is None for p in points if not p["cuda_graph"])


def test_rung_sizes_halve_by_three_within_the_launches():
    assert _tune.rung_sizes(40, 12) == [8, 3, 1]
    assert _tune.rung_sizes(2, 12) == [2, 1, 1]
    assert sum(_tune.rung_sizes(100, 30)) <= 30
    assert _tune.rung_sizes(0, 12) == [0]


def test_the_report_and_the_plot_show_every_measured_candidate_and_the_front():
    result = tune(FakeTrials(), goal={"ttft_p95_ms": 60})
    text = _tune.markdown(result, "r1", "ct129")
    measured = [c for c in result["candidates"] if c["rung"] > 0]
    assert text.count("\n| ") >= len(measured) + len(result["dropped"])
    assert "**BETTER**" in text and "Dropped by the planner" in text
    image = ET.fromstring(_tune.svg(result))
    circles = image.findall("{http://www.w3.org/2000/svg}circle")
    assert len([c for c in circles if c.get("fill") != "none"]) == len([c for c in measured if c["ok"]])
    assert any(c.get("fill") == "blue" for c in circles)
    assert _tune.pareto([(1, 10), (2, 5), (3, 20), (2, 15)]) == [(1, 10), (2, 15), (3, 20)]


def test_the_winner_is_a_variant_that_inherits_the_base_with_its_provenance():
    result = tune(FakeTrials())
    variant = _tune.winner_variant(result, "nextn-tuned", "r1", {"sglang_version": "0.5.11", "host": "ct129"})
    entry = variant["nextn-tuned"]
    assert entry["inherits"] == "nextn"
    assert {k: entry[k] for k in result["winner"]["changes"]} == result["winner"]["changes"]
    assert entry["provenance"]["run"] == "r1" and entry["provenance"]["sglang_version"] == "0.5.11"
    assert entry["provenance"]["ratio"]["verdict"] == "better"
    # it resolves over the base in the variant table and passes the table's checks
    table = {"nextn": dict(BASE, disable_radix_cache=True), **variant}
    _name, params = _variants.resolve("nextn-tuned", table)
    assert _variants.check(params) == []
    assert params["mem_fraction_static"] == result["winner"]["params"]["mem_fraction_static"]
    assert "provenance" not in " ".join(_variants.argv(params, {"model_path": "/m", "tp_size": 2}, (0, 5, 11)))


class FailingTrials(FakeTrials):
    """Compares as FakeTrials does until ``after`` comparisons, then ``side``'s rounds fail."""

    def __init__(self, after: int, side: str, **kw) -> None:
        super().__init__(**kw)
        self.after, self.side, self.compares = after, side, 0

    def compare(self, load):
        self.compares += 1
        if self.compares > self.after:
            return {"ok": False, "side": self.side, "msg": f"the {self.side}'s round 1 failed: 16 of 16 requests"}
        return super().compare(load)


def test_a_reference_that_stops_serving_ends_the_search_with_what_was_measured():
    trials = FailingTrials(2, "reference")
    result = tune(trials)
    assert "the reference (nextn) stopped serving" in result["note"]
    measured = [c for c in result["candidates"] if c["rung"] > 0]
    assert len(measured) == 2 and all(c["ok"] for c in measured)  # the failed comparison is no candidate's
    assert not trials.running  # both trial servers stopped


def test_a_candidate_that_fails_under_load_is_recorded_and_never_wins():
    trials = FailingTrials(0, "candidate")
    result = tune(trials, budget={"trials": 3})
    assert result["verdict"] == "none" and result["winner"] is None
    assert all(c["missed"][0].startswith("failed under load: the candidate's round 1 failed") for c in result["candidates"]
               if c["rung"] > 0)


def test_without_a_plan_the_first_rung_is_spread_over_every_value_of_each_setting():
    """No GPU to plan against: the plan predicts nothing, and the first rung sees each value of each setting
    (not the points that would run the whole load at once, a GPU's prediction)."""
    def unplanned(_params):
        return {"fits": True, "binding": None, "reason": "not planned"}
    space = {"max_running_requests": [1, 2, 4], "chunked_prefill_size": [128, 512]}
    kept, _dropped = _tune.screen(_tune.grid(_tune.normalise(BASE), space), unplanned, _tune.objective(GOAL))
    first = _tune.first_rung([e for e in kept if e["params"] != _tune.normalise(BASE)], 3)
    assert {e["params"]["max_running_requests"] for e in first} == {1, 2, 4}
    assert {e["params"]["chunked_prefill_size"] for e in first} == {128, 512}


def test_one_slot_measures_the_base_before_and_after_and_each_candidate_alone():
    trials = OneSlot()
    result = tune(trials, budget={"trials": 12})
    roles = [role for role, _p in trials.started]
    # the base first and last, each candidate in between, never two at once (OneSlot.start asserts it)
    assert roles[0] == "reference" and roles[-1] == "reference" and roles.count("reference") == 2
    assert result["trial_slots"] == 1 and result["reference_starts"] == 2
    assert result["verdict"] == "better", result["msg"]
    points = [p for p in _tune.grid(_tune.normalise(BASE), _tune.default_space(_tune.normalise(BASE), _tune.objective(GOAL)))
              if planner(p)["fits"]]
    assert speed(result["winner"]["params"]) >= 0.95 * max(speed(p) for p in points)
    # the winner's interval is against the base's rounds before and after: Welch's, over 10 of them
    ratio = result["winner"]["ratio"]
    assert ratio["low"] > 1 and ratio["pairs"] == _tune.RUNG_PAIRS[-1]
    assert result["reference_drift"]["verdict"] == "no difference within noise"
    # the ratio is not the paired one: the rounds were measured apart
    measured = [c for c in result["candidates"] if c["ok"]]
    assert measured and all(c["ratio"]["figure"] == "output_tokens_per_s" for c in measured)


def test_one_slot_a_host_that_drifts_shows_in_the_bases_rounds_and_widens_the_interval():
    steady = tune(OneSlot(noise=0.01), budget={"trials": 6})
    drifting = tune(OneSlot(noise=0.01, drift=0.02), budget={"trials": 6})
    assert drifting["reference_drift"]["verdict"] == "worse" and drifting["reference_drift"]["ratio"] < 0.95
    width = [r["winner" if r["winner"] else "best"]["ratio"] for r in (steady, drifting)]
    log_width = [math.log(w["high"] / w["low"]) for w in width]
    assert log_width[1] > 2 * log_width[0]


def test_one_slot_a_base_that_does_not_serve_again_is_said_and_keeps_the_first_comparisons():
    trials = OneSlot()
    starts = {"reference": 0}
    alive = trials.start

    def start(role, params):
        if role == "reference":
            starts["reference"] += 1
            if starts["reference"] == 2:
                trials.started.append((role, dict(params)))
                return {"ready": False, "seconds": 3.0, "cause": "cuda_oom", "verdict": "process_exited"}
        return alive(role, params)
    trials.start = start
    result = tune(trials, budget={"trials": 6})
    assert "did not start again after the candidates (cuda_oom)" in result["note"]
    assert result["reference_drift"] is None and result["best"]["ratio"]["ratio"] is not None


def test_the_report_and_the_verdict_carry_sglangs_own_signals():
    """The base (4 running requests for a load of 8) logs a full pool with requests queued; the winner runs all 8
    at once, and its row says what its log said."""
    result = tune(FakeTrials(), budget={"trials": 6})
    assert result["reference_signals"]["reading"] == ["the KV pool was full"]
    report = _tune.markdown(result, "r1", "ct129")
    assert "The base under the same load, SGLang's log: usage 0.95, queue 4: the KV pool was full" in report
    winner_row = next(line for line in report.splitlines() if line.startswith("| 3 |"))
    assert "| usage 0.40, queue 0 |" in winner_row
    # a winner whose own log reads as trouble says so in the verdict
    trials = FakeTrials()
    trials.signals = lambda role: {"retractions": 2, "retracted_reqs": 3,
                                   "reading": ["the KV pool filled and 3 running request(s) were retracted"]}
    result = tune(trials, budget={"trials": 6})
    assert result["verdict"] == "better" and "SGLang's log of it under the load: the KV pool filled" in result["msg"]


class RoundsTrials(FakeTrials):
    """Compare as _bench.interleaved answers: each side's rounds kept (every figure _bench reads)."""

    def compare(self, load):
        ref, cand = self.truth(self.running["reference"]), self.truth(self.running["candidate"])
        pairs = max(2, load["rounds"])
        self.compared.append(pairs)

        def rounds(rate, params):
            return [dict({f: None for f in _bench.FIGURES}, output_tokens_per_s=rate * (1 + self.rng.gauss(0, self.noise)),
                         ttft_p95=ttft(params)) for _pair in range(pairs)]
        both = {"reference": rounds(ref, self.running["reference"]), "candidate": rounds(cand, self.running["candidate"])}
        return {"ok": True, "rounds": both, "figures": _bench.medians(both["candidate"]),
                "reference": {"figures": _bench.medians(both["reference"])},
                "comparison": _bench.compare_rounds(both, paired=True), "seconds": 1.0}


def test_the_last_rung_adds_pairs_until_its_interval_is_narrow_and_no_further():
    quiet = RoundsTrials(noise=0.01)
    quiet.compared = []
    result = tune(quiet, budget={"trials": 6})
    # five pairs were enough: nothing added
    assert result["winner"]["ratio"]["pairs"] == 5 and max(quiet.compared) == 5
    noisy = RoundsTrials(noise=0.2, seed=3)
    noisy.compared = []
    result = tune(noisy, budget={"trials": 6})
    last = result["best"]["ratio"]
    # the first measurement of the last rung was wide; pairs came three at a time, up to the cap at most
    assert last["pairs"] > 5 and last["pairs"] <= _tune.MAX_PAIRS and noisy.compared.count(3) >= 1
    assert last["pairs"] == _tune.MAX_PAIRS or last["high"] / last["low"] <= _tune.PRECISION
    assert any(e["event"] == "more pairs" for e in noisy.events)
    assert f"over {last['pairs']} |" in _tune.markdown(result, "r1", "ct129")


def test_among_candidates_the_measurements_cannot_tell_apart_the_one_sglang_has_no_objection_to_goes_on(monkeypatch):
    """Two ways to run all 8 requests at once: at mem_fraction_static 0.85 1 % faster (both intervals narrow
    and overlapping: tied) but leaving 3 GB for activations, at 0.82 leaving 6 GB. The 0.82 one goes on and
    wins; SGLang's guide objects to the other. Without the log's say, the 0.85 one would have won."""
    def memory_left(fake):
        return lambda role: {"device": "gpu", "retractions": 0, "retracted_reqs": 0,
                             "available_mem_gb": 3.0 if fake.running[role]["mem_fraction_static"] == 0.85 else 6.0}

    def run() -> dict:
        trials = FakeTrials(noise=0.002, truth=lambda p: speed(p) * (1.01 if p["mem_fraction_static"] == 0.85 else 1.0))
        trials.signals = memory_left(trials)
        return tune(trials, space={"max_running_requests": [8], "mem_fraction_static": [0.82, 0.85]}, budget={"trials": 6})
    result = run()
    measured = {c["params"]["mem_fraction_static"]: c for c in result["candidates"] if c["ok"]}
    assert set(measured) == {0.82, 0.85}
    assert result["verdict"] == "better" and result["winner"]["params"]["mem_fraction_static"] == 0.82
    assert measured[0.85]["rung"] == 1 and measured[0.82]["rung"] == 3
    assert measured[0.85]["ratio"]["ratio"] > measured[0.82]["ratio"]["ratio"]
    with monkeypatch.context() as patched:
        patched.setattr(_tune, "trouble", lambda entry: [])
        assert run()["winner"]["params"]["mem_fraction_static"] == 0.85
    # a candidate slower beyond noise is not saved by a clean log
    faster = FakeTrials(truth=lambda p: speed(p) * (1.5 if p["mem_fraction_static"] == 0.85 else 1.0))
    faster.signals = memory_left(faster)
    result = tune(faster, space={"max_running_requests": [8], "mem_fraction_static": [0.82, 0.85]}, budget={"trials": 6})
    assert result["winner"]["params"]["mem_fraction_static"] == 0.85 and "under the 5-8 GB" in result["msg"]
