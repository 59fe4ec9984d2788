# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A short load on a serving SGLang server, measured the same way each time,
and the comparison of two such measurements (a new variant against the
known-good service on the same host).

Why a client of our own and not ``sglang.bench_serving``: that one loads a
tokenizer and a dataset (downloaded from the Hub unless given), needs the
server's venv and its heavy imports in the measuring process, and reports
through files and stdout; the gate needs a few seconds of fixed prompts on
the loopback, bounded in time and memory, with no download, from a module.

One sample is one streamed ``POST /generate`` (``stream: true``): real SGLang
answers ``data: <json>`` lines, each with the cumulative
``meta_info.completion_tokens``, then ``data: [DONE]`` (0.5.11
srt/entrypoints/http_server.py:708-726). From the arrival times: the time to
the first token (TTFT), the inter-token latency (ITL: each step's time over the
tokens it added, so a speculative step of 3 tokens counts as 3; lines that
arrive in one read share a time, so a fast server's ITL can read 0), the time
per output token after the first (TPOT: the request's decode time over its
tokens less one, which no batching of lines hides), the tokens,
and the speculative accept length from the last ``meta_info``
(``spec_accept_length``; absent without speculative decoding). A round is N
requests at concurrency C; its output tokens/s are all its tokens over its wall
time. A warmup round is not counted; the median of the rounds is the figure.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time

try:
    from ansible_collections.inferops.sglang.plugins.module_utils import _stats
except ImportError:  # loaded from the tree (tools/, lab/bench/: _variants imports this file by its name)
    import _stats  # type: ignore[no-redef]

PROMPTS = (
    "Explain in plain words how a hash table handles collisions.",
    "Write a short story about a lighthouse keeper who finds a map.",
    "List the steps to make bread at home, with the reason for each.",
    "Describe the water cycle to a ten year old.",
    "Summarise the causes and effects of the industrial revolution.",
    "Compare two ways of sorting a list and say when each is faster.",
    "Write a polite email asking a colleague to review a document.",
    "What should a traveller pack for a week of hiking in the rain?",
)
FIGURES = ("output_tokens_per_s", "ttft_p50", "ttft_p95", "tpot_p50", "itl_p50", "accept_length")
# Per figure: which way is better, and the default limit on new / known-good.
THRESHOLDS = {"output_tokens_per_s": ("min", 0.90), "ttft_p95": ("max", 1.20), "accept_length": ("min", 0.90)}
# Seconds by which a latency may grow whatever its ratio: the p95 of a short load's first
# tokens is nearly its slowest request, which one scheduling hiccup of a busy host moves by
# tens of milliseconds (measured on the lab: 0.114 s -> 0.157 s for the same server speed).
SLACK = {"ttft_p95": 0.05}


class BenchError(Exception):
    """A benchmark setting out of range."""


def defaults(max_running_requests: int | None, context_length: int | None) -> dict:
    """The load for a variant: concurrency up to its running-request limit (at most 8), two
    requests per slot, and an output that fits a quarter of its context (at most 128 tokens)."""
    concurrency = max(1, min(8, int(max_running_requests or 8)))
    max_tokens = max(8, min(128, int(context_length or 4096) // 4))
    return {"concurrency": concurrency, "requests": 2 * concurrency, "max_tokens": max_tokens}


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile (``share`` in (0, 1]) of ``values``, None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))
    return ordered[int(rank) - 1]


def parse(started: float, events: list[tuple[float, bytes]], max_tokens: int) -> dict:
    """One streamed generation's figures from its events (arrival time, ``data:`` payload). A count
    beyond ``max_tokens``, what the request asked for, is the server's error, not a figure (one
    event claiming millions of tokens would otherwise build a list that long)."""
    points: list[tuple[float, int]] = []
    meta: dict = {}
    for arrived, payload in events:
        try:
            data = json.loads(payload)
        except ValueError:
            return {"ok": False, "error": f"not JSON in the stream: {payload[:120]!r}"}
        if not isinstance(data, dict):
            return {"ok": False, "error": f"not an object in the stream: {payload[:120]!r}"}
        if "error" in data:
            return {"ok": False, "error": f"the server's error: {str(data['error'])[:200]}"}
        info = data.get("meta_info") if isinstance(data.get("meta_info"), dict) else {}
        tokens = info.get("completion_tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            if not 0 <= tokens <= max_tokens:
                return {"ok": False, "error": f"the stream claims {tokens} completion tokens, the request asked for "
                                              f"at most {max_tokens}"}
            points.append((arrived, tokens))
            meta = info
    produced = [(t, n) for t, n in points if n >= 1]
    if not produced:
        return {"ok": False, "error": "the stream ended without a token"}
    itl = []
    for (t0, n0), (t1, n1) in zip(produced, produced[1:]):
        if n1 > n0:
            itl.extend([(t1 - t0) / (n1 - n0)] * (n1 - n0))
    accept = meta.get("spec_accept_length")
    tokens = produced[-1][1]
    tpot = (produced[-1][0] - produced[0][0]) / (tokens - 1) if tokens > 1 else None
    return {"ok": True, "ttft": produced[0][0] - started, "itl": itl, "tpot": tpot, "tokens": tokens,
            "e2e": produced[-1][0] - started,
            "accept_length": float(accept) if isinstance(accept, (int, float)) and not isinstance(accept, bool) else None}


def sample(client, prompt: str, max_tokens: int, timeout: float) -> dict:
    """One streamed generation of ``max_tokens`` tokens (greedy, the end-of-sequence ignored)."""
    started = time.monotonic()
    response, events = client.stream("/generate", {
        "text": prompt, "stream": True,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}, timeout)
    if response.kind != "ok":
        return {"ok": False, "error": f"POST /generate: {response.describe()}"}
    return parse(started, events, max_tokens)


def run_round(client, requests: int, concurrency: int, max_tokens: int, timeout: float, offset: int = 0) -> dict:
    """``requests`` generations, ``concurrency`` at a time; the round's figures."""
    results: list[dict] = [{} for _index in range(requests)]
    lock = threading.Lock()
    queue = list(range(requests))

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                index = queue.pop(0)
            results[index] = sample(client, PROMPTS[(offset + index) % len(PROMPTS)], max_tokens, timeout)

    started = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _slot in range(min(concurrency, requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5)
    wall = time.monotonic() - started
    good = [r for r in results if r.get("ok")]
    errors = [r.get("error", "no answer") for r in results if not r.get("ok")]
    accepts = [r["accept_length"] for r in good if r["accept_length"] is not None]
    ttfts = [r["ttft"] for r in good]
    return {
        "requests": requests, "concurrency": concurrency, "max_tokens": max_tokens, "wall": round(wall, 3),
        "completed": len(good), "errors": errors[:3], "error_count": len(errors),
        "output_tokens_per_s": round(sum(r["tokens"] for r in good) / wall, 2) if good and wall > 0 else None,
        "ttft_p50": _round(percentile(ttfts, 0.5)), "ttft_p95": _round(percentile(ttfts, 0.95)),
        "tpot_p50": _round(percentile([r["tpot"] for r in good if r["tpot"] is not None], 0.5)),
        "itl_p50": _round(percentile([x for r in good for x in r["itl"]], 0.5)),
        "accept_length": round(statistics.mean(accepts), 3) if accepts else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def benchmark(client, requests: int, concurrency: int, max_tokens: int, rounds: int = 3, warmup: bool = True,
              timeout: float = 60, budget: float | None = None) -> dict:
    """A warmup round (not counted), then ``rounds`` rounds; each figure is the median of the rounds.
    With ``budget`` (seconds), a round that would end past it (judged by the round before) is not
    started: at least one round is measured, and the result says how many were. Any failed request
    fails the measurement: a server that cannot serve the load is not measured."""
    for name, value, low in (("requests", requests, 1), ("concurrency", concurrency, 1), ("max_tokens", max_tokens, 1),
                             ("rounds", rounds, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise BenchError(f"{name} must be an integer >= {low}, got {value!r}")
    started = time.monotonic()
    if warmup:
        first = run_round(client, min(concurrency, requests), concurrency, max_tokens, timeout)
        if first["error_count"]:
            return _failed(first, started, "the warmup round")
    measured: list[dict] = []
    for index in range(rounds):
        if budget and measured and time.monotonic() - started + measured[-1]["wall"] > budget:
            break
        result = run_round(client, requests, concurrency, max_tokens, timeout, offset=index)
        if result["error_count"]:
            return _failed(result, started, f"round {index + 1}")
        measured.append(result)
    figures = medians(measured)
    return {"ok": True, "figures": figures, "rounds": measured, "seconds": round(time.monotonic() - started, 2),
            "load": {"requests": requests, "concurrency": concurrency, "max_tokens": max_tokens, "rounds": rounds,
                     "warmup": warmup, "budget": budget, "rounds_measured": len(measured)},
            "msg": _describe(figures)}


def _failed(result: dict, started: float, which: str) -> dict:
    return {"ok": False, "figures": None, "rounds": [result], "seconds": round(time.monotonic() - started, 2),
            "msg": f"{which} failed: {result['error_count']} of {result['requests']} requests ({'; '.join(result['errors'])})"}


def _describe(figures: dict) -> str:
    parts = [f"{figures.get('output_tokens_per_s')} output tokens/s",
             f"TTFT p50 {_ms(figures.get('ttft_p50'))} p95 {_ms(figures.get('ttft_p95'))}",
             f"TPOT p50 {_ms(figures.get('tpot_p50'))}", f"ITL p50 {_ms(figures.get('itl_p50'))}"]
    if figures.get("accept_length") is not None:
        parts.append(f"accept length {figures['accept_length']}")
    return ", ".join(parts)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def check_thresholds(thresholds: object, what: str = "thresholds") -> list[str]:
    """Every problem of a thresholds dict (figure -> ratio > 0), named with ``what``."""
    if not isinstance(thresholds, dict):
        return [f"{what} must be a dict of figure: ratio, got {thresholds!r}"]
    errors = []
    for name, value in thresholds.items():
        if name not in THRESHOLDS:
            errors.append(f"{what}: unknown figure {name} (known: {', '.join(THRESHOLDS)})")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 100:
            errors.append(f"{what}.{name} must be a ratio in (0, 100), got {value!r}")
    return errors


def compare(figures: dict, baseline: dict | None, thresholds: dict | None = None) -> dict:
    """The new figures against the known-good's, figure by figure: ``{passed, checks, msg}``. A figure
    either side lacks (no speculative decoding: no accept length) is not compared."""
    errors = check_thresholds(thresholds or {})
    if errors:
        raise BenchError("; ".join(errors))
    limits = {name: THRESHOLDS[name][1] for name in THRESHOLDS}
    limits.update({name: float(value) for name, value in (thresholds or {}).items()})
    if not baseline:
        return {"passed": True, "checks": [], "msg": "no known-good figures to compare with"}
    checks = []
    for name, (way, _default) in THRESHOLDS.items():
        new, old = figures.get(name), baseline.get(name)
        if new is None or old is None or old <= 0:
            continue
        ratio = round(new / old, 3)
        ok = ratio >= limits[name] if way == "min" else (ratio <= limits[name] or new - old <= SLACK.get(name, 0))
        checks.append({"figure": name, "new": new, "known_good": old, "ratio": ratio,
                       "limit": f"{'>=' if way == 'min' else '<='} {limits[name]:g}x"
                                + (f" or +{SLACK[name]:g} s" if name in SLACK else ""), "ok": ok})
    failed = [c for c in checks if not c["ok"]]
    text = "; ".join(f"{c['figure']} {c['new']} vs {c['known_good']} ({c['ratio']:g}x, limit {c['limit']})"
                     for c in (failed or checks))
    return {"passed": not failed, "checks": checks,
            "msg": ("slower than the known-good service: " if failed else "as fast as the known-good service: ") + text}


def medians(rounds: list[dict]) -> dict:
    """Each figure's median over the rounds that have it (None where none has)."""
    figures = {}
    for name in FIGURES:
        values = [r[name] for r in rounds if r[name] is not None]
        figures[name] = round(statistics.median(values), 4) if values else None
    return figures


def interleaved(reference, candidate, load: dict, thresholds: dict | None = None) -> dict:
    """The candidate against the reference, both serving on this host now (two slots): a warmup round
    each, then ``load["rounds"]`` pairs of rounds (at least two), their order alternating (_stats.order),
    within ``load["budget"]`` for both sides (at least two pairs). The figures are each side's medians;
    each figure's comparison is the pairs' ratio with its 95 % interval (_stats), and a figure fails
    its limit only when the whole interval is past it (or, for TTFT p95, past it by more than its
    slack): noise alone does not fail a candidate. Any failed request fails the measurement of that
    side. The result has what ``measure`` returns, with ``reference`` (the reference's figures)."""
    errors = check_thresholds(thresholds or {})
    if errors:
        raise BenchError("; ".join(errors))
    clients = {"reference": reference, "candidate": candidate}
    requests, concurrency, max_tokens, timeout = (load["requests"], load["concurrency"], load["max_tokens"],
                                                  load["timeout"])
    started = time.monotonic()
    if load.get("warmup", True):
        for side, client in clients.items():
            first = run_round(client, min(concurrency, requests), concurrency, max_tokens, timeout)
            if first["error_count"]:
                return dict(_failed(first, started, f"the {side}'s warmup round"), passed=False, side=side)
    rounds: dict[str, list[dict]] = {"reference": [], "candidate": []}
    budget = load.get("budget")
    for index, sides in enumerate(_stats.order(max(2, int(load.get("rounds") or 2)))):
        last = [rounds[s][-1]["wall"] for s in sides if rounds[s]]
        if budget and index >= 2 and time.monotonic() - started + sum(last) > 2 * budget:
            break
        for side in sides:
            result = run_round(clients[side], requests, concurrency, max_tokens, timeout, offset=index)
            if result["error_count"]:
                return dict(_failed(result, started, f"the {side}'s round {index + 1}"), passed=False, side=side)
            rounds[side].append(result)
    comparison = compare_rounds(rounds, thresholds, paired=True)
    figures = {side: medians(rs) for side, rs in rounds.items()}
    return {"ok": True, "figures": figures["candidate"], "reference": {"figures": figures["reference"]},
            "rounds": rounds, "seconds": round(time.monotonic() - started, 2),
            "load": {"requests": requests, "concurrency": concurrency, "max_tokens": max_tokens,
                     "rounds": load.get("rounds"), "warmup": load.get("warmup", True), "budget": budget,
                     "rounds_measured": len(rounds["candidate"]), "interleaved": True},
            "passed": comparison["passed"], "comparison": comparison,
            "msg": f"{_describe(figures['candidate'])}; {comparison['msg']}"}


def compare_rounds(rounds: dict, thresholds: dict | None = None, paired: bool = True) -> dict:
    """Each figure of ``rounds["candidate"]`` against ``rounds["reference"]``: its ratio with a 95 %
    interval (``paired``: the i-th rounds of each side measured together, _stats.ratio_interval;
    otherwise measured apart, _stats.unpaired_interval) and its verdict; a figure fails its limit only
    when the whole interval is past it (or, for TTFT p95, past it by more than its slack)."""
    figures = {side: medians(rs) for side, rs in rounds.items()}
    limits = {name: THRESHOLDS[name][1] for name in THRESHOLDS}
    limits.update({name: float(value) for name, value in (thresholds or {}).items()})
    interval_of = _stats.ratio_interval if paired else _stats.unpaired_interval
    checks = []
    for name, (way, _default) in THRESHOLDS.items():
        higher = way == "min"
        interval = interval_of([r[name] for r in rounds["reference"]], [r[name] for r in rounds["candidate"]])
        if interval["ratio"] is None:
            continue
        new, old = figures["candidate"][name], figures["reference"][name]
        ok = not _stats.beyond_limit(interval, limits[name], higher) or (
            not higher and new is not None and old is not None and new - old <= SLACK.get(name, 0))
        checks.append({"figure": name, "new": new, "known_good": old, "ratio": interval["ratio"],
                       "low": interval["low"], "high": interval["high"], "pairs": interval["pairs"],
                       "verdict": _stats.verdict(interval, higher),
                       "limit": f"{'>=' if higher else '<='} {limits[name]:g}x beyond noise"
                                + (f" or +{SLACK[name]:g} s" if name in SLACK else ""), "ok": ok})
    failed = [c for c in checks if not c["ok"]]
    text = "; ".join(_stats.describe(c["figure"], c, c["figure"] != "ttft_p95") + f" (limit {c['limit']})"
                     for c in (failed or checks))
    return {"passed": not failed, "checks": checks, "method": "interleaved" if paired else "apart",
            "msg": ("slower than the live service beyond noise: " if failed
                    else "not slower than the live service beyond noise: ") + text}


# The deploy's performance gate (the perf state of _switch.py).
# enforce: a regression fails the gate and the switch rolls back; report: measured,
# compared and recorded, never rolled back; off: nothing is measured.
MODES = ("enforce", "report", "off")
# Seconds one measurement may take (rounds after the first are skipped past it): a switch
# measures the new variant, and the known-good one when the history has no figures of it.
BUDGET = 30
# What makes two measurements comparable: the same load. Rounds, warmup and the
# request timeout change how well a figure is measured, not what it measures.
LOAD_KEYS = ("requests", "concurrency", "max_tokens")
LOAD_SETTINGS = {"requests": 1, "concurrency": 1, "max_tokens": 1, "rounds": 1, "warmup": None, "timeout": 1, "budget": 1}
# What identifies the service that was measured: the same command line of the same
# release on the same GPUs (a record's argv, sglang_version, gpu_devices).
SERVICE_KEYS = ("argv", "sglang_version", "gpu_devices")


def measure(client, load: dict, baseline: dict | None, thresholds: dict) -> dict:
    """One measurement under ``load`` compared with ``baseline``: the benchmark's result with
    ``passed`` and ``comparison`` (what the sglang_bench module and the switch's gate return).
    BenchError when it cannot run."""
    result = benchmark(client, load["requests"], load["concurrency"], load["max_tokens"], load["rounds"],
                       load["warmup"], load["timeout"], load["budget"])
    if not result["ok"]:
        return dict(result, passed=False)
    comparison = compare(result["figures"], baseline, thresholds)
    result["msg"] = f"{result['msg']}; {comparison['msg']}"
    return dict(result, passed=comparison["passed"], comparison=comparison)


def check_load(load: object, what: str = "load") -> list[str]:
    """Every problem of a load override: requests, concurrency, max_tokens, rounds (integers >= 1),
    warmup (bool), timeout and budget (finite seconds > 0)."""
    if not isinstance(load, dict):
        return [f"{what} must be a dict, got {load!r}"]
    errors = []
    for name, value in load.items():
        if name not in LOAD_SETTINGS:
            errors.append(f"{what}: unknown setting {name} (known: {', '.join(LOAD_SETTINGS)})")
        elif name == "warmup":
            if not isinstance(value, bool):
                errors.append(f"{what}.warmup must be true or false, got {value!r}")
        elif name in ("timeout", "budget"):
            # nan and inf are floats too: a gate that never times out, or a benchmark that fails
            # only after the service was switched
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                errors.append(f"{what}.{name} must be a finite number of seconds > 0, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
            errors.append(f"{what}.{name} must be an integer in [1, 4096], got {value!r}")
    return errors


def compose_load(max_running_requests: int | None, context_length: int | None, override: dict | None = None) -> dict:
    """The variant's default load with ``override`` laid over it, unchecked: requests follow an
    overridden concurrency unless given too."""
    load = dict(defaults(max_running_requests, context_length), rounds=3, warmup=True, timeout=60, budget=BUDGET)
    load.update(override or {})
    if "requests" not in (override or {}):
        load["requests"] = 2 * load["concurrency"]
    return load


def plan_load(max_running_requests: int | None, context_length: int | None, override: dict | None = None) -> dict:
    """This run's load: the operator's override checked (check_load), then composed (compose_load)."""
    errors = check_load(override or {})
    if errors:
        raise BenchError("; ".join(errors))
    return compose_load(max_running_requests, context_length, override)


def same_load(one: dict | None, other: dict | None) -> bool:
    return bool(one) and bool(other) and all(one.get(k) == other.get(k) for k in LOAD_KEYS)


def _measurements(rec: dict):
    """The measurements of a serving service a history record holds: the switched variant's
    (its own argv) and the known-good's measured before its stop."""
    perf = rec.get("performance") or {}
    if rec.get("outcome") == "switched" and perf.get("measured_ok"):
        yield {"variant": rec.get("variant"), "time": rec.get("time"), "figures": perf["figures"],
               "load": perf.get("load"), **{k: rec.get(k) for k in SERVICE_KEYS}}
    known = perf.get("known_good") or {}
    if known.get("source") == "measured" and known.get("figures"):
        yield {k: known.get(k) for k in ("variant", "time", "figures", "load", *SERVICE_KEYS)}


def known_good(records: list[dict], service: dict, load: dict) -> dict | None:
    """The newest figures of ``service`` (argv, sglang_version, gpu_devices; a service with no
    recorded argv has none) measured under the same load, from history records oldest first."""
    if not service or not service.get("argv"):
        return None
    for rec in reversed(records):
        if not isinstance(rec, dict):
            continue
        for found in _measurements(rec):
            if all(found.get(k) == service.get(k) for k in SERVICE_KEYS) and same_load(found.get("load"), load):
                return dict(found, source="history")
    return None


PERF_KEYS = ("mode", "enforced", "measured_ok", "passed", "figures", "load", "seconds", "comparison", "known_good",
             "msg")


def gate_record(mode: str, result: dict | None, known: dict | None, why_report: str | None = None) -> dict | None:
    """What the deploy record keeps of the performance gate: the mode, the figures, the
    comparison with the known-good service's figures (and where those came from)."""
    if mode == "off" or not (result or known):
        return None
    result = result or {"msg": "the variant did not get to the performance gate"}
    measured_ok = bool(result.get("figures"))
    comparison = result.get("comparison") or {}
    known = {k: known.get(k) for k in ("variant", "source", "time", "figures", "load", "seconds", "error",
                                       *SERVICE_KEYS)} if known else None
    if not measured_ok:
        msg = f"not measured: {result.get('msg', 'no result')}"
    elif not comparison.get("checks"):
        why = (known or {}).get("error") or "no known-good figures under this load"
        # the figures alone: the measurement's own msg already says it had nothing to compare with
        msg = f"{_describe(result['figures'])}; not compared ({why}): these figures are the next switch's baseline"
    else:
        msg = result.get("msg")
    if why_report:
        msg += f" (reported only: {why_report})"
    return {"mode": mode, "enforced": mode == "enforce", "measured_ok": measured_ok,
            "passed": bool(result.get("passed")), "figures": result.get("figures"), "load": result.get("load"),
            "seconds": result.get("seconds"),
            "comparison": {"checks": comparison.get("checks", []), "msg": comparison.get("msg", "")} if comparison else None,
            "known_good": known, "msg": msg}
