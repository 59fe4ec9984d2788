"""The readiness gate against real processes and real HTTP: the SGLang simulator
(a test double) for the field story's failures, and a scripted HTTP server
(tests/unit/fake_sglang_http.py, also a test double) for the HTTP edge cases.

The fail-fast assertions use a generous deadline and check the verdict came far
sooner: without fail-fast the gate would have waited the deadline out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sim_helpers import BALANCED, MODEL, NEXTN, NOGRAPH, SHADOW, FakeClock, free_port

from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as r
from ansible_collections.inferops.sglang.plugins.module_utils import _process_watch
from ansible_collections.inferops.sglang.plugins.module_utils._process_watch import NoWatcher, PidWatcher, UnitWatcher

FAKE = Path(__file__).resolve().parents[2] / "fake_sglang_http.py"
DEADLINE = 60.0


def gate(port: int, watcher=None, api_key: str | None = None, clock: FakeClock | None = None, **kw) -> dict:
    """The gate on 127.0.0.1:port; with a FakeClock its deadline, budgets and waits
    pass in that clock's time (for a watched process that does not need real time to
    get anywhere: a scripted unit, a hung process)."""
    kw.setdefault("timeout", DEADLINE)
    kw.setdefault("interval", 0.25)
    kw.setdefault("settle", 0.5)
    if clock is not None:
        kw.update(clock=clock.monotonic, sleep=clock.sleep)
    client = r.Client(f"http://127.0.0.1:{port}", api_key, True, kw.pop("request_timeout", 10))
    return r.Gate(client, watcher or NoWatcher(), **kw).run()


def unit(run, clock: FakeClock, **kw) -> UnitWatcher:
    """A UnitWatcher of sglang-qwen.service over a run_command double, on the test's clock."""
    return UnitWatcher(kw.pop("name", "sglang-qwen.service"), run, clock=clock.monotonic, wall_clock=clock.time, **kw)


def watch(server) -> PidWatcher:
    return PidWatcher(server.proc.pid, str(server.log))


@pytest.fixture
def fake(tmp_path):
    procs = []

    def start(**scenario):
        port = free_port()
        log = tmp_path / f"fake-{port}.log"
        proc = subprocess.Popen([sys.executable, str(FAKE), str(port), json.dumps(scenario)],
                                stdout=log.open("w"), stderr=subprocess.STDOUT)
        procs.append(proc)
        proc.port, proc.log = port, log
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


# -- the field story, on the simulator ------------------------------------------

def test_nextn_is_ready_with_a_real_generation(launch):
    server = launch([*MODEL, *NEXTN])
    result = gate(server.port, watch(server))
    assert result["ready"] is True, result["msg"]
    assert result["phase"] == "settled" and result["failure"] is None
    assert list(result["phases"]) == list(r.PHASES)
    assert result["models"] == ["Qwen3.6-27B"]
    gen = result["generation"]
    assert gen["completion_tokens"] == 16 and gen["text"].strip()
    assert gen["spec_accept_length"] == pytest.approx(2.71)
    assert gen["tokens_per_second"] > 0
    assert "ready after" in result["msg"]


@pytest.mark.parametrize("endpoint, path", [("completions", "/v1/completions"), ("chat", "/v1/chat/completions")])
def test_openai_endpoints_use_the_listed_model(launch, endpoint, path):
    server = launch([*MODEL, *NEXTN])
    result = gate(server.port, watch(server), endpoint=endpoint, generations=2)
    assert result["ready"], result["msg"]
    assert [g["endpoint"] for g in result["generations"]] == [path, path]
    assert result["generation"]["model"] == "Qwen3.6-27B"
    # Qwen3.6 has a vision section: SGLang's own warmup is a chat request with an image
    # (real-sglang.md; the simulator does the same since it conforms), on top of the gate's two
    warmup = 1 if path == "/v1/chat/completions" else 0
    assert server.output().count(f'"POST {path} HTTP/1.1"') == 2 + warmup


def test_pool_error_fails_at_once_with_the_cause(launch):
    server = launch([*MODEL, *SHADOW], ddtree=True)
    result = gate(server.port, watch(server))
    assert result["ready"] is False
    assert result["failure"] == "process_exited"
    assert result["cause"] == "kv_pool_too_small"
    assert any("Not enough memory. Please try to increase --mem-fraction-static" in x for x in result["evidence"])
    assert "raise mem_fraction_static" in result["msg"]
    assert result["elapsed"] < DEADLINE / 4


