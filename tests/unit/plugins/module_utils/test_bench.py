"""_bench: a streamed generation's figures, a round, the median of rounds, and the
comparison with the known-good figures; on scripted streams (the lines real
SGLang sends: 0.5.11 srt/entrypoints/http_server.py:708-726) and on the lab's
simulator (a real HTTP server)."""

from __future__ import annotations

import json

import pytest
from sim_helpers import MODEL, NEXTN

from ansible_collections.inferops.sglang.plugins.module_utils import _bench
from ansible_collections.inferops.sglang.plugins.module_utils._http import Client


def event(at: float, tokens: int, **meta) -> tuple[float, bytes]:
    return at, json.dumps({"text": "x" * tokens, "meta_info": {"completion_tokens": tokens, **meta}}).encode()


def test_a_stream_gives_ttft_itl_tokens_and_accept_length():
    # the first token 0.5 s after the request, then speculative steps of 3 tokens every 60 ms
    events = [event(10.5, 1), event(10.56, 4), event(10.62, 7, spec_accept_length=2.9)]
    got = _bench.parse(10.0, events, 7)
    assert got["ok"] and got["tokens"] == 7 and got["ttft"] == pytest.approx(0.5)
    assert got["itl"] == pytest.approx([0.02] * 6) and got["accept_length"] == 2.9
    assert got["e2e"] == pytest.approx(0.62) and got["tpot"] == pytest.approx(0.02)


@pytest.mark.parametrize("events, error", [
    ([], "the stream ended without a token"),
    ([(1.0, b"{not json")], "not JSON in the stream"),
    ([(1.0, b'{"error": {"message": "The input is too long"}}')], "the server's error: {'message': 'The input is too long'}"),
    ([event(1.0, 0)], "the stream ended without a token"),
    # issue 29: one event claiming 50 million tokens built a 774 MiB list of intervals
    ([event(1.0, 1), (1.1, json.dumps({"meta_info": {"completion_tokens": 50_000_000}}).encode())],
     "the stream claims 50000000 completion tokens, the request asked for at most 16"),
    ([event(1.0, 1), (1.1, json.dumps({"meta_info": {"completion_tokens": -3}}).encode())],
     "the stream claims -3 completion tokens"),
])
def test_a_broken_stream_is_an_error(events, error):
    got = _bench.parse(0.0, events, 16)
    assert got["ok"] is False and got["error"].startswith(error)


def test_percentile_is_nearest_rank():
    assert _bench.percentile([5, 1, 4, 2, 3], 0.5) == 3
    assert _bench.percentile(list(range(1, 101)), 0.95) == 95
    assert _bench.percentile([7], 0.95) == 7 and _bench.percentile([], 0.5) is None


def test_the_default_load_follows_the_variant():
    assert _bench.defaults(48, 262144) == {"concurrency": 8, "requests": 16, "max_tokens": 128}
    assert _bench.defaults(2, 1024) == {"concurrency": 2, "requests": 4, "max_tokens": 128}
    assert _bench.defaults(None, 64) == {"concurrency": 8, "requests": 16, "max_tokens": 16}


BASE = {"output_tokens_per_s": 1000.0, "ttft_p50": 0.1, "ttft_p95": 0.2, "itl_p50": 0.01, "accept_length": 3.0}


def test_a_variant_as_fast_as_the_known_good_passes():
    result = _bench.compare(dict(BASE, output_tokens_per_s=1240.0), BASE)
    assert result["passed"] and result["msg"].startswith("as fast as the known-good service: ")
    assert [c["figure"] for c in result["checks"]] == ["output_tokens_per_s", "ttft_p95", "accept_length"]
    assert result["checks"][0]["ratio"] == 1.24


@pytest.mark.parametrize("change, figure", [
    ({"output_tokens_per_s": 890.0}, "output_tokens_per_s"),   # 0.89x < 0.90x
    ({"ttft_p95": 0.26}, "ttft_p95"),                          # 1.30x > 1.20x, and 60 ms more
    ({"accept_length": 1.0}, "accept_length"),                 # accept length fell to 1.0
])
def test_a_regression_fails_with_the_figure_named(change, figure):
    result = _bench.compare(dict(BASE, **change), BASE)
    assert not result["passed"] and [c["figure"] for c in result["checks"] if not c["ok"]] == [figure]
    assert result["msg"].startswith(f"slower than the known-good service: {figure} ")


