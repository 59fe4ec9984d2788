"""sglang_deploy_lock (the module, as the action plugin runs it on the host):
acquire, contention, renew, release, lost, takeover, check mode and the
directory it creates, on real files."""

from __future__ import annotations

import json
import os
import stat

import pytest
from sim_helpers import RunCommand, run_module

from ansible_collections.inferops.sglang.plugins.modules import sglang_deploy_lock

A = "a" * 32
B = "b" * 32
HOLDER = dict(controller_user="alice", controller_host="ctl-1", controller_pid=4242, awx_job_id="42")


def run(capsys, path, check_mode=False, **args):
    args = dict(dict(path=str(path), service="sglang-qwen.service", variant="shadow-balanced", run_id=A, holder=HOLDER), **args)
    return run_module(sglang_deploy_lock.main, capsys, args, check_mode=check_mode)[:2]


@pytest.fixture
def warned(monkeypatch):
    """The warnings the module gives (module.warn), per test: in-process they reach the result
    or, once controller code is imported, the controller's display."""
    messages: list[str] = []
    real = sglang_deploy_lock.AnsibleModule.warn

    def warn(self, warning):
        messages.append(warning)
        real(self, warning)

    monkeypatch.setattr(sglang_deploy_lock.AnsibleModule, "warn", warn)
    return messages


def test_acquire_creates_the_directory_and_the_lock(capsys, tmp_path):
    path = tmp_path / "sglang-qwen" / "deploy.lock"
    rc, result = run(capsys, path, lease=900)
    assert rc == 0, result
    assert result["acquired"] and result["changed"] and result["run_id"] == A and result["lost"] is False
    assert result["previous"] is None and result["taken_over"] is False
    record = json.loads(path.read_text())
    assert result["holder"] == record
    assert record["service"] == "sglang-qwen.service" and record["variant"] == "shadow-balanced"
    assert record["controller_user"] == "alice" and record["controller_pid"] == 4242 and record["awx_job_id"] == "42"
    assert record["lease_s"] == 900
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_another_run_is_not_given_the_lock(capsys, tmp_path):
    path = tmp_path / "deploy.lock"
    run(capsys, path)
    before = path.read_bytes()
    rc, result = run(capsys, path, run_id=B, variant="nextn", holder=dict(HOLDER, controller_user="bob"))
    assert rc == 0 and result["acquired"] is False and result["changed"] is False
    assert result["holder"]["run_id"] == A and result["holder"]["controller_user"] == "alice"
    assert path.read_bytes() == before


def test_renew_and_release_of_this_run(capsys, tmp_path):
    path = tmp_path / "deploy.lock"
    run(capsys, path, lease=60)
    expires = json.loads(path.read_text())["expires"]
    rc, result = run(capsys, path, state="renewed", lease=3600)
    assert rc == 0 and result["changed"] and not result["lost"]
    assert json.loads(path.read_text())["expires"] >= expires + 3600 - 60
    rc, result = run(capsys, path, state="released")
    assert rc == 0 and result["changed"] and not result["lost"] and result["holder"] is None
    assert not path.exists()


def test_a_lost_lock_fails_renew_and_release_leaves_it_alone(capsys, tmp_path, warned):
    path = tmp_path / "deploy.lock"
    run(capsys, path, run_id=B, holder=dict(HOLDER, controller_user="bob"))
    before = path.read_bytes()
    rc, result = run(capsys, path, state="renewed")
    assert rc == 1 and result["lost"] is True and result["holder"]["run_id"] == B
    assert result["msg"].startswith(f"the deploy lock of sglang-qwen.service ({path}) is lost: it is held by run {B}, bob@ctl-1")
    rc, result = run(capsys, path, state="released")
    assert rc == 0 and result["lost"] is True and result["changed"] is False
    assert any("is lost" in w and "left alone" in w for w in warned)
    assert path.read_bytes() == before


