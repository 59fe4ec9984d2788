"""The readiness gate (plugins/module_utils/_readiness.py) against real SGLang on CPU.

Each case runs the gate as wait_for_sglang does in PID mode: a Gate with a PidWatcher on
the real server's main process and its log file (real_gate.py). The server is real sglang
0.5.11 (the pinned release; the ready case on 0.5.23 too) from lab/real/build.sh's cache,
started by real_sglang.RealServer. One server (``shared``) serves the ready, metrics, key,
drain, benchmark, port-taken, wedged and killed-scheduler cases (the last, which kills it,
runs last; a case after it gets a fresh one), and the three variants refused at start are
started together (they die in argument resolution). The cases that start servers of their
own are in test_real_gate_own_servers.py. ``make conformance`` runs this module's cases in
one worker, one after another, while the other worker runs the rest (conftest.py).

Every figure a case measures (time from the server's death to the verdict, the case's own
wall time) is printed at the end of the run (conftest.py).
"""

from __future__ import annotations


from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from real_gate import (KEY, LOAD_DEADLINE, POLL_SLACK, GateThread, assert_drains_a_real_generation, assert_ready,
                       assert_the_simulators_metrics_are_real, note, requests_for, run_gate, scheduler_of, servers, timed)
from real_sglang import REPO, ExitClock, RealServer, free_port, model_max

from ansible_collections.inferops.sglang.plugins.module_utils import _bench
from ansible_collections.inferops.sglang.plugins.module_utils import _gateway
from ansible_collections.inferops.sglang.plugins.module_utils import _http
from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as r
from ansible_collections.inferops.sglang.plugins.module_utils import _watchdog
from ansible_collections.inferops.sglang.plugins.module_utils._process_watch import PidWatcher

__all__ = ["servers", "timed"]  # fixtures of real_gate.py this module's cases use


@pytest.fixture(scope="module")
def shared_servers(real, tmp_path_factory):
    """The shared 0.5.11 servers of the module (one, unless a case killed it), stopped at its end."""
    started: list[RealServer] = []
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def shared(real, tmp_path_factory, shared_servers):
    """One real 0.5.11 server with an API key and --enable-metrics (as the role renders it), started
    when the first case needs it: the first gate waits through its real load. A case that ends it
    (the killed scheduler, last in the file) leaves any case after it a fresh one: the cases hold
    in any order."""
    if not shared_servers or shared_servers[-1].proc.poll() is not None:
        shared_servers.append(RealServer(real, "0.5.11", tmp_path_factory.mktemp("shared") / "shared.log",
                                         args=("--api-key", KEY, "--enable-metrics")))
    return shared_servers[-1]


# -- 1. ready with a real generation; wrong and missing key -----------------------

def test_ready_with_a_real_generation_0_5_11(shared):
    started = time.monotonic()
    result = run_gate(shared)
    assert_ready(result, shared)
    # /health was 200 only after warmup: real SGLang logs "The server is fired up and ready
    # to roll!" when its warmup request returned (0.5.11 srt/entrypoints/http_server.py:2032)
    assert "The server is fired up and ready to roll!" in shared.text()
    assert KEY not in json.dumps(result)  # /server_info holds it in clear: only the figures are kept
    # real 0.5.11 has no /ready (it came with 0.5.20): a 404 passes the phase
    assert any(e["event"] == "/ready is not served (SGLang before 0.5.20)" for e in result["timeline"])
    # 0.5.11's default chunked prefill for this machine's "GPU" memory (CPU: 2048)
    assert result["server"]["chunked_prefill_size"] == 2048
    note("ready 0.5.11", load_to_ready=time.monotonic() - started, http=result["phases"]["http"],
         health=result["phases"]["health"], tokens=result["generation"]["completion_tokens"])


