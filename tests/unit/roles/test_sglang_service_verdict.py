"""The switch's verdict after a gate module that failed itself (no failure,
no cause, only its msg): the role's own tasks ("The gate's verdict" in
switch.yml, "Keep the failure" in rollback.yml) run by ansible-playbook on
localhost must fail with that reason and hand the rollback a failure it can
record, not an internal templating error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from sim_helpers import REPO, free_port

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy

TASKS = REPO / "roles" / "sglang_service" / "tasks"


def task(path, name_start: str) -> dict:
    """A task of the role by the start of its name, blocks searched too."""
    stack = list(yaml.safe_load(path.read_text()))
    while stack:
        item = stack.pop(0)
        if str(item.get("name", "")).startswith(name_start) and "block" not in item:
            return item
        stack.extend(item.get("block", []) + item.get("rescue", []) + item.get("always", []))
    raise AssertionError(f"no task {name_start!r} in {path}")


def test_a_gate_module_that_fails_itself_still_leads_to_a_recordable_rollback(tmp_path):
    verdict = task(TASKS / "switch.yml", "The gate's verdict on")
    keep = task(TASKS / "rollback.yml", "Keep the failure")
    out = tmp_path / "failed.json"
    play = [{
        "hosts": "localhost", "gather_facts": False,
        "vars": {"__sglang_service_variant": {"variant": "nextn"}, "__sglang_service_gate": {}},
        "tasks": [{
            "name": "Switch",
            "block": [
                # the gate refuses a key it cannot send (a newline): module failure, no verdict fields
                {"name": "Gate nextn", "inferops.sglang.wait_for_sglang": {
                    "url": f"http://127.0.0.1:{free_port()}", "api_key": "s3cr3t\nLD_PRELOAD=/tmp/x.so",
                    "timeout": 5}, "register": "__sglang_service_gate", "failed_when": False},
                verdict,
            ],
            "rescue": [keep, {"name": "Write the failure", "ansible.builtin.copy": {
                "content": "{{ {'failed': _sglang_service_failed, 'task': _sglang_service_failed_task} | to_json }}",
                "dest": str(out)}}],
        }],
    }]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = False\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
               ANSIBLE_LOCALHOST_WARNING="0")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c",
                           "local", "play.yml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    output = proc.stdout + proc.stderr
    assert "s3cr3t" not in output
    kept = json.loads(out.read_text())
    assert kept["task"] == "The gate's verdict on nextn"
    msg = kept["failed"]["msg"]
    assert msg.startswith("nextn is not ready: the gate did not run: cannot gate http://127.0.0.1:"), msg
    assert "the API key has control characters" in msg and "(no cause in the log)" in msg
    assert "s3cr3t" not in msg and "object has no attribute" not in msg
    # and the record keeps it as the failure of that task
    recorded = _deploy.verdict(kept["failed"], "rolled_back", kept["task"])
    assert recorded["failure"] == "task_failed"
    assert recorded["msg"] == f'task "The gate\'s verdict on nextn" failed: {msg}'