def test_a_stale_lock_is_taken_over_with_a_warning(capsys, tmp_path, warned):
    path = tmp_path / "deploy.lock"
    path.write_text(json.dumps(dict(HOLDER, run_id=B, service="sglang-qwen.service", variant="nextn", started="s",
                                    renewed="s", expires=1000, lease_s=60)))
    rc, result = run(capsys, path)
    assert rc == 0 and result["acquired"] and result["taken_over"]
    assert result["previous"]["run_id"] == B and json.loads(path.read_text())["run_id"] == A
    assert any(f"took over the deploy lock {path} of run {B}" in w and "its lease ran out" in w for w in warned)


def test_take_over_run_id_breaks_a_live_lock(capsys, tmp_path):
    path = tmp_path / "deploy.lock"
    run(capsys, path, run_id=B)
    rc, result = run(capsys, path, take_over_run_id=B)
    assert rc == 0 and result["taken_over"] and result["previous"]["run_id"] == B
    assert json.loads(path.read_text())["run_id"] == A


def test_check_mode_writes_nothing_and_warns_of_another_deploy(capsys, tmp_path, warned):
    path = tmp_path / "state" / "deploy.lock"
    rc, result = run(capsys, path, check_mode=True)
    assert rc == 0 and result["acquired"] and result["changed"] and result["holder"] is None
    assert not path.parent.exists()
    run(capsys, path, run_id=B, holder=dict(HOLDER, controller_user="bob"))
    before = path.read_bytes()
    rc, result = run(capsys, path, check_mode=True)
    assert rc == 0 and not result["acquired"] and result["holder"]["run_id"] == B
    assert any(w.startswith("sglang-qwen.service is being deployed by bob@ctl-1 (AWX job 42), variant shadow-balanced")
               for w in warned)
    rc, result = run(capsys, path, state="renewed", check_mode=True)
    assert rc == 0 and result["lost"] and not result["changed"]
    assert path.read_bytes() == before and sorted(os.listdir(path.parent)) == ["deploy.lock"]


def test_without_service_the_lock_names_its_directory(capsys, tmp_path):
    path = tmp_path / "sglang-qwen" / "deploy.lock"
    rc, result = run(capsys, path, service=None, holder=dict(HOLDER, service=None))
    assert rc == 0 and json.loads(path.read_text())["service"] == "sglang-qwen"


def test_bad_input_and_a_file_that_is_not_a_lock_fail(capsys, tmp_path):
    path = tmp_path / "deploy.lock"
    rc, result = run(capsys, path, lease=0)
    assert rc == 1 and result["msg"] == "lease must be a positive number of seconds, got 0" and not path.exists()
    path.write_text("not a lock")
    rc, result = run(capsys, path)
    assert rc == 1 and "is not a deploy lock" in result["msg"] and path.read_text() == "not a lock"


# -- inspect: the service read under the lock, in the same call ---------------------------------------------------------

UNIT = "u.service"
ARGV = ["--model-path", "/srv/models/Qwen3.6-27B", "--host", "0.0.0.0", "--port", "30001", "--tp-size", "2"]


def service_layout(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    state = tmp_path / "state"
    (state / "known-good").mkdir(parents=True)
    files = [
        {"name": UNIT, "src": str(etc / UNIT), "mode": "0644", "template": "sglang.service.j2"},
        {"name": "u.yaml", "src": str(etc / "u.yaml"), "mode": "0600", "template": "sglang.config.yaml.j2"},
        {"name": "current.json", "src": str(state / "current.json"), "mode": "0600", "template": None},
    ]
    return state, files


def tree(directory) -> dict[str, bytes]:
    found = {}
    for root, _dirs, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, directory)] = handle.read()
    return found