def test_the_simulators_metrics_are_real_sglangs_0_5_11(shared):
    """After the gate's generations, the real server's request counters count them (its warmup
    included; /health's own generation is not: log_metrics=False, 0.5.11
    srt/entrypoints/http_server.py:537,547), under the names the simulator uses."""
    assert shared.wait_for_line("The server is fired up and ready to roll!", LOAD_DEADLINE)
    real = assert_the_simulators_metrics_are_real(shared)
    assert sum(v for _n, _l, v in real["sglang:num_requests_total"]["samples"]) >= 2
    assert "sglang:engine_startup_time" in real and "sglang:startup_time_seconds" not in real
    assert not any("is_streaming" in labels for _n, labels, _v in real["sglang:num_requests_total"]["samples"])
    note("metrics 0.5.11", families=len(real))


@pytest.mark.parametrize("key", ["wrong-key", None], ids=["wrong key", "missing key"])
def test_wrong_or_missing_key_is_unauthorized_at_once(shared, key):
    assert shared.wait_for_line("The server is fired up and ready to roll!", LOAD_DEADLINE)
    before = requests_for(shared, ("/v1/models",))
    result = run_gate(shared, api_key=key)
    assert (result["phase"], result["failure"]) == ("models", "unauthorized"), result["msg"]  # HTTP answered: 401
    # real SGLang answers 401 on /v1/models without the right bearer token
    assert "HTTP 401" in result["detail"]
    assert "API key is wrong or missing" in result["msg"]
    assert result["elapsed"] < 5, result["elapsed"]
    assert result["listener"]["state"] == "owned"
    assert requests_for(shared, ("/v1/models",)) == before + 1  # one request, then the verdict
    note(f"unauthorized ({key or 'no key'})", verdict=result["elapsed"])


def test_a_drain_waits_for_a_real_generation_0_5_11(shared):
    assert shared.wait_for_line("The server is fired up and ready to roll!", LOAD_DEADLINE)
    result = assert_drains_a_real_generation(shared)
    note("drain 0.5.11", drain=result["seconds"], polls=result["polls"])


def test_the_benchmark_reads_real_sglangs_stream_0_5_11(shared):
    """Streamed /generate on real SGLang (srt/entrypoints/http_server.py:708-726): the figures come
    out of its data: lines; no speculative decoding on CPU, so no accept length."""
    assert shared.wait_for_line("The server is fired up and ready to roll!", LOAD_DEADLINE)
    result = _bench.benchmark(_http.Client(shared.url, KEY, True, 120), requests=2, concurrency=2, max_tokens=16, rounds=1)
    assert result["ok"], result["msg"]
    (measured,) = result["rounds"]
    assert measured["completed"] == 2 and measured["error_count"] == 0
    figures = result["figures"]
    assert figures["accept_length"] is None
    assert figures["output_tokens_per_s"] > 0 and 0 < figures["ttft_p50"] <= figures["ttft_p95"]
    # lines that arrive in one read share a time: on this fast tiny model, with the client late to
    # read on a loaded machine, every token of a request can come in one read, so TPOT and the ITL
    # may read 0 (seen in a CI run: TPOT p50 0.0 with TTFT 0.38 s)
    assert figures["tpot_p50"] >= 0 and figures["itl_p50"] >= 0
    note("bench 0.5.11", seconds=result["seconds"], tokens_per_s=figures["output_tokens_per_s"],
         ttft_p95=figures["ttft_p95"], itl_p50=figures["itl_p50"])


GATEWAY_PYTHON = REPO / ".cache" / "gateway-venv" / "bin" / "python"


def unit_helpers():
    """The unit tests' helpers module (sim_helpers: the gateway's runner and its clients)."""
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    try:
        import sim_helpers  # noqa: E402  pylint: disable=import-outside-toplevel
    finally:
        sys.path.remove(str(REPO / "tests" / "unit"))
    return sim_helpers


