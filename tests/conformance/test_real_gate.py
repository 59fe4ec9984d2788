"""The readiness gate (plugins/module_utils/_readiness.py) against real SGLang on CPU.

Each case runs the gate as wait_for_sglang does in PID mode: a Gate with a PidWatcher on
the real server's main process and its log file. The server is real sglang 0.5.11 (the
pinned release; the ready case on 0.5.23 too) from lab/real/build.sh's cache, started by
real_sglang.RealServer. One server (``shared``) serves the ready, metrics, key, drain,
benchmark, port-taken, wedged and killed-scheduler cases (the last, which kills it, runs
last; a case after it gets a fresh one), and the three variants refused at start are started
together (they die in argument resolution), so the file runs in a few minutes on 2 cores;
besides those three it never runs more than two real servers at once (only the port-taken
case does).

Every figure a case measures (time from the server's death to the verdict, the case's own
wall time) is printed at the end of the module (``pytest -s`` or ``-rA`` shows it).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from real_sglang import ExitClock, RealServer, free_port, model_max, session_pids

from ansible_collections.inferops.sglang.plugins.module_utils import _bench
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics
from ansible_collections.inferops.sglang.plugins.module_utils import _drain
from ansible_collections.inferops.sglang.plugins.module_utils import _http
from ansible_collections.inferops.sglang.plugins.module_utils import _listener
from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as r
from ansible_collections.inferops.sglang.plugins.module_utils import _watchdog
from ansible_collections.inferops.sglang.plugins.module_utils._process_watch import PidWatcher

KEY = "conformance-key-4b1e9c"
INTERVAL = 0.5
LOAD_DEADLINE = 300.0  # a real CPU start is 10-45 s here; the deadline only bounds a broken run
# "within about a poll": the gate notices a dead process at its next poll (INTERVAL) and
# then classifies the log it already holds; 1.5 s leave room for a loaded 2-core machine.
POLL_SLACK = INTERVAL + 1.5

FIGURES: dict[str, dict] = {}


@pytest.fixture(scope="module", autouse=True)
def report(request):
    yield
    lines = [f"  {case}: " + ", ".join(f"{k}={v}" for k, v in figures.items()) for case, figures in FIGURES.items()]
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and lines:
        reporter.write_line("\nreal-SGLang gate figures (s):\n" + "\n".join(lines))


def note(case: str, **figures) -> None:
    FIGURES.setdefault(case, {}).update({k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()})


@pytest.fixture(autouse=True)
def timed(request):
    started = time.monotonic()
    yield
    note(request.node.name, wall=time.monotonic() - started)


def run_gate(server: RealServer, api_key: str | None = KEY, **kw) -> dict:
    client = r.Client(server.url, api_key, True, kw.pop("request_timeout", 30))
    watcher = PidWatcher(server.proc.pid, str(server.log_path))
    kw.setdefault("timeout", LOAD_DEADLINE)
    kw.setdefault("interval", INTERVAL)
    kw.setdefault("settle", 1.0)
    return r.Gate(client, watcher, **kw).run()


class GateThread(threading.Thread):
    """The gate running while the test acts on the server; ``done`` is when it returned."""

    def __init__(self, server: RealServer, **kw) -> None:
        super().__init__(daemon=True)
        client = r.Client(server.url, kw.pop("api_key", KEY), True, 30)
        kw.setdefault("timeout", LOAD_DEADLINE)
        kw.setdefault("interval", INTERVAL)
        self.gate = r.Gate(client, PidWatcher(server.proc.pid, str(server.log_path)), **kw)
        self.result: dict | None = None
        self.done: float | None = None

    def run(self) -> None:
        self.result = self.gate.run()
        self.done = time.monotonic()

    def wait_phase(self, phase: str, timeout: float = LOAD_DEADLINE) -> None:
        deadline = time.monotonic() + timeout
        while self.gate.phase != phase:
            assert self.is_alive(), f"the gate ended before {phase}: {self.result and self.result['msg']}"
            assert time.monotonic() < deadline, f"the gate did not reach {phase}"
            time.sleep(0.05)


def tree(pid: int) -> dict[int, str]:
    """The server's processes: pid -> cmdline (real SGLang names its children with
    setproctitle: ``sglang::scheduler``, ``sglang::detokenizer``)."""
    return {p: _listener.cmdline(p) or "" for p in _listener.descendants(pid)}


def scheduler_of(server: RealServer, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p, line in tree(server.proc.pid).items() if line.startswith("sglang::scheduler")]
        if found:
            return found[0]
        assert server.proc.poll() is None, server.text()[-2000:]
        time.sleep(0.05)
    raise AssertionError(f"no sglang::scheduler below {server.proc.pid}: {tree(server.proc.pid)}")


def session_left(server: RealServer) -> list[str]:
    """The processes of the server's session still alive besides its leader: a parent that
    dies of a signal before it set up its handlers leaves them."""
    return [_listener.cmdline(pid) or str(pid) for pid in session_pids(server.proc.pid) if pid != server.proc.pid]


def requests_for(server: RealServer, paths: tuple[str, ...]) -> int:
    """Requests uvicorn logged for these paths ('INFO: 127.0.0.1:N - "GET /v1/models HTTP/1.1" 401')."""
    return sum(server.text().count(f'"{method} {path} HTTP/1.1"') for path in paths for method in ("GET", "POST"))


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


@pytest.fixture
def servers(real, tmp_path):
    """start(release, *args, port=None) -> a RealServer stopped (its whole session) after the test."""
    started: list[RealServer] = []

    def start(release: str, *args: str, port: int | None = None) -> RealServer:
        server = RealServer(real, release, tmp_path / f"server-{len(started)}.log", port=port, args=args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def assert_ready(result: dict, server: RealServer) -> None:
    assert result["ready"] is True, result["msg"]
    assert result["failure"] is None and result["phase"] == "settled"
    assert list(result["phases"]) == list(r.PHASES)
    gen = result["generation"]
    assert gen["completion_tokens"] > 0 and gen["text"].strip(), gen
    # the listener was checked and is the server's own main process (uvicorn runs in it)
    assert result["listener"]["state"] == "owned", result["listener"]
    assert result["listener"]["pid"] in _listener.descendants(server.proc.pid)
    assert "sglang.launch_server" in result["listener"]["cmdline"]
    assert requests_for(server, ("/generate",)) >= 2  # SGLang's own warmup and the gate's
    # the real start-up milestones were followed, in order, up to the real "fired up" line
    seen = [s["stage"] for s in result["stages"]]
    for stage in ("weights", "memory_pool", "http", "warmup", "serving"):
        assert stage in seen, seen
    assert seen.index("weights") < seen.index("memory_pool") < seen.index("http") < seen.index("warmup") < seen.index("serving")
    # what the server resolved, from its own /server_info (real_sglang.CPU_ARGS: 4096 tokens, 1024 context)
    info = result["server"]
    assert info["max_total_tokens"] == 4096 and info["context_length"] == 1024, info
    assert info["version"] == server.release and isinstance(info["max_running_requests"], int) and info["max_running_requests"] > 0
    assert 0 < info["mem_fraction_static"] < 1 and info["cuda_graph_bs"] == []  # --disable-cuda-graph


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


def assert_the_simulators_metrics_are_real(server: RealServer) -> dict:
    """The simulator's /metrics (lab/simulator/sglang_simulator/metrics.py) against the real
    server's, same release: every family the simulator exposes is a real one, with the same
    type and the same label names. Real /metrics needs no API key (0.5.11 srt/utils/auth.py:100,
    0.5.23 :101-105). Returns the real families."""
    from sglang_simulator import metrics as sim_metrics
    from sglang_simulator.versions import release

    import urllib.request

    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as resp:  # no key
        assert resp.status == 200
        real = _deploy_metrics.parse(resp.read().decode("utf-8"))
    simulated = sim_metrics.Metrics(release(server.release), "m")
    simulated.observe(4, 8, 0.1, 0.5, False)
    simulated.observe(4, 8, 0.1, 0.5, True)
    sim = _deploy_metrics.parse(simulated.text({}, 1.0))

    def label_names(family: dict) -> set:
        return {name for _s, labels, _v in family["samples"] for name in labels if name != "le"}

    wrong = []
    for name, family in sim.items():
        if name not in real:
            wrong.append(f"{name}: not exposed by real {server.release}")
        elif real[name]["type"] != family["type"] or label_names(real[name]) != label_names(family):
            wrong.append(f"{name}: real {real[name]['type']} {sorted(label_names(real[name]))}, "
                         f"simulator {family['type']} {sorted(label_names(family))}")
    assert not wrong, wrong
    return real


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


# -- 1c. the drain before a stop reads real SGLang's load ------------------------------

def assert_drains_a_real_generation(server: RealServer) -> dict:
    """A client's long generation in flight: GET /v1/loads counts it running (0.5.11
    srt/entrypoints/v1_loads.py:134-180, 0.5.23 :96-151), or on 0.5.11 with --enable-metrics
    /metrics' scheduler gauges, a drain of 0 s says so, and a drain waits until it ended."""
    client = _http.Client(server.url, KEY, True, 5)
    assert _drain.drain(client, 0, 0.1)["in_flight_at_start"] == 0
    done: dict = {}

    def generate() -> None:
        answer = _http.Client(server.url, KEY, True, 120).call("POST", "/generate", {
            "text": "Count slowly:", "sampling_params": {"max_new_tokens": 120, "ignore_eos": True, "temperature": 0}})
        done["answer"], done["at"] = answer, time.monotonic()

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while _drain.read(client)[0] != (1, 0) and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.05)
    snapshot = _drain.drain(client, 0, 0.1)
    assert snapshot["timed_out"] is True and (snapshot["running_at_stop"], snapshot["waiting_at_stop"]) == (1, 0), snapshot
    result = _drain.drain(client, 120, 0.2)
    ended = time.monotonic()
    thread.join(10)
    assert result["drained"] is True and result["in_flight_at_start"] == 1 and result["in_flight_at_stop"] == 0, result
    if server.release == "0.5.11":
        # with --enable-metrics real 0.5.11 answers /v1/loads with 500: its metrics middleware reads
        # route.path of the included v1_loads router (srt/utils/common.py:1511-1519), which fastapi
        # 0.165.0 (the release's constraints) does not have; the drain reads /metrics instead
        assert client.call("GET", _drain.ENDPOINT).status == 500
        assert result["endpoint"] == "/metrics" and "read from /metrics" in result["msg"], result
        assert "'_IncludedRouter' object has no attribute 'path'" in server.text()
    else:  # 0.5.16+ read it with getattr (0.5.23 srt/observability/http_request_metrics.py:115)
        assert result["endpoint"] == "/v1/loads", result
    assert done["answer"].kind == "ok" and done["answer"].body["meta_info"]["completion_tokens"] == 120
    assert done["at"] <= ended  # the drain ended after the generation, not before
    return result


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
    assert figures["output_tokens_per_s"] > 0 and 0 < figures["ttft_p50"] <= figures["ttft_p95"] and figures["tpot_p50"] > 0
    # lines that arrive in one read share a time: on this fast tiny model the ITL may read 0
    assert figures["itl_p50"] >= 0
    note("bench 0.5.11", seconds=result["seconds"], tokens_per_s=figures["output_tokens_per_s"],
         ttft_p95=figures["ttft_p95"], itl_p50=figures["itl_p50"])


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