def test_a_draft_oom_ends_the_wait_with_the_cause(launch):
    """Field case 3 (shadow-nograph). Real SGLang does not stay alive after a scheduler's
    exception: it SIGKILLs its tree (0.5.11 managers/scheduler.py:3936-3939,
    entrypoints/engine.py:1185-1191), and the simulator now does so too."""
    server = launch([*MODEL, *NOGRAPH], ddtree=True)
    result = gate(server.port, watch(server))
    assert result["failure"] == "process_exited", result["msg"]
    assert result["cause"] == "cuda_oom"
    assert "while loading the draft model" in result["cause_summary"]
    assert result["phase"] == "http" and result["last_response"] == "connection refused"
    assert result["elapsed"] < DEADLINE / 4


def test_crash_on_the_first_real_request_after_health_passed(launch):
    server = launch([*MODEL, *BALANCED], ddtree=True)
    result = gate(server.port, watch(server))
    assert result["ready"] is False
    assert result["phases"].get("health") is not None  # /health said 200 ...
    assert result["phase"] == "generation"  # ... and the real request killed it
    assert result["failure"] == "process_exited"
    assert result["cause"] == "cuda_library"
    assert result["cause_line"] == "OSError: libcudart.so.12: cannot open shared object file: No such file or directory"
    assert "not a memory problem" in result["msg"]


def test_same_variant_is_ready_where_the_library_exists(launch):
    server = launch([*MODEL, *BALANCED], ddtree=True, host="ct200", gpus="0,1")
    result = gate(server.port, watch(server))
    assert result["ready"], result["msg"]
    assert result["generation"]["spec_accept_length"] > 4


@pytest.mark.parametrize("case, extra, cause", [
    ("lost GPU", dict(gpus="0,1"), "gpu_lost"),
    ("too few GPUs", dict(gpus="0"), "gpu_count"),
])
def test_gpu_faults_are_named(launch, case, extra, cause):
    server = launch([*MODEL, *NEXTN], **extra)
    result = gate(server.port, watch(server))
    assert (result["failure"], result["cause"]) == ("process_exited", cause), case


def test_removed_flag_on_a_newer_sglang(launch):
    server = launch([*MODEL, *NEXTN, "--cuda-graph-max-bs", "16"], version="0.5.20")
    result = gate(server.port, watch(server))
    assert (result["failure"], result["cause"]) == ("process_exited", "bad_flag")
    assert any("ambiguous option: --cuda-graph-max-bs" in x for x in result["evidence"])


def test_missing_model_path(launch):
    server = launch(["--model-path", "/srv/models/absent", "--tp-size", "2"])
    result = gate(server.port, watch(server))
    assert result["cause"] == "model_path"


def test_port_taken_by_the_old_server(launch):
    first = launch([*MODEL, *NEXTN], host="ct200", gpus="0,1")
    assert gate(first.port, watch(first), settle=0)["ready"]
    # a second server on the same port (other GPUs of ct129's stand-in) cannot bind
    second = launch([*MODEL, "--speculative-algorithm", "NEXTN", "--context-length", "8192", "--max-running-requests", "4",
                     "--mem-fraction-static", "0.88"], gpus="3,4", port=first.port)
    result = gate(second.port, watch(second))
    # The old server answers on the port: the gate names it at once, before the new one
    # gets as far as binding (real SGLang would then exit 3 after a warmup against the old
    # server, real-sglang.md; tests/conformance/test_real_gate.py shows it on real 0.5.11).
    assert (result["phase"], result["failure"]) == ("http", "port_taken"), result["msg"]
    assert result["listener"]["pid"] == first.proc.pid
    assert result["elapsed"] < 2


def test_wrong_api_key_is_unauthorized_not_timeout(launch):
    server = launch([*MODEL, *NEXTN, "--api-key", "s3cret-key"])
    result = gate(server.port, watch(server), api_key="wrong")
    assert result["failure"] == "unauthorized"
    assert "API key is wrong or missing" in result["msg"]
    assert result["elapsed"] < DEADLINE / 4
    ok = gate(server.port, watch(server), api_key="s3cret-key")
    assert ok["ready"], ok["msg"]
    assert "s3cret-key" not in json.dumps(ok)


# -- HTTP edge cases, on the scripted server -------------------------------------

def test_nothing_listening_times_out_as_not_listening():
    clock = FakeClock()
    result = gate(free_port(), timeout=1.5, clock=clock)
    assert result["elapsed"] >= 1.5
    assert (result["phase"], result["failure"]) == ("http", "not_listening")
    assert result["last_response"] == "connection refused"


def test_health_never_ready_is_not_ready(fake):
    server = fake(ready_after=3600)
    result = gate(server.port, PidWatcher(server.pid, str(server.log)), timeout=2)
    assert (result["phase"], result["failure"]) == ("health", "not_ready")
    assert result["last_response"] == "HTTP 503"
    assert result["models"] == ["fake-model"]


def test_waits_through_a_slow_start(fake):
    server = fake(bind_after=1.0, ready_after=1.0)
    result = gate(server.port, PidWatcher(server.pid, str(server.log)))
    assert result["ready"], result["msg"]
    assert result["phases"]["http"] >= 0.9 and result["phases"]["health"] >= 1.9
    assert "Uvicorn running" in result["last_log_line"] or "POST /generate" in server.log.read_text()