def test_a_first_token_a_few_tens_of_ms_later_is_noise_not_a_regression():
    # 3x, but 40 ms: within the slack a busy host's scheduling gives a short load's slowest request
    result = _bench.compare(dict(BASE, ttft_p95=0.06), dict(BASE, ttft_p95=0.02))
    assert result["passed"] and result["checks"][1]["limit"] == "<= 1.2x or +0.05 s"
    assert not _bench.compare(dict(BASE, ttft_p95=0.071), dict(BASE, ttft_p95=0.02))["passed"]


def test_thresholds_are_per_variant_and_checked():
    assert _bench.compare(dict(BASE, output_tokens_per_s=890.0), BASE, {"output_tokens_per_s": 0.85})["passed"]
    with pytest.raises(_bench.BenchError, match="thresholds: unknown figure itl"):
        _bench.compare(BASE, BASE, {"itl": 1.1})
    with pytest.raises(_bench.BenchError, match=r"thresholds.ttft_p95 must be a ratio in \(0, 100\), got 0"):
        _bench.compare(BASE, BASE, {"ttft_p95": 0})


def test_no_baseline_or_a_missing_figure_is_not_compared():
    assert _bench.compare(BASE, None) == {"passed": True, "checks": [], "msg": "no known-good figures to compare with"}
    result = _bench.compare(dict(BASE, accept_length=None), BASE)  # no speculative decoding on one side
    assert result["passed"] and "accept_length" not in [c["figure"] for c in result["checks"]]


def test_the_simulator_is_measured_with_its_accept_length(launch):
    server = launch([*MODEL, *NEXTN, "--api-key", "bench-key"], version="0.5.11", host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, timeout=120, what="health")
    client = Client(f"http://127.0.0.1:{server.port}", "bench-key", True, 30)
    result = _bench.benchmark(client, requests=4, concurrency=2, max_tokens=32, rounds=2)
    assert result["ok"], result
    figures = result["figures"]
    assert figures["accept_length"] == 2.71  # the simulator's NEXTN
    assert figures["output_tokens_per_s"] > 0 and 0 < figures["ttft_p50"] <= figures["ttft_p95"] and figures["itl_p50"] > 0
    assert figures["tpot_p50"] > 0
    assert [r["completed"] for r in result["rounds"]] == [4, 4]
    assert result["msg"].startswith(f"{figures['output_tokens_per_s']} output tokens/s, TTFT p50 ")
    # a wrong key fails the measurement, with the server's answer
    failed = _bench.benchmark(Client(f"http://127.0.0.1:{server.port}", "wrong", True, 30), 2, 2, 8, rounds=1)
    assert failed["ok"] is False and failed["msg"].startswith("the warmup round failed: 2 of 2 requests (POST /generate: HTTP 401")


def test_the_module_measures_and_compares(launch, capsys, tmp_path):
    from sim_helpers import run_module

    from ansible_collections.inferops.sglang.plugins.modules import sglang_bench

    server = launch([*MODEL, *NEXTN, "--api-key", "bench-key"], version="0.5.23", host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, timeout=120, what="health")
    config = tmp_path / "sglang-qwen.yaml"
    config.write_text('api-key: "bench-key"\n')
    args = {"url": f"http://127.0.0.1:{server.port}", "api_key_file": str(config), "max_running_requests": 2,
            "context_length": 128, "rounds": 1}
    rc, result, _out = run_module(sglang_bench.main, capsys, args)
    assert rc == 0 and result["passed"] is True, result
    assert result["load"] == {"requests": 4, "concurrency": 2, "max_tokens": 32, "rounds": 1, "warmup": True,
                              "budget": None, "rounds_measured": 1}
    assert "bench-key" not in json.dumps(result)
    # the same server against figures ten times as fast (a margin no noise of a shared machine closes): a regression, named
    faster = dict(result["figures"], output_tokens_per_s=10 * result["figures"]["output_tokens_per_s"])
    rc, result, _out = run_module(sglang_bench.main, capsys, dict(args, baseline=faster))
    assert rc == 0 and result["passed"] is False
    assert "slower than the known-good service: output_tokens_per_s" in result["msg"]
    rc, result, _out = run_module(sglang_bench.main, capsys, dict(args, thresholds={"itl": 2}))
    assert rc == 1 and result["msg"].startswith("thresholds: unknown figure itl")
    # one interface: the deploy's whole-load form is gone (the switch measures in-process)
    rc, result, _out = run_module(sglang_bench.main, capsys, dict(args, load={"rounds": 1}))
    assert rc == 1 and "load" in result["msg"] and "Unsupported parameters" in result["msg"], result


# -- the deploy's performance gate: the load, the known-good figures in the history, the record

