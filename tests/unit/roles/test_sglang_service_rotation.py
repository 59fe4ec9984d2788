"""Drain before stop, with the rotation hooks: the role's own tasks (switch.yml's
"Take the host out of rotation and drain" block, its "Put the host back in
rotation" and "The host is back in rotation", rotation.yml) run by
ansible-playbook on localhost against the lab's SGLang simulator with a client's
generation in flight, and a load balancer stand-in (an HTTP server here)."""

from __future__ import annotations

import copy
import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from sim_helpers import MODEL, NEXTN, REPO, run_local_play

TASKS = REPO / "roles" / "sglang_service" / "tasks"
KEY = "rotation-key-77a0"
TOKEN = "lb-token-9c3f"


def find(tasks: list, name_start: str) -> dict:
    stack = list(tasks)
    while stack:
        item = stack.pop(0)
        if str(item.get("name", "")).startswith(name_start):
            return item
        stack.extend(item.get("block", []) + item.get("rescue", []) + item.get("always", []))
    raise AssertionError(f"no task {name_start!r}")


def rooted(item):
    """The task with its include_tasks of rotation.yml given as an absolute path (the play is elsewhere)."""
    item = copy.deepcopy(item)
    stack = [item]
    while stack:
        task = stack.pop()
        if task.get("ansible.builtin.include_tasks") == "rotation.yml":
            task["ansible.builtin.include_tasks"] = str(TASKS / "rotation.yml")
        stack.extend(task.get("block", []) + task.get("rescue", []) + task.get("always", []))
    return item


class Balancer:
    """A load balancer's API stand-in: records each call (method, path, Authorization) and answers ``status``."""

    def __init__(self, status: int = 204) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.status = status
        balancer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):  # noqa: A002 - http.server API
                return

            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                balancer.calls.append((self.command, self.path, self.headers.get("Authorization", "")))
                self.send_response(balancer.status)
                self.send_header("content-length", "0")
                self.end_headers()

            do_DELETE = do_PUT = do_POST = _answer  # noqa: N815 - http.server API

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture(name="balancer")
def fixture_balancer():
    balancer = Balancer()
    yield balancer
    balancer.server.shutdown()


@pytest.fixture(name="sim")
def fixture_sim(launch):
    server = launch([*MODEL, *NEXTN, "--api-key", KEY], version="0.5.23", host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, timeout=120, what="health")
    return server


LOAD = {"requests": 4, "concurrency": 2, "max_tokens": 16, "rounds": 2, "warmup": True, "timeout": 30, "budget": 30}


def run(tmp_path, sim, out_hook: dict, in_hook: dict, switch_ok: bool = True, perf: str = "off") -> tuple[int, str, dict]:
    """The drain block, then (as after a gate that passed) the in hook and its check; the facts at the end.
    perf: the performance gate's mode (the running service is measured after its drain unless off)."""
    switch = yaml.safe_load((TASKS / "switch.yml").read_text())
    config = tmp_path / "sglang-qwen.yaml"
    config.write_text(f"api-key: {json.dumps(KEY)}\n")
    facts = tmp_path / "facts.json"
    play = [{
        "hosts": "localhost", "gather_facts": False,
        "vars": {
            "sglang_service_name": "sglang-qwen.service", "_sglang_service_switch": True,
            "_sglang_service_before": {"active": True, "interrupted": False, "variant": "nextn",
                                       "url": f"http://127.0.0.1:{sim.port}", "api_key_file": str(config)},
            "_sglang_service_url": f"http://127.0.0.1:{sim.port}", "__sglang_service_variant": {"variant": "shadow-balanced"},
            "sglang_service_rotation_out": out_hook, "sglang_service_rotation_in": in_hook,
            "sglang_service_drain_timeout": 30, "sglang_service_drain_interval": 0.2,
            "__sglang_service_drain": {}, "_sglang_service_rotation": {},
            "sglang_service_perf_gate": perf, "_sglang_service_perf_baseline": None,
            "__sglang_service_perf_plan": {"load": LOAD, "known_good": None},
        },
        "tasks": [
            rooted(find(switch, "Take the host out of rotation and drain")),
            *([rooted(find(switch, "Put the host back in rotation"))] if switch_ok else []),
            {"name": "Keep the facts", "ansible.builtin.copy": {
                "dest": str(facts),
                "content": "{{ {'drain': __sglang_service_drain, 'rotation': _sglang_service_rotation,"
                           " 'known_good': _sglang_service_perf_baseline} | to_json }}"}},
            find(switch, "The host is back in rotation"),
        ],
    }]
    rc, output = run_local_play(tmp_path, play)
    assert KEY not in output and TOKEN not in output
    return rc, output, json.loads(facts.read_text()) if facts.exists() else {}


