"""wait_for_sglang (the action plugin) against a scripted host: the module launched
as an async job with a progress file in its temporary directory, the polls, the
progress lines and how often they come, the module's result returned as it was,
the lost, unreadable and overrunning job, the removal of the progress file's
directory, and the tasks that run the module as a plain call. The same plugin
through real ansible-playbook runs is in test_wait_for_sglang_live.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.plugins.shell.sh import ShellModule

from ansible_collections.inferops.sglang.plugins.action import wait_for_sglang as action_mod

JID = "j123456.4242"
TMP = "/home/deploy/.ansible/tmp/ansible-tmp-1767000000.1-99-1234"
PROGRESS = f"{TMP}/{action_mod.PROGRESS_NAME}"
EPOCH = 1767000000
ARGS = dict(unit="sglang-qwen.service", url="http://127.0.0.1:30000", timeout=600)
READY = dict(changed=False, ready=True, phase="settled", failure=None, cause=None, elapsed=41.3, msg="SGLang is ready",
             phases={"process": 0.01, "http": 30.2, "settled": 41.3}, timeline=[{"elapsed": 0.01, "phase": "process", "event": "up"}],
             invocation={"module_args": dict(ARGS)}, _ansible_parsed=True)
DIED = dict(changed=False, failed=True, ready=False, phase="http", failure="unit_failed", cause="cuda_oom", elapsed=12.0,
            msg="sglang-qwen.service failed while starting: CUDA out of memory", _ansible_parsed=True)


def running() -> dict:
    return dict(started=True, finished=False, ansible_job_id=JID, results_file=f"/root/.ansible_async/{JID}", _ansible_parsed=True)


def finished(result: dict) -> dict:
    """A finished job as async_status returns it: the module's record plus its two keys."""
    return dict(result, finished=True, ansible_job_id=JID)


def progress(elapsed: float, **fields) -> dict:
    """The progress file written ``elapsed`` s after the launch (the host's clock is EPOCH then)."""
    record = dict(time=EPOCH + elapsed, elapsed=elapsed, phase="http", stage="weights", stage_elapsed=elapsed - 10,
                  event="stage weights (loading the weights)", last_log_line="Load weight begin. avail mem=70.12 GB")
    record.update(fields)
    return record


class Harness:
    """The action plugin with a fake clock (sleep advances it) and a scripted host:
    ``job(t)`` is async_status's answer t s after the launch, ``file(t)`` the progress
    file's content (None: no such file)."""

    def __init__(self, args: dict, job=None, file=None, check_mode: bool = False, async_val: int = 0, no_log: bool = False,
                 launch: dict | None = None, connection: dict | None = None) -> None:
        task = SimpleNamespace(args=dict(args), check_mode=check_mode, async_val=async_val, action=action_mod.MODULE, no_log=no_log,
                               environment=[])
        conn = dict(_shell=ShellModule(), has_native_async=False, always_pipeline_modules=False, become=None)
        conn.update(connection or {})
        self.action = action_mod.ActionModule(task, SimpleNamespace(**conn), None, None, None)
        self.action._load_name = "wait_for_sglang"
        self.task, self.shell = task, conn["_shell"]
        self.job = job or (lambda t: finished(READY))
        self.file = file or (lambda t: None)
        self.launch_result = launch or dict(failed=False, started=True, finished=False, ansible_job_id=JID, changed=True)
        self.now = 1000.0
        self.launched_at: float | None = None
        self.launches: list[dict] = []
        self.plain: list[dict] = []
        self.polls: list[tuple[float, str]] = []
        self.commands: list[tuple[str, bool]] = []
        self.action._clock = lambda: self.now
        self.action._sleep = self.sleep
        self.action._execute_module = self.execute
        self.action._low_level_execute_command = self.command
        self.action._make_tmp_path = self.make_tmp
        self.action._remote_expand_user = lambda path, sudoable=True: path.replace("~", "/root", 1)
        self.action.get_shell_option = lambda option, default=None: default

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def since(self) -> float:
        return self.now - self.launched_at

    def make_tmp(self) -> str:
        self.shell.tmpdir = TMP
        return TMP

    def execute(self, module_name=None, module_args=None, task_vars=None, wrap_async=False):
        if module_name == action_mod.ASYNC_STATUS:
            assert module_args["_async_dir"] == "/root/.ansible_async" and module_args["jid"] == JID
            self.polls.append((self.since(), module_args["mode"]))
            if module_args["mode"] == "cleanup":
                return dict(ansible_job_id=JID, erased=f"/root/.ansible_async/{JID}")
            answer = self.job(self.since())
            if isinstance(answer, Exception):
                raise answer
            return dict(answer)
        assert module_name == action_mod.MODULE
        if not wrap_async and not self.task.async_val:
            self.plain.append(dict(module_args))
            return dict(READY)
        self.launches.append(dict(args=dict(module_args), async_val=self.task.async_val, wrap_async=wrap_async, tmpdir=self.shell.tmpdir))
        self.launched_at = self.now
        self.shell.tmpdir = None  # async_wrapper owns the directory now, as _execute_module says
        return dict(self.launch_result)

    def command(self, cmd, sudoable=True, in_data=None):
        self.commands.append((cmd, sudoable))
        if cmd.startswith("date +%s && cat "):
            content = self.file(self.since())
            clock = f"{EPOCH + int(self.since())}\n"
            if content is None:
                return dict(rc=1, stdout=clock, stderr=f"cat: {PROGRESS}: No such file or directory")
            return dict(rc=0, stdout=clock + (content if isinstance(content, str) else json.dumps(content)), stderr="")
        return dict(rc=0, stdout="", stderr="")

    def removed(self) -> list[str]:
        return [cmd for cmd, sudoable in self.commands if cmd.startswith("rm ")]

    def run(self, **task_vars) -> dict:
        return self.action.run(task_vars=dict(dict(inventory_hostname="ct129"), **task_vars))


