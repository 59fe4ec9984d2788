"""The sglang_service role's preflight refuses hostile input in its first
check (sglang_preflight's step "inputs"), before the host manifest, the lock or anything else: one real
ansible-playbook run, one local host per hostile value (its host vars), the
role's own tasks (include_role tasks_from: preflight.yml)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from sim_helpers import REPO

CASES = {
    "description_newline": ({"sglang_service_overrides": {"description": "x\nExecStartPre=+/bin/sh -c id"}},
                            "sglang_service_overrides.description must not contain control characters"),
    "env_newline": ({"sglang_service_environment": {"FOO": "x\nExecStartPre=+/bin/id"}},
                    "environment variable FOO must not contain control characters"),
    "rw_path_newline": ({"sglang_service_read_write_paths": ["/srv/x\nUser=root"]},
                        "sglang_service_read_write_paths[0] must not contain control characters"),
    "service_name_dotdot": ({"sglang_service_name": "../../tmp/x.service"}, "sglang_service_name must be"),
    "variant_key_dotdot": ({"sglang_service_variant_overrides": {"../../var/tmp/x": {}}},
                           "sglang_service_variant_overrides key must match"),
    "gate_interval_zero": ({"sglang_service_gate_interval": "0"}, "sglang_service_gate_interval ("),
    "key_newline": ({"sglang_service_api_key": "hostile-secret\nLD_PRELOAD=/tmp/x.so"},
                    "sglang_service_api_key must be printable ASCII"),
    "key_cyrillic": ({"sglang_service_api_key": "hostile-secret-ключ"}, "sglang_service_api_key must be printable ASCII"),
    "key_leading_dash": ({"sglang_service_api_key": "-hostile-secret"}, "sglang_service_api_key must not begin with '-'"),
    "served_name_u2028": ({"sglang_service_served_model_name": "Qwen\u2028User=root"},
                          "sglang_service_served_model_name must not contain control characters"),
    "user_newline": ({"sglang_service_user": "root\nUser=root"}, "sglang_service_user must be a user or group name"),
    "stall_budget_negative": ({"sglang_service_gate_stall_budgets": {"weights": -1}},
                              "sglang_service_gate_stall_budgets.weights must be a finite number of seconds >= 0"),
    "keep_attempts_zero": ({"sglang_service_keep_attempts": 0},
                           "sglang_service_keep_attempts (attempt directories kept) must be >= 1"),
    # a rotation hook's credentials: checked on the controller, never sent to the host (whose journal
    # logs a module's options) nor shown in the task's result; the good one stops at the manifest
    "hook_credentials": ({"sglang_service_rotation_out": {"url": "https://lb.example.internal/out",
                                                          "headers": {"Authorization": "Bearer hostile-secret-lb"}}},
                         None),
    "hook_where": ({"sglang_service_rotation_out": {"command": ["/bin/true", "hostile-secret-arg"], "where": "moon"}},
                   "sglang_service_rotation_out.where must be controller or host"),
    "good": ({}, None),
}


def test_hostile_values_are_refused_by_the_first_preflight_check(tmp_path):
    hosts = {name: dict(ansible_connection="local", ansible_python_interpreter=sys.executable,
                        inferops_model_path="/srv/models/none", sglang_service_host_manifest=str(tmp_path / "none.json"),
                        sglang_service_state_dir=str(tmp_path / "state"), **values)
             for name, (values, _error) in CASES.items()}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "hosts": "all", "gather_facts": False,
        "vars": {"sglang_service_variant": "nextn"},
        "tasks": [{"name": "Preflight", "ansible.builtin.include_role": {
            "name": "inferops.sglang.sglang_service", "tasks_from": "preflight.yml"}}],
    }]))
    (tmp_path / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = False\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "inventory.yml",
                           "play.yml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert "hostile-secret" not in proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    tasks = report["plays"][0]["tasks"]
    by_host: dict[str, list[tuple[str, dict]]] = {}
    for task in tasks:
        for host, result in task["hosts"].items():
            # each task by its module (never by its name)
            by_host.setdefault(host, []).append((result.get("action"), result))
    for name, (_values, error) in CASES.items():
        ran = by_host[name]
        failed = [(task, result) for task, result in ran if result.get("failed")]
        assert len(failed) == 1, (name, ran)
        task, result = failed[0]
        if error is None:
            # good input passes the check and stops at the missing host manifest
            assert (task, result["step"]) == ("inferops.sglang.sglang_preflight", "manifest"), result
            assert result["msg"].startswith("no host manifest")
            continue
        assert (task, result["step"]) == ("inferops.sglang.sglang_preflight", "inputs")
        assert result["msg"].startswith("bad input, nothing was changed: ") and error in result["msg"], result["msg"]
        assert [t for t, _result in ran][-1] == task  # nothing after it ran
    assert not (tmp_path / "state").exists()
