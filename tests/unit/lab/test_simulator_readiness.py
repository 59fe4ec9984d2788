"""The simulator's readiness surface against real SGLang: /ready, the API-key exemptions,
/server_info's shape per release, the start-up milestones in order, and the silent
stage hang (SGLANG_SIMULATOR_HANG). Real texts are quoted from the wheels and from real
CPU runs of 0.5.11 and 0.5.23 (real-sglang.md)."""

from __future__ import annotations

import re
import signal
import time

import pytest
from sim_helpers import MODEL, NEXTN

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SCHEDULER_LINE = re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(\d+), max_prefill_tokens=16384, "
                            r"max_running_requests=(\d+), context_len=(\d+), available_gpu_mem=[\d.]+ GB$")


def messages(output: str) -> list[str]:
    """Each line without SGLang's "[time]" / "[time TPn]" prefix."""
    return [re.sub(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: TP\d+)?\] ", "", line) for line in output.splitlines()]


def healthy(launch, version: str, extra: list[str] | None = None, **kw):
    server = launch([*MODEL, *NEXTN, *(extra or [])], version=version, host="ct200", gpus="0,1", **kw)
    server.wait_for(lambda: server.status("/health") == 200, what="health")
    return server


def test_ready_is_404_before_0_5_20(launch):
    # no @app.get("/ready") before 0.5.20; FastAPI's answer for an unknown path (the real
    # 0.5.11 log: "GET /ready HTTP/1.1" 404 Not Found)
    server = healthy(launch, "0.5.11")
    assert server.request("GET", "/ready") == (404, {"detail": "Not Found"})


def test_ready_is_503_until_warmup_then_200_from_0_5_20(launch):
    # 0.5.23 http_server.py:714-718: 200 if tokenizer_manager.is_ready() else 503, empty body;
    # is_ready() needs ServerStatus.Up (tokenizer_manager.py:728-734), which only the warmup sets (:2502)
    server = launch([*MODEL, *NEXTN], version="0.5.23", host="ct200", gpus="0,1", hw={"time_scale": 0.3})
    server.wait_for(lambda: server.status("/v1/models") == 200, what="/v1/models")
    assert server.request("GET", "/ready") == (503, None)
    assert "The server is fired up and ready to roll!" not in server.output()
    server.wait_for(lambda: server.status("/ready") == 200, what="/ready 200")
    assert "The server is fired up and ready to roll!" in server.output()
    assert server.request("GET", "/ready") == (200, None)


@pytest.mark.parametrize("version, ready_without_key", [
    ("0.5.11", 401),  # utils/auth.py:100 exempts /health* and /metrics* only; the middleware runs before routing
    ("0.5.23", 200),  # utils/auth.py:101-105 adds /ready*
])
def test_api_key_exemptions_are_the_releases(launch, version, ready_without_key):
    server = healthy(launch, version, ["--api-key", KEY])
    assert server.status("/health") == 200 and server.status("/health_generate") == 200
    assert server.status("/ready") == ready_without_key
    if ready_without_key == 401:
        assert server.request("GET", "/ready") == (401, {"error": "Unauthorized"})
        assert server.status("/ready", headers=AUTH) == 404
    for path in ("/v1/models", "/server_info"):
        assert server.request("GET", path) == (401, {"error": "Unauthorized"})
        assert server.status(path, headers={"Authorization": "Bearer wrong"}) == 401
        # _check_bearer_token: the scheme in any case (0.5.11 utils/auth.py:103-112)
        assert server.status(path, headers={"Authorization": f"bearer {KEY}"}) == 200
    # dataclasses.asdict(server_args): the key in clear (0.5.11 http_server.py:640-641)
    assert server.request("GET", "/server_info", headers=AUTH)[1]["api_key"] == KEY


def scheduler_figures(server) -> dict:
    found = [SCHEDULER_LINE.search(line) for line in messages(server.output())]
    match = next(m for m in found if m)
    total, chunked, running, context = (int(x) for x in match.groups())
    return {"total": total, "chunked": chunked, "running": running, "context": context}