@pytest.mark.parametrize("mode, failure", [
    ("empty", "generation_empty"),
    ("zero_tokens", "generation_empty"),
    ("error", "generation_error"),
    ("hang", "generation_timeout"),
])
def test_generation_failures(fake, mode, failure):
    server = fake(generation=mode)
    result = gate(server.port, PidWatcher(server.pid, str(server.log)), request_timeout=1)
    assert (result["phase"], result["failure"]) == ("generation", failure)
    assert "passed its health check but a real generation" in result["msg"]
    if mode == "error":
        assert "HTTP 500" in result["detail"] and "Internal server error" in result["detail"]


def test_server_dying_on_the_request_is_a_process_failure(fake):
    server = fake(generation="die")
    result = gate(server.port, PidWatcher(server.pid, str(server.log)))
    assert (result["phase"], result["failure"]) == ("generation", "process_exited")
    assert result["cause"] == "unknown"
    assert "Segmentation fault" in " ".join(result["evidence"])


def test_exit_during_settle_is_caught(fake):
    server = fake(exit_after=1.0)
    result = gate(server.port, PidWatcher(server.pid, str(server.log)), settle=30)
    assert (result["phase"], result["failure"]) == ("settled", "process_exited")
    assert result["elapsed"] < 10  # not the 30 s settle


@pytest.mark.parametrize("status", [401, 403])
def test_gateway_refusals_are_unauthorized(fake, status):
    server = fake(api_key="k", status_for_auth=status)
    result = gate(server.port, timeout=5)
    assert result["failure"] == "unauthorized" and f"HTTP {status}" in result["detail"]


def test_consecutive_generations_are_all_made(fake):
    server = fake()
    result = gate(server.port, generations=3, endpoint="chat")
    assert result["ready"]
    assert len(result["generations"]) == 3
    assert server.log.read_text().count('"POST /v1/chat/completions HTTP/1.1"') == 3
    assert result["generation"]["text"] == " Paris. It is the capital"  # reasoning_content counts


def test_proxy_in_the_environment_is_not_used(fake, monkeypatch):
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    dead = free_port()  # nothing listens here: a request through this proxy would fail
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{dead}")
    server = fake()
    result = gate(server.port)
    assert result["ready"], result["msg"]


def test_vanished_pid_fails_before_any_request():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    result = gate(free_port(), PidWatcher(proc.pid))
    assert (result["phase"], result["failure"]) == ("process", "process_exited")
    assert result["elapsed"] < 1


def test_log_file_progress_is_reported(fake):
    server = fake(ready_after=0.5)
    result = gate(server.port, PidWatcher(server.pid, str(server.log)))
    assert result["ready"]
    events = [e["event"] for e in result["timeline"]]
    # a process that just started is in the implicit first stage, then passes its phases
    assert events[0].startswith("stage starting (") and events[1].startswith("process alive")
    assert events[-1].startswith("same process after")
    assert result["last_log_line"]


# -- the systemd watcher's reading of systemctl/journalctl -----------------------

def fake_systemctl(states: list[dict], journal: list[dict] | None = None):
    """run_command double that answers `systemctl show` with the given property
    sets in turn (the text format systemd prints) and journalctl with entries."""
    calls = {"show": 0}

    def run(argv):
        if argv[0] == "systemctl":
            props = states[min(calls["show"], len(states) - 1)]
            calls["show"] += 1
            return 0, "".join(f"{k}={v}\n" for k, v in props.items()), ""
        entries = list(journal or [])
        after = next((a.split("=", 1)[1] for a in argv if a.startswith("--after-cursor=")), None)
        if after is not None:  # as journalctl does: only the entries after that cursor
            cursors = [e.get("__CURSOR") for e in entries]
            entries = entries[cursors.index(after) + 1:] if after in cursors else []
        if "--reverse" in argv:  # as journalctl does: newest first, the first N of those
            entries = entries[::-1][:int(argv[argv.index("-n") + 1])] if "-n" in argv else entries[::-1]
        return 0, "".join(json.dumps(e) + "\n" for e in entries), ""

    return run


BASE = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
        "MainPID": "4242", "NRestarts": "0", "InvocationID": "abc", "ExecMainCode": "0", "ExecMainStatus": "0",
        "InactiveExitTimestampMonotonic": str(int((time.monotonic() - 30) * 1e6)),
        "ExecMainExitTimestampMonotonic": "0"}