def test_a_scheduler_killed_while_loading_is_named(servers):
    """The host's OOM killer during start-up, as SIGKILL of the scheduler while it loads:
    "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). ..." (0.5.11
    srt/entrypoints/engine.py:1216-1224), exit status 1."""
    server = servers("0.5.11")
    gate = GateThread(server)
    gate.start()
    scheduler = scheduler_of(server)
    clock = ExitClock(server.proc.pid)
    killed = time.monotonic()
    os.kill(scheduler, signal.SIGKILL)
    gate.join(60)
    result = gate.result
    assert result is not None and result["failure"] == "process_exited", result
    assert result["phase"] == "http"
    assert result["cause"] == "subprocess_died", result
    assert result["cause_line"].startswith("RuntimeError: Rank 0 scheduler died during initialization (exit code: -9)")
    assert server.proc.wait(10) == 1
    assert gate.done - clock.at < POLL_SLACK, gate.done - clock.at
    note("scheduler killed while loading", kill_to_exit=clock.at - killed, exit_to_verdict=gate.done - clock.at)


# -- 5. SIGTERM during the gate ---------------------------------------------------------

@pytest.mark.parametrize("release", ["0.5.11", "0.5.23"])
def test_sigterm_while_loading_ends_the_gate(servers, release):
    """A stop while the server loads: the gate ends at its next poll with process_exited,
    not ready and not a wait to the deadline. The exit status depends on when the signal
    lands (before SGLang installs its handlers the default action kills with -15; a served
    0.5.11 ends -9 after draining, real-sglang.md), so it is recorded, not pinned."""
    server = servers(release)
    gate = GateThread(server)
    gate.start()
    gate.wait_phase("http")
    scheduler_of(server)  # loading: the scheduler exists, the port is not open yet
    assert "Uvicorn running" not in server.text()
    clock = ExitClock(server.proc.pid)
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    gate.join(60)
    result = gate.result
    assert result is not None and result["ready"] is False
    assert (result["phase"], result["failure"]) == ("http", "process_exited"), result["msg"]
    rc = server.proc.wait(10)
    assert rc in (-signal.SIGTERM, -signal.SIGKILL, 0), rc
    assert gate.done - clock.at < POLL_SLACK, gate.done - clock.at
    # recorded: under systemd the unit's cgroup is killed with it; by hand they linger
    left = session_left(server)
    note(f"SIGTERM while loading {release}", term_to_exit=clock.at - sent, exit_to_verdict=gate.done - clock.at, rc=rc,
         left_behind=",".join(sorted({x.split()[0] for x in left})) or "none")


