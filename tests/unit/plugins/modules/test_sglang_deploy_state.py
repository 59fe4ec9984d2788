"""sglang_deploy_state: its two steps on a real state directory, systemctl stubbed.

step=amend rewrites this run's line in history.jsonl with the rotation
hooks' results; step=stage makes the directories and writes this run's renderings into its
staging directory, each staged unit verified (systemd-analyze through run_command). The switch itself (sglang_switch, _switch) is tested in
tests/unit/plugins/module_utils/test_switch.py."""

from __future__ import annotations

import json
import os
import stat

import pytest
from sim_helpers import RunCommand, run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy
from ansible_collections.inferops.sglang.plugins.modules import sglang_deploy_state

UNIT = "u.service"
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


@pytest.fixture(name="systemctl")
def fixture_systemctl(monkeypatch):
    return RunCommand().install(monkeypatch)


def run(capsys, check_mode: bool = False, **args):
    code, result = run_module(sglang_deploy_state.main, capsys, args, check_mode=check_mode)[:2]
    return code, result


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


# -- step=stage ---------------------------------------------------------------------------

KEY = "sk-staged-secret-123"
UNIT_TEXT = "[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\n"
CONFIG_TEXT = f'api-key: "{KEY}"\n'
BASELINE_UNIT = "[Unit]\nDescription=nextn\n[Service]\nExecStart=/bin/true\n"


def stage_args(tmp_path, **extra) -> dict:
    etc, state = tmp_path / "etc", tmp_path / "state"
    files = [
        {"name": UNIT, "src": str(etc / "systemd" / UNIT), "mode": "0644", "template": "sglang.service.j2"},
        {"name": "u.yaml", "src": str(etc / "sglang" / "u.yaml"), "mode": "0600", "template": "sglang.config.yaml.j2"},
    ]
    args = {
        "step": "stage", "service_dir": str(state / "u"),
        "directories": [{"path": str(etc), "mode": "0755"}, {"path": str(etc / "sglang"), "mode": "0755"},
                        {"path": str(state), "mode": "0700"}, {"path": str(state / "u"), "mode": "0700"},
                        {"path": str(state / "u" / "staging"), "mode": "0700"}],
        "staging": str(state / "u" / "staging" / "run1"),
        "files": files, "contents": [UNIT_TEXT, CONFIG_TEXT],
    }
    args.update(extra)
    return args