def test_the_load_is_the_variants_with_the_operators_override():
    assert _bench.plan_load(16, 131072) == {"concurrency": 8, "requests": 16, "max_tokens": 128, "rounds": 3,
                                            "warmup": True, "timeout": 60, "budget": 30}
    # an overridden concurrency brings its requests along, unless they are given too
    assert _bench.plan_load(16, 131072, {"concurrency": 2})["requests"] == 4
    assert _bench.plan_load(16, 131072, {"concurrency": 2, "requests": 9})["requests"] == 9
    with pytest.raises(_bench.BenchError, match=r"load.rounds must be an integer in \[1, 4096\], got 0"):
        _bench.plan_load(16, 131072, {"rounds": 0})


@pytest.mark.parametrize("load, error", [
    ([], "load must be a dict"),
    ({"users": 3}, "load: unknown setting users"),
    ({"concurrency": "8"}, "load.concurrency must be an integer in [1, 4096], got '8'"),
    ({"max_tokens": True}, "load.max_tokens must be an integer"),
    ({"warmup": "yes"}, "load.warmup must be true or false"),
    ({"timeout": 0}, "load.timeout must be a finite number of seconds > 0"),
    # YAML's .nan and .inf are floats: they passed, and the benchmark then failed after the switch
    ({"timeout": float("nan")}, "load.timeout must be a finite number of seconds > 0, got nan"),
    ({"budget": float("inf")}, "load.budget must be a finite number of seconds > 0, got inf"),
])
def test_a_bad_load_is_named(load, error):
    assert _bench.check_load(load)[0].startswith(error)


@pytest.mark.parametrize("thresholds, error", [
    ({"speed": 1.0}, "t: unknown figure speed"),
    ({"ttft_p95": 0}, "t.ttft_p95 must be a ratio in (0, 100), got 0"),
    ({"accept_length": "0.9"}, "t.accept_length must be a ratio"),
    ("0.9", "t must be a dict of figure: ratio"),
])
def test_bad_thresholds_are_named(thresholds, error):
    assert _bench.check_thresholds(thresholds, "t")[0].startswith(error)


SERVICE = {"argv": ["--model-path", "/m", "--speculative-algorithm", "NEXTN"], "sglang_version": "0.5.11",
           "gpu_devices": [0, 1]}
LOAD = _bench.plan_load(16, 131072)


def perf(figures, load=None, known=None, measured_ok=True):
    return {"figures": figures, "load": load or LOAD, "measured_ok": measured_ok, "known_good": known}


def test_the_known_good_figures_are_the_newest_of_the_same_service_under_the_same_load():
    old = dict(SERVICE, outcome="switched", variant="nextn", time="t1", performance=perf({"output_tokens_per_s": 1.0}))
    new = dict(old, time="t2", performance=perf({"output_tokens_per_s": 2.0}))
    other_load = dict(old, time="t3", performance=perf({"output_tokens_per_s": 3.0}, load=dict(LOAD, concurrency=4)))
    rolled_back = dict(old, time="t4", outcome="rolled_back", performance=perf({"output_tokens_per_s": 4.0}))
    other_gpus = dict(old, time="t5", gpu_devices=[2, 3], performance=perf({"output_tokens_per_s": 5.0}))
    found = _bench.known_good([old, new, other_load, rolled_back, other_gpus, "not a record"], SERVICE, LOAD)
    assert found["figures"] == {"output_tokens_per_s": 2.0} and found["time"] == "t2" and found["source"] == "history"
    # rounds and warmup do not change what a figure measures; the load's size does
    assert _bench.known_good([new], SERVICE, dict(LOAD, rounds=5, warmup=False))["time"] == "t2"
    assert _bench.known_good([new], SERVICE, dict(LOAD, max_tokens=64)) is None
    # another release of the same command line is another service; so is an unrecorded one
    assert _bench.known_good([new], dict(SERVICE, sglang_version="0.5.23"), LOAD) is None
    assert _bench.known_good([new], dict(SERVICE, argv=None), LOAD) is None


def test_a_known_good_measured_before_its_stop_counts_even_when_the_switch_rolled_back():
    measured = dict(SERVICE, variant="nextn", source="measured", time="t1", figures={"output_tokens_per_s": 7.0}, load=LOAD)
    rec = {"outcome": "rolled_back", "variant": "shadow-balanced", "argv": ["--other"], "sglang_version": "0.5.11",
           "gpu_devices": [0, 1], "performance": perf({"output_tokens_per_s": 3.0}, known=measured)}
    found = _bench.known_good([rec], SERVICE, LOAD)
    assert found["figures"] == {"output_tokens_per_s": 7.0} and found["variant"] == "nextn"
    # a known-good that could not be measured has no figures to reuse
    assert _bench.known_good([dict(rec, performance=perf(None, known=dict(measured, figures=None)))], SERVICE, LOAD) is None