# -- 1b. ready on the newest supported release --------------------------------------------

def test_ready_with_a_real_generation_0_5_23(servers):
    server = servers("0.5.23", "--api-key", KEY, "--enable-metrics")
    started = time.monotonic()
    result = run_gate(server)
    assert_ready(result, server)
    # 0.5.23 serves /ready (srt/entrypoints/http_server.py:714-718): 200 once ready
    assert any(e["event"] == "/ready 200 (takes new requests)" for e in result["timeline"])
    # and resolves another chunked prefill default than 0.5.11 (4096: arg_groups/memory_hook.py:101-117)
    assert result["server"]["chunked_prefill_size"] == 4096
    note("ready 0.5.23", load_to_ready=time.monotonic() - started, health=result["phases"]["health"])
    # its /metrics: the simulator's families are real 0.5.23 ones; is_streaming from 0.5.17 and
    # startup_time_seconds{phase} replacing engine_startup_time (_sglang_releases metrics_* facts)
    real = assert_the_simulators_metrics_are_real(server)
    assert {l.get("is_streaming") for _n, l, _v in real["sglang:num_requests_total"]["samples"]} == {"false"}
    assert "sglang:startup_time_seconds" in real and "sglang:engine_startup_time" not in real
    note("metrics 0.5.23", families=len(real))
    drained = assert_drains_a_real_generation(server)
    note("drain 0.5.23", drain=drained["seconds"], polls=drained["polls"])


