"""sglang_deploy_state: its two steps on a real state directory, systemctl stubbed.

step=inspect reads the service before a deploy (the unit through run_command, current.json,
the marker, known-good/); step=amend rewrites this run's line in history.jsonl with the rotation
hooks' results. The switch itself (sglang_switch, _switch) is tested in
tests/unit/plugins/module_utils/test_switch.py."""

from __future__ import annotations

import json
import os
import stat

import pytest
from sim_helpers import run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy
from ansible_collections.inferops.sglang.plugins.modules import sglang_deploy_state

UNIT = "u.service"
ARGV = ["--model-path", "/srv/models/Qwen3.6-27B", "--host", "0.0.0.0", "--port", "30001", "--tp-size", "2"]
OUT_OK = {"ok": True, "msg": "HTTP 204"}
IN_OK = {"ok": True, "msg": "HTTP 204"}
IN_FAILED = {"ok": False, "msg": "HTTP 503 (expected 200): Service Unavailable"}


def layout(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    state = tmp_path / "state"
    for sub in ("staging/run1", "known-good", "attempts"):
        (state / sub).mkdir(parents=True)
    files = [
        {"name": UNIT, "src": str(etc / UNIT), "mode": "0644", "template": "sglang.service.j2"},
        {"name": "u.yaml", "src": str(etc / "u.yaml"), "mode": "0600", "template": "sglang.config.yaml.j2"},
        {"name": "current.json", "src": str(state / "current.json"), "mode": "0600", "template": None},
    ]
    return state, files


class Systemctl:
    """module.run_command's stand-in: answers ``systemctl show`` and keeps every argv."""

    def __init__(self, rc: int = 0, out: str = "ActiveState=active\nLoadState=loaded\n") -> None:
        self.rc, self.out, self.argvs = rc, out, []

    def __call__(self, args, **_kwargs):
        self.argvs.append(list(args))
        return self.rc, self.out, ""

    def install(self, monkeypatch) -> Systemctl:
        monkeypatch.setattr(sglang_deploy_state.AnsibleModule, "run_command", lambda _module, args, **kw: self(args, **kw))
        return self


@pytest.fixture(name="systemctl")
def fixture_systemctl(monkeypatch):
    return Systemctl().install(monkeypatch)


def run(capsys, check_mode: bool = False, **args):
    code, result = run_module(sglang_deploy_state.main, capsys, args, check_mode=check_mode)[:2]
    return code, result


def tree(directory) -> dict[str, bytes]:
    """Every file under a directory, with its bytes."""
    found = {}
    for root, _dirs, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, directory)] = handle.read()
    return found


# -- inspect -----------------------------------------------------------------------------------------------------------

def test_inspect_reads_the_unit_the_record_the_marker_and_the_known_good(tmp_path, capsys, systemctl):
    state, files = layout(tmp_path)
    (state / "current.json").write_text(json.dumps({"variant": "nextn", "argv": ARGV, "sglang_version": "0.5.11",
                                                    "gpu_devices": [0, 1], "params": {"gate_timeout": 600}}))
    (state / "switch.json").write_text(json.dumps({"variant": "shadow", "run_id": "dead", "state": "gate"}))
    (state / "known-good" / UNIT).write_text("unit")
    (state / "known-good/current.json").write_text(json.dumps({"variant": "plain", "argv": ["--port", "30000"],
                                                               "params": {"gate_timeout": 1200}}))
    with open(files[1]["src"], "w", encoding="utf-8") as handle:
        handle.write('api-key: "k"\n')
    files_before = tree(tmp_path)
    code, result = run(capsys, step="inspect", service_dir=str(state), unit=UNIT, files=files)
    assert code == 0 and result["changed"] is False
    assert result["before"] == {
        "active": True, "loaded": True, "variant": "nextn", "argv": ARGV, "url": "http://127.0.0.1:30001",
        "api_key_file": files[1]["src"], "interrupted": True,
        "marker": {"variant": "shadow", "run_id": "dead", "state": "gate"},
        "known_good": True, "known_good_variant": "plain", "known_good_argv": ["--port", "30000"],
        "sglang_version": "0.5.11", "gpu_devices": [0, 1], "gate_timeout": 600, "known_good_gate_timeout": 1200}
    assert systemctl.argvs == [["systemctl", "show", "-p", "ActiveState,LoadState", "--", UNIT]]
    assert tree(tmp_path) == files_before  # read-only


@pytest.mark.parametrize("rc,out", [
    (0, "ActiveState=inactive\nLoadState=not-found\n"),
    (0, "ActiveState=activating\nLoadState=loaded\n"),  # starting is not active
    (1, "ActiveState=active\nLoadState=loaded\n"),      # systemctl failed: nothing is known to run
])
def test_inspect_of_a_host_without_a_running_managed_service(tmp_path, capsys, monkeypatch, rc, out):
    state, files = layout(tmp_path)
    # a known-good record without its unit is no known-good service; a damaged current.json records nothing
    (state / "known-good/current.json").write_text(json.dumps({"variant": "plain", "params": {"gate_timeout": 1200}}))
    (state / "current.json").write_text('{"variant": "nex')
    Systemctl(rc, out).install(monkeypatch)
    code, result = run(capsys, step="inspect", service_dir=str(state), unit=UNIT, files=files)
    before = result["before"]
    assert code == 0
    assert before["active"] is False and before["loaded"] is (rc == 0 and "LoadState=loaded" in out)
    assert before["variant"] is None and before["argv"] is None and before["url"] is None
    assert before["interrupted"] is False and before["marker"] is None
    assert before["known_good"] is False and before["known_good_variant"] is None
    assert before["gate_timeout"] is None and before["known_good_gate_timeout"] is None
    assert before["api_key_file"] is None  # the --config file is not installed