@pytest.mark.parametrize("later, failure, detail", [
    ({"ActiveState": "failed", "SubState": "failed", "Result": "signal", "MainPID": "0", "ExecMainCode": "2",
      "ExecMainStatus": "9"}, "unit_failed", "failed/failed, Result: signal, code=killed, signal=KILL"),
    ({"ActiveState": "activating", "SubState": "auto-restart", "Result": "exit-code", "MainPID": "0"}, "unit_restarted", "auto-restart"),
    ({"NRestarts": "1", "MainPID": "5151"}, "unit_restarted", "NRestarts 0 -> 1, MainPID 4242 -> 5151"),
    ({"MainPID": "5151"}, "unit_restarted", "MainPID 4242 -> 5151"),
    ({"ActiveState": "inactive", "SubState": "dead", "MainPID": "0"}, "unit_inactive", "inactive/dead"),
    ({"ActiveState": "deactivating", "SubState": "stop-sigterm"}, "unit_inactive", "deactivating"),
])
def test_unit_state_changes_end_the_wait(later, failure, detail):
    clock = FakeClock()
    watcher = unit(fake_systemctl([BASE, BASE, {**BASE, **later}]), clock)
    result = gate(free_port(), watcher, timeout=30, clock=clock)
    assert result["failure"] == failure
    assert detail in result["detail"]
    assert result["elapsed"] < 10  # the 30 s deadline is not waited out ...
    assert result["elapsed"] >= UnitWatcher.cause_wait  # ... the journal is read for a cause for 6 s (it has none)
    assert result["msg"].startswith("unit sglang-qwen.service")


def test_unit_not_installed():
    clock = FakeClock()
    watcher = unit(fake_systemctl([{**BASE, "LoadState": "not-found", "ActiveState": "inactive"}]), clock, name="nope.service")
    result = gate(free_port(), watcher, clock=clock)
    assert (result["phase"], result["failure"]) == ("process", "unit_missing")
    assert "not-found" in result["msg"]
    assert result["elapsed"] < 2  # no waiting for a dead process's last lines: there was none


def test_journal_since_the_units_start_only():
    start = time.monotonic() - 30
    start_us = int((time.time() - 30) * 1e6)
    failed = {**BASE, "ActiveState": "failed", "SubState": "failed", "Result": "signal", "MainPID": "0",
              "InactiveExitTimestampMonotonic": str(int(start * 1e6)), "ExecMainExitTimestampMonotonic": str(int((start + 33.5) * 1e6))}
    journal = [
        {"__CURSOR": "c1", "__REALTIME_TIMESTAMP": str(start_us - 60_000_000),
         "MESSAGE": "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable"},  # an older run
        {"__CURSOR": "c2", "__REALTIME_TIMESTAMP": str(start_us + 1_000_000), "MESSAGE": "Load weight begin. avail mem=47.50 GB"},
        {"__CURSOR": "c3", "__REALTIME_TIMESTAMP": str(start_us + 33_000_000),
         "MESSAGE": list(b"RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
                         b"mem_fraction_static=0.88 \xff")},
    ]
    watcher = UnitWatcher("sglang-qwen.service", fake_systemctl([failed], journal))
    result = gate(free_port(), watcher)
    assert result["cause"] == "kv_pool_too_small"
    assert result["since_start"] == pytest.approx(33.5, abs=0.2)
    assert result["msg"].startswith("unit sglang-qwen.service failed 34 s after start (failed/failed, Result: signal")
    assert "SGLang could not size its KV pool" in result["msg"]


def up_for(clock: FakeClock, seconds: float) -> FakeClock:
    """The clock of a machine up an hour longer than ``seconds`` at least, whatever this
    one's uptime (systemd's monotonic timestamps count from boot: a unit started
    ``seconds`` ago on a machine up less has no such timestamp)."""
    clock.now = max(clock.now, seconds + 3600.0)
    clock.epoch = time.time() - clock.now
    return clock


def probe_journal(clock: FakeClock) -> list[dict]:
    """A journal with a line from an hour ago (the same run) and one from now (the probe's)."""
    now_us = int(clock.time() * 1e6)
    return [
        {"__CURSOR": "c1", "__REALTIME_TIMESTAMP": str(now_us - 3595_000_000), "MESSAGE": "an hour-old line"},
        {"__CURSOR": "c2", "__REALTIME_TIMESTAMP": str(now_us), "MESSAGE": "a line of the probe"},
    ]


def recorded(run, seen: list):
    def recording(argv):
        seen.append(argv)
        return run(argv)
    return recording


def test_log_since_reads_only_what_the_unit_wrote_after_it():
    """The watchdog's probe of a server up for hours (log_since: the probe's start) reads the
    journal from then, not the run's whole log: an old error line of the same run is not its cause."""
    clock = up_for(FakeClock(), 3600)
    up = {**BASE, "InactiveExitTimestampMonotonic": str(int((clock.monotonic() - 3600) * 1e6))}
    journal = probe_journal(clock)
    seen: list = []
    since = clock.time() - 0.5
    watcher = unit(recorded(fake_systemctl([up], journal), seen), clock, log_since=since)
    watcher.begin()
    assert watcher.since_start() == pytest.approx(3600, abs=1)
    assert watcher.all_lines() == ["a line of the probe"]
    assert f"--since=@{int(since - 1.0) - 1}" in seen[-1]
    # without it, the run's whole journal
    whole = unit(recorded(fake_systemctl([up], journal), seen), clock)
    whole.begin()
    assert whole.all_lines() == ["an hour-old line", "a line of the probe"]
    assert f"--since=@{int(clock.time() - 3600) - 1}" in seen[-1]


