"""sglang_deploy_lock (the action plugin): the holder it builds on the controller,
the run id per play and host, and the wait loop (polls, timeout, the failure
naming the holder, the takeover of a holder whose ansible-playbook process on
this controller is gone) with a scripted _execute_module and a fake clock; then
the whole plugin through real ansible-playbook runs on localhost."""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ansible_collections.inferops.sglang.plugins.action import sglang_deploy_lock as action_mod
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_lock as lock

REPO = Path(__file__).resolve().parents[4]
S = "5" * 32
ARGS = dict(path="/var/lib/inferops-sglang/sglang-qwen/deploy.lock", service="sglang-qwen.service", variant="shadow-balanced")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def other(**fields) -> dict:
    """The lock's record of another run."""
    record = dict(run_id=S, service="sglang-qwen.service", variant="nextn", controller_user="alice", controller_host="ctl-1",
                  controller_pid=4242, awx_job_id="42", started="2026-12-01T10:00:00Z", renewed="2026-12-01T10:00:00Z",
                  expires=1796121000, lease_s=1800)
    record.update(fields)
    return record


def held(record: dict) -> dict:
    return dict(changed=False, acquired=False, holder=record, previous=None, taken_over=False, lost=False)


def got(module_args: dict, **extra) -> dict:
    return dict(dict(changed=True, acquired=True, holder=dict(module_args["holder"], run_id=module_args["run_id"]),
                     previous=None, taken_over=False, lost=False), **extra)


class Harness:
    """The action plugin with a fake clock (sleep advances it) and a scripted host."""

    def __init__(self, args: dict, host, check_mode: bool = False, play_uuid: str = "play-1") -> None:
        task = SimpleNamespace(args=dict(args), check_mode=check_mode, async_val=0, action="inferops.sglang.sglang_deploy_lock",
                               get_play=lambda: SimpleNamespace(_uuid=play_uuid))
        connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
        self.action = action_mod.ActionModule(task, connection, None, None, None)
        self.action._load_name = "sglang_deploy_lock"
        self.now = 5000.0
        self.sleeps: list[float] = []
        self.calls: list[dict] = []
        self.host = host
        self.action._clock = lambda: self.now
        self.action._sleep = self.sleep
        self.action._execute_module = self.execute

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def execute(self, module_name=None, module_args=None, task_vars=None):
        assert module_name == "inferops.sglang.sglang_deploy_lock"
        self.calls.append(module_args)
        return self.host(module_args)

    def run(self, **task_vars) -> dict:
        return self.action.run(task_vars=dict(dict(inventory_hostname="ct200"), **task_vars))


def test_the_holder_is_this_controller_and_the_run_id_is_one_per_play_and_host():
    h = Harness(ARGS, got)
    result = h.run(awx_job_id=42)
    assert result["acquired"] and len(h.calls) == 1 and h.sleeps == []
    sent = h.calls[0]
    assert sent["holder"] == dict(service="sglang-qwen.service", variant="shadow-balanced", controller_user=getpass.getuser(),
                                  controller_host=socket.gethostname(), controller_pid=os.getpid(), awx_job_id="42")
    assert sent["state"] == "acquired" and sent["lease"] == 1800 and sent["take_over_run_id"] is None
    run_id = result["run_id"]
    assert len(run_id) == 32 and int(run_id, 16) >= 0 and sent["run_id"] == run_id
    assert Harness(ARGS, got).run()["run_id"] == run_id
    assert Harness(ARGS, got).run(inventory_hostname="ct129")["run_id"] != run_id
    assert Harness(ARGS, got, play_uuid="play-2").run()["run_id"] != run_id
    tower = Harness(ARGS, got)
    tower.run(tower_job_id="7")
    assert tower.calls[0]["holder"]["awx_job_id"] == "7"
    plain = Harness(ARGS, got)
    plain.run()
    assert plain.calls[0]["holder"]["awx_job_id"] is None


