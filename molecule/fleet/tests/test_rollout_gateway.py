"""A fleet's gateway on another host (sglang_service_gateway_url): the real gateway on fleet-01
(molecule/fleet/fleet_gateway.yml, the collection's sglang_gateway module) in front of fleet-02's
server, which listens beyond loopback. A deploy of fleet-02, run as AWX runs it, takes the host out
of that gateway through its worker API before the drain and puts it back once the variant serves;
the record says so, and the gateway routes to it again. Runs after test_rollout.py (fleet-02 serves
shadow-balanced then) and touches no other host's server.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import ansible_runner
import testinfra

REPO = Path(__file__).resolve().parents[3]
HISTORY = "/var/lib/inferops-sglang/sglang-qwen/history.jsonl"
KEY_FILE = "/etc/sglang/fleet-gateway.key"
ASK = r"""
import json, sys, urllib.request, urllib.error
key = open("/etc/sglang/fleet-gateway.key").read().strip()
method, path, body = sys.argv[1], sys.argv[2], sys.argv[3]
req = urllib.request.Request("http://127.0.0.1:31000" + path, data=body.encode() if body else None, method=method,
                             headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
try:
    with urllib.request.urlopen(req, timeout=60) as resp:
        print(json.dumps({"status": resp.status, "body": json.loads(resp.read() or b"null")}))
except urllib.error.HTTPError as exc:
    print(json.dumps({"status": exc.code, "body": None}))
"""


def host(name: str):
    return testinfra.get_host(f"podman://{name}")


def address(name: str) -> str:
    return host(name).check_output("hostname -I").split()[0]


def ask(method: str, path: str, body: dict | None = None) -> dict:
    """The fleet's gateway's answer, asked on fleet-01 with its control key (read there, never here)."""
    out = host("fleet-01").run("python3 -c %s %s %s %s", ASK, method, path, json.dumps(body) if body else "")
    assert out.rc == 0, out.stderr
    return json.loads(out.stdout)


def playbook(tmp_path: Path, path: Path, extravars: dict | None = None, limit: str | None = None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    runner = ansible_runner.run(private_data_dir=str(tmp_path), project_dir=str(REPO), playbook=str(path),
                                inventory=os.environ["MOLECULE_INVENTORY_FILE"], extravars=extravars or {},
                                limit=limit, quiet=True)
    return runner, runner.stdout.read()


def worker(url: str) -> dict | None:
    listed = ask("GET", "/workers")["body"]["workers"]
    return next((w for w in listed if w["url"] == url), None)


def test_a_deploy_takes_the_host_out_of_the_fleets_gateway_and_back(tmp_path):
    runner, out = playbook(tmp_path / "gateway", REPO / "molecule" / "fleet" / "fleet_gateway.yml")
    assert runner.rc == 0, out
    url = f"http://{address('fleet-02')}:30000"
    assert ask("POST", "/workers", {"url": url})["status"] == 202
    deadline = time.monotonic() + 60
    while not ((w := worker(url)) and w["status"] == "ready" and w["is_healthy"]):
        assert time.monotonic() < deadline, f"the fleet gateway never routed to {url}: {w}"
        time.sleep(1)
    generate = {"text": "Hello", "sampling_params": {"max_new_tokens": 4}}
    assert ask("POST", "/generate", generate)["status"] == 200

    control = host("fleet-01").file(KEY_FILE).content_string.strip()
    before = len(host("fleet-02").file(HISTORY).content_string.splitlines())
    runner, out = playbook(tmp_path / "deploy", REPO / "deploy.yml", {
        "variant": "nextn", "rollout_canary": 1, "rollout_batch": "1",
        "sglang_service_gateway_url": f"http://{address('fleet-01')}:31000",
        "sglang_service_gateway_control_key": control, "sglang_service_gateway_worker_url": url}, limit="fleet-02")
    assert runner.rc == 0, out
    assert control not in out  # the key went to the job as a secret: no output shows it
    records = [json.loads(line) for line in host("fleet-02").file(HISTORY).content_string.splitlines() if line.strip()]
    assert len(records) == before + 1
    record = records[-1]
    assert record["outcome"] == "switched" and record["from"] == "shadow-balanced"
    gateway = record["gateway"]
    assert gateway["url"] == f"http://{address('fleet-01')}:31000" and gateway["worker"] == url
    assert gateway["out"]["removed"] is True and gateway["in"]["added"] is True
    assert gateway["unavailable_s"] > 0
    assert control not in json.dumps(records)
    # routed again, through the fleet's gateway
    listed = worker(url)
    assert listed and listed["status"] == "ready" and listed["is_healthy"]
    assert ask("POST", "/generate", generate)["status"] == 200