def test_log_since_holds_when_the_units_start_is_unknown():
    """systemd gives no start (InactiveExitTimestampMonotonic 0: none recorded): the probe
    still reads only from log_since; without log_since, the journal's last 200 lines."""
    clock = FakeClock()
    unknown = {**BASE, "InactiveExitTimestampMonotonic": "0"}
    journal = probe_journal(clock)
    seen: list = []
    since = clock.time() - 0.5
    watcher = unit(recorded(fake_systemctl([unknown], journal), seen), clock, log_since=since)
    watcher.begin()
    assert watcher.since_start() is None
    assert watcher.all_lines() == ["a line of the probe"]
    assert f"--since=@{int(since - 1.0) - 1}" in seen[-1] and seen[-1][-3:] == ["--reverse", "-n", str(_process_watch.FIRST_READ)]
    whole = unit(recorded(fake_systemctl([unknown], journal), seen), clock)
    whole.begin()
    assert whole.all_lines() == ["an hour-old line", "a line of the probe"]
    assert seen[-1][-2:] == ["-n", "200"] and not any(a.startswith("--since") for a in seen[-1])


def test_gate_begun_after_the_crash_reads_the_crashed_run():
    """A gate that starts after the server already died (a slow controller) finds
    the unit held for an automatic restart. systemd 252 passes it through inactive
    on the way, so InactiveExitTimestamp is the crash itself: the crashed run's
    lines are those since its main process started, not since that timestamp."""
    start = time.monotonic() - 8
    start_us = int((time.time() - 8) * 1e6)
    held = {**BASE, "ActiveState": "activating", "SubState": "auto-restart", "Result": "signal", "MainPID": "0",
            "ExecMainCode": "2", "ExecMainStatus": "9",
            "ExecMainStartTimestampMonotonic": str(int(start * 1e6)),
            "ExecMainExitTimestampMonotonic": str(int((start + 1.1) * 1e6)),
            "InactiveExitTimestampMonotonic": str(int((start + 1.1) * 1e6) + 400)}
    journal = [
        {"__CURSOR": "c1", "__REALTIME_TIMESTAMP": str(start_us - 60_000_000),
         "MESSAGE": "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable"},  # an older run
        {"__CURSOR": "c2", "__REALTIME_TIMESTAMP": str(start_us + 300_000), "MESSAGE": "Load weight begin. avail mem=47.50 GB"},
        {"__CURSOR": "c3", "__REALTIME_TIMESTAMP": str(start_us + 1_050_000),
         "MESSAGE": "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.88"},
        {"__CURSOR": "c4", "__REALTIME_TIMESTAMP": str(start_us + 1_100_500),
         "MESSAGE": "sglang-qwen.service: Main process exited, code=killed, status=9/KILL"},
    ]
    watcher = UnitWatcher("sglang-qwen.service", fake_systemctl([held], journal))
    result = gate(free_port(), watcher)
    assert (result["failure"], result["cause"]) == ("unit_restarted", "kv_pool_too_small")
    assert result["since_start"] == pytest.approx(1.1, abs=0.05)
    assert result["detection_delay"] == pytest.approx(6.9, abs=1.0)
    assert "CUDA-capable device" not in " ".join(result["evidence"])


def test_a_fresh_start_does_not_read_the_previous_crash():
    """The same timestamps outside auto-restart (a new start after a failed run)
    keep the new run's start: the old run's cause is not reported again."""
    start = time.monotonic() - 8
    start_us = int((time.time() - 8) * 1e6)
    failed = {**BASE, "ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "MainPID": "0",
              "ExecMainCode": "1", "ExecMainStatus": "1",
              "ExecMainStartTimestampMonotonic": str(int(start * 1e6)),
              "ExecMainExitTimestampMonotonic": str(int((start + 1.1) * 1e6)),
              "InactiveExitTimestampMonotonic": str(int((start + 5) * 1e6))}
    journal = [
        {"__CURSOR": "c1", "__REALTIME_TIMESTAMP": str(start_us + 1_050_000),
         "MESSAGE": "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."},
        {"__CURSOR": "c2", "__REALTIME_TIMESTAMP": str(start_us + 5_200_000), "MESSAGE": "ValueError: nope"},
    ]
    clock = FakeClock()
    result = gate(free_port(), unit(fake_systemctl([failed], journal), clock), clock=clock)
    assert result["cause"] != "kv_pool_too_small"