RESULT = {"passed": False, "figures": {"output_tokens_per_s": 500.0}, "load": LOAD, "seconds": 9.5,
          "comparison": {"passed": False, "checks": [{"figure": "output_tokens_per_s", "new": 500.0, "known_good": 1000.0,
                                                      "ratio": 0.5, "limit": ">= 0.9x", "ok": False}],
                         "msg": "slower than the known-good service: output_tokens_per_s 500.0 vs 1000.0 (0.5x, limit >= 0.9x)"},
          "msg": "500.0 output tokens/s; slower than the known-good service: ..."}


def test_the_gate_record_keeps_mode_figures_comparison_and_the_known_goods_origin():
    known = dict(SERVICE, variant="nextn", source="history", time="t", figures={"output_tokens_per_s": 1000.0},
                 load=LOAD, extra="dropped")
    rec = _bench.gate_record("enforce", RESULT, known)
    assert list(rec) == list(_bench.PERF_KEYS)
    assert rec["enforced"] and rec["measured_ok"] and rec["passed"] is False and rec["seconds"] == 9.5
    assert rec["comparison"]["checks"][0]["ratio"] == 0.5 and "extra" not in rec["known_good"]
    assert rec["known_good"]["source"] == "history"
    # report: the same figures, not enforced, and the reason is said
    rec = _bench.gate_record("report", RESULT, known, "the baseline variant nextn is the reference")
    assert not rec["enforced"] and rec["msg"].endswith("(reported only: the baseline variant nextn is the reference)")
    assert _bench.gate_record("off", RESULT, known) is None and _bench.gate_record("enforce", None, None) is None


def test_a_gate_with_nothing_to_compare_says_its_figures_are_the_next_baseline():
    figures = {"output_tokens_per_s": 9.0, "ttft_p50": 0.1, "ttft_p95": 0.2, "tpot_p50": 0.01, "itl_p50": 0.01,
               "accept_length": None}
    result = {"passed": True, "figures": figures, "load": LOAD, "seconds": 2.0,
              "comparison": {"passed": True, "checks": [], "msg": "no known-good figures to compare with"},
              "msg": "9.0 output tokens/s, TTFT p50 100 ms p95 200 ms, TPOT p50 10 ms, ITL p50 10 ms; "
                     "no known-good figures to compare with"}
    rec = _bench.gate_record("enforce", result, None)
    # said once: why there was nothing to compare with, and what the figures are for
    assert rec["msg"] == ("9.0 output tokens/s, TTFT p50 100 ms p95 200 ms, TPOT p50 10 ms, ITL p50 10 ms; not compared "
                          "(no known-good figures under this load): these figures are the next switch's baseline")
    failed_known = {"variant": "nextn", "source": "measured", "figures": None, "error": "round 1 failed: 2 of 16 requests"}
    assert "not compared (round 1 failed: 2 of 16 requests)" in _bench.gate_record("enforce", result, failed_known)["msg"]
    # the variant never got to the gate (it failed its readiness gate): the known-good's measurement is still kept
    rec = _bench.gate_record("enforce", None, dict(failed_known, figures={"output_tokens_per_s": 1.0}))
    assert rec["measured_ok"] is False and rec["known_good"]["figures"] == {"output_tokens_per_s": 1.0}
    assert rec["msg"] == "not measured: the variant did not get to the performance gate"