def test_server_info_0_5_11_shape(launch):
    server = healthy(launch, "0.5.11")
    info = server.request("GET", "/server_info")[1]
    log = scheduler_figures(server)
    # {**asdict(server_args), **scheduler_info, "internal_states": [...], "version"} (http_server.py:631-645)
    assert info["version"] == "0.5.11" and info["status"] == "ready"
    assert info["max_total_num_tokens"] == log["total"]
    assert info["max_req_input_len"] == min(log["context"] - 1, log["total"] - 1) - 5  # tp_worker.py:302-306
    assert info["chunked_prefill_size"] == log["chunked"] and info["mem_fraction_static"] == 0.88
    assert info["context_length"] == 131072 and info["max_running_requests"] == 16
    # server_args.py:1497-1528, the speculative list up to cuda_graph_max_bs
    assert info["cuda_graph_bs"][-1] == info["cuda_graph_max_bs"] and info["cuda_graph_bs"][:9] == [1, 2, 3, 4, 5, 6, 7, 8, 10]
    assert "cuda_graph_config" not in info and "launch_command" not in info and "kv_events" not in info
    [state] = info["internal_states"]  # one per DP rank
    assert state["effective_max_running_requests_per_dp"] == log["running"]  # scheduler.py:3381
    assert state["cuda_graph_bs"] == info["cuda_graph_bs"] and state["mem_fraction_static"] == 0.88
    usage = state["memory_usage"]  # scheduler.py:3372-3380: graph one float
    assert set(usage) == {"weight", "kvcache", "token_capacity", "graph"}
    assert usage["token_capacity"] == log["total"] and usage["graph"] > 0 and usage["weight"] > 20
    assert state["avg_spec_accept_length"] > 1 and "world_size" not in state and "decode_cuda_graph_bs" not in state


def test_server_info_0_5_23_shape(launch):
    server = healthy(launch, "0.5.23")
    info = server.request("GET", "/server_info")[1]
    log = scheduler_figures(server)
    assert info["version"] == "0.5.23" and info["frontend"] == "python" and info["kv_events"] is None
    assert info["max_total_num_tokens"] == log["total"] and info["chunked_prefill_size"] == log["chunked"]
    assert info["mem_fraction_static"] == 0.88 and "--speculative-algorithm NEXTN" in info["launch_command"]
    # 0.5.14+: the resolved sizes live in cuda_graph_config; the flags stay as given
    decode = info["cuda_graph_config"]["decode"]
    assert decode["backend"] == "full" and decode["bs"][-1] == decode["max_bs"]
    assert "cuda_graph_bs" not in info and info["cuda_graph_max_bs_decode"] is None
    [state] = info["internal_states"]
    assert state["effective_max_running_requests_per_dp"] == log["running"] and state["world_size"] == 2
    assert state["decode_cuda_graph_bs"] == decode["bs"]  # internal_state.py:101-103, the sizes captured
    graph = state["memory_usage"]["graph"]  # graph_memory_usage.py:5-12
    assert set(graph) == {"prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend"}
    # each capture booked under its phase (cuda_graph_setup.py:703-708, eagle_worker_v2.py:520-524, :641-645)
    assert graph["target_verify"] > 0 and graph["draft_decode"] > 0 and graph["draft_extend"] > 0
    assert graph["decode"] == graph["prefill"] == graph["draft_prefill"] == 0.0
    assert state["decode_cuda_graph_memory_gb"] == pytest.approx(graph["target_verify"] + graph["draft_decode"] + graph["draft_extend"],
                                                                 abs=0.002)
    assert state["memory_usage"]["token_capacity"] == log["total"] and state["memory_usage"]["token_capacity_swa"] is None


def test_graphs_off_captures_nothing_but_keeps_the_sizes(launch):
    # the real 0.5.23 /server_info with --disable-cuda-graph: decode.backend "disabled", bs listed, decode_cuda_graph_bs []
    info = healthy(launch, "0.5.23", ["--disable-cuda-graph"]).request("GET", "/server_info")[1]
    assert info["cuda_graph_config"]["decode"]["backend"] == "disabled" and info["cuda_graph_config"]["decode"]["bs"]
    assert info["internal_states"][0]["decode_cuda_graph_bs"] == []


