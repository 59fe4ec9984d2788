"""sglang_deploy_lock (the module, as the action plugin runs it on the host):
acquire, contention, renew, release, lost, takeover, check mode and the
directory it creates, on real files."""

from __future__ import annotations

import json
import os
import stat

import pytest
from sim_helpers import run_module

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
