# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The search for the configuration that serves best on a host, beside its live service.

A tune starts from a base variant and the operator's objective (a load: concurrency,
requests, prompt and output length; a service level: TTFT p95 at most X ms, at least Y output
tokens/s; a context length the service must keep). Its search space is data: per setting, the
values to try (``default_space`` builds one around the base). Every point of the grid is
planned first (the memory planner, _memplan): one that does not fit is never launched, and the
report says what binds and by how much. What fits is ordered by what the plan predicts for the
load (how many of its requests run at once instead of queueing, whether CUDA graphs cover the
batch) and searched by successive halving: every candidate the budget allows gets a cheap
measurement, the best third a longer one, and so on; each measurement is the candidate and the
base, both serving beside the live service at once, in interleaved pairs of rounds (_bench.
interleaved, _stats), so its figures are ratios to the base with a 95 % interval, measured under
the same noise. Where the host has one trial slot (one free GPU group, or the live service's own
GPUs with the live service stopped: a tune in place), the base is measured alone before the
candidates and again after them, each candidate alone, and each ratio's interval is Welch's on
the rounds measured apart, against the base's rounds before and after (a host that drifted over
the tune widens it, and the report shows the base's drift). A candidate that dies has its
readiness gate's verdict as its result.

Why our own successive halving and not a general library's sampler: the grid is small once the
planner has pruned it (tens of points, not thousands), the planner's figures order it better
than a sampler's prior could, and the costly part is a launch (minutes on a GPU), which halving
spends only where the cheap measurement says it is worth it. What a run measured is kept (per
host, model, SGLang version and build, and load: ``store_key``) and reused by the next.

This module decides; the host is behind the ``Trials`` seam (start a server in a trial slot,
compare the two, stop one), the planner behind a function; tests and the lab bench drive it
in-process.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from typing import Callable, Protocol

from ansible_collections.inferops.sglang.plugins.module_utils import _bench
from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_log
from ansible_collections.inferops.sglang.plugins.module_utils import _stats