@pytest.fixture
def shown(monkeypatch):
    """The lines the plugin displays, with the fake clock's time since the launch."""
    lines: list[str] = []
    monkeypatch.setattr(action_mod.display, "display", lambda msg, *args, **kwargs: lines.append(msg))
    return lines


def test_the_module_runs_as_an_async_job_and_its_result_comes_back_as_it_returned_it(shown):
    h = Harness(dict(ARGS, progress_interval=5), job=lambda t: running() if t < 21 else finished(READY), file=progress)
    result = h.run()
    assert result == READY
    (launch,) = h.launches
    assert launch["wrap_async"] is True and launch["async_val"] == 600 + action_mod.ASYNC_MARGIN and launch["tmpdir"] == TMP
    assert launch["args"] == dict(ARGS, progress_interval=5, progress_file=PROGRESS)
    assert h.task.async_val == 0 and h.plain == []
    # polled every 2 s until the job finished, then its record removed
    assert [t for t, mode in h.polls if mode == "status"] == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22]
    assert h.polls[-1] == (22, "cleanup")
    # the progress file read as the become user, one line every 5 s
    assert (f"date +%s && cat {PROGRESS}", True) in h.commands
    assert shown == [f"[ct129] wait_for_sglang: {t} s, phase http, stage weights {t - 10} s: Load weight begin. avail mem=70.12 GB"
                     for t in (6, 12, 18)]
    assert h.removed() == [f"rm -f -r {TMP} > /dev/null 2>&1"] and h.shell.tmpdir is None


def test_a_failed_gate_fails_the_task_with_the_modules_own_verdict(shown):
    h = Harness(dict(ARGS, progress_interval=1), job=lambda t: running() if t < 3 else finished(DIED), file=progress)
    result = h.run()
    assert result == DIED
    assert len(shown) == 2 and h.removed()


def test_the_default_interval_is_15_s_and_a_line_comes_only_when_the_file_was_read(shown):
    unreadable = {16: None, 18: "{not json", 20: "[1, 2]"}
    h = Harness(ARGS, job=lambda t: running() if t < 60 else finished(READY),
                file=lambda t: unreadable.get(t, progress(t, stage=None, last_log_line=None, event="http answered")))
    h.run()
    assert shown == [f"[ct129] wait_for_sglang: {t} s, phase http: http answered" for t in (22, 38, 54)]