class SlowRounds:
    """A client whose every generation takes ``seconds`` (a fake: the budget's arithmetic only)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def stream(self, _path, _body, _timeout):
        import time

        from ansible_collections.inferops.sglang.plugins.module_utils._http import Response

        started = time.monotonic()
        time.sleep(self.seconds)
        return Response(200, None), [(started + self.seconds / 2, b'{"meta_info": {"completion_tokens": 1}}'),
                                     (time.monotonic(), b'{"meta_info": {"completion_tokens": 4}}')]


def test_a_budget_stops_starting_rounds_but_measures_one():
    # rounds of 0.2 s, a budget of 0.5 s: the warmup (0.2) and round 1 (0.2) leave no room for round 2
    result = _bench.benchmark(SlowRounds(0.2), requests=1, concurrency=1, max_tokens=4, rounds=5, budget=0.5)
    assert result["ok"] and result["load"]["rounds_measured"] == 1 and len(result["rounds"]) == 1
    assert result["load"]["budget"] == 0.5 and result["load"]["rounds"] == 5
    # a budget smaller than one round still measures one
    result = _bench.benchmark(SlowRounds(0.2), requests=1, concurrency=1, max_tokens=4, rounds=3, budget=0.01)
    assert result["load"]["rounds_measured"] == 1
    # no budget: every round
    assert _bench.benchmark(SlowRounds(0.05), 1, 1, 4, rounds=3)["load"]["rounds_measured"] == 3


def scripted_rounds(monkeypatch, speeds: dict):
    """run_round replaced: each client (a name) answers its next scripted tokens/s; the calls in order."""
    calls, left = [], {name: list(values) for name, values in speeds.items()}

    def run_round(client, requests, concurrency, max_tokens, timeout, offset=0):
        calls.append(client)
        speed = left[client].pop(0)
        return {"wall": 1.0, "error_count": 0 if speed else 1, "errors": [] if speed else ["HTTP 503"],
                "requests": requests, "completed": requests if speed else 0, "output_tokens_per_s": speed,
                "ttft_p50": 0.1, "ttft_p95": 0.2, "tpot_p50": 0.01, "itl_p50": 0.01, "accept_length": None}
    monkeypatch.setattr(_bench, "run_round", run_round)
    return calls


LOAD = {"requests": 4, "concurrency": 2, "max_tokens": 32, "rounds": 4, "warmup": True, "timeout": 60, "budget": None}


def test_interleaved_rounds_alternate_and_fail_only_beyond_noise(monkeypatch):
    calls = scripted_rounds(monkeypatch, {"live": [1, 100, 120, 90, 110], "new": [1, 80, 115, 85, 100]})
    result = _bench.interleaved("live", "new", LOAD)
    # a warmup each, then live-new, new-live, live-new, new-live
    assert calls == ["live", "new", "live", "new", "new", "live", "live", "new", "new", "live"]
    (speed,) = [c for c in result["comparison"]["checks"] if c["figure"] == "output_tokens_per_s"]
    assert speed["pairs"] == 4 and speed["low"] < 0.9 < speed["high"] and speed["ok"]
    assert result["passed"] and result["load"]["interleaved"] and result["reference"]["figures"]["output_tokens_per_s"] == 105
    assert "no difference within noise" in result["msg"] or "worse" in result["msg"]
    scripted_rounds(monkeypatch, {"live": [1, 100, 102, 98, 101], "new": [1, 60, 62, 59, 61]})
    slow = _bench.interleaved("live", "new", LOAD)
    assert slow["passed"] is False and slow["comparison"]["msg"].startswith("slower than the live service beyond noise")
    scripted_rounds(monkeypatch, {"live": [1, 100], "new": [1, 0]})
    failed = _bench.interleaved("live", "new", LOAD)
    assert failed["passed"] is False and failed["side"] == "candidate" and failed["figures"] is None


def test_two_servers_serving_side_by_side_are_compared_in_interleaved_rounds(launch):
    """Blue/green's performance gate through the switch's host: the live slot and the candidate (the simulator's
    NEXTN on GPUs 0,2 and 3,4 of ct129's stand-in, the same variant: an A/A comparison) measured in pairs of
    rounds; the same server is not slower beyond noise."""
    from ansible_collections.inferops.sglang.plugins.module_utils import _switch

    servers = [launch([*MODEL, *NEXTN, "--api-key", "bench-key"], version="0.5.11", host="ct129", gpus=gpus)
               for gpus in ("0,2", "3,4")]
    for server in servers:
        server.wait_for(lambda s=server: s.status("/health") == 200, timeout=120, what="health")
    host = _switch.SystemHost("sglang-qwen.service", api_key="bench-key", gate_options={"check_listener": False})
    load = dict(LOAD, requests=4, max_tokens=16, rounds=3, budget=60)
    result = host.bench_pair(*({"url": f"http://127.0.0.1:{s.port}", "api_key_file": None, "unit": u}
                               for s, u in zip(servers, ("sglang-qwen.service", "sglang-qwen-green.service"))),
                             load, {})
    assert result["passed"], result["msg"]
    (speed,) = [c for c in result["comparison"]["checks"] if c["figure"] == "output_tokens_per_s"]
    assert speed["pairs"] == 3 and speed["low"] <= speed["ratio"] <= speed["high"]
    assert result["reference"]["figures"]["accept_length"] == result["figures"]["accept_length"] == 2.71
    assert "bench-key" not in str(result)