N = r"[\d.]+"
BS = r"\[1, 2, 3, [\d, ]+\]"
# The same in both releases once the engine is up: the scheduler's summary (0.5.11
# managers/scheduler.py:764, 0.5.23 :1269), uvicorn, and the warmup's end (0.5.11
# entrypoints/http_server.py:2032, 0.5.23 :2600).
SERVING_TAIL = [
    rf"max_total_num_tokens=\d+, chunked_prefill_size=\d+, max_prefill_tokens=16384, max_running_requests=\d+, "
    rf"context_len=131072, available_gpu_mem={N} GB$",
    r"INFO:     Started server process \[\d+\]$",
    r"INFO:     Waiting for application startup\.$",
    r"INFO:     Application startup complete\.$",
    r"INFO:     Uvicorn running on http://127\.0\.0\.1:\d+ \(Press CTRL\+C to quit\)$",
    r"The server is fired up and ready to roll!$",
]
MILESTONES_0_5_11 = [
    r"Init torch distributed begin\.$",  # model_runner.py:1103
    rf"Init torch distributed ends\. elapsed={N} s, mem usage={N} GB$",  # :1235-1238
    rf"Load weight begin\. avail mem={N} GB$",  # :1290
    rf"Load weight end\. elapsed={N} s, type=Qwen3_5ForConditionalGeneration, avail mem={N} GB, mem usage={N} GB\.$",
    r"Using KV cache dtype: torch\.bfloat16$",  # :2256
    rf"KV Cache is allocated\. #tokens: \d+, K size: {N} GB, V size: {N} GB$",  # memory_pool.py:735
    rf"Memory pool end\. avail mem={N} GB$",
    rf"Capture cuda graph begin\. This can take up to several minutes\. avail mem={N} GB$",  # model_runner.py:2778-2780
    rf"Capture cuda graph end\. Time elapsed: {N} s\. mem usage={N} GB\. avail mem={N} GB\.$",  # :2796-2799
    rf"Load weight begin\. avail mem={N} GB$",  # the draft's runner; NEXTN's MTP class (model_config.py:394)
    rf"Load weight end\. elapsed={N} s, type=Qwen3_5ForCausalLMMTP, avail mem={N} GB, mem usage={N} GB\.$",
    rf"Capture draft cuda graph begin\. This can take up to several minutes\. avail mem={N} GB$",  # eagle_worker_v2.py:277
    rf"Capture draft cuda graph end\. Time elapsed: {N} s\. mem usage={N} GB\. avail mem={N} GB\.$",
    rf"Capture draft extend cuda graph begin\. This can take up to several minutes\. avail mem={N} GB$",  # :317
    rf"Capture draft extend cuda graph end\. Time elapsed: {N} s\. mem usage={N} GB\. avail mem={N} GB\.$",
    *SERVING_TAIL,
]
MILESTONES_0_5_23 = [
    r"Init parallel begin\.$",  # distributed/bootstrap.py:115
    rf"Init parallel ends\. elapsed={N} s$",  # :190
    rf"Memory baseline taken\. mem usage={N} GB$",  # :219-222
    rf"Load weight begin\. avail mem={N} GB$",  # model_runner.py:1274
    rf"Load weight end\. elapsed={N} s, type=Qwen3_5ForConditionalGeneration, avail mem={N} GB, mem usage={N} GB\.$",
    rf"KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, K size: {N} GB, V size: {N} GB$",
    rf"Memory pool end\. avail mem={N} GB$",
    # cuda_graph_setup.py:758-762, :787-793: "target verify" under speculative decoding, bs= on the end line
    rf"Capture target verify CUDA graph begin\. backend=full, num_tokens_per_req=4, avail mem={N} GB$",
    rf"Capture target verify CUDA graph end\. bs={BS}, elapsed={N} s, mem usage={N} GB, avail mem={N} GB\.$",
    # speculative/eagle_worker_v2.py:514-518, :532-537, :633-637, :653-658
    rf"Capture draft decode CUDA graph begin\. backend=full, num_tokens_per_req=1, bs={BS}, avail mem={N} GB$",
    rf"Capture draft decode CUDA graph end\. elapsed={N} s, mem usage={N} GB, avail mem={N} GB\.$",
    rf"Capture draft extend CUDA graph begin\. backend=full, num_tokens_per_req=4, bs={BS}, avail mem={N} GB$",
    rf"Capture draft extend CUDA graph end\. elapsed={N} s, mem usage={N} GB, avail mem={N} GB\.$",
    *SERVING_TAIL,
]
MILESTONE_WORDS = ("Init ", "Memory baseline", "Load weight", "KV Cache", "Using KV cache dtype", "Memory pool", "Capture ",
                   "max_total_num_tokens=", "INFO:     Started", "INFO:     Waiting", "INFO:     Application",
                   "INFO:     Uvicorn", "fired up")