# -- /ready, /server_info, the progress file ------------------------------------


def test_ready_endpoint_is_a_phase_where_served(fake):
    server = fake(ready_after=1.0, ready_endpoint=True)
    result = gate(server.port, PidWatcher(server.pid, str(server.log)))
    assert result["ready"], result["msg"]
    assert list(result["phases"]) == list(r.PHASES)
    assert result["phases"]["ready"] >= result["phases"]["health"]
    assert any(e["event"] == "/ready 200 (takes new requests)" for e in result["timeline"])


def test_ready_endpoint_absent_before_0_5_20_passes(fake):
    server = fake()
    result = gate(server.port, PidWatcher(server.pid, str(server.log)))
    assert result["ready"], result["msg"]
    assert any("SGLang before 0.5.20" in e["event"] for e in result["timeline"])


# /server_info bodies cut down to the keys the gate reads, as the real servers answered them
# on CPU (0.5.11 and 0.5.23, the tiny model): the 0.5.11 graph sizes at the top level, the
# 0.5.23 ones per rank; the running-request cap per DP rank; the API key at the top level.
INFO_0_5_11 = {"version": "0.5.11", "max_total_num_tokens": 4096, "max_running_requests": None, "chunked_prefill_size": 2048,
               "mem_fraction_static": 0.843, "context_length": 1024, "cuda_graph_bs": [1, 2, 4, 8], "disable_cuda_graph": False,
               "api_key": "k-secret",
               "internal_states": [{"effective_max_running_requests_per_dp": 2048, "memory_usage": {"token_capacity": 4096}}]}
INFO_0_5_23 = {"version": "0.5.23", "max_total_num_tokens": 4096, "max_running_requests": None, "chunked_prefill_size": 4096,
               "mem_fraction_static": 0.719, "context_length": 1024, "cuda_graph_bs": None, "disable_cuda_graph": False,
               "dp_size": 2, "api_key": "k-secret",
               "internal_states": [{"effective_max_running_requests_per_dp": 8, "decode_cuda_graph_bs": [1, 2, 4]}]}


@pytest.mark.parametrize("info, figures", [
    (INFO_0_5_11, {"version": "0.5.11", "max_total_tokens": 4096, "max_running_requests": 2048, "chunked_prefill_size": 2048,
                   "mem_fraction_static": 0.843, "context_length": 1024, "cuda_graph_bs": [1, 2, 4, 8]}),
    (INFO_0_5_23, {"version": "0.5.23", "max_total_tokens": 4096, "max_running_requests": 16, "chunked_prefill_size": 4096,
                   "mem_fraction_static": 0.719, "context_length": 1024, "cuda_graph_bs": [1, 2, 4]}),
    ({**INFO_0_5_11, "disable_cuda_graph": True}, {"cuda_graph_bs": []}),
    # 0.5.14-0.5.20: only the resolved cuda_graph_config (the simulator's and the wheels' shape)
    ({**INFO_0_5_11, "cuda_graph_bs": None, "cuda_graph_config": {"decode": {"backend": "full", "bs": [1, 2, 4], "max_bs": 4}}},
     {"cuda_graph_bs": [1, 2, 4]}),
    ({**INFO_0_5_11, "cuda_graph_bs": None, "cuda_graph_config": {"decode": {"backend": "disabled", "bs": [1, 2]}}},
     {"cuda_graph_bs": []}),
    ("not json", None),
])
def test_server_figures(info, figures):
    got = r.server_figures(info)
    if figures is None:
        assert got is None
    else:
        assert {k: got[k] for k in figures} == figures
        assert "api_key" not in got and "k-secret" not in json.dumps(got)


def test_ready_server_reports_its_figures_never_its_key(fake):
    server = fake(server_info=INFO_0_5_11)
    result = gate(server.port, PidWatcher(server.pid, str(server.log)))
    assert result["ready"], result["msg"]
    assert result["server"]["max_total_tokens"] == 4096 and result["server"]["max_running_requests"] == 2048
    # (the listener's command line is the test double's, with its scenario, key included)
    assert "k-secret" not in json.dumps({k: v for k, v in result.items() if k != "listener"})


def test_server_info_unanswered_still_ready(fake):
    server = fake()  # /server_info is 404 here
    result = gate(server.port, PidWatcher(server.pid, str(server.log)))
    assert result["ready"] and result["server"] is None
    assert any(e["event"].startswith("/server_info not read (HTTP 404") for e in result["timeline"])


