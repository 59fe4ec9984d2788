"""The module's own surface: option validation, check mode, no_log, the
verdict in exit_json/fail_json. The gate itself is tested in module_utils."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sim_helpers
from sim_helpers import free_port

from ansible_collections.inferops.sglang.plugins.modules import wait_for_sglang

FAKE = Path(__file__).resolve().parents[2] / "fake_sglang_http.py"


def run_module(capsys, **args) -> tuple[int, dict, str]:
    return sim_helpers.run_module(wait_for_sglang.main, capsys, args)


@pytest.mark.parametrize("args, error", [
    (dict(unit="sglang-qwen.service", pid=4242), "mutually exclusive"),
    (dict(log_file="/var/log/sglang.log"), "missing parameter(s) required by 'log_file': pid"),
    (dict(interval=10, timeout=5), "interval (10.0) must not exceed timeout (5.0)"),
    (dict(timeout=0), "timeout must be a finite number of seconds greater than 0"),
    (dict(timeout=float("nan")), "timeout must be a finite number of seconds greater than 0, got nan"),
    (dict(request_timeout=float("inf")), "request_timeout must be a finite number of seconds greater than 0, got inf"),
    (dict(interval="nan"), "interval must be a finite number of seconds greater than 0, got nan"),
    (dict(settle=-1), "settle must be a finite number of seconds, 0 or more"),
    (dict(stall_budgets={"weight": 10}), "stall_budgets: unknown stage 'weight'"),
    (dict(stall_budgets={"weights": "abc"}), "stall_budgets.weights must be a number of seconds"),
    (dict(max_response_bytes=10), "max_response_bytes must be at least 1024"),
    (dict(generations=0), "generations must be at least 1"),
    (dict(url="127.0.0.1:30000"), "url must start with http:// or https://"),
    (dict(endpoint="responses"), "value of endpoint must be one of: generate, completions, chat"),
    (dict(pid=-3), "pid must be a positive process id"),
])
def test_bad_options_fail_with_a_clear_message(capsys, args, error):
    rc, result, raw = run_module(capsys, **args)
    assert rc == 1 and result["failed"]
    assert error in result["msg"]


def test_check_mode_touches_nothing(capsys):
    port = free_port()  # nothing listens: a real wait would fail
    rc, result, raw = run_module(capsys, url=f"http://127.0.0.1:{port}", unit="sglang-qwen.service", _ansible_check_mode=True)
    assert rc == 0 and result["changed"] is False and result["ready"] is None
    assert result["would_wait_for"]["watch"] == {"kind": "unit", "unit": "sglang-qwen.service"}
    assert result["would_wait_for"]["phases"] == ["process", "http", "models", "health", "ready", "generation", "settled"]


@pytest.fixture
def server(tmp_path):
    port = free_port()
    log = tmp_path / "fake.log"
    proc = subprocess.Popen([sys.executable, str(FAKE), str(port), json.dumps({"api_key": "s3cret-key"})],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    yield proc, port, log
    proc.kill()
    proc.wait()


def test_ready_exits_ok_and_never_shows_the_key(capsys, server):
    proc, port, log = server
    rc, result, raw = run_module(capsys, url=f"http://127.0.0.1:{port}", api_key="s3cret-key", pid=proc.pid,
                                 log_file=str(log), settle=0.2, interval=0.2, timeout=30)
    assert rc == 0 and result["ready"] is True and result["changed"] is False
    assert result["process"] == {"kind": "pid", "pid": proc.pid, "state": "running", "log_file": str(log)}
    assert "s3cret-key" not in raw


def test_not_ready_fails_the_task_with_the_verdict(capsys, server):
    proc, port, log = server
    rc, result, raw = run_module(capsys, url=f"http://127.0.0.1:{port}", api_key="wrong", pid=proc.pid, timeout=30)
    assert rc == 1 and result["failed"] is True and result["ready"] is False
    assert result["failure"] == "unauthorized"
    assert result["msg"].startswith(f"http://127.0.0.1:{port} refused the request")


def test_the_key_of_the_servers_own_config_file_wins_over_api_key(capsys, server, tmp_path):
    """A restored service is gated with the key of its own --config file (the role's
    rollback after a key change), not with this run's api_key; a file without a key
    means no key, which this server refuses."""
    proc, port, log = server
    config = tmp_path / "sglang-qwen.yaml"
    config.write_text('# managed\napi-key: "s3cret-key"\n')
    rc, result, raw = run_module(capsys, url=f"http://127.0.0.1:{port}", api_key="the-new-key", api_key_file=str(config),
                                 pid=proc.pid, settle=0.2, interval=0.2, timeout=30)
    assert rc == 0 and result["ready"] is True and "s3cret-key" not in raw
    config.write_text("# managed\n{}\n")
    rc, result, raw = run_module(capsys, url=f"http://127.0.0.1:{port}", api_key="s3cret-key", api_key_file=str(config),
                                 pid=proc.pid, timeout=30)
    assert rc == 1 and result["failure"] == "unauthorized"
    rc, result, raw = run_module(capsys, url=f"http://127.0.0.1:{port}", api_key_file=str(tmp_path / "absent.yaml"), pid=proc.pid)
    assert rc == 1 and result["msg"].startswith(f"api_key_file {tmp_path / 'absent.yaml'}:")


def test_another_process_on_the_port_fails_port_taken_and_gets_nothing(capsys, server):
    """The fake server answers like SGLang, but the watched process is another one (a
    `sleep`, as in the impostor report): port_taken, and no request reached the listener."""
    proc, port, log = server
    deadline = time.monotonic() + 20
    while "Uvicorn running" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    watched = subprocess.Popen(["sleep", "30"])
    try:
        rc, result, raw = run_module(capsys, url=f"http://127.0.0.1:{port}", api_key="s3cret-key", pid=watched.pid, timeout=30)
        assert rc == 1 and result["failure"] == "port_taken", result["msg"]
        assert result["listener"]["pid"] == proc.pid and result["listener"]["state"] == "foreign"
        assert f"is answered by another process, not by process {watched.pid}" in result["msg"]
        assert "HTTP/1.1" not in log.read_text()  # not one request
        assert "s3cret-key" not in raw
        # check_listener=false is the documented way out (a local proxy in front of the server)
        rc, result, raw = run_module(capsys, url=f"http://127.0.0.1:{port}", api_key="s3cret-key", pid=watched.pid,
                                     timeout=30, settle=0.2, interval=0.2, check_listener=False)
        assert rc == 0 and result["ready"] is True and result["listener"]["state"] == "unverified"
    finally:
        watched.kill()
        watched.wait()
