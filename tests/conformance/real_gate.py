"""What the real-SGLang gate cases share (test_real_gate.py, test_real_gate_own_servers.py):
the gate run as wait_for_sglang runs it in PID mode (a Gate with a PidWatcher on the real
server's main process and its log file), the servers' process trees, the checks of a ready
verdict, of real /metrics against the simulator's and of a drain, and the figures each case
notes (printed at the end of the run: conftest.py)."""

from __future__ import annotations

import threading
import time

import pytest

from real_sglang import RealServer, session_pids

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics
from ansible_collections.inferops.sglang.plugins.module_utils import _drain
from ansible_collections.inferops.sglang.plugins.module_utils import _http
from ansible_collections.inferops.sglang.plugins.module_utils import _listener
from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as r
from ansible_collections.inferops.sglang.plugins.module_utils._process_watch import PidWatcher

KEY = "conformance-key-4b1e9c"
INTERVAL = 0.5
LOAD_DEADLINE = 300.0  # a real CPU start is 10-45 s here; the deadline only bounds a broken run
# "within about a poll": the gate notices a dead process at its next poll (INTERVAL) and
# then classifies the log it already holds; 1.5 s leave room for a loaded 2-core machine.
POLL_SLACK = INTERVAL + 1.5

FIGURES: dict[str, dict] = {}


def note(case: str, **figures) -> None:
    FIGURES.setdefault(case, {}).update({k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()})


@pytest.fixture(autouse=True)
def timed(request):
    """Each case's wall time and the figures it noted go with its report (conftest.py prints
    them at the end of the run, from whichever worker ran the case)."""
    started = time.monotonic()
    FIGURES.clear()
    yield
    note(request.node.name, wall=time.monotonic() - started)
    request.node.user_properties.extend(("real-SGLang gate figures (s)", {case: figures}) for case, figures in FIGURES.items())


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
    # That the drain ended after the generation is the server's own count (in flight 1 at the
    # start, 0 at the stop, read after the scheduler released it); the client's answer is written
    # after that release, so its arrival may trail the drain's end on a loaded machine (one CI run:
    # the answer arrived after the drain returned, with the whole 120 tokens).
    assert result["seconds"] > 0
    return result
