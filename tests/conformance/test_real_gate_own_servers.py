"""The readiness gate against real SGLang on CPU: the cases that start servers of their own
(a scheduler killed while loading, SIGTERM while loading, ready on 0.5.23, a server stopped
mid-start). Each runs alone, so ``make conformance``'s two workers run them beside the
shared server's cases (test_real_gate.py, whose docstring says how the gate is run) and
beside one another (conftest.py's scheduler).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from real_gate import (LOAD_DEADLINE, POLL_SLACK, GateThread, KEY, assert_drains_a_real_generation, assert_ready,
                       assert_the_simulators_metrics_are_real, note, run_gate, scheduler_of, servers, session_left, timed)
from real_sglang import ExitClock

from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as r

__all__ = ["servers", "timed"]  # fixtures of real_gate.py this module's cases use


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