def test_inspect_needs_the_unit_and_each_file_whole(tmp_path, capsys, systemctl):
    state, files = layout(tmp_path)
    code, result = run(capsys, step="inspect", service_dir=str(state), files=files)
    assert code == 1 and "unit" in result["msg"]
    code, result = run(capsys, step="inspect", service_dir=str(state), unit=UNIT,
                       files=[{"name": UNIT, "src": files[0]["src"]}])
    assert code == 1 and result["msg"].startswith("each of files needs name, src and mode;")
    assert result["msg"].endswith("lacks mode")
    assert systemctl.argvs == []


# -- amend -------------------------------------------------------------------------------------------------------------

def record(run_id: str = "run1", outcome: str = "switched", rotation: dict | None = None) -> dict:
    """A record as sglang_switch returns it (the out hook's result in it)."""
    fields = {"time": "2026-12-03T02:00:00Z", "host": "ct200", "service": UNIT, "run_id": run_id, "variant": "nextn",
              "from": "plain", "outcome": outcome, "verdict": {"ready": True, "msg": "nextn is ready"},
              "drain": {"drained": True, "seconds": 0.5, "msg": "drained in 0.5 s"},
              "rotation": {"out": OUT_OK} if rotation is None else rotation}
    return _deploy.record(fields)


def history(state, *lines: str) -> str:
    text = "".join(line + "\n" for line in lines)
    (state / "history.jsonl").write_text(text)
    os.chmod(state / "history.jsonl", 0o600)
    return text


def test_amend_rewrites_this_runs_line_with_the_rotation_hooks_and_nothing_else(tmp_path, capsys):
    state = layout(tmp_path)[0]
    rec = record()
    older = json.dumps(record("run0", rotation={"out": OUT_OK, "in": IN_FAILED}))
    history(state, older, '{"cut short', json.dumps(rec))
    code, result = run(capsys, step="amend", service_dir=str(state), record=rec, rotation={"out": OUT_OK, "in": IN_OK})
    assert code == 0 and result["changed"]
    assert result["record"] == dict(rec, rotation={"out": OUT_OK, "in": IN_OK})
    lines = (state / "history.jsonl").read_text().splitlines()
    assert lines[:2] == [older, '{"cut short'] and json.loads(lines[2]) == result["record"]
    assert stat.S_IMODE(os.stat(state / "history.jsonl").st_mode) == 0o600
    assert result["summary"] == _deploy.summary_text(result["record"], str(state))
    assert "OUT of rotation" not in result["summary"]


def test_amend_says_the_host_is_out_of_rotation_when_the_in_hook_failed(tmp_path, capsys):
    state = layout(tmp_path)[0]
    rec = record()
    assert "The host is OUT of rotation (the in hook did not run)." in _deploy.summary_text(rec, str(state))
    history(state, json.dumps(rec))
    code, result = run(capsys, step="amend", service_dir=str(state), record=rec,
                       rotation={"out": OUT_OK, "in": IN_FAILED})
    assert code == 0 and result["record"]["rotation"]["in"] == IN_FAILED
    assert result["summary"].endswith(f"The host is OUT of rotation ({IN_FAILED['msg']}).")
    assert json.loads((state / "history.jsonl").read_text())["rotation"]["in"] == IN_FAILED


def test_amend_of_an_unchanged_host_writes_nothing(tmp_path, capsys):
    state = layout(tmp_path)[0]
    rec = record(outcome="unchanged", rotation={})
    text = history(state, json.dumps(record("run0")), json.dumps(dict(rec, outcome="switched")))
    mtime = os.stat(state / "history.jsonl").st_mtime_ns
    code, result = run(capsys, step="amend", service_dir=str(state), record=rec, rotation={"out": OUT_OK, "in": IN_OK})
    assert code == 0 and result["changed"] is False
    assert result["record"]["rotation"] == {"out": OUT_OK, "in": IN_OK}  # returned amended, not written
    assert (state / "history.jsonl").read_text() == text and os.stat(state / "history.jsonl").st_mtime_ns == mtime


def test_amend_in_check_mode_writes_nothing(tmp_path, capsys):
    state = layout(tmp_path)[0]
    rec = record()
    text = history(state, json.dumps(rec))
    code, result = run(capsys, check_mode=True, step="amend", service_dir=str(state), record=rec,
                       rotation={"out": OUT_OK, "in": IN_FAILED})
    assert code == 0 and result["changed"] is False and result["record"] == rec
    assert (state / "history.jsonl").read_text() == text


def test_amend_needs_the_record_and_fails_with_a_history_it_cannot_read(tmp_path, capsys):
    state = layout(tmp_path)[0]
    code, result = run(capsys, step="amend", service_dir=str(state), rotation={"in": IN_OK})
    assert code == 1 and "record" in result["msg"]
    (state / "history.jsonl").mkdir()  # not a file
    code, result = run(capsys, step="amend", service_dir=str(state), record=record(), rotation={"in": IN_OK})
    assert code == 1 and result["msg"].startswith(f"read {state / 'history.jsonl'}: ")


def test_amend_without_a_line_of_this_run_changes_nothing(tmp_path, capsys):
    state = layout(tmp_path)[0]
    text = history(state, json.dumps(record("run0")))
    code, result = run(capsys, step="amend", service_dir=str(state), record=record(), rotation={"out": OUT_OK, "in": IN_OK})
    assert code == 0 and (state / "history.jsonl").read_text() == text
    assert result["changed"] is False