def test_stage_makes_the_directories_and_writes_the_renderings_root_only_and_verifies_the_unit(tmp_path, capsys, systemctl):
    args = stage_args(tmp_path, baseline_contents=[BASELINE_UNIT, "{}\n"])
    rc, result, raw = run_module(sglang_deploy_state.main, capsys, args)
    assert rc == 0, result
    staging = tmp_path / "state/u/staging/run1"
    assert (staging / UNIT).read_text() == UNIT_TEXT and (staging / "u.yaml").read_text() == CONFIG_TEXT
    assert (staging / "baseline" / UNIT).read_text() == BASELINE_UNIT
    for path in (staging / UNIT, staging / "u.yaml", staging / "baseline" / "u.yaml"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for path, mode in ((tmp_path / "etc", 0o755), (tmp_path / "state/u", 0o700), (staging, 0o700), (staging / "baseline", 0o700)):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    # the variant's unit and the baseline's, each verified where it was staged
    assert systemctl.argvs == [["systemd-analyze", "verify", str(staging / UNIT)],
                               ["systemd-analyze", "verify", str(staging / "baseline" / UNIT)]]
    # a first run made the directories: a change; both files differ from the (missing) installed ones
    assert result["changed"] and result["differ"] == [UNIT, "u.yaml"]
    assert result["directories_changed"] == [d["path"] for d in args["directories"]]
    # the --config file's key is in no output of the module
    assert KEY not in raw


def test_stage_again_with_the_installed_files_is_no_change(tmp_path, capsys, systemctl):
    args = stage_args(tmp_path)
    assert run_module(sglang_deploy_state.main, capsys, args)[0] == 0
    (tmp_path / "etc/systemd").mkdir()
    for item, text in zip(args["files"], args["contents"]):
        with open(item["src"], "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(item["src"], int(item["mode"], 8))
    rc, result = run_module(sglang_deploy_state.main, capsys, dict(args, staging=str(tmp_path / "state/u/staging/run2")))[:2]
    assert rc == 0 and result["changed"] is False and result["differ"] == [] and result["directories_changed"] == []
    assert not (tmp_path / "state/u/staging/run2/baseline").exists()


def test_stage_mends_a_directory_of_the_wrong_mode(tmp_path, capsys, systemctl):
    args = stage_args(tmp_path)
    assert run_module(sglang_deploy_state.main, capsys, args)[0] == 0
    os.chmod(tmp_path / "state/u", 0o755)
    rc, result = run_module(sglang_deploy_state.main, capsys, args)[:2]
    assert rc == 0 and result["changed"] and result["directories_changed"] == [str(tmp_path / "state/u")]
    assert stat.S_IMODE((tmp_path / "state/u").stat().st_mode) == 0o700


def test_stage_in_check_mode_writes_nothing_and_names_what_would_change(tmp_path, capsys, systemctl):
    args = stage_args(tmp_path)
    assert run_module(sglang_deploy_state.main, capsys, args)[0] == 0
    (tmp_path / "etc/systemd").mkdir()
    unit, config = args["files"]
    with open(unit["src"], "w", encoding="utf-8") as handle:
        handle.write(UNIT_TEXT)
    os.chmod(unit["src"], 0o644)
    with open(config["src"], "w", encoding="utf-8") as handle:
        handle.write(CONFIG_TEXT)
    os.chmod(config["src"], 0o644)  # the right text, the wrong mode: it would change
    staging = tmp_path / "state/u/staging/check"
    systemctl.argvs.clear()
    rc, result = run_module(sglang_deploy_state.main, capsys, dict(args, staging=str(staging)), check_mode=True)[:2]
    assert rc == 0 and result["changed"] and result["differ"] == ["u.yaml"] and result["staged"] == []
    assert not staging.exists() and systemctl.argvs == []


def test_stage_refuses_a_link_where_a_directory_should_be_and_writes_nothing_through_it(tmp_path, capsys, systemctl):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    os.chmod(elsewhere, 0o777)
    args = stage_args(tmp_path)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/sglang").symlink_to(elsewhere)
    rc, result = run_module(sglang_deploy_state.main, capsys, args)[:2]
    assert rc == 1 and result["failed"]
    assert f"cannot make the directory {tmp_path / 'etc/sglang'}" in result["msg"] and "not a directory" in result["msg"]
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o777 and list(elsewhere.iterdir()) == []
    assert not (tmp_path / "state").exists()


def test_stage_fails_with_systemds_words_when_it_refuses_the_staged_unit(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sglang_deploy_state.AnsibleModule, "run_command",
                        lambda _module, args, **kw: (1, "", "u.service: Unknown key Foo=\n"))
    rc, result, raw = run_module(sglang_deploy_state.main, capsys, stage_args(tmp_path))
    assert rc == 1 and "systemd refuses the staged unit" in result["msg"] and "Unknown key Foo=" in result["msg"]
    assert KEY not in raw


@pytest.mark.parametrize("bad, words", [
    ({"contents": [UNIT_TEXT]}, "contents has 1 texts for 2 files"),
    ({"baseline_contents": [UNIT_TEXT]}, "baseline_contents has 1 texts for 2 files"),
    ({"directories": [{"path": "/x", "mode": "rwx"}]}, "each of directories needs path and an octal mode"),
])
def test_stage_refuses_input_that_does_not_fit_before_writing(tmp_path, capsys, systemctl, bad, words):
    rc, result = run_module(sglang_deploy_state.main, capsys, stage_args(tmp_path, **bad))[:2]
    assert rc == 1 and words in result["msg"]
    assert not (tmp_path / "state").exists() and systemctl.argvs == []


# -- the service's account (stage's first step) ------------------------------------------------------------------------

def test_stage_makes_a_missing_account_first_and_reports_it(tmp_path, capsys, systemctl):
    user, group = "inferops-test-no-such-user", "inferops-test-no-such-group"
    args = dict(stage_args(tmp_path), account={"user": user, "group": group})
    rc, result = run_module(sglang_deploy_state.main, capsys, args)[:2]
    assert rc == 0 and result["changed"]
    made = [["groupadd", "--system", group],
            ["useradd", "--system", "--gid", group, "--shell", "/usr/sbin/nologin", "--home-dir", "/var/lib/sglang",
             "--no-create-home", user]]
    assert systemctl.argvs[:2] == made  # before any directory or file (the unit's User= must exist)
    assert result["account_changed"] == [" ".join(argv) for argv in made]


def test_stage_in_check_mode_says_it_would_make_the_account_and_runs_nothing(tmp_path, capsys, systemctl):
    args = dict(stage_args(tmp_path), account={"user": "inferops-test-no-such-user", "group": "root"})
    rc, result = run_module(sglang_deploy_state.main, capsys, args, check_mode=True)[:2]
    assert rc == 0 and result["changed"] and systemctl.argvs == []
    assert result["account_changed"] == ["useradd --system --gid root --shell /usr/sbin/nologin --home-dir /var/lib/sglang "
                                         "--no-create-home inferops-test-no-such-user"]


def test_stage_stops_before_any_file_when_the_account_cannot_be_made(tmp_path, capsys, monkeypatch):
    RunCommand(rc=9).install(monkeypatch)
    args = dict(stage_args(tmp_path), account={"user": "inferops-test-no-such-user", "group": "root"})
    rc, result = run_module(sglang_deploy_state.main, capsys, args)[:2]
    assert rc == 1 and result["msg"].startswith("cannot make the service's account: useradd --system")
    assert "(exit 9)" in result["msg"] and not (tmp_path / "state").exists()
