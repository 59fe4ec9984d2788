"""The watchdog on a lab host under systemd (fleet-04, untouched by the rollout test,
which runs first: its unchanged process there proves no healthy server was restarted).

fleet-04's watchdog probes every 5 s and restarts after 3 failed probes (host_vars).
The simulator's wedge (SIGUSR2: its scheduler stops, as real SGLang's does stopped with
SIGSTOP: /v1/models still 200, /health 503, generations never return) must be caught
and the unit restarted within interval x failures plus the probes' time and the
restart; while a deploy holds the host's lock the watchdog must stay quiet, and act
once the lock is gone. The same on real SGLang: molecule/real/verify.yml.
"""

from __future__ import annotations

import json
import time

import testinfra

HOST = "fleet-04"
SERVICE = "sglang-qwen.service"
WATCHDOG = "/var/lib/inferops-sglang/sglang-qwen/watchdog"
LOCK = "/var/lib/inferops-sglang/sglang-qwen/deploy.lock"
INTERVAL, FAILURES, TIMEOUT = 5, 3, 5
# a restart within interval x failures, plus each probe's own time (a wedged probe waits its
# timeout), plus a timer's accuracy and this machine's load
RESTART_WITHIN = INTERVAL * FAILURES + FAILURES * TIMEOUT + 30


def host():
    return testinfra.get_host(f"podman://{HOST}")


def show(h, prop: str) -> str:
    return h.check_output(f"systemctl show -p {prop} --value {SERVICE}")


def records(h) -> list[dict]:
    path = h.file(f"{WATCHDOG}/history.jsonl")
    if not path.exists:
        return []
    return [json.loads(line) for line in path.content_string.splitlines() if line.strip()]


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def serving(h) -> bool:
    return h.run("curl -s -o /dev/null -w '%{http_code}' -m 10 http://127.0.0.1:30000/health").stdout == "200"


def wedge(h) -> tuple[str, str, float]:
    """Wedge the server; (its InvocationID, its MainPID, when)."""
    invocation, pid = show(h, "InvocationID"), show(h, "MainPID")
    h.check_output(f"kill -USR2 {pid}")
    return invocation, pid, time.monotonic()


def test_the_watchdog_is_installed_and_probes_a_healthy_server():
    h = host()
    assert h.service("sglang-qwen-watchdog.timer").is_running
    assert h.service("sglang-qwen-watchdog.timer").is_enabled
    settings = h.file("/etc/sglang/sglang-qwen.watchdog.json")
    assert settings.mode == 0o600 and settings.user == "root"
    loaded = json.loads(settings.content_string)
    assert (loaded["interval"], loaded["failures"], loaded["timeout"]) == (INTERVAL, FAILURES, TIMEOUT)
    # it has probed: the state says this run of the unit served
    state = wait(lambda: h.file(f"{WATCHDOG}/state.json").exists
                 and json.loads(h.file(f"{WATCHDOG}/state.json").content_string), 3 * INTERVAL + 30, "a first probe")
    assert state["served"] is True and state["failures"] == 0
    assert state["invocation"] == show(h, "InvocationID")
    assert records(h) == []  # nothing to record about a healthy server


def test_a_wedged_server_is_restarted_and_recovers():
    h = host()
    assert serving(h)
    invocation, pid, wedged_at = wedge(h)
    assert h.run("curl -s -o /dev/null -w '%{http_code}' -m 10 http://127.0.0.1:30000/v1/models").stdout == "200"
    restarted = wait(lambda: [r for r in records(h) if r["event"] == "restarted"], RESTART_WITHIN, "a restart")
    took = time.monotonic() - wedged_at
    (rec,) = restarted
    assert rec["invocation"] == invocation and str(rec["main_pid"]) == pid and rec["failures"] == FAILURES
    assert rec["probe"]["failure"] in ("not_ready", "generation_timeout"), rec
    assert show(h, "InvocationID") != invocation and show(h, "MainPID") != pid
    wait(lambda: serving(h), 120, "the restarted server serving")
    recovered = wait(lambda: [r for r in records(h) if r["event"] == "recovered"], 3 * INTERVAL + 30, "recovered")
    assert recovered[0]["invocation"] == show(h, "InvocationID")
    journal = h.check_output("journalctl -u sglang-qwen-watchdog.service -o cat --no-pager")
    assert f"{FAILURES} probes in a row failed" in journal and "restarted sglang-qwen.service" in journal
    print(f"wedge to restart: {took:.1f} s (bound {RESTART_WITHIN} s)")


def test_the_watchdog_is_quiet_while_a_deploy_holds_the_lock():
    h = host()
    wait(lambda: serving(h), 120, "serving")
    now = int(time.time())
    lock = {"run_id": "fleet-test-deploy", "service": SERVICE, "variant": "nextn", "controller_user": "tester",
            "controller_host": "fleet-test", "controller_pid": 1, "awx_job_id": None,
            "started": "2026-12-02T00:00:00Z", "renewed": "2026-12-02T00:00:00Z", "expires": now + 600, "lease_s": 600}
    h.check_output(f"umask 077; echo {json.dumps(json.dumps(lock))} > {LOCK}")
    before = len(records(h))
    held = "a deploy holds the host's lock (run fleet-test-deploy by tester@fleet-test"
    try:
        invocation, _pid, _at = wedge(h)
        # the watchdog's journal from the wedge on: each of its runs that finds the lock says so
        cursor = h.check_output("journalctl -u sglang-qwen-watchdog.service --show-cursor -n 0 -q --no-pager")
        cursor = cursor.split("cursor: ", 1)[1].strip()

        def declined() -> int:
            journal = h.check_output(f"journalctl -u sglang-qwen-watchdog.service -o cat --no-pager --after-cursor '{cursor}'")
            return journal.count(held)

        # FAILURES + 1 runs of the timer, each finding the lock, with the server wedged all along:
        # a watchdog blind to the lock would have failed FAILURES probes in a row and restarted
        wait(lambda: declined() >= FAILURES + 1, RESTART_WITHIN, f"{FAILURES + 1} watchdog runs that found the lock")
        assert show(h, "InvocationID") == invocation, "restarted while a deploy held the lock"
        assert len(records(h)) == before
    finally:
        h.check_output(f"rm -f {LOCK}")
    # the deploy is gone: the wedge is caught now
    wait(lambda: show(h, "InvocationID") != invocation, RESTART_WITHIN, "a restart once the lock is gone")
    wait(lambda: serving(h), 120, "serving after the restart")