# The settings a tune moves, as the variant table names them (_variants.PARAMS).
KNOBS = ("mem_fraction_static", "context_length", "max_running_requests", "chunked_prefill_size", "cuda_graph",
         "cuda_graph_max_bs", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
OBJECTIVE_DEFAULTS = {"concurrency": 8, "requests": None, "max_tokens": 128, "prompt_words": 0, "ttft_p95_ms": None,
                      "min_output_tokens_per_s": None, "context_length": None}
BUDGET_DEFAULTS = {"trials": 12, "minutes": 60}
# Pairs of rounds per rung of the halving (the last rung's interval is the winner's verdict), and
# the share of a rung kept for the next.
RUNG_PAIRS = (2, 3, 5)
KEEP = 3
# The last rung's measurement goes on, EXTRA_PAIRS at a time, until the throughput ratio's interval is
# narrow enough to tell a difference of about a tenth (its high / low at most PRECISION) or it holds
# MAX_PAIRS pairs. The rule looks at the interval's width, never at which side of 1 it lies, so adding
# pairs does not make a difference that is not there more likely to be called (as stopping once the
# verdict reads "better" would).
PRECISION = 1.25
EXTRA_PAIRS = 3
MAX_PAIRS = 14
# With one trial slot (the reference and a candidate cannot serve at once), the reference's rounds,
# measured before the candidates and again after them.
REFERENCE_ROUNDS = 5
FIGURE = "output_tokens_per_s"


# A tune's job: its time limit is the budget's minutes, the gates of the starts that may follow the
# last launch's budget check (the last candidate, the base again with one slot, the live service in
# place: two or three), and this margin for the measurements.
JOB_MARGIN = 600
# After a tune in place, the live service is started again by a timer this long after the job's limit.
RESTORE_GRACE = 60


def job_limit(minutes: float, gate_timeout: float, in_place: bool = False) -> int:
    """Seconds a tune's job may run (the action plugin's async limit)."""
    return int(math.ceil(60 * float(minutes) + (3 if in_place else 2) * float(gate_timeout))) + JOB_MARGIN


def in_place_downtime(minutes: float, gate_timeout: float, unit: str) -> dict:
    """What a tune in place costs the live service, stated before it is stopped: ``at_most`` seconds
    (when the restore timer starts it again whatever happens to the job) and ``msg``."""
    at_most = job_limit(minutes, gate_timeout, in_place=True) + RESTORE_GRACE
    return {"at_most": at_most, "msg": (
        f"{unit} is stopped for the whole tune: about the budget's {float(minutes):g} min and three server starts "
        f"(the last candidate, the base measured again, {unit} itself; each within the gate's {float(gate_timeout):g} s), "
        f"at most {at_most / 60:.0f} min: a systemd timer starts {unit} again then, whatever happens to the job")}


class TuneError(Exception):
    """A tune's setting out of range: refused before anything on the host changes."""


class ReferenceLost(Exception):
    """The reference stopped answering: no later comparison would mean anything."""


class Trials(Protocol):
    """What a tune does to the host, and nothing else. ``together``: the reference and a candidate
    serve at once (two trial slots), compared in interleaved pairs; else one slot holds one of them
    at a time, each measured alone, and the reference is measured before and after the candidates."""

    together: bool

    def start(self, role: str, params: dict) -> dict: ...  # role reference|candidate; {ready, seconds, cause, signals}
    def stop(self, role: str) -> None: ...
    def compare(self, load: dict) -> dict: ...            # _bench.interleaved(reference, candidate, load)
    def measure(self, role: str, load: dict) -> dict: ...  # _bench.benchmark of one server alone (one slot)
    def signals(self, role: str) -> dict: ...             # _sglang_log.signals of its log since it started
    def time(self) -> float: ...                          # seconds, monotonic
    def progress(self, event: dict) -> None: ...


def objective(given: dict | None) -> dict:
    """The objective with its defaults; TuneError naming every bad field."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(OBJECTIVE_DEFAULTS))
    out = dict(OBJECTIVE_DEFAULTS, **{k: v for k, v in given.items() if v is not None})
    problems = [f"unknown objective field(s): {', '.join(unknown)}"] if unknown else []
    for name in ("concurrency", "max_tokens"):
        if not isinstance(out[name], int) or isinstance(out[name], bool) or out[name] < 1:
            problems.append(f"objective.{name} must be a whole number of at least 1, got {out[name]!r}")
    for name in ("requests", "context_length"):
        if out[name] is not None and (not isinstance(out[name], int) or isinstance(out[name], bool) or out[name] < 1):
            problems.append(f"objective.{name} must be a whole number of at least 1, got {out[name]!r}")
    if not isinstance(out["prompt_words"], int) or isinstance(out["prompt_words"], bool) or out["prompt_words"] < 0:
        problems.append(f"objective.prompt_words must be a whole number, got {out['prompt_words']!r}")
    for name in ("ttft_p95_ms", "min_output_tokens_per_s"):
        value = out[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            problems.append(f"objective.{name} must be a positive number, got {value!r}")
    if problems:
        raise TuneError("; ".join(problems))
    if out["requests"] is None and isinstance(out["concurrency"], int):
        out["requests"] = 2 * out["concurrency"]
    return out


def _unique(values) -> list:
    seen: list = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen


def default_space(base: dict, goal: dict) -> dict:
    """Values to try around the base: its static memory share a few points either way, CUDA graphs
    on and off with their largest batch at the load's concurrency or twice it, the running-request
    limit at the concurrency, twice it and the base's, and, for a draft of top-k 1, one to five
    draft steps. The context length is the objective's where it names one, else the base's."""
    mfs = float(base.get("mem_fraction_static") or 0.85)
    conc = int(goal["concurrency"])
    space: dict = {
        "mem_fraction_static": sorted(_unique(round(min(0.95, max(0.5, mfs + d)), 2) for d in (-0.06, -0.03, 0, 0.03, 0.06))),
        "cuda_graph": [True, False],
        "cuda_graph_max_bs": sorted(_unique([conc, 2 * conc])),
        "max_running_requests": sorted(_unique(v for v in (conc, 2 * conc, base.get("max_running_requests")) if v)),
    }
    if goal.get("context_length"):
        space["context_length"] = [int(goal["context_length"])]
    if base.get("speculative_algorithm") and base.get("speculative_num_steps") and (base.get("speculative_eagle_topk") or 1) == 1:
        space["speculative_num_steps"] = list(range(1, 6))
    return space


def check_space(space: object) -> dict:
    """The space as {knob: [values]}; TuneError naming every bad entry."""
    if not isinstance(space, dict) or not space:
        raise TuneError(f"the search space must be a mapping of settings to lists of values, got {space!r}")
    problems = []
    for name, values in space.items():
        if name not in KNOBS:
            problems.append(f"{name} is not a setting a tune moves ({', '.join(KNOBS)})")
        elif not isinstance(values, list) or not values:
            problems.append(f"space.{name} must be a non-empty list, got {values!r}")
        elif name == "cuda_graph" and any(not isinstance(v, bool) for v in values):
            problems.append(f"space.cuda_graph takes true and false, got {values!r}")
        elif name == "mem_fraction_static" and any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1
                                                   for v in values):
            problems.append(f"space.mem_fraction_static takes numbers between 0 and 1, got {values!r}")
        elif name not in ("cuda_graph", "mem_fraction_static") and any(
                v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1) for v in values):
            problems.append(f"space.{name} takes whole numbers of at least 1 (or null for SGLang's default), got {values!r}")
    if problems:
        raise TuneError("; ".join(problems))
    return {name: list(values) for name, values in space.items()}


def check_budget(given: dict | None) -> dict:
    out = dict(BUDGET_DEFAULTS, **{k: v for k, v in (given or {}).items() if v is not None})
    problems = [f"unknown budget field(s): {', '.join(sorted(set(out) - set(BUDGET_DEFAULTS)))}"] \
        if set(out) - set(BUDGET_DEFAULTS) else []
    if not isinstance(out["trials"], int) or isinstance(out["trials"], bool) or out["trials"] < 1:
        problems.append(f"budget.trials must be a whole number of at least 1, got {out['trials']!r}")
    if isinstance(out["minutes"], bool) or not isinstance(out["minutes"], (int, float)) or out["minutes"] <= 0:
        problems.append(f"budget.minutes must be a positive number, got {out['minutes']!r}")
    if problems:
        raise TuneError("; ".join(problems))
    return out


def normalise(params: dict) -> dict:
    """One candidate's settings as SGLang reads them: no CUDA graph batch without CUDA graphs; a draft
    of top-k 1 verifies its steps plus one token (real SGLang 0.5.11 adjusts num_draft_tokens to that for
    top-k 1 and warns: srt/server_args.py:3540-3546 of its wheel)."""
    out = dict(params)
    if out.get("cuda_graph") is False:
        out["cuda_graph_max_bs"] = None
    if out.get("speculative_algorithm") and out.get("speculative_num_steps") and (out.get("speculative_eagle_topk") or 1) == 1:
        out["speculative_num_draft_tokens"] = int(out["speculative_num_steps"]) + 1
    return out


def key_of(params: dict) -> str:
    """A candidate's identity: its tuned settings (and the algorithm they belong to)."""
    knobs = {k: params.get(k) for k in (*KNOBS, "speculative_algorithm")}
    return hashlib.sha256(json.dumps(knobs, sort_keys=True).encode()).hexdigest()[:12]


def changes(base: dict, params: dict) -> dict:
    """The tuned settings where a candidate differs from the base."""
    return {k: params.get(k) for k in KNOBS if params.get(k) != base.get(k)}


def grid(base: dict, space: dict) -> list[dict]:
    """Every point of the space laid over the base, normalised, each once; the base's own point first."""
    names = list(space)
    points = [normalise(base)]
    for values in itertools.product(*(space[n] for n in names)):
        points.append(normalise(dict(base, **dict(zip(names, values)))))
    out, seen = [], set()
    for point in points:
        key = key_of(point)
        if key not in seen:
            seen.add(key)
            out.append(point)
    return out


def capacity(plan: dict, params: dict, goal: dict) -> int:
    """How many of the load's requests the planned server runs at once: its running-request limit and
    its KV tokens over each request's (prompt and output)."""
    per_request = max(1, int(goal.get("prompt_words") or 0) + 32 + int(goal["max_tokens"]))
    running = int(plan.get("max_running_requests") or params.get("max_running_requests") or goal["concurrency"])
    tokens = int(plan.get("max_total_tokens") or 0)
    return max(0, min(running, tokens // per_request if tokens else running))


def prior(plan: dict, params: dict, goal: dict) -> tuple:
    """The plan's prediction for the load, larger is better: the share of the load's requests that run
    at once, CUDA graphs covering that batch, then the KV tokens. Without a plan (no GPU to plan
    against) it predicts nothing: every point ties, and the first rung is spread by its settings
    alone (on CPU, running more requests at once need not pay: the tune bench on real SGLang)."""
    if not plan.get("max_total_tokens"):
        return (1.0, True, 0)
    conc = int(goal["concurrency"])
    running = min(conc, capacity(plan, params, goal))
    graphed = bool(params.get("cuda_graph", True)) and (params.get("cuda_graph_max_bs") or conc) >= running
    return (round(running / conc, 3), graphed, int(plan.get("max_total_tokens") or 0))


def screen(points: list[dict], planner: Callable[[dict], dict], goal: dict) -> tuple[list[dict], list[dict]]:
    """Plan every point: (kept, dropped), each an entry {key, params, plan, prior} or {key, params, why}."""
    kept, dropped = [], []
    need = goal.get("context_length")
    for params in points:
        key = key_of(params)
        if need and params.get("context_length") and int(params["context_length"]) < int(need):
            dropped.append({"key": key, "params": params, "binding": "context_length",
                            "why": f"context_length {params['context_length']} is below the {need} tokens the objective requires"})
            continue
        try:
            plan = planner(params)
        except Exception as exc:  # noqa: BLE001 - a planner error drops the point with its text
            dropped.append({"key": key, "params": params, "binding": "planner", "why": f"the planner refused it: {exc}"})
            continue
        if not plan.get("fits"):
            dropped.append({"key": key, "params": params, "binding": plan.get("binding"), "why": plan.get("reason"),
                            "plan": _plan_figures(plan)})
            continue
        if need and plan.get("max_total_tokens") is not None and int(plan["max_total_tokens"]) < int(need):
            dropped.append({"key": key, "params": params, "binding": "kv_tokens", "plan": _plan_figures(plan),
                            "why": f"{plan['max_total_tokens']} KV tokens hold no request of the {need} tokens the objective requires"})
            continue
        kept.append({"key": key, "params": params, "plan": _plan_figures(plan), "prior": prior(plan, params, goal)})
    return kept, dropped


def _plan_figures(plan: dict) -> dict:
    return {k: plan.get(k) for k in ("max_total_tokens", "max_running_requests", "binding", "reason") if k in plan}


def first_rung(kept: list[dict], size: int) -> list[dict]:
    """The first rung's candidates: the best the plan predicts, spread over the settings the plan
    cannot tell apart (one by one, the candidate of the best predicted tier with the most values not
    yet chosen, then the one that differs most from those chosen, then by its KV tokens), so that the
    cheap measurement sees each value of each setting before it sees near-copies of one point."""
    chosen: list[dict] = []
    rest = list(kept)
    while rest and len(chosen) < size:
        seen = {(k, json.dumps(c["params"].get(k))) for c in chosen for k in KNOBS}

        def rank(entry: dict) -> tuple:
            new = sum((k, json.dumps(entry["params"].get(k))) not in seen for k in KNOBS)
            apart = min((sum(entry["params"].get(k) != c["params"].get(k) for k in KNOBS) for c in chosen), default=0)
            return (entry["prior"][:2], new, apart, entry["prior"][2:])
        best = max(rest, key=rank)
        rest.remove(best)
        chosen.append(best)
    return chosen


def rung_sizes(fits: int, trials: int) -> list[int]:
    """How many candidates each rung measures: the largest first rung whose halving fits the launches."""
    best = [min(1, fits)]
    for first in range(1, fits + 1):
        sizes = [first]
        while len(sizes) < len(RUNG_PAIRS) and sizes[-1] > 1:
            sizes.append(math.ceil(sizes[-1] / KEEP))
        while len(sizes) < len(RUNG_PAIRS):
            sizes.append(sizes[-1])
        if sum(sizes) <= trials:
            best = sizes
    return best


def meets(figures: dict, goal: dict) -> list[str]:
    """What of the service level a measurement misses (empty: met)."""
    missed = []
    p95 = figures.get("ttft_p95")
    if goal.get("ttft_p95_ms") and (p95 is None or p95 * 1000 > goal["ttft_p95_ms"]):
        missed.append(f"TTFT p95 {'?' if p95 is None else round(p95 * 1000)} ms > {goal['ttft_p95_ms']:g} ms")
    rate = figures.get(FIGURE)
    if goal.get("min_output_tokens_per_s") and (rate is None or rate < goal["min_output_tokens_per_s"]):
        missed.append(f"{'?' if rate is None else round(rate, 1)} output tokens/s < {goal['min_output_tokens_per_s']:g}")
    return missed


def ratio_of(result: dict, figure: str = FIGURE) -> dict:
    """The comparison's interval for ``figure`` (ratio, low, high, pairs, verdict), or {}."""
    return next((c for c in (result.get("comparison") or {}).get("checks", []) if c["figure"] == figure), {})


def score(entry: dict, goal: dict) -> tuple:
    """Larger is better: meeting the service level, then the throughput ratio to the base."""
    measured = entry.get("measured")
    if not measured:
        return (-1, 0.0)
    return (0 if entry["missed"] else 1, float(ratio_of(measured).get("ratio") or 0.0))


def precise(interval: dict) -> bool:
    """Whether a ratio's interval is narrow enough to tell a difference of about a tenth (high / low at most PRECISION)."""
    return bool(interval.get("low")) and interval.get("high") is not None and interval["high"] / interval["low"] <= PRECISION


def trouble(entry: dict) -> list[str]:
    """What SGLang's log of a measured candidate says against it (_sglang_log.trouble: retractions, too
    little memory left for activations)."""
    return _sglang_log.trouble(((entry.get("measured") or {}).get("signals") or {}).get("log") or {})


def ranked(entries, goal: dict) -> list[dict]:
    """Measured candidates, best first: meeting the service level, then those tied with the best (both
    intervals narrow, high / low at most PRECISION, and overlapping) with SGLang's log saying nothing
    against them, then the rest of the tied, then by their ratio. Among candidates the measurements
    cannot tell apart, the one SGLang's guide has no objection to (no retraction, enough memory left)
    goes on; a wide interval ties nothing (two pairs on a noisy host say little either way)."""
    order = sorted(entries, key=lambda e: score(e, goal), reverse=True)
    if not order:
        return order
    best = ratio_of(order[0]["measured"])

    def tied(entry: dict) -> bool:
        mine = ratio_of(entry["measured"])
        return entry["missed"] == order[0]["missed"] and precise(mine) and precise(best) and mine["high"] >= best["low"]
    return sorted(order, key=lambda e: (score(e, goal)[0], tied(e) and not trouble(e), tied(e), score(e, goal)[1]),
                  reverse=True)


class Tune:
    """One tune: screen the grid, measure by successive halving, say the winner and its verdict."""

    def __init__(self, base_name: str, base: dict, goal: dict, space: dict, budget: dict,
                 planner: Callable[[dict], dict], trials: Trials, store: dict | None = None, load: dict | None = None) -> None:
        self.base_name, self.base = base_name, normalise(base)
        self.goal = objective(goal)
        self.space = check_space(space if space is not None else default_space(self.base, self.goal))
        self.budget = check_budget(budget)
        self.planner, self.trials = planner, trials
        self.store = store if store is not None else {}
        self.load = dict({"requests": self.goal["requests"], "concurrency": self.goal["concurrency"],
                          "max_tokens": self.goal["max_tokens"], "timeout": 120, "warmup": True}, **(load or {}))
        self.entries: dict[str, dict] = {}
        self.launches = 0
        self.reused = 0
        self.deaths: list[dict] = []
        self.together = bool(getattr(trials, "together", True))
        self.launches_reference = 0
        self.reference_signals: dict = {}
        self.started = 0.0
        # one slot: the base's rounds, before the candidates ("before") and after them ("after")
        self.reference_rounds: dict[str, list[dict]] = {}

    # -- the parts ------------------------------------------------------------------------------------------

    def _over_time(self, started: float) -> bool:
        return self.trials.time() - started > 60 * float(self.budget["minutes"])

    def _measure(self, entry: dict, pairs: int) -> dict | None:
        """One candidate at one rung: reused from the store, else started, compared with the base, stopped."""
        stored = self.store.get(entry["key"], {}).get(str(pairs))
        if stored is not None:
            self.reused += 1
            self.trials.progress({"event": "reused", "key": entry["key"], "pairs": pairs})
            return stored
        self.launches += 1
        self.trials.progress({"event": "start", "key": entry["key"], "changes": changes(self.base, entry["params"]),
                              "pairs": pairs})
        started = self.trials.start("candidate", entry["params"])
        try:
            if not started.get("ready"):
                died = {"ok": False, "died": True, "cause": started.get("cause"), "seconds": started.get("seconds"),
                        "verdict": started.get("verdict")}
                self.deaths.append({"key": entry["key"], **died})
                self.store.setdefault(entry["key"], {})[str(pairs)] = died
                return died
            if self.together:
                result = self.trials.compare(dict(self.load, rounds=pairs))
                if not result.get("ok") and result.get("side") == "reference":
                    raise ReferenceLost(str(result.get("msg")))
                if result.get("ok") and pairs == RUNG_PAIRS[-1] and result.get("rounds"):
                    result = self._until_precise(result)
                result = {k: result.get(k) for k in ("ok", "figures", "reference", "comparison", "seconds", "msg")}
            else:
                result = self._alone(pairs)
            result.update(start_seconds=started.get("seconds"),
                          signals=dict(started.get("signals") or {}, log=self.trials.signals("candidate")))
            if result.get("ok"):
                self.store.setdefault(entry["key"], {})[str(pairs)] = result
            return result
        finally:
            self.trials.stop("candidate")

    def _until_precise(self, result: dict) -> dict:
        """The last rung's comparison, EXTRA_PAIRS more pairs at a time (no warmup: both are warm), until
        its throughput interval's high / low is at most PRECISION, it holds MAX_PAIRS pairs, or the
        budget's minutes run out; the pairs pooled, the comparison taken over all of them."""
        rounds = {side: list(result["rounds"][side]) for side in ("reference", "candidate")}
        while len(rounds["candidate"]) < MAX_PAIRS and not self._over_time(self.started):
            if precise(ratio_of(result)):
                break
            more = self.trials.compare(dict(self.load, rounds=min(EXTRA_PAIRS, MAX_PAIRS - len(rounds["candidate"])),
                                            warmup=False))
            if not more.get("ok"):
                if more.get("side") == "reference":
                    raise ReferenceLost(str(more.get("msg")))
                break  # the candidate failed the extra rounds: what it measured before stands
            for side in rounds:
                rounds[side] += more["rounds"][side]
            result = dict(result, rounds=rounds, figures=_bench.medians(rounds["candidate"]),
                          reference={"figures": _bench.medians(rounds["reference"])},
                          comparison=_bench.compare_rounds(rounds, paired=True),
                          seconds=round(float(result.get("seconds") or 0) + float(more.get("seconds") or 0), 2))
            self.trials.progress({"event": "more pairs", "pairs": len(rounds["candidate"]),
                                  "ratio": ratio_of(result).get("ratio"), "low": ratio_of(result).get("low"),
                                  "high": ratio_of(result).get("high")})
        return result

    def _alone(self, rounds: int) -> dict:
        """The candidate measured alone in the one slot, compared with the base's rounds so far."""
        result = self.trials.measure("candidate", dict(self.load, rounds=rounds))
        result = {k: result.get(k) for k in ("ok", "figures", "rounds", "seconds", "msg")}
        if result.get("ok"):
            result.update(self._against([r for side in self.reference_rounds.values() for r in side], result["rounds"]))
        return result

    @staticmethod
    def _against(reference: list[dict], candidate: list[dict]) -> dict:
        return {"reference": {"figures": _bench.medians(reference)},
                "comparison": _bench.compare_rounds({"reference": reference, "candidate": candidate}, paired=False)}

    def _reference_alone(self, when: str) -> dict:
        """The base measured alone in the one slot (its rounds kept under ``when``); stopped after."""
        try:
            measured = self.trials.measure("reference", dict(self.load, rounds=REFERENCE_ROUNDS))
            if measured.get("ok"):
                self.reference_signals = self.trials.signals("reference")
        finally:
            self.trials.stop("reference")
        if measured.get("ok"):
            self.reference_rounds[when] = list(measured["rounds"])
        self.trials.progress({"event": "reference", "when": when, "ok": bool(measured.get("ok")),
                              "figure": (measured.get("figures") or {}).get(FIGURE), "msg": measured.get("msg")})
        return measured

    def _after(self) -> str | None:
        """One slot, after the candidates: the base started and measured again, and every measured
        candidate's comparison taken against the base's rounds before and after. Returns a note when
        the base did not serve again (the comparisons stay against its rounds before)."""
        self.launches_reference += 1
        again = self.trials.start("reference", self.base)
        if not again.get("ready"):
            self.trials.stop("reference")
            return f"the base did not start again after the candidates ({again.get('cause')}): ratios are to its rounds before them"
        measured = self._reference_alone("after")
        if not measured.get("ok"):
            return f"the base failed its measurement after the candidates ({measured.get('msg')}): ratios are to its rounds before them"
        pooled = self.reference_rounds["before"] + self.reference_rounds["after"]
        for entry in self.entries.values():
            measured = entry.get("measured") or {}
            if measured.get("ok") and measured.get("rounds"):
                entry["measured"] = dict(measured, **self._against(pooled, measured["rounds"]))
        return None

    def drift(self) -> dict | None:
        """One slot: the base's rounds after the candidates against its rounds before (a host that moved)."""
        if not self.reference_rounds.get("after"):
            return None
        interval = _stats.unpaired_interval([r[FIGURE] for r in self.reference_rounds["before"]],
                                            [r[FIGURE] for r in self.reference_rounds["after"]])
        return dict(interval, figure=FIGURE, verdict=_stats.verdict(interval, True))

    def run(self) -> dict:
        started = self.started = self.trials.time()
        points = grid(self.base, self.space)
        kept, dropped = screen(points, self.planner, self.goal)
        base_key = key_of(self.base)
        base_fits = any(e["key"] == base_key for e in kept)
        candidates = sorted((e for e in kept if e["key"] != base_key), key=lambda e: e["prior"], reverse=True)
        for entry in candidates:
            self.entries[entry["key"]] = dict(entry, measured=None, rung=-1, missed=[])
        self.trials.progress({"event": "planned", "grid": len(points), "dropped": len(dropped), "fit": len(candidates)})
        sizes = rung_sizes(len(candidates), self.budget["trials"])
        self.launches_reference = 1
        reference = self.trials.start("reference", self.base)
        if not reference.get("ready"):
            self.trials.stop("reference")
            return self._result(started, points, dropped, sizes, reference,
                                f"the base {self.base_name} did not start in the trial slot: {reference.get('cause')}")
        if not self.together:
            before = self._reference_alone("before")
            if not before.get("ok"):
                return self._result(started, points, dropped, sizes, reference,
                                    f"the base {self.base_name} did not serve the load alone in the trial slot: {before.get('msg')}")
        stopped_early = None
        try:
            pool = [self.entries[e["key"]] for e in first_rung(candidates, sizes[0])] if sizes and sizes[0] else []
            for rung, pairs in enumerate(RUNG_PAIRS):
                if not pool:
                    break
                for entry in pool:
                    if self._over_time(started):
                        stopped_early = f"the budget of {self.budget['minutes']:g} minutes ran out in rung {rung + 1}"
                        break
                    measured = self._measure(entry, pairs)
                    if measured.get("ok"):
                        missed = meets(measured.get("figures") or {}, self.goal)
                    else:
                        missed = ["died at start" if measured.get("died") else f"failed under load: {measured.get('msg')}"]
                    entry.update(measured=measured, rung=rung, missed=missed)
                    self.trials.progress({"event": "measured", "key": entry["key"], "rung": rung + 1,
                                          "ratio": ratio_of(measured).get("ratio"), "missed": entry["missed"]})
                if stopped_early:
                    break
                alive = ranked((e for e in pool if e["rung"] == rung and (e["measured"] or {}).get("ok")), self.goal)
                if rung + 1 < len(sizes):
                    pool = alive[:sizes[rung + 1]]
                else:
                    pool = []
        except ReferenceLost as exc:
            stopped_early = f"the reference ({self.base_name}) stopped serving, the search ended there: {exc}"
        finally:
            if self.together:
                self.reference_signals = self.trials.signals("reference")
            self.trials.stop("reference")
        if not self.together and any((e.get("measured") or {}).get("ok") for e in self.entries.values()):
            late = self._after()
            stopped_early = "; ".join(x for x in (stopped_early, late) if x) or None
        return self._result(started, points, dropped, sizes, reference, stopped_early, base_fits=base_fits)

    def _result(self, started: float, points: list, dropped: list, sizes: list, reference: dict | None,
                note: str | None, base_fits: bool = True) -> dict:
        measured = [e for e in self.entries.values() if e["measured"]]
        ok = [e for e in measured if (e["measured"] or {}).get("ok")]
        last = max((e["rung"] for e in ok), default=-1)
        finalists = ranked((e for e in ok if e["rung"] == last), self.goal)
        winner = finalists[0] if finalists else None
        verdict, why = "none", note or "no candidate was measured"
        if winner is not None:
            interval = ratio_of(winner["measured"])
            base_missed = meets((winner["measured"].get("reference") or {}).get("figures") or {}, self.goal)
            if winner["missed"]:
                verdict, why = "none", f"no candidate meets the service level (the best: {'; '.join(winner['missed'])})"
            elif interval.get("verdict") == "better":
                verdict = "better"
                why = f"{self._describe(winner)} beats {self.base_name}: {FIGURE} {self._interval(interval)}"
            elif base_missed:
                verdict = "better"
                why = (f"{self._describe(winner)} meets the service level, {self.base_name} does not "
                       f"({'; '.join(base_missed)})")
            else:
                verdict = "none"
                why = (f"nothing beats {self.base_name} beyond noise: the best measured, {self._describe(winner)}, "
                       f"{FIGURE} {self._interval(interval)}")
        if verdict == "better" and winner is not None:
            said = trouble(winner)
            if said:
                why += f"; SGLang's log of it under the load: {'; '.join(said)}"
        return {
            "verdict": verdict, "msg": why, "note": note, "base": self.base_name, "base_fits": base_fits,
            "objective": self.goal, "space": self.space, "budget": self.budget,
            "grid": len(points), "dropped": dropped, "fit": len(self.entries), "rungs": sizes[:len(RUNG_PAIRS)],
            "launches": self.launches, "reused": self.reused, "deaths": self.deaths,
            "trial_slots": 2 if self.together else 1, "reference_starts": self.launches_reference,
            "reference_drift": self.drift(), "reference_signals": self.reference_signals,
            "seconds": round(self.trials.time() - started, 2),
            "reference_start": reference,
            "candidates": [self._public(e) for e in sorted(self.entries.values(), key=lambda e: (-e["rung"], e["key"]))],
            "winner": self._public(winner) if winner is not None and verdict == "better" else None,
            "best": self._public(winner) if winner is not None else None,
        }

    def _describe(self, entry: dict) -> str:
        return ", ".join(f"{k} {v}" for k, v in changes(self.base, entry["params"]).items()) or "the base's settings"

    @staticmethod
    def _interval(interval: dict) -> str:
        if interval.get("ratio") is None:
            return "not measured"
        span = f" [{interval['low']:g}, {interval['high']:g}]" if interval.get("low") is not None else ""
        return f"{interval['ratio']:g}x{span} ({interval.get('verdict')})"

    def _public(self, entry: dict) -> dict:
        measured = entry.get("measured") or {}
        return {"key": entry["key"], "changes": changes(self.base, entry["params"]), "params": entry["params"],
                "plan": entry.get("plan"), "prior": list(entry.get("prior") or []), "rung": entry["rung"] + 1,
                "ok": measured.get("ok"), "died": measured.get("died", False), "cause": measured.get("cause"),
                "start_seconds": measured.get("start_seconds") if measured.get("ok") else measured.get("seconds"),
                "figures": measured.get("figures"), "reference": (measured.get("reference") or {}).get("figures"),
                "served": ((measured.get("signals") or {}).get("server") or None) if measured.get("ok") else None,
                "log": ((measured.get("signals") or {}).get("log") or None) if measured.get("ok") else None,
                "ratio": ratio_of(measured) if measured.get("ok") else None, "missed": entry.get("missed") or []}


def store_key(host: str, model: str, sglang_version: str, build: str | None, base: dict, goal: dict) -> str:
    """What makes a stored measurement reusable: the same host, model, release, build, base settings and load."""
    load = {k: goal[k] for k in ("concurrency", "requests", "max_tokens", "prompt_words")}
    text = json.dumps([host, model, sglang_version, build or "", key_of(normalise(base)), load], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def winner_variant(result: dict, name: str, run: str, provenance: dict) -> dict | None:
    """The winner as a variant table entry: the base inherited, the tuned settings over it, and where it came from."""
    winner = result.get("winner")
    if not winner:
        return None
    ratio = {k: (winner.get("ratio") or {}).get(k) for k in ("figure", "ratio", "low", "high", "pairs", "verdict")}
    entry = {"inherits": result["base"], **winner["changes"],
             "description": f"{result['base']} tuned by run {run}: {FIGURE} {ratio.get('ratio')}x "
                            f"[{ratio.get('low')}, {ratio.get('high')}] of {result['base']}",
             "provenance": dict(provenance, run=run, figures=winner.get("figures"), reference=winner.get("reference"),
                                ratio=ratio, objective=result["objective"])}
    return {name: entry}


# -- the report ------------------------------------------------------------------------------------------------

def _fmt(value, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def markdown(result: dict, run: str, host: str) -> str:
    """The run's report: what was searched, what the planner dropped and why, every measured candidate."""
    goal = result["objective"]
    level = ", ".join(x for x in (f"TTFT p95 <= {goal['ttft_p95_ms']:g} ms" if goal.get("ttft_p95_ms") else "",
                                  f">= {goal['min_output_tokens_per_s']:g} output tokens/s"
                                  if goal.get("min_output_tokens_per_s") else "") if x) or "none (throughput only)"
    lines = [f"# Tune {run} on {host}: around {result['base']}", "",
             f"**{result['verdict'].upper()}**: {result['msg']}", "",
             f"- Load: {goal['concurrency']} at once, {goal['requests']} requests a round, {goal['max_tokens']} output tokens"
             + (f", prompts of about {goal['prompt_words']} words" if goal.get("prompt_words") else ""),
             f"- Service level: {level}" + (f"; context length at least {goal['context_length']}" if goal.get("context_length") else ""),
             f"- Grid {result['grid']} points; dropped by the planner before any launch: {len(result['dropped'])}; "
             f"fit: {result['fit']}; launched {result['launches']} (reused {result['reused']} from earlier runs); "
             f"died at start: {len(result['deaths'])}; {result['seconds']:.0f} s",
             f"- Rungs of the halving: {result['rungs']} candidates, {list(RUNG_PAIRS)[:len(result['rungs'])]} pairs of rounds each"
             f" (the last rung's, side by side, {EXTRA_PAIRS} more at a time until the interval's high / low is at most "
             f"{PRECISION:g}, up to {MAX_PAIRS})"
             + (f"; {result['note']}" if result.get("note") else ""),
             f"- Trials: {_slots_text(result)}", "",
             "## Measured (ratios to the base in interleaved pairs, 95 % interval)", "",
             "KV tokens and running requests: the plan's, then what the started server resolved (/server_info). "
             "SGLang's log: what the server logged under the load (the most of its KV pool in use, requests queued, "
             "retractions; memory left after its pool), and SGLang's tuning guide's reading of it.", "",
             f"The base under the same load, SGLang's log: {_log_text(result.get('reference_signals'))}", "",
             "| rung | changes | tokens/s | ratio | TTFT p95 ms | KV tokens | running | start s | SGLang's log | result |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["candidates"]:
        if c["rung"] == 0:
            continue
        ratio = c.get("ratio") or {}
        span = (f"{ratio.get('ratio')}x [{ratio.get('low')}, {ratio.get('high')}] over {ratio.get('pairs')}"
                if ratio.get("ratio") is not None else "-")
        what = (f"died: {c.get('cause')}" if c.get("died") else "; ".join(c["missed"]) or (ratio.get("verdict") or "measured"))
        plan, served = c.get("plan") or {}, c.get("served") or {}
        tokens = f"{plan.get('max_total_tokens', '-')} / {served.get('max_total_tokens', '-')}"
        running = f"{plan.get('max_running_requests', '-')} / {served.get('max_running_requests', '-')}"
        lines.append(f"| {c['rung']} | {_changes_text(c['changes'])} | {_fmt((c.get('figures') or {}).get(FIGURE))} | {span} | "
                     f"{_fmt((c.get('figures') or {}).get('ttft_p95'), 1000, 0)} | {tokens} | {running} | "
                     f"{_fmt(c.get('start_seconds'))} | {_log_text(c.get('log'))} | {what} |")
    lines += ["", f"## Dropped by the planner ({len(result['dropped'])})", "", "| changes | binds | why |", "|---|---|---|"]
    for d in result["dropped"]:
        searched = {k: d["params"].get(k) for k in KNOBS if k in result["space"]}
        lines.append(f"| {_changes_text(searched)} | {d.get('binding')} | {str(d.get('why')).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _log_text(found: dict | None) -> str:
    """A server's log signals in a table cell: ``usage 0.97, queue 17, 2 retractions, 12.4 GB left: <reading>``."""
    if not found:
        return "-"
    parts = []
    if found.get("token_usage_max") is not None:
        parts.append(f"usage {found['token_usage_max']:.2f}, queue {found.get('queue_max')}")
    if found.get("retractions"):
        parts.append(f"{found['retractions']} retractions")
    if found.get("available_mem_gb") is not None:
        parts.append(f"{found['available_mem_gb']:g} GB {found.get('device')} left")
    text = ", ".join(parts) or "no decode line"
    if found.get("reading"):
        text += ": " + "; ".join(found["reading"])
    return text.replace("|", "/")


def _slots_text(result: dict) -> str:
    """How the trials ran: side by side, or taking turns (the base's drift), and in place (the live service's return)."""
    if result.get("trial_slots", 2) == 2:
        return "the base and each candidate serving at once, in interleaved pairs"
    drift = result.get("reference_drift") or {}
    text = (f"one slot, taking turns: the base alone before and after the candidates ({result.get('reference_starts')} starts), "
            "each ratio Welch's on rounds measured apart; the base after / before: "
            + (Tune._interval(drift) if drift else "not measured again"))
    if result.get("mode") == "in_place":
        restored = result.get("restored") or {}
        text += (f"; in place: the live service {restored.get('unit')} stopped for the tune, serving again "
                 f"(ready in {restored.get('seconds')} s)" if restored.get("ready") else "; in place: the live service was not proven back")
    return text


def _changes_text(found: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in found.items()) or "(the base)"


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other beats on both: lower x (TTFT) and higher y (tokens/s), by x."""
    front = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def svg(result: dict, width: int = 640, height: int = 420) -> str:
    """Throughput against TTFT p95 for every measured candidate (its longest measurement), the base,
    the service level's limits and the Pareto front, as an SVG image."""
    pts = [((c["figures"]["ttft_p95"] or 0) * 1000, c["figures"][FIGURE] or 0, c)
           for c in result["candidates"] if c.get("ok") and c.get("figures")]
    refs = [((c["reference"]["ttft_p95"] or 0) * 1000, c["reference"][FIGURE] or 0) for c in result["candidates"]
            if c.get("ok") and c.get("reference")]
    goal = result["objective"]
    xs = [p[0] for p in pts] + [r[0] for r in refs] + ([goal["ttft_p95_ms"]] if goal.get("ttft_p95_ms") else [])
    ys = [p[1] for p in pts] + [r[1] for r in refs] + ([goal["min_output_tokens_per_s"]] if goal.get("min_output_tokens_per_s") else [])
    left, right, top, bottom = 70, 20, 30, 50
    x_max, y_max = (max(xs) * 1.1 if xs else 1.0), (max(ys) * 1.1 if ys else 1.0)

    def px(x: float) -> float:
        return left + (width - left - right) * x / (x_max or 1)

    def py(y: float) -> float:
        return height - bottom - (height - top - bottom) * y / (y_max or 1)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18">Tune around {result["base"]}: output tokens/s against TTFT p95</text>',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
           f'<text x="{(width + left) / 2:.0f}" y="{height - 12}" text-anchor="middle">TTFT p95 (ms)</text>',
           f'<text x="16" y="{(height) / 2:.0f}" transform="rotate(-90 16 {height / 2:.0f})" text-anchor="middle">output tokens/s</text>']
    for i in range(6):
        xv, yv = x_max * i / 5, y_max * i / 5
        out.append(f'<text x="{px(xv):.1f}" y="{height - bottom + 16}" text-anchor="middle">{xv:.0f}</text>')
        out.append(f'<text x="{left - 6}" y="{py(yv) + 4:.1f}" text-anchor="end">{yv:.0f}</text>')
    if goal.get("ttft_p95_ms"):
        x = px(goal["ttft_p95_ms"])
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="red" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{x + 4:.1f}" y="{top + 12}" fill="red">TTFT p95 limit</text>')
    if goal.get("min_output_tokens_per_s"):
        y = py(goal["min_output_tokens_per_s"])
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="red" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{width - right - 4}" y="{y - 4:.1f}" fill="red" text-anchor="end">tokens/s floor</text>')
    front = pareto([(x, y) for x, y, _c in pts])
    if len(front) > 1:
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in front)
        out.append(f'<polyline points="{path}" fill="none" stroke="green" stroke-width="1.5"/>')
    for x, y in refs:
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="none" stroke="gray"/>')
    winner = (result.get("winner") or {}).get("key")
    for x, y, c in pts:
        colour = "blue" if c["key"] == winner else ("black" if not c["missed"] else "orange")
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{6 if c["key"] == winner else 4}" fill="{colour}">'
                   f'<title>{_changes_text(c["changes"])}</title></circle>')
    out.append(f'<text x="{width - right}" y="{top + 28}" text-anchor="end">blue: winner, black: meets the level, '
               'orange: misses it, gray rings: the base, green: Pareto front</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