def test_progress_file_holds_the_last_state(fake, tmp_path):
    server = fake(ready_after=0.5)
    progress = tmp_path / "progress.json"
    # the temporary file's name used to be predictable: a link there is neither followed nor replaced
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    planted = tmp_path / f".progress.json.{os.getpid()}"
    planted.symlink_to(victim)
    client = r.Client(f"http://127.0.0.1:{server.port}", None, True, 10)
    result = r.Gate(client, PidWatcher(server.pid, str(server.log)), timeout=DEADLINE, interval=0.25, settle=0.5,
                    progress_file=str(progress)).run()
    assert result["ready"]
    state = json.loads(progress.read_text())
    assert state["phase"] == "settled" and state["event"].startswith("same process after")
    assert oct(progress.stat().st_mode & 0o777) == "0o600" and not progress.is_symlink()
    assert victim.read_text() == "untouched" and planted.is_symlink()
    assert list(tmp_path.glob(".progress.json.*")) == [planted]  # no temporary file left


# -- stalls: a start whose stage outlasts its budget ------------------------------

class Hanging:
    """A live process that logs the given lines, then nothing (a real hang logs nothing)."""

    def __init__(self, tmp_path, lines: list[str]) -> None:
        self.log = tmp_path / "hang.log"
        self.log.write_text("".join(line + "\n" for line in lines))
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    def watcher(self) -> PidWatcher:
        return PidWatcher(self.proc.pid, str(self.log))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def hanging(tmp_path):
    made = []

    def start(lines):
        made.append(Hanging(tmp_path, lines))
        return made[-1]

    yield start
    for h in made:
        h.stop()


# Lines as real 0.5.11 logs them (model_runner.py:1103 and :1290, cuda_graph_runner.py:639)
CAPTURE = ["[2026-12-01 17:15:12 TP0] Init torch distributed begin.",
           "[2026-12-01 17:15:12 TP0] Init torch distributed ends. elapsed=0.02 s, mem usage=0.49 GB",
           "[2026-12-01 17:15:13 TP0] Load weight begin. avail mem=47.50 GB",
           "[2026-12-01 17:15:40 TP0] Load weight end. elapsed=27.01 s, type=Qwen3_5ForConditionalGeneration, avail mem=21.30 GB, "
           "mem usage=26.20 GB.",
           "[2026-12-01 17:15:41 TP0] KV Cache is allocated. #tokens: 197762, K size: 3.02 GB, V size: 3.02 GB",
           "[2026-12-01 17:15:41 TP0] Memory pool end. avail mem=14.10 GB",
           "[2026-12-01 17:15:42 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=14.00 GB"]


def test_a_silent_hang_in_capture_is_stalled_at_its_budget(hanging):
    h = hanging(CAPTURE)
    result = gate(free_port(), h.watcher(), budgets={"cuda_graph": 2}, clock=FakeClock())
    assert (result["failure"], result["stage"], result["phase"]) == ("stalled", "cuda_graph", "http"), result["msg"]
    assert 2 <= result["elapsed"] < 6, result["elapsed"]  # the budget, not the 60 s deadline
    assert "no progress in stage cuda_graph" in result["detail"] and "Capture cuda graph begin" in result["detail"]
    assert result["cause"] is None
    assert [s["stage"] for s in result["stages"]][-1] == "cuda_graph"
    assert "is alive but stuck" in result["msg"]


def test_a_budget_of_zero_turns_the_stage_off(hanging):
    h = hanging(CAPTURE)
    result = gate(free_port(), h.watcher(), timeout=3, budgets={"cuda_graph": 0}, clock=FakeClock())
    assert result["failure"] == "not_listening", result["msg"]


def test_without_a_log_there_is_no_stall_verdict(hanging):
    h = hanging(CAPTURE)
    result = gate(free_port(), PidWatcher(h.proc.pid), timeout=3, budgets={"starting": 1}, clock=FakeClock())
    assert result["failure"] == "not_listening" and result["stage"] is None


def test_a_start_whose_log_shows_nothing_is_not_judged_by_the_starting_budget(hanging):
    """No line at all: the server logs where the gate does not read (a unit writing to a
    file), which is no hang; one line and then silence is."""
    result = gate(free_port(), hanging([]).watcher(), timeout=3, budgets={"starting": 1}, clock=FakeClock())
    assert result["failure"] == "not_listening" and result["stage"] == "starting"
    result = gate(free_port(), hanging(["[2026-12-01 17:15:02] Using default HuggingFace chat template"]).watcher(),
                  timeout=10, budgets={"starting": 1}, clock=FakeClock())
    assert (result["failure"], result["stage"]) == ("stalled", "starting"), result["msg"]


def test_a_long_running_server_is_not_judged_by_the_starting_budget(hanging):
    """A server up longer than the starting budget whose log shows no milestone (rotated
    away) is not failed as stalled in starting: only what the gate sees counts."""
    h = hanging([])
    time.sleep(0.6)  # the process's real age, from /proc: longer than the budget
    result = gate(free_port(), h.watcher(), timeout=3, budgets={"starting": 0.3}, clock=FakeClock())
    assert result["failure"] == "not_listening" and result["stage"] is None