def in_flight(sim, tokens: int) -> threading.Thread:
    """A client's generation in the background, with time to outlast ansible-playbook's start."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{sim.port}/generate", method="POST",
        data=json.dumps({"text": "a client's request", "sampling_params": {"max_new_tokens": tokens}}).encode(),
        headers={"content-type": "application/json", "Authorization": f"Bearer {KEY}"})
    thread = threading.Thread(target=lambda: urllib.request.urlopen(request, timeout=120).read(), daemon=True)
    thread.start()
    sim.wait_for(lambda: sim.request("GET", "/v1/loads", headers={"Authorization": f"Bearer {KEY}"})[1]
                 ["loads"][0]["num_running_reqs"] == 1, what="the generation in flight")
    return thread


def test_out_of_rotation_then_drained_then_back_in(tmp_path, sim, balancer):
    hook = {"url": balancer.url + "/pools/sglang/ct200", "headers": {"Authorization": f"Bearer {TOKEN}"},
            "status_code": [200, 204]}
    thread = in_flight(sim, 150000)  # seconds on ct200's time scale, longer than ansible-playbook's start
    rc, output, facts = run(tmp_path, sim, dict(hook, method="DELETE"), dict(hook, method="PUT"), perf="enforce")
    assert rc == 0, output[-3000:]
    assert [(m, p) for m, p, _auth in balancer.calls] == [("DELETE", "/pools/sglang/ct200"), ("PUT", "/pools/sglang/ct200")]
    assert all(auth == f"Bearer {TOKEN}" for _m, _p, auth in balancer.calls)
    drain = facts["drain"]
    assert drain["drained"] is True and drain["in_flight_at_start"] == 1 and drain["in_flight_at_stop"] == 0
    assert drain["polls"] >= 2 and drain["seconds"] > 0, drain  # it waited for the generation to end
    assert facts["rotation"] == {"out": {"ok": True, "msg": "HTTP 204"}, "in": {"ok": True, "msg": "HTTP 204"}}
    # drained and out of rotation, the running service was measured for the performance gate, with its key
    known = facts["known_good"]
    assert known["source"] == "measured" and known["variant"] == "nextn" and known["error"] is None, known
    assert known["figures"]["output_tokens_per_s"] > 0 and known["figures"]["accept_length"] == 2.71
    assert known["load"] == dict({k: LOAD[k] for k in ("requests", "concurrency", "max_tokens", "rounds", "warmup", "budget")},
                                 rounds_measured=2)
    thread.join(30)


def test_a_failed_out_hook_changes_nothing_and_tries_the_in_hook(tmp_path, sim):
    marker = tmp_path / "back-in"
    rc, output, facts = run(tmp_path, sim, {"command": ["sh", "-c", "echo balancer says no >&2; exit 3"]},
                            {"command": ["touch", str(marker)]})
    assert rc == 2
    assert "the rotation out hook failed (command exit 3: balancer says no); nothing was changed, nextn still runs" \
           in " ".join(output.split()), output[-3000:]
    assert "rotation in hook: command exit 0" in " ".join(output.split())
    assert marker.exists() and not facts  # the play ended in the rescue, before the switch


def test_a_failed_in_hook_fails_the_host_and_says_it_is_out_of_rotation(tmp_path, sim, balancer):
    balancer.status = 503
    rc, output, facts = run(tmp_path, sim, {"command": ["true"]}, {"url": balancer.url + "/in", "method": "POST"})
    assert rc == 2
    assert facts["rotation"]["in"] == {"ok": False, "msg": "HTTP 503 (expected 200): "
                                                           + facts["rotation"]["in"]["msg"].split(": ", 1)[1]}
    assert "shadow-balanced serves, but the host is NOT back in rotation: the rotation in hook failed (HTTP 503" \
           in " ".join(output.split()), output[-3000:]


def test_without_hooks_the_drain_still_runs(tmp_path, sim):
    rc, output, facts = run(tmp_path, sim, {}, {})
    assert rc == 0, output[-3000:]
    assert facts["rotation"] == {} and facts["drain"]["drained"] is True and facts["drain"]["in_flight_at_start"] == 0
    assert facts["known_good"] is None  # the performance gate is off: nothing measured