def test_a_line_shows_the_time_since_the_file_was_written_too(shown):
    """The module rewrites the file every 5 s (or less often while a request waits): a
    line's times are the file's plus its age on the host's clock."""
    def written(t):
        at = t - t % 5
        return progress(at, stage_elapsed=at / 2) if t < 30 else progress(20, stage=None, time="garbage")

    h = Harness(dict(ARGS, progress_interval=3), job=lambda t: running() if t < 34 else finished(READY), file=written)
    h.run()
    expected = [f" {t} s, phase http, stage weights {(t - t % 5) / 2 + t % 5:.0f} s" for t in (4, 8, 12, 16, 20, 24, 28)]
    assert [line.split(":")[1] for line in shown] == expected + [" 20 s, phase http"]


def test_the_text_of_a_line_is_masked_and_left_out_for_a_no_log_task(shown):
    line = "server_args=ServerArgs(model_path='/srv/models/qwen', api_key='s3cret-key', admin_api_key='other', max_total_num_tokens=4096)"
    args = dict(ARGS, api_key="s3cret-key", progress_interval=1)
    Harness(args, job=lambda t: running() if t < 2 else finished(READY), file=lambda t: progress(45, last_log_line=line)).run()
    assert shown == ["[ct129] wait_for_sglang: 45 s, phase http, stage weights 35 s: server_args=ServerArgs(model_path='/srv/models/qwen', "
                     "api_key=********, admin_api_key=********, max_total_num_tokens=4096)"]
    shown.clear()
    Harness(args, no_log=True, job=lambda t: running() if t < 2 else finished(READY), file=lambda t: progress(45, last_log_line=line)).run()
    assert shown == ["[ct129] wait_for_sglang: 45 s, phase http, stage weights 35 s"]


def test_a_progress_file_given_by_the_task_is_the_one_read_and_it_stays(shown):
    h = Harness(dict(ARGS, progress_file="/var/lib/sglang/gate.json", progress_interval=1),
                job=lambda t: running() if t < 2 else finished(READY), file=progress)
    assert h.run() == READY
    assert h.launches[0]["args"]["progress_file"] == "/var/lib/sglang/gate.json"
    assert ("date +%s && cat /var/lib/sglang/gate.json", True) in h.commands and h.removed() == []


def test_a_job_killed_by_async_wrapper_at_its_limit_fails_saying_so(shown):
    killed = dict(msg="Timeout exceeded", failed=True, child_pid=5150, _ansible_parsed=True)
    h = Harness(dict(ARGS, timeout=30), job=lambda t: running() if t < 90 else finished(killed))
    result = h.run()
    assert result["failed"] and result["changed"] is False
    assert result["msg"] == (f"wait_for_sglang on ct129: the async job {JID} ran past its async limit of 90 s (timeout + 60 s) "
                             "and was killed on the host; the gate's verdict is unknown")
    assert h.removed()


def test_a_job_that_never_finishes_is_given_up_after_its_limit(shown):
    h = Harness(dict(ARGS, timeout=10.5), job=lambda t: running())
    result = h.run()
    assert result["failed"] and h.since() > 71 + action_mod.OVERRUN_GRACE and h.since() <= 71 + action_mod.OVERRUN_GRACE + 2
    assert result["msg"] == f"wait_for_sglang on ct129: the async job {JID} did not finish within its async limit of 71 s (timeout + 60 s)"
    assert h.launches[0]["async_val"] == 71 and h.removed()


def lost(t: float) -> dict:
    return dict(failed=True, msg="could not find job", ansible_job_id=JID, started=True, finished=True, _ansible_parsed=True)


def test_a_job_lost_while_it_ran_fails_with_a_clear_message(shown):
    h = Harness(ARGS, job=lambda t: running() if t < 7 else lost(t))
    result = h.run()
    assert result["failed"] and h.since() == 8
    assert result["msg"] == (f"wait_for_sglang on ct129: the async job {JID} was lost while it ran: async_status could not find it "
                             "in the async directory; the gate's verdict is unknown")
    assert all(mode == "status" for t, mode in h.polls) and h.removed()