def test_without_service_the_lock_names_its_directory():
    h = Harness(dict(path=ARGS["path"], variant="nextn"), got)
    h.run()
    assert h.calls[0]["holder"]["service"] == "sglang-qwen" and h.calls[0]["holder"]["variant"] == "nextn"


def test_it_polls_until_the_other_deploy_releases():
    answers = [held(other()), held(other())]
    h = Harness(dict(ARGS, poll=3), lambda args: answers.pop(0) if answers else got(args))
    result = h.run()
    assert result["acquired"] and not result.get("failed")
    assert len(h.calls) == 3 and h.sleeps == [3, 3] and result["waited"] == 6.0


def test_it_fails_after_the_timeout_naming_the_holder_without_overshooting():
    h = Harness(dict(ARGS, timeout=10, poll=3), lambda args: held(other()))
    result = h.run()
    assert result["failed"] and not result["acquired"] and result["waited"] == 10.0
    assert h.sleeps == [3, 3, 3, 1] and len(h.calls) == 5
    assert result["msg"].startswith(
        "sglang-qwen.service on ct200 is being deployed by alice@ctl-1 (AWX job 42), variant nextn, "
        "since 2026-12-01T10:00:00Z; waited 10 s (sglang_service_lock_timeout). "
        f"The lock is {ARGS['path']} (run {S}, ")
    assert result["holder"]["run_id"] == S and result["changed"] is False
    assert all(call["take_over_run_id"] is None for call in h.calls)


def test_timeout_zero_tries_once():
    h = Harness(dict(ARGS, timeout=0), lambda args: held(other()))
    result = h.run()
    assert result["failed"] and len(h.calls) == 1 and h.sleeps == []
    assert "; waited 0 s (sglang_service_lock_timeout)." in result["msg"]


def test_a_holder_whose_playbook_died_on_this_controller_is_taken_over_at_once(monkeypatch):
    warned = []
    monkeypatch.setattr(action_mod.display, "warning", warned.append)
    stale = other(controller_host=socket.gethostname(), controller_pid=dead_pid())

    def host(args):
        if args["take_over_run_id"] == S:
            return got(args, taken_over=True, previous=stale)
        return held(stale)

    h = Harness(ARGS, host)
    result = h.run()
    assert result["acquired"] and result["taken_over"] and result["previous"]["run_id"] == S
    assert [call["take_over_run_id"] for call in h.calls] == [None, S] and h.sleeps == []
    assert warned == [f"took over the deploy lock {ARGS['path']} on ct200 of run {S}: its ansible-playbook process "
                      f"(pid {stale['controller_pid']} on {socket.gethostname()}) is gone"]