def test_bad_budgets_are_refused():
    for bad, words in (({"weight": 3}, "unknown stage 'weight'"), ({"weights": "abc"}, "must be a number"),
                       ({"weights": float("nan")}, "finite"), ({"weights": -1}, "finite")):
        with pytest.raises(ValueError, match=words):
            r.stall_budgets(bad)


# -- the journal: only the unit's own lines -----------------------------------------

def test_lines_logged_under_the_units_name_by_someone_else_are_not_read():
    """`logger -t sglang-qwen "RuntimeError: CUDA out of memory"` by any local user: the
    entry carries SYSLOG_IDENTIFIER=sglang-qwen but journald's trusted _SYSTEMD_UNIT and
    _PID are the user's session's, so it is not the server's and gives no cause."""
    failed = {**BASE, "ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "MainPID": "0",
              "SyslogIdentifier": "sglang-qwen"}
    now_us = int(time.time() * 1e6)
    forged = {"__CURSOR": "f1", "__REALTIME_TIMESTAMP": str(now_us), "SYSLOG_IDENTIFIER": "sglang-qwen", "_PID": "777",
              "_SYSTEMD_UNIT": "session-3.scope", "_UID": "1000",
              "MESSAGE": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.61 GiB."}
    own = [{"__CURSOR": f"o{i}", "__REALTIME_TIMESTAMP": str(now_us), "SYSLOG_IDENTIFIER": "sglang-qwen", "_PID": "4242",
            "MESSAGE": text} for i, text in enumerate((
                "Traceback (most recent call last):", '  File "sglang/srt/managers/scheduler.py", line 3930, in run_scheduler_process',
                "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."))]

    def run(journal):
        systemctl = fake_systemctl([BASE, failed])

        def command(argv):
            if argv[0] == "systemctl":
                return systemctl(argv)
            if any(a.startswith("SYSLOG_IDENTIFIER=") for a in argv):
                return 0, "".join(json.dumps(e) + "\n" for e in journal), ""
            return 0, "", ""  # the unit's own stream: nothing stored
        clock = FakeClock()
        return gate(free_port(), unit(command, clock), timeout=20, clock=clock)

    assert run([forged])["cause"] == "unknown"
    # the unit's own main process (seen by the gate as MainPID 4242) is read
    assert run([forged, *own])["cause"] == "kv_pool_too_small"


def test_the_progress_file_never_holds_the_key(hanging, tmp_path):
    """SGLang logs its arguments with the key in clear (0.5.11 srt/entrypoints/engine.py:679);
    the progress file, which Ansible's no_log does not mask, holds neither the gate's key
    nor any key-like argument."""
    h = hanging([*CAPTURE[:3], "[2026-12-01 17:15:13] server_args=ServerArgs(model_path='/m', api_key='k3y-in-log', "
                 "admin_api_key='adm1n', tokenizer_mode='auto')"])
    progress = tmp_path / "p.json"
    client = r.Client(f"http://127.0.0.1:{free_port()}", "k3y-in-log", True, 10)
    clock = FakeClock()
    result = r.Gate(client, h.watcher(), timeout=DEADLINE, interval=0.25, budgets={"weights": 1},
                    progress_file=str(progress), clock=clock.monotonic, sleep=clock.sleep).run()
    assert result["failure"] == "stalled" and result["stage"] == "weights"
    state = json.loads(progress.read_text())
    assert "api_key=********" in state["last_log_line"] and "admin_api_key=********" in state["last_log_line"]
    assert "k3y-in-log" not in progress.read_text() and "adm1n" not in progress.read_text()


def test_a_first_read_takes_the_newest_entries_of_a_long_run_then_follows_the_cursor():
    """A server up for an hour under load has logged every request since its start: the first read takes
    the newest FIRST_READ entries of the run (what the gate keeps), not all of them, and the next reads
    only what came after."""
    clock = up_for(FakeClock(), 3600)
    up = {**BASE, "InactiveExitTimestampMonotonic": str(int((clock.monotonic() - 3600) * 1e6))}
    now_us = int(clock.time() * 1e6)
    journal = [{"__CURSOR": f"c{i}", "__REALTIME_TIMESTAMP": str(now_us - 3000_000_000 + i), "MESSAGE": f"request {i}"}
               for i in range(_process_watch.FIRST_READ + 500)]
    seen: list = []
    watcher = unit(recorded(fake_systemctl([up], journal), seen), clock)
    watcher.begin()
    first = watcher.new_lines()
    assert len(first) == _process_watch.FIRST_READ and first[0] == "request 500" and first[-1] == f"request {len(journal) - 1}"
    journal.append({"__CURSOR": "next", "__REALTIME_TIMESTAMP": str(now_us), "MESSAGE": "a new line"})
    assert watcher.new_lines() == ["a new line"]