# -- 6. a real hang: the server stopped mid-start logs nothing more -------------------------

def test_a_real_server_stopped_mid_start_is_stalled_at_its_stage_budget(servers):
    """Real SGLang's hangs (NCCL, a graph capture with custom all-reduce) log nothing and
    the process stays alive. Here the real server's whole tree is stopped (SIGSTOP) once
    the gate has seen it reach a milestone past ``starting``: the gate must end at that
    stage's budget with ``stalled``, naming the stage and the last real log line, not at
    its deadline. The budgets are the defaults but for the stages after ``starting``."""
    server = servers("0.5.11")
    budget = 10.0
    budgets = {stage: budget for stage in r.STALL_BUDGETS if stage != "starting"}
    gate = GateThread(server, budgets=budgets)
    gate.start()
    deadline = time.monotonic() + LOAD_DEADLINE
    while gate.gate.stage in (None, "starting"):
        assert gate.is_alive() and time.monotonic() < deadline, gate.result and gate.result["msg"]
        time.sleep(0.02)
    os.killpg(server.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        gate.join(budget + 30)
        result = gate.result
        assert result is not None, "the gate did not end"
        assert result["failure"] == "stalled", result["msg"]
        assert result["stage"] != "serving" and f"no progress in stage {result['stage']}" in result["detail"]
        assert "last log line: " in result["detail"] and result["last_log_line"]
        assert gate.done - stopped < budget + POLL_SLACK + 2, gate.done - stopped
        # ended at the stage's budget, not at the gate's deadline (the start before the stop alone took 20-85 s
        # on a busy two-core machine)
        assert result["elapsed"] < LOAD_DEADLINE / 2
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)
    note("stopped mid-start", stage=result["stage"], stop_to_verdict=gate.done - stopped, budget=budget)