@pytest.mark.parametrize("version, expected", [("0.5.11", MILESTONES_0_5_11), ("0.5.23", MILESTONES_0_5_23)])
def test_startup_milestones_in_the_releases_order_and_words(launch, version, expected):
    server = healthy(launch, version)
    seen = [m for m in messages(server.output()) if m.startswith(MILESTONE_WORDS) or "fired up" in m]
    assert len(seen) == len(expected), "\n".join(seen)
    for line, pattern in zip(seen, expected):
        assert re.match(pattern, line), (pattern, line)


@pytest.mark.parametrize("stage, entered", [
    ("distributed", "Init torch distributed begin."),
    ("weights", "Load weight begin. avail mem="),
    ("cuda_graph", "Capture cuda graph begin. This can take up to several minutes. avail mem="),
])
def test_hang_logs_the_stage_entry_then_nothing(launch, monkeypatch, stage, entered):
    # a real NCCL / custom all-reduce hang (upstream PR #11275) logs nothing: alive, never bound
    monkeypatch.setenv("SGLANG_SIMULATOR_HANG", stage)
    server = launch([*MODEL, *NEXTN], host="ct200", gpus="0,1")
    server.wait_for(lambda: entered in server.output(), what=stage)
    before = server.output()
    time.sleep(2)  # the whole start-up takes well under 1 s at this time scale
    assert server.output() == before and messages(before)[-1].startswith(entered)
    assert server.proc.poll() is None and server.status("/health") is None
    server.proc.send_signal(signal.SIGTERM)  # systemd's stop still ends it
    assert server.proc.wait(timeout=10) == 0


def test_hang_in_another_stage_does_not_hang_this_one(launch, monkeypatch):
    monkeypatch.setenv("SGLANG_SIMULATOR_HANG", "cuda_graph")
    server = launch([*MODEL, *NEXTN, "--disable-cuda-graph"], host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, what="health without graphs")


