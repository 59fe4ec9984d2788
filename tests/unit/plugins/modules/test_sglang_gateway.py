"""sglang_gateway: the gateway's unit, keys, workers file and code installed in one call, idempotent,
restarted only when something it runs with changed (systemctl faked: the module's run_command); the
unit's own command line, run from the installed tree, starts the real gateway (smg, the pinned one)."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess

import pytest
from sim_helpers import REPO, FakeSystemctl, free_port

from ansible_collections.inferops.sglang.plugins.module_utils import _gateway, _http
from ansible_collections.inferops.sglang.plugins.modules import sglang_gateway as mod

GATEWAY_PYTHON = os.path.join(os.environ.get("INFEROPS_GATEWAY_VENV", str(REPO / ".cache" / "gateway-venv")), "bin", "python")
UNIT = "sglang-qwen-gateway"
KEY = "api-key-9Zq"


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def params(tmp_path, **overrides) -> dict:
    for d in ("etc", "units", "state"):
        (tmp_path / d).mkdir(exist_ok=True)
    return dict(dict(state="present", unit=UNIT, unit_dir=str(tmp_path / "units"), root=str(tmp_path / "code"),
                     python=GATEWAY_PYTHON, bind_host="0.0.0.0", port=30000, metrics_port=29000,
                     control_key_file=str(tmp_path / "etc" / "gw.key"), api_key=KEY,
                     api_key_file=str(tmp_path / "etc" / "gw.api-key"),
                     workers_file=str(tmp_path / "state" / "gateway-workers.json"),
                     description="SGLang gateway of sglang-qwen", privileged_port=False, wait_timeout=60,
                     user="sglang-gateway", group="sglang-gateway"), **overrides)


class Accounts:
    """The account step: what it was asked, and what it says it did (made once)."""

    def __init__(self) -> None:
        self.calls, self.made = [], False

    def __call__(self, user, group, run_command, check):
        self.calls.append((user, group, check))
        if self.made:
            return []
        self.made = not check
        return [f"useradd --system --gid {group} {user}"]


class Waits:
    def __init__(self) -> None:
        self.calls = []

    def __call__(self, url, timeout):
        self.calls.append((url, timeout))
        return 0.4


def test_first_install_makes_the_keys_the_workers_file_and_the_unit_and_starts_it(tmp_path):
    p, systemctl, waits = params(tmp_path), FakeSystemctl(), Waits()
    result = mod.present(p, False, systemctl, wait=waits, holder=lambda url: None, account=Accounts())
    assert result["changed"] and result["action"] == "started" and result["url"] == "http://127.0.0.1:30000"
    assert systemctl.changing() == ["daemon-reload", f"enable -- {UNIT}.service", f"start -- {UNIT}.service"]
    assert waits.calls == [("http://127.0.0.1:30000", 60)] and result["liveness_s"] == 0.4
    control = open(p["control_key_file"]).read().strip()
    assert len(control) >= 40 and ":" not in control and _mode(p["control_key_file"]) == 0o600
    assert open(p["api_key_file"]).read() == KEY + "\n" and _mode(p["api_key_file"]) == 0o600
    assert json.loads(open(p["workers_file"]).read()) == {"workers": []} and _mode(p["workers_file"]) == 0o600
    unit = open(os.path.join(p["unit_dir"], f"{UNIT}.service")).read()
    assert KEY not in unit and control not in unit and KEY not in json.dumps(result) and control not in json.dumps(result)
    for line in ("User=sglang-gateway\nGroup=sglang-gateway", "PrivateDevices=yes", "CapabilityBoundingSet=\n",
                 f"LoadCredential=control-key:{p['control_key_file']}", f"LoadCredential=api-key:{p['api_key_file']}",
                 f"LoadCredential=workers:{p['workers_file']}", "--prometheus-host 127.0.0.1 --prometheus-port 29000",
                 "--health-check-timeout-secs 25", "--host 0.0.0.0 --port 30000"):
        assert line in unit, line
    assert sorted(n for n in result["written"] if "/" not in n) == ["_gateway.py", "_gateway_launch.py", "_http.py", "_mask.py"]


def test_a_port_the_server_before_the_gateway_holds_is_not_waited_for(tmp_path):
    p, waits = params(tmp_path), Waits()
    result = mod.present(p, False, FakeSystemctl(), wait=waits, holder=lambda url: "another listener (HTTP 404)",
                         account=Accounts())
    assert result["action"] == "started" and result["port_held_by"] == "another listener (HTTP 404)"
    assert waits.calls == [] and result["liveness_s"] is None


def test_a_second_run_changes_nothing_and_keeps_the_control_key(tmp_path):
    p, accounts = params(tmp_path), Accounts()
    first = mod.present(p, False, FakeSystemctl(), wait=Waits(), holder=lambda url: None, account=accounts)
    assert first["account"] == ["useradd --system --gid sglang-gateway sglang-gateway"]
    control = open(p["control_key_file"]).read()
    systemctl = FakeSystemctl(enabled=True, active=True)
    again = mod.present(p, False, systemctl, wait=Waits(), account=accounts)
    assert not again["changed"] and again["action"] == "none" and again["written"] == [] and again["account"] == []
    assert accounts.calls == [("sglang-gateway", "sglang-gateway", False)] * 2
    assert systemctl.changing() == [] and open(p["control_key_file"]).read() == control


@pytest.mark.parametrize("change, credential", [({"api_key": "rotated-key"}, True), ({"api_key": None}, False),
                                                ({"port": 30100}, True)])
def test_a_new_key_or_port_restarts_the_gateway(tmp_path, change, credential):
    p = params(tmp_path)
    mod.present(p, False, FakeSystemctl(), wait=Waits(), holder=lambda url: None, account=Accounts())
    systemctl = FakeSystemctl(enabled=True, active=True)
    result = mod.present(dict(p, **change), False, systemctl, wait=Waits(), account=Accounts())
    assert result["action"] == "restarted" and systemctl.changing()[-1] == f"restart -- {UNIT}.service"
    assert os.path.exists(p["api_key_file"]) is credential
    unit = open(os.path.join(p["unit_dir"], f"{UNIT}.service")).read()
    assert ("LoadCredential=api-key:" in unit) is credential


def test_check_mode_says_what_it_would_do_and_writes_nothing(tmp_path):
    p = params(tmp_path)
    systemctl = FakeSystemctl()
    result = mod.present(p, True, systemctl, wait=Waits(), holder=lambda url: None, account=Accounts())
    assert result["changed"] and result["action"] == "started" and result["liveness_s"] is None
    assert p["control_key_file"] in result["written"] and p["workers_file"] in result["written"]
    assert systemctl.calls == [] and not os.path.exists(p["control_key_file"]) and not os.path.exists(p["root"])


def test_a_control_key_path_through_a_link_is_not_followed(tmp_path):
    p = params(tmp_path)
    target = tmp_path / "elsewhere"
    os.symlink(target, p["control_key_file"])  # kept as it is: never written through
    mod.present(p, False, FakeSystemctl(), wait=Waits(), holder=lambda url: None, account=Accounts())
    assert not target.exists() and os.path.islink(p["control_key_file"])


def test_absent_stops_and_removes_the_unit_and_keeps_the_keys(tmp_path):
    p = params(tmp_path)
    mod.present(p, False, FakeSystemctl(), wait=Waits(), holder=lambda url: None, account=Accounts())
    systemctl = FakeSystemctl(enabled=True, active=True)
    result = mod.absent(p, False, systemctl)
    assert result["changed"] and result["action"] == "stopped"
    assert systemctl.changing() == [f"disable --now -- {UNIT}.service", "daemon-reload"]
    assert not os.path.exists(os.path.join(p["unit_dir"], f"{UNIT}.service")) and os.path.exists(p["control_key_file"])
    assert not mod.absent(p, False, FakeSystemctl())["changed"]


def test_the_units_command_line_from_the_installed_tree_runs_the_real_gateway(tmp_path):
    """The unit's ExecStart as systemd would run it: the installed code tree alone on PYTHONPATH (no
    collection checkout), the credentials directory systemd makes from LoadCredential=."""
    port, metrics = free_port(), free_port()
    p = params(tmp_path, bind_host="127.0.0.1", port=port, metrics_port=metrics)
    mod.present(p, False, FakeSystemctl(), wait=Waits(), holder=lambda url: None, account=Accounts())
    unit = open(os.path.join(p["unit_dir"], f"{UNIT}.service")).read()
    execstart = shlex.split(next(line for line in unit.splitlines() if line.startswith("ExecStart="))[len("ExecStart="):])
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    for line in unit.splitlines():
        if line.startswith("LoadCredential="):
            name, path = line[len("LoadCredential="):].split(":", 1)
            (credentials / name).write_bytes(open(path, "rb").read())
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": p["root"], "CREDENTIALS_DIRECTORY": str(credentials)}
    log = (tmp_path / "gateway.log").open("w")
    proc = subprocess.Popen(execstart, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        waited = _gateway.Gateway(_http.Client(f"http://127.0.0.1:{port}", None, True, 5)).wait_up(30)
        assert waited < 30
        control = open(p["control_key_file"]).read().strip()
        assert _gateway.Gateway(_http.Client(f"http://127.0.0.1:{port}", control, True, 5)).workers() == []
        with pytest.raises(_gateway.GatewayError, match="HTTP 401"):
            _gateway.Gateway(_http.Client(f"http://127.0.0.1:{port}", KEY, True, 5)).workers()
    finally:
        proc.kill()
        proc.wait()
    assert KEY not in (tmp_path / "gateway.log").read_text()


def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    p = params(tmp_path, python="/bin/true")
    mod.present(p, False, FakeSystemctl(), wait=Waits(), holder=lambda url: None, account=Accounts())
    done = subprocess.run(["systemd-analyze", "verify", os.path.join(p["unit_dir"], f"{UNIT}.service")],
                          capture_output=True, text=True, check=False, timeout=60)
    problems = [line for line in done.stderr.splitlines() if f"{UNIT}.service" in line]
    assert problems == [], done.stderr