def test_the_lock_reads_the_unit_the_record_the_marker_and_the_known_good(tmp_path, capsys, monkeypatch):
    state, files = service_layout(tmp_path)
    (state / "current.json").write_text(json.dumps({"variant": "nextn", "argv": ARGV, "sglang_version": "0.5.11",
                                                    "gpu_devices": [0, 1], "params": {"gate_timeout": 600}}))
    (state / "switch.json").write_text(json.dumps({"variant": "shadow", "run_id": "dead", "state": "gate"}))
    (state / "known-good" / UNIT).write_text("unit")
    (state / "known-good/current.json").write_text(json.dumps({"variant": "plain", "argv": ["--port", "30000"],
                                                               "params": {"gate_timeout": 1200}}))
    with open(files[1]["src"], "w", encoding="utf-8") as handle:
        handle.write('api-key: "k"\n')
    files_before = tree(tmp_path)
    systemctl = RunCommand().install(monkeypatch)
    lock_path = tmp_path / "lock" / "deploy.lock"
    rc, result = run(capsys, lock_path, service=UNIT, inspect={"service_dir": str(state), "files": files})
    assert rc == 0 and result["acquired"], result
    assert result["before"] == {
        "active": True, "loaded": True, "unit": UNIT, "slot": "blue", "variant": "nextn", "argv": ARGV,
        "url": "http://127.0.0.1:30001", "api_key_file": files[1]["src"], "interrupted": True,
        "marker": {"variant": "shadow", "run_id": "dead", "state": "gate"},
        "known_good": True, "known_good_variant": "plain", "known_good_argv": ["--port", "30000"],
        "sglang_version": "0.5.11", "gpu_devices": [0, 1], "gate_timeout": 600, "known_good_gate_timeout": 1200}
    assert systemctl.argvs == [["systemctl", "show", "-p", "ActiveState,LoadState", "--", UNIT]]
    # the service's files are only read; the lock is the one file written
    assert {k: v for k, v in tree(tmp_path).items() if not k.startswith("lock/")} == files_before


@pytest.mark.parametrize("rc,out", [
    (0, "ActiveState=inactive\nLoadState=not-found\n"),
    (0, "ActiveState=activating\nLoadState=loaded\n"),  # starting is not active
    (1, "ActiveState=active\nLoadState=loaded\n"),      # systemctl failed: nothing is known to run
])
def test_the_lock_reads_a_host_without_a_running_managed_service(tmp_path, capsys, monkeypatch, rc, out):
    state, files = service_layout(tmp_path)
    # a known-good record without its unit is no known-good service; a damaged current.json records nothing
    (state / "known-good/current.json").write_text(json.dumps({"variant": "plain", "params": {"gate_timeout": 1200}}))
    (state / "current.json").write_text('{"variant": "nex')
    RunCommand(rc, out).install(monkeypatch)
    code, result = run(capsys, tmp_path / "deploy.lock", service=UNIT, inspect={"service_dir": str(state), "files": files})
    before = result["before"]
    assert code == 0
    assert before["active"] is False and before["loaded"] is (rc == 0 and "LoadState=loaded" in out)
    assert before["variant"] is None and before["argv"] is None and before["url"] is None
    assert before["interrupted"] is False and before["marker"] is None
    assert before["known_good"] is False and before["known_good_variant"] is None
    assert before["gate_timeout"] is None and before["known_good_gate_timeout"] is None
    assert before["api_key_file"] is None  # the --config file is not installed


def test_the_lock_of_another_run_reads_nothing_but_check_mode_does(tmp_path, capsys, monkeypatch):
    state, files = service_layout(tmp_path)
    systemctl = RunCommand().install(monkeypatch)
    path = tmp_path / "deploy.lock"
    inspect = {"service_dir": str(state), "files": files}
    run(capsys, path, run_id=B)
    code, result = run(capsys, path, service=UNIT, inspect=inspect)
    assert code == 0 and not result["acquired"] and result["before"] is None and systemctl.argvs == []
    # check mode: what a run would find, whoever holds the lock now
    code, result = run(capsys, path, check_mode=True, service=UNIT, inspect=inspect)
    assert code == 0 and not result["acquired"] and result["before"]["active"] is True
    assert len(systemctl.argvs) == 1


def test_inspect_needs_each_file_whole_and_changes_nothing_when_refused(tmp_path, capsys, monkeypatch):
    state, files = service_layout(tmp_path)
    systemctl = RunCommand().install(monkeypatch)
    path = tmp_path / "deploy.lock"
    code, result = run(capsys, path, service=UNIT,
                       inspect={"service_dir": str(state), "files": [{"name": UNIT, "src": files[0]["src"]}]})
    assert code == 1 and result["msg"].startswith("each of inspect.files needs name, src and mode;")
    assert result["msg"].endswith("lacks mode")
    assert systemctl.argvs == [] and not path.exists()