def test_a_job_not_yet_written_right_after_the_launch_is_waited_for_then_lost(shown):
    assert Harness(ARGS, job=lambda t: lost(t) if t < 5 else finished(READY)).run() == READY
    result = Harness(ARGS, job=lost).run()
    assert result["msg"].startswith(f"wait_for_sglang on ct129: the async job {JID} was lost right after its start")


def test_a_record_that_cannot_be_parsed_fails_naming_it(shown):
    bad = dict(failed=True, msg="Could not parse job output: {trunc", started=True, finished=True, _ansible_parsed=True)
    result = Harness(ARGS, job=lambda t: running() if t < 3 else bad).run()
    assert result["failed"]
    assert result["msg"] == f"wait_for_sglang on ct129: the result of the async job {JID} could not be read: Could not parse job output: {{trunc"


def test_a_connection_that_bounces_during_a_poll_is_retried(shown):
    resets = []

    def job(t):
        if t in (4, 6):
            return AnsibleConnectionFailure("ssh: connect to host ct129 port 22: Connection refused")
        if t == 8:
            return dict(failed=True, msg="Module result deserialization failed", _ansible_parsed=False)
        return running() if t < 12 else finished(READY)

    h = Harness(ARGS, job=job, connection=dict(reset=lambda: resets.append(1)))
    assert h.run() == READY and len(resets) == 2


def test_a_connection_lost_for_good_fails_after_the_limit_naming_the_error(shown):
    h = Harness(dict(ARGS, timeout=5), job=lambda t: AnsibleConnectionFailure("Connection timed out"))
    result = h.run()
    assert result["failed"] and result["msg"].endswith("(timeout + 60 s); its status could not be read: Connection timed out")


def test_a_launch_that_fails_is_the_result_and_nothing_is_polled(shown):
    failure = dict(failed=True, msg="could not create directory: /root/.ansible_async - [Errno 13] Permission denied")
    h = Harness(ARGS, launch=failure)
    assert h.run() == failure and h.polls == [] and h.removed()
    h = Harness(ARGS, launch=dict(failed=False, started=True))
    assert h.run()["msg"].startswith("wait_for_sglang on ct129: the async job started without a job id")


@pytest.mark.parametrize("why, harness", [
    ("progress_interval 0", dict(args=dict(ARGS, progress_interval=0))),
    ("check mode", dict(args=ARGS, check_mode=True)),
    ("winrm, psrp", dict(args=ARGS, connection=dict(has_native_async=True, always_pipeline_modules=True))),
    ("a timeout the module refuses", dict(args=dict(ARGS, timeout="soon"))),
    ("a zero timeout", dict(args=dict(ARGS, timeout=0))),
])
def test_without_live_progress_the_module_is_one_plain_call(shown, why, harness):
    h = Harness(**harness)
    assert h.run() == READY, why
    assert h.plain == [harness["args"]] and h.launches == [] and h.polls == [] and shown == []


def test_become_to_an_unprivileged_user_is_a_plain_call(shown):
    h = Harness(ARGS)
    h.action._is_become_unprivileged = lambda: True
    assert h.run() == READY and len(h.plain) == 1 and h.launches == []


def test_a_task_that_is_itself_async_is_left_to_ansibles_own_async(shown):
    h = Harness(ARGS, async_val=1200)
    assert h.run() == h.launch_result
    assert h.launches[0]["args"] == ARGS and h.launches[0]["wrap_async"] is True and h.launches[0]["async_val"] == 1200
    assert h.polls == [] and h.task.async_val == 1200


@pytest.mark.parametrize("value", [-1, "often", float("nan")])
def test_a_bad_progress_interval_fails_before_anything_runs(shown, value):
    h = Harness(dict(ARGS, progress_interval=value))
    with pytest.raises(AnsibleActionFail, match="progress_interval must be 0 .no live progress. or a positive number of seconds"):
        h.run()
    assert h.launches == [] and h.plain == [] and h.commands == []


def test_the_async_limit_follows_the_modules_timeout():
    assert action_mod.async_limit({}) == 960
    assert action_mod.async_limit(dict(timeout="120.2")) == 181
    assert action_mod.async_limit(dict(timeout=-3)) is None and action_mod.async_limit(dict(timeout="inf")) is None