def test_a_dead_pid_of_another_controller_or_a_live_one_here_is_waited_for(monkeypatch):
    for record in (other(controller_host="elsewhere", controller_pid=dead_pid()),
                   other(controller_host=socket.gethostname(), controller_pid=os.getpid())):
        h = Harness(dict(ARGS, timeout=4), lambda args, record=record: held(record))
        result = h.run()
        assert result["failed"] and h.sleeps == [2, 2]
        assert all(call["take_over_run_id"] is None for call in h.calls)

    def kill(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(lock.os, "kill", kill)
    h = Harness(dict(ARGS, timeout=2), lambda args: held(other(controller_host=socket.gethostname())))
    assert h.run()["failed"] and all(call["take_over_run_id"] is None for call in h.calls)


def test_check_mode_never_waits():
    h = Harness(ARGS, lambda args: held(other()), check_mode=True)
    result = h.run()
    assert not result.get("failed") and not result["acquired"] and result["holder"]["run_id"] == S
    assert len(h.calls) == 1 and h.sleeps == []


def test_renew_and_release_make_one_call_with_the_run_id():
    acquired = Harness(ARGS, got).run()["run_id"]
    for state in ("renewed", "released"):
        h = Harness(dict(path=ARGS["path"], state=state), lambda args: dict(changed=True, acquired=False, lost=False))
        result = h.run()
        assert len(h.calls) == 1 and h.calls[0]["state"] == state and h.sleeps == []
        assert h.calls[0]["run_id"] == acquired == result["run_id"]
    h = Harness(dict(path=ARGS["path"], state="released", run_id=S), lambda args: dict(changed=True, lost=False))
    h.run()
    assert h.calls[0]["run_id"] == S


def test_bad_arguments_fail_before_the_host_is_asked():
    for args, message in ((dict(ARGS, timeout=-1), "timeout must be 0"),
                          (dict(service="sglang-qwen.service"), "missing required arguments: path"),
                          (dict(ARGS, poll=0), "poll must be a positive"),
                          (dict(ARGS, bogus=1), "bogus")):
        h = Harness(args, got)
        with pytest.raises(action_mod.AnsibleActionFail, match=message):
            h.run()
        assert h.calls == []


# Through ansible-playbook: the module on localhost, the action in a real worker process.

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - inferops.sglang.sglang_deploy_lock:
        path: "{{ lock }}"
        service: sglang-qwen.service
        variant: shadow-balanced
        timeout: "{{ timeout | default(30) }}"
        poll: 0.5
      register: got
    - ansible.builtin.copy:
        content: "{{ got | to_json }}"
        dest: "{{ out }}"
    - ansible.builtin.wait_for:
        path: "{{ go }}"
        timeout: 60
      when: go is defined
    - inferops.sglang.sglang_deploy_lock:
        path: "{{ lock }}"
        state: released
"""


def playbook(tmp_path: Path, name: str, **extra) -> subprocess.Popen:
    (tmp_path / "lock.yml").write_text(PLAYBOOK)
    (tmp_path / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = False\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="0")
    variables = dict(lock=str(tmp_path / "state" / "deploy.lock"), out=str(tmp_path / f"{name}.json"), **extra)
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", "lock.yml",
           "-e", json.dumps(variables)]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"{path} not written"
        time.sleep(0.1)


def test_two_playbooks_one_deploys_the_other_fails_naming_it(tmp_path):
    first = playbook(tmp_path, "first", go=str(tmp_path / "go"))
    wait_for(tmp_path / "first.json", first)
    holder = json.loads((tmp_path / "first.json").read_text())["holder"]
    # The holder is the ansible-playbook process itself, not its worker.
    assert holder["controller_pid"] == first.pid and holder["controller_host"] == socket.gethostname()
    assert json.loads((tmp_path / "state" / "deploy.lock").read_text()) == holder
    second = playbook(tmp_path, "second", timeout=2)
    out = second.communicate(timeout=120)[0]
    assert second.returncode == 2, out
    # "waited N s" is the wait measured: at least the 2 s timeout, a little more on a loaded machine
    said = re.search(re.escape(f"sglang-qwen.service on localhost is being deployed by {holder['controller_user']}@"
                               f"{holder['controller_host']}, variant shadow-balanced, since {holder['started']}; waited ")
                     + r"(\d+) s \(sglang_service_lock_timeout\)", " ".join(out.split()))
    assert said and 2 <= int(said.group(1)) <= 5, out
    assert not (tmp_path / "second.json").exists()
    (tmp_path / "go").touch()
    out = first.communicate(timeout=120)[0]
    assert first.returncode == 0, out
    assert not (tmp_path / "state" / "deploy.lock").exists()


def test_a_playbook_takes_over_the_lock_of_a_dead_playbook(tmp_path):
    (tmp_path / "state").mkdir(mode=0o700)
    stale = other(controller_host=socket.gethostname(), controller_pid=dead_pid(), expires=int(time.time()) + 3600)
    (tmp_path / "state" / "deploy.lock").write_text(json.dumps(stale))
    proc = playbook(tmp_path, "taker", timeout=0)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    result = json.loads((tmp_path / "taker.json").read_text())
    assert result["taken_over"] and result["previous"] == stale and result["holder"]["controller_pid"] == proc.pid
    assert f"its ansible-playbook process (pid {stale['controller_pid']} on {socket.gethostname()}) is gone" in " ".join(out.split())