def test_the_real_gateway_routes_to_a_real_server_then_lets_it_go_0_5_11(shared, tmp_path):
    """The gateway (smg, _gateway.PINNED) in front of real SGLang 0.5.11 with an API key, as a
    switch drives it (_gateway): registered with the server's key, routed to once the gateway
    lists it ready (it probes the real /v1/models and server info), a generation through it with
    the key and none without, then removed: listed as draining, gone after the settle time, and
    the gateway not ready again."""
    assert shared.wait_for_line("The server is fired up and ready to roll!", LOAD_DEADLINE)
    process = unit_helpers().GatewayProcess(GATEWAY_PYTHON, tmp_path, "control-" + KEY, KEY)
    try:
        gw = _gateway.Gateway(process.client("control-" + KEY))
        worker_id = gw.add(shared.url, KEY)
        ready = gw.wait_ready(shared.url, timeout=60)
        body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
        served = process.client(KEY).call("POST", "/generate", body)
        assert served.status == 200 and served.body["meta_info"]["completion_tokens"] == 4, served.body
        assert process.client(None).call("POST", "/generate", body).status == 401
        assert gw.remove(worker_id) is True
        assert [w["status"] for w in gw.workers()] == ["draining"]
        gone = gw.wait_gone(worker_id, timeout=30)
        assert gw.readiness().status == 503
    finally:
        process.stop()
    note("gateway 0.5.11", ready=ready["seconds"], gone=gone)


def test_blue_green_through_the_real_gateway_costs_clients_nothing_0_5_11(shared, servers, tmp_path):
    """The blue/green order on two real 0.5.11 servers behind the real gateway: the new one started
    beside the live one, added and routed to before the live one is removed. Short requests sent all
    along all succeed, and a stream on the live server in flight at the cut runs to its end."""
    assert shared.wait_for_line("The server is fired up and ready to roll!", LOAD_DEADLINE)
    new = servers("0.5.11", "--api-key", KEY, "--enable-metrics")
    helpers = unit_helpers()
    process = helpers.GatewayProcess(GATEWAY_PYTHON, tmp_path, "control-" + KEY, KEY)
    try:
        gw = _gateway.Gateway(process.client("control-" + KEY))
        live = gw.add(shared.url, KEY)
        gw.wait_ready(shared.url, timeout=60)
        assert new.wait_for_line("The server is fired up and ready to roll!", LOAD_DEADLINE), new.text()[-2000:]
        traffic = helpers.GatewayTraffic(process.port, 600, KEY)
        try:
            gw.add(new.url, KEY)
            ready = gw.wait_ready(new.url, timeout=60)
            assert gw.remove(live) is True
            cut = time.monotonic()
            gone = gw.wait_gone(live, timeout=30)
        finally:
            traffic.stop()
        assert traffic.stream_ended > cut  # in flight on the live server at the cut
        assert traffic.stream == {"status": 200, "tokens": 600}
        assert len(traffic.answers) >= 5 and set(traffic.answers) == {200}, traffic.answers
        assert [w["url"] for w in gw.workers()] == [new.url]
    finally:
        process.stop()
    note("blue/green 0.5.11", requests=len(traffic.answers), failed=0, ready=ready["seconds"], gone=gone)


# -- 4. the port already held by another real server ------------------------------

def test_a_second_server_on_a_taken_port_is_not_ready(shared, servers):
    """Server B on server A's port: real B loads, uvicorn fails to bind ([Errno 98]), its
    warmup thread (started before the bind, 0.5.11 http_server.py:390-400) succeeds
    against A, it logs "The server is fired up and ready to roll!" and exits: 3 (uvicorn's
    startup failure) when it gets there first, -9 when its subprocess watchdog (0.5.11
    srt/utils/watchdog.py:203-221, a poll every 1 s) sees the scheduler killed in the
    shutdown first and SIGQUITs it, whose handler SIGKILLs the whole tree, itself included
    (srt/entrypoints/engine.py:1184-1191). Both were seen; which one is a race. The gate
    on B must say port_taken, naming A, and must not send B's API key to A."""
    assert shared.wait_for_line("The server is fired up and ready to roll!", LOAD_DEADLINE)
    gate_paths = ("/v1/models", "/health", "/health_generate", "/generate", "/v1/completions", "/v1/chat/completions")
    before = requests_for(shared, gate_paths)
    b = servers("0.5.11", "--api-key", KEY, port=shared.port)
    started = time.monotonic()
    result = run_gate(b)
    verdict = time.monotonic() - started
    assert result["ready"] is False
    assert result["failure"] == "port_taken", result["msg"]
    assert result["listener"]["pid"] == shared.proc.pid
    assert "sglang.launch_server" in result["listener"]["cmdline"] and f"--port {shared.port}" in result["listener"]["cmdline"]
    assert f"process {b.proc.pid}" in result["msg"] and f"pid {shared.proc.pid}" in result["msg"]
    assert verdict < POLL_SLACK, verdict
    assert requests_for(shared, gate_paths) == before  # the gate sent A nothing, its key least of all
    # the control: the same gate without the ownership check passes B, against A
    legacy = run_gate(b, check_listener=False, settle=0.5)
    assert legacy["ready"] is True, legacy["msg"]
    assert b.proc.poll() is None and "Uvicorn running" not in b.text()
    # what real B then does, as real-sglang.md says
    rc = b.proc.wait(LOAD_DEADLINE)
    text = b.text()
    assert "[Errno 98]" in text and "address already in use" in text
    assert "The server is fired up and ready to roll!" in text
    if rc != 3:  # the watchdog won the race: it says so before the tree is killed
        assert rc == -9 and "crashed with exit code" in text and "Triggering SIGQUIT for cleanup" in text, text[-3000:]
    assert shared.proc.poll() is None
    note("port taken", verdict=verdict, b_exit_after=time.monotonic() - started, b_rc=rc)