def test_a_wedged_simulator_answers_as_real_sglang_with_its_scheduler_stopped(launch):
    """SIGUSR2 wedges the simulator's scheduler. Checked against real 0.5.11 on CPU with its
    scheduler stopped (tests/conformance/test_real_gate.py, the watchdog case): /v1/models
    still 200, /health 503 after its one-token check's limit (20 s real; 1 s here through
    SGLANG_HEALTH_CHECK_TIMEOUT, the real variable), a generation never returns, nothing
    logged, the process alive; the watchdog's probe fails with not_ready."""
    import os
    import urllib.error

    from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as r
    from ansible_collections.inferops.sglang.plugins.module_utils._process_watch import PidWatcher
    from ansible_collections.inferops.sglang.plugins.module_utils import _watchdog as wd

    server = launch([*MODEL, *NEXTN], version="0.5.11", host="ct200", gpus="0,1",
                    env_extra={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    server.wait_for(lambda: server.status("/health") == 200, what="health")
    settings = wd.load_settings({"unit": "x.service", "url": f"http://127.0.0.1:{server.port}", "service_dir": "/x",
                                 "timeout": 5})
    client = r.Client(settings["url"], None, True, 5)
    assert wd.probe(settings, client, PidWatcher(server.proc.pid, str(server.log)))["ready"] is True
    before = server.output()
    os.kill(server.proc.pid, signal.SIGUSR2)
    assert server.status("/v1/models") == 200
    started = time.monotonic()
    assert server.status("/health") == 503
    assert 0.9 < time.monotonic() - started < 5
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{server.port}/generate", method="POST",
                                     data=b'{"text": "hi", "sampling_params": {"max_new_tokens": 2}}',
                                     headers={"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=2).read()
    verdict = wd.probe(settings, client, PidWatcher(server.proc.pid, str(server.log)))
    assert verdict["ready"] is False and verdict["failure"] == "not_ready", verdict["msg"]
    assert server.proc.poll() is None
    new = server.output()[len(before):]
    assert "Traceback" not in new and "SIGTERM" not in new


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_the_simulators_metrics_count_requests_under_real_names(launch, version):
    """--enable-metrics: GET /metrics in the text format with real SGLang's family names (checked
    against real servers in tests/conformance/test_real_gate.py); the request counters count the
    warmup and each generation, streamed or not; 0.5.17+ split them by is_streaming; the pool
    gauge is the server's own max_total_tokens; no key is needed. Without the flag: 404."""
    import urllib.request

    from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics as dm

    server = launch([*MODEL, *NEXTN, "--enable-metrics", "--api-key", "sekret"], version=version, host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, what="health")

    def families():
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as resp:
            assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
            return dm.parse(resp.read().decode())

    def requests_total(fams):
        return sum(v for _n, _labels, v in fams["sglang:num_requests_total"]["samples"])

    before = families()
    assert requests_total(before) == 1  # the warmup's generation
    auth = {"Authorization": "Bearer sekret"}
    info = server.request("GET", "/server_info", headers=auth)[1]
    pool = before["sglang:max_total_num_tokens"]["samples"][0]
    assert pool[2] == info["max_total_num_tokens"] and pool[1]["tp_rank"] == "0"
    assert server.request("POST", "/generate", {"text": "one two three", "sampling_params": {"max_new_tokens": 4}},
                          headers=auth)[0] == 200
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}/generate", method="POST", headers=dict(auth),
                                 data=b'{"text": "hi", "stream": true, "sampling_params": {"max_new_tokens": 3}}')
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert b"[DONE]" in resp.read()
    after = families()
    assert requests_total(after) == 3
    generated = sum(v for _n, _l, v in after["sglang:generation_tokens_total"]["samples"])
    assert generated == sum(v for _n, _l, v in before["sglang:generation_tokens_total"]["samples"]) + 4 + 3
    ttft = after["sglang:time_to_first_token_seconds"]
    assert ttft["type"] == "histogram" and any(n.endswith("_count") and v == 3 for n, _l, v in ttft["samples"]) is (version == "0.5.11")
    streaming = {l.get("is_streaming") for _n, l, _v in after["sglang:num_requests_total"]["samples"]}
    assert streaming == ({None} if version == "0.5.11" else {"true", "false"})
    startup = "sglang:engine_startup_time" if version == "0.5.11" else "sglang:startup_time_seconds"
    assert startup in after

    server.proc.terminate()  # the simulated GPUs' memory is freed for the next server
    server.proc.wait(timeout=20)
    plain = launch([*MODEL, *NEXTN], version=version, host="ct200", gpus="0,1")
    plain.wait_for(lambda: plain.status("/health") == 200, what="health")
    assert plain.status("/metrics") == 404


@pytest.mark.parametrize("version, loads", [("0.5.11", 500), ("0.5.16", 200)])
def test_the_simulators_v1_loads_fails_under_metrics_as_real_sglang_before_0_5_16(launch, version, loads):
    """Real 0.5.11 with --enable-metrics answers GET /v1/loads with 500 (its metrics middleware and
    fastapi 0.165.0; tests/conformance/test_real_gate.py, the drain case); 0.5.16 fixed it. The
    simulator answers the same, and the collection's drain reads /metrics there."""
    from ansible_collections.inferops.sglang.plugins.module_utils import _drain, _http

    server = launch([*MODEL, *NEXTN, "--enable-metrics"], version=version, host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, what="health")
    client = _http.Client(f"http://127.0.0.1:{server.port}", None, True, 5)
    answer = client.call("GET", _drain.ENDPOINT)
    assert answer.status == loads and (loads == 200 or answer.body == "Internal Server Error"), answer.body
    result = _drain.drain(client, 5, 0.1)
    assert result["drained"] is True and result["endpoint"] == ("/metrics" if loads == 500 else "/v1/loads"), result
    if loads == 500:
        assert "AttributeError: '_IncludedRouter' object has no attribute 'path'" in server.output()
