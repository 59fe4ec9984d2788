"""sglang_drain against the lab's SGLang simulator (a real HTTP server): its
GET /v1/loads per release, a generation in flight counted and waited for, the
API key read from the --config file, and a drain that times out."""

from __future__ import annotations

import json
import threading

import pytest
from sim_helpers import MODEL, NEXTN, run_module

from ansible_collections.inferops.sglang.plugins.modules import sglang_drain

KEY = "drain-key-5d1e"
AUTH = {"Authorization": f"Bearer {KEY}"}


def start(launch, version: str):
    server = launch([*MODEL, *NEXTN, "--api-key", KEY], version=version, host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, timeout=120, what="health")
    return server


def in_flight(server, tokens: int) -> threading.Thread:
    """A client's generation of ``tokens`` tokens, running in the background (ct200's time scale 0.05
    and NEXTN's accept length 3.0: 3000 tokens take about a second)."""
    thread = threading.Thread(target=server.request, args=("POST", "/generate"),
                              kwargs={"body": {"text": "drain me", "sampling_params": {"max_new_tokens": tokens}},
                                      "headers": AUTH}, daemon=True)
    thread.start()
    server.wait_for(lambda: running(server) == 1, what="the generation in flight")
    return thread


def running(server) -> int:
    return server.request("GET", "/v1/loads", headers=AUTH)[1]["loads"][0]["num_running_reqs"]


def config_file(tmp_path) -> str:
    path = tmp_path / "sglang-qwen.yaml"
    path.write_text(f"api-key: {json.dumps(KEY)}\n")
    return str(path)


def drain(capsys, sim, check_mode: bool = False, **args) -> dict:
    rc, result, _out = run_module(sglang_drain.main, capsys, {"url": f"http://127.0.0.1:{sim.port}", **args},
                                  check_mode=check_mode)
    assert rc == 0, result
    assert result["changed"] is False and KEY not in json.dumps(result)
    return result


def assert_shape(sim, aggregate: bool, accelerators: bool) -> None:
    status, body = sim.request("GET", "/v1/loads", headers=AUTH)
    assert status == 200
    assert ("aggregate" in body) is aggregate and ("num_accelerators" in body) is accelerators
    (rank,) = body["loads"]
    assert rank["num_running_reqs"] == 0 and rank["num_waiting_reqs"] == 0
    assert sim.request("GET", "/v1/loads")[0] == 401  # not one of the exempt paths


def test_a_generation_in_flight_is_waited_for_on_0_5_23(launch, tmp_path, capsys):
    sim = start(launch, "0.5.23")
    assert_shape(sim, aggregate=False, accelerators=True)  # 0.5.23 srt/entrypoints/v1_loads.py:145-151
    thread = in_flight(sim, 6000)
    result = drain(capsys, sim, api_key_file=config_file(tmp_path), timeout=30, interval=0.2)
    assert result["drained"] is True and result["in_flight_at_start"] == 1 and result["in_flight_at_stop"] == 0
    assert result["polls"] >= 2 and 0 < result["seconds"] < 30
    thread.join(10)
    # check mode reads once and does not wait
    thread = in_flight(sim, 9000)
    result = drain(capsys, sim, check_mode=True, api_key_file=config_file(tmp_path), timeout=30)
    assert result["polls"] == 1 and result["in_flight_at_start"] == 1 and result["seconds"] < 1
    thread.join(10)


def test_a_drain_times_out_or_cannot_read_without_holding_the_stop_on_0_5_11(launch, tmp_path, capsys):
    sim = start(launch, "0.5.11")
    assert_shape(sim, aggregate=True, accelerators=False)  # 0.5.11 srt/entrypoints/v1_loads.py:173-179
    thread = in_flight(sim, 20000)  # about 7 s
    result = drain(capsys, sim, api_key_file=config_file(tmp_path), timeout=1, interval=0.3)
    assert result["timed_out"] is True and result["drained"] is False
    assert result["running_at_stop"] == 1 and 1 <= result["seconds"] < 5
    # without the key the load cannot be read: the wait ends at once, with the reason
    result = drain(capsys, sim, timeout=30)
    assert result["drained"] is False and result["timed_out"] is False and result["polls"] == 1
    assert result["error"].startswith("GET /v1/loads: HTTP 401")
    thread.join(10)


@pytest.mark.parametrize("args, message", [
    ({"timeout": -1}, "timeout must be a finite number of seconds >= 0"),
    ({"interval": 0}, "interval must be a finite number of seconds > 0"),
    ({"timeout": float("nan")}, "timeout must be a finite number of seconds >= 0"),
])
def test_bad_settings_are_refused(capsys, args, message):
    rc, result, _out = run_module(sglang_drain.main, capsys, {"url": "http://127.0.0.1:9", **args})
    assert rc == 1 and result["msg"].startswith(message)