# -- 7. a wedged server, after ready: the watchdog's probe ------------------------------

def test_a_real_server_whose_scheduler_is_stopped_fails_the_watchdog_probe(shared):
    """A server that stays alive and stops serving: the real scheduler stopped (SIGSTOP), as one
    stuck in a collective is. Real 0.5.11 still answers /v1/models (the tokenizer manager runs in
    the main process), /health answers 503 after its 20 s one-token check (0.5.11
    srt/entrypoints/http_server.py, HEALTH_CHECK_TIMEOUT), a generation never returns: the
    watchdog's probe (the gate's checks, no settle) fails within its timeout, and after
    ``failures`` such probes the watchdog decides to restart. The simulator's wedge (SIGUSR2)
    claims the same three answers; this is where they were checked. Once the scheduler runs
    again the probe passes: nothing was broken but the stop."""
    settings = _watchdog.load_settings({"unit": "sglang-qwen.service", "url": shared.url, "service_dir": "/nonexistent",
                                        "timeout": 30, "failures": 2})
    client = r.Client(shared.url, KEY, True, 30)

    def probe() -> tuple[dict, float]:
        started = time.monotonic()
        verdict = _watchdog.probe(settings, client, PidWatcher(shared.proc.pid, str(shared.log_path)))
        return verdict, time.monotonic() - started

    first, _took = probe()
    assert first["ready"] is True, first["msg"]
    assert first["generation"]["completion_tokens"] > 0
    state, event = _watchdog.decide(settings, _watchdog.fresh_state("run-1"), first, 3600.0, time.time())
    assert event == "ok" and state["served"] is True
    scheduler = scheduler_of(shared)
    os.kill(scheduler, signal.SIGSTOP)
    try:
        models = client.call("GET", "/v1/models", timeout=10)
        assert models.status == 200, models.describe()
        started = time.monotonic()
        health = client.call("GET", "/health", timeout=40)
        health_after = time.monotonic() - started
        assert health.status == 503 and 15 < health_after < 35, (health.describe(), health_after)
        wedged, took = probe()
        assert wedged["ready"] is False
        assert wedged["failure"] in ("not_ready", "generation_timeout"), wedged["msg"]
        assert wedged["phase"] in ("health", "generation"), wedged["phase"]
        assert took < settings["timeout"] + 10, took
        state, event = _watchdog.decide(settings, state, wedged, 3600.0, time.time())
        assert (event, state["failures"]) == ("failed", 1)
        state, event = _watchdog.decide(settings, state, wedged, 3600.0, time.time())
        assert (event, state["failures"]) == ("restart", 2)
    finally:
        os.kill(scheduler, signal.SIGCONT)
    deadline = time.monotonic() + 120
    again, _took = probe()
    while not again["ready"] and time.monotonic() < deadline:
        again, _took = probe()
    assert again["ready"] is True, again["msg"]
    note("wedged (scheduler stopped)", health_503_after=health_after, probe_failed_after=took,
         probe_failure=wedged["failure"])


# -- 3. a killed scheduler child, after ready ---------------------------------------

