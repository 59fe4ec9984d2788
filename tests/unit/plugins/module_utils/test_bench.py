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
    got = _bench.parse(10.0, events)
    assert got["ok"] and got["tokens"] == 7 and got["ttft"] == pytest.approx(0.5)
    assert got["itl"] == pytest.approx([0.02] * 6) and got["accept_length"] == 2.9
    assert got["e2e"] == pytest.approx(0.62) and got["tpot"] == pytest.approx(0.02)


@pytest.mark.parametrize("events, error", [
    ([], "the stream ended without a token"),
    ([(1.0, b"{not json")], "not JSON in the stream"),
    ([(1.0, b'{"error": {"message": "The input is too long"}}')], "the server's error: {'message': 'The input is too long'}"),
    ([event(1.0, 0)], "the stream ended without a token"),
])
def test_a_broken_stream_is_an_error(events, error):
    got = _bench.parse(0.0, events)
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
    ({"ttft_p95": 0.25}, "ttft_p95"),                          # 1.25x > 1.20x
    ({"accept_length": 1.0}, "accept_length"),                 # accept length fell to 1.0
])
def test_a_regression_fails_with_the_figure_named(change, figure):
    result = _bench.compare(dict(BASE, **change), BASE)
    assert not result["passed"] and [c["figure"] for c in result["checks"] if not c["ok"]] == [figure]
    assert result["msg"].startswith(f"slower than the known-good service: {figure} ")


def test_thresholds_are_per_variant_and_checked():
    assert _bench.compare(dict(BASE, output_tokens_per_s=890.0), BASE, {"output_tokens_per_s": 0.85})["passed"]
    with pytest.raises(_bench.BenchError, match="unknown threshold itl"):
        _bench.compare(BASE, BASE, {"itl": 1.1})
    with pytest.raises(_bench.BenchError, match="must be a ratio > 0"):
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
    assert result["load"] == {"requests": 4, "concurrency": 2, "max_tokens": 32, "rounds": 1, "warmup": True}
    assert "bench-key" not in json.dumps(result)
    # the same server against figures ten times as fast (a margin no noise of a shared machine closes): a regression, named
    faster = dict(result["figures"], output_tokens_per_s=10 * result["figures"]["output_tokens_per_s"])
    rc, result, _out = run_module(sglang_bench.main, capsys, dict(args, baseline=faster))
    assert rc == 0 and result["passed"] is False
    assert "slower than the known-good service: output_tokens_per_s" in result["msg"]
    rc, result, _out = run_module(sglang_bench.main, capsys, dict(args, thresholds={"itl": 2}))
    assert rc == 1 and result["msg"].startswith("unknown threshold itl")