def test_killed_scheduler_after_ready_ends_the_gate_with_the_real_line(shared):
    """SIGKILL of sglang::scheduler while the gate settles: the parent's SubprocessWatchdog
    (1 s poll) logs "Subprocess scheduler_0 (pid=N) crashed with exit code -9. Triggering
    SIGQUIT for cleanup..." (0.5.11 srt/utils/watchdog.py:215-220) and kills the tree."""
    gate = GateThread(shared, settle=600)  # the settle phase outlasts the test: only the kill ends it
    gate.start()
    gate.wait_phase("settled")
    scheduler = scheduler_of(shared)
    clock = ExitClock(shared.proc.pid)
    killed = time.monotonic()
    os.kill(scheduler, signal.SIGKILL)
    gate.join(60)
    assert not gate.is_alive()
    clock.join(5)
    result = gate.result
    assert (result["phase"], result["failure"]) == ("settled", "process_exited"), result["msg"]
    assert result["cause"] == "subprocess_died", result
    assert result["cause_line"].startswith(f"Subprocess scheduler_0 (pid={scheduler}) crashed with exit code -9."), result["cause_line"]
    assert "OOM killer" in result["advice"]
    assert shared.proc.wait(10) == -signal.SIGKILL  # the tree was killed, its leader too
    assert clock.at is not None and gate.done - clock.at < POLL_SLACK, (gate.done - clock.at)
    note("killed scheduler", kill_to_tree_dead=clock.at - killed, tree_dead_to_verdict=gate.done - clock.at,
         kill_to_verdict=gate.done - killed)


# -- 2. variants real SGLang refuses at start -----------------------------------------

REFUSED = ("context_length", "served_name", "port")


@pytest.fixture(scope="module")
def refused(real, tmp_path_factory):
    """The three variants real 0.5.11 refuses at start, started together when the first case needs
    them, each with its exit clock and its gate running from its start as wait_for_sglang's would:
    three servers that die in argument resolution, their imports side by side instead of one after
    another. case -> (server, gate, clock, cause, line)."""
    out = {}
    for case in REFUSED:
        args: tuple[str, ...] = ()
        port = None
        if case == "context_length":
            # 0.5.11 srt/configs/model_config.py:452-477, raised from ServerArgs.__post_init__
            limit = model_max(real)
            args = ("--context-length", str(limit * 2))
            cause = "context_length"
            line = (f"ValueError: Warning: User-specified context_length ({limit * 2}) is greater than the derived "
                    f"context_length ({limit}).")
        elif case == "served_name":
            # 0.5.11 srt/server_args.py:6804-6809, check_server_args (engine.py:673)
            args = ("--served-model-name", "tiny:v1")
            cause, line = "invalid_argument", "AssertionError: served_model_name cannot contain a colon (':') character."
        else:
            # 0.5.11 srt/server_args.py:1042-1050: the gRPC port is port + 10000, even with gRPC off
            port = free_port(55536, 60999)
            cause, line = "invalid_argument", f"ValueError: SGLANG_GRPC_PORT ({port + 10000}) must be between 1 and 65535"
        server = RealServer(real, "0.5.11", tmp_path_factory.mktemp("refused") / f"{case}.log", port=port, args=args)
        clock = ExitClock(server.proc.pid)
        gate = GateThread(server, settle=1.0)
        gate.start()
        out[case] = (server, gate, clock, cause, line)
    yield out
    for server, *_rest in out.values():
        server.stop()


@pytest.mark.parametrize("case", REFUSED)
def test_a_refused_variant_ends_the_gate_within_a_poll(refused, case):
    server, gate, clock, cause, line = refused[case]
    gate.join(LOAD_DEADLINE + 30)
    assert not gate.is_alive(), "the gate did not end"
    result, done = gate.result, gate.done
    assert result["failure"] == "process_exited", result["msg"]
    assert result["cause"] == cause, result
    assert result["cause_line"].startswith(line), result["cause_line"]
    assert server.proc.wait(10) == 1
    assert clock.at is not None and done - clock.at < POLL_SLACK, done - clock.at
    note(f"refused ({case})", start_to_exit=result["since_start"] or 0.0, exit_to_verdict=done - clock.at)
