"""plugin_utils/_async_job.py (AsyncModuleJob) on its own, for any module: a fake
action plugin (the ActionBase methods the job calls) over a scripted host and a
fake clock that the job's injected sleep advances. The job launched under
async_wrapper with its progress file, polled to its end, the caller's lines no
more often than the interval, the job missing right after its launch (within and
beyond the grace), the overrunning and the killed job, and the plain call where
live progress cannot be had. wait_for_sglang's use of it is tested in
tests/unit/plugins/action/test_action_wait_for_sglang.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from ansible.plugins.shell.sh import ShellModule
from ansible.utils.display import Display

from ansible_collections.inferops.sglang.plugins.plugin_utils import _async_job
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import AsyncModuleJob

MODULE = "inferops.sglang.sglang_switch"
JID = "j987654.777"
TMP = "/home/deploy/.ansible/tmp/ansible-tmp-1767000000.1-99-4321"
NAME = "switch.progress.json"
PROGRESS = f"{TMP}/{NAME}"
EPOCH = 1767000000
ARGS = dict(unit="sglang-qwen.service", variant="balanced")
RESULT = dict(changed=True, switched=True, msg="switched to balanced", _ansible_parsed=True)


def running() -> dict:
    return dict(started=True, finished=False, ansible_job_id=JID, results_file=f"/root/.ansible_async/{JID}", _ansible_parsed=True)


def finished(result: dict) -> dict:
    return dict(result, finished=True, ansible_job_id=JID)


def missing(t: float) -> dict:
    return dict(failed=True, msg="could not find job", ansible_job_id=JID, started=True, finished=True, _ansible_parsed=True)


def step(t: float) -> dict:
    """The progress file as the module wrote it at ``t`` s after the launch."""
    return dict(time=EPOCH + t, elapsed=t, step=f"step {int(t) // 10}")


class Host:
    """A fake action plugin on a scripted host: ``job(t)`` is async_status's answer t s
    after the launch, ``file(t)`` the progress file (None: not there). Its ``sleep``
    advances ``now``, the clock the job reads."""

    def __init__(self, job=None, file=None, check_mode=False, async_val=0, connection=None, unprivileged=False):
        self._task = SimpleNamespace(args=dict(ARGS), check_mode=check_mode, async_val=async_val, no_log=False)
        self._connection = SimpleNamespace(**dict(dict(_shell=ShellModule(), has_native_async=False, always_pipeline_modules=False),
                                                  **(connection or {})))
        self.shell = self._connection._shell
        self.job = job or (lambda t: finished(RESULT))
        self.file = file or (lambda t: None)
        self.unprivileged = unprivileged
        self.now = 500.0
        self.launched_at = None
        self.sleeps: list[float] = []
        self.launches: list[dict] = []
        self.plain: list[dict] = []
        self.polls: list[tuple[float, str]] = []
        self.reads: list[float] = []
        self.commands: list[str] = []

    # the injected clock and sleep
    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def since(self) -> float:
        return self.now - self.launched_at

    # the ActionBase methods the job calls
    def _is_become_unprivileged(self) -> bool:
        return self.unprivileged

    def _make_tmp_path(self) -> str:
        self.shell.tmpdir = TMP
        return TMP

    def _remote_expand_user(self, path, sudoable=True):
        return path.replace("~", "/root", 1)

    def get_shell_option(self, option, default=None):
        return default

    def _execute_module(self, module_name=None, module_args=None, task_vars=None, wrap_async=False):
        if module_name == _async_job.ASYNC_STATUS:
            assert module_args["jid"] == JID and module_args["_async_dir"] == "/root/.ansible_async"
            self.polls.append((self.since(), module_args["mode"]))
            if module_args["mode"] == "cleanup":
                return dict(ansible_job_id=JID, erased=f"/root/.ansible_async/{JID}")
            return dict(self.job(self.since()))
        assert module_name == MODULE
        if not self._task.async_val:
            self.plain.append(dict(module_args=dict(module_args), wrap_async=wrap_async))
            return dict(RESULT)
        self.launches.append(dict(args=dict(module_args), async_val=self._task.async_val, wrap_async=wrap_async))
        self.launched_at = self.now
        self.shell.tmpdir = None
        return dict(failed=False, started=True, finished=False, ansible_job_id=JID, changed=True)

    def _low_level_execute_command(self, cmd, sudoable=True, in_data=None):
        self.commands.append(cmd)
        if cmd.startswith("date +%s && cat "):
            self.reads.append(self.since())
            content = self.file(self.since())
            clock = f"{EPOCH + int(self.since())}\n"
            if content is None:
                return dict(rc=1, stdout=clock, stderr="No such file or directory")
            return dict(rc=0, stdout=clock + json.dumps(content), stderr="")
        return dict(rc=0, stdout="", stderr="")

    def run(self, limit=120, interval=10.0, line=None, **options) -> dict:
        line = line or (lambda progress: f"{progress['elapsed']:.0f} s, {progress['step']}")
        job = AsyncModuleJob(self, dict(inventory_hostname="ct129"), MODULE, self._task.args, limit, NAME, interval, line,
                             clock=self.clock, sleep=self.sleep, **options)
        return job.run()


@pytest.fixture
def shown(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(Display(), "display", lambda msg, *args, **kwargs: lines.append(msg))
    return lines


def test_a_job_that_finishes_after_some_polls_prints_the_callbacks_lines_at_the_interval(shown):
    host = Host(job=lambda t: running() if t < 31 else finished(RESULT), file=step)
    result = host.run(limit=120, interval=10, poll_period=3)
    assert result == RESULT  # the module's own result, without async_status's keys
    (launch,) = host.launches
    assert launch == dict(args=dict(ARGS, progress_file=PROGRESS), async_val=120, wrap_async=True)
    assert host._task.async_val == 0 and host.plain == []
    assert host.sleeps == [3] * 11 and [t for t, mode in host.polls if mode == "status"] == [3 * n for n in range(1, 12)]
    assert host.polls[-1] == (33, "cleanup")
    # a line at the first poll 10 s or more after the previous one, never more often; the
    # progress file read only when a line is due
    assert host.reads == [12, 24]
    assert shown == ["12 s, step 1", "24 s, step 2"]
    assert host.commands[-1] == f"rm -f -r {TMP} > /dev/null 2>&1" and host.shell.tmpdir is None


def test_the_first_polls_come_soon_after_the_launch_and_back_off_to_the_poll_period(shown):
    host = Host(job=lambda t: running() if t < 0.7 else finished(RESULT))
    assert host.run(first_poll=0.25, poll_period=2) == RESULT
    # a job that ends at once is seen within a second, not at the first 2 s poll
    assert host.sleeps == [0.25, 0.5] and host.since() == 0.75
    host = Host(job=lambda t: running() if t < 9 else finished(RESULT))
    host.run(first_poll=0.25, poll_period=2)
    assert host.sleeps == [0.25, 0.5, 1, 2, 2, 2, 2]
    # without first_poll, every wait is the poll period
    host = Host(job=lambda t: running() if t < 0.7 else finished(RESULT))
    host.run(poll_period=2)
    assert host.sleeps == [2]


def test_an_interval_shorter_than_the_poll_period_polls_at_the_interval(shown):
    host = Host(job=lambda t: running() if t < 3 else finished(RESULT), file=step)
    host.run(interval=1, poll_period=2)
    assert host.sleeps == [1, 1, 1] and shown == ["1 s, step 0", "2 s, step 0"]


def test_the_clock_keys_of_the_file_move_on_to_the_hosts_clock_and_a_none_line_prints_nothing(shown):
    written = dict(time=EPOCH + 5, elapsed=5.0, stage_elapsed=1.0, step="pull")
    seen: list[dict] = []

    def line(progress):
        seen.append(progress)
        return None

    host = Host(job=lambda t: running() if t < 25 else finished(RESULT), file=lambda t: written)
    host.run(interval=10, line=line, elapsed_keys=("elapsed", "stage_elapsed"))
    assert shown == []
    assert [(p["elapsed"], p["stage_elapsed"]) for p in seen] == [(10.0, 6.0), (20.0, 16.0)]


def test_a_progress_file_not_there_or_unreadable_gives_no_line_until_it_is(shown):
    host = Host(job=lambda t: running() if t < 15 else finished(RESULT), file=lambda t: step(t) if t >= 12 else None)
    host.run(interval=5, poll_period=2)
    assert host.reads == [6, 8, 10, 12] and shown == ["12 s, step 1"]


def test_a_job_missing_right_after_the_launch_is_waited_for_within_the_grace(shown):
    host = Host(job=lambda t: missing(t) if t < 7 else running() if t < 12 else finished(RESULT))
    assert host.run(poll_period=2) == RESULT
    assert [t for t, mode in host.polls] == [2, 4, 6, 8, 10, 12, 12]


def test_a_job_missing_beyond_the_grace_fails_with_a_clear_message(shown):
    host = Host(job=missing)
    result = host.run(poll_period=2, missing_grace=5)
    assert result == dict(failed=True, changed=False, msg=(
        f"sglang_switch on ct129: the async job {JID} was lost right after its start: async_status could not find it "
        "in the async directory; its result is unknown"))
    assert host.since() == 6 and all(mode == "status" for t, mode in host.polls)
    assert host.commands[-1].startswith(f"rm -f -r {TMP}")


def test_a_job_that_goes_missing_while_it_ran_fails_at_once_naming_the_outcome(shown):
    host = Host(job=lambda t: running() if t < 4 else missing(t))
    result = host.run(poll_period=2, label="the switch", outcome="the switch's outcome")
    assert host.since() == 4
    assert result["msg"] == (f"the switch on ct129: the async job {JID} was lost while it ran: async_status could not find it "
                             "in the async directory; the switch's outcome is unknown")


def test_a_job_overrunning_its_limit_is_reported_failed(shown):
    host = Host(job=lambda t: running())
    result = host.run(limit=30, poll_period=2, overrun_grace=5, limit_note="timeout + 10 s")
    assert result["failed"] and 35 < host.since() <= 37
    assert result["msg"] == f"sglang_switch on ct129: the async job {JID} did not finish within its async limit of 30 s (timeout + 10 s)"
    assert host.launches[0]["async_val"] == 30


def test_a_job_killed_by_async_wrapper_is_reported_failed_unless_the_result_is_the_modules_own(shown):
    killed = dict(msg="Timeout exceeded", failed=True, child_pid=4242, _ansible_parsed=True)
    result = Host(job=lambda t: running() if t < 30 else finished(killed)).run(limit=30)
    assert result["failed"] and result["changed"] is False
    assert result["msg"] == (f"sglang_switch on ct129: the async job {JID} ran past its async limit of 30 s "
                             "and was killed on the host; its result is unknown")
    own = dict(killed, switched=False)
    assert Host(job=lambda t: finished(own)).run(own_key="switched") == own


@pytest.mark.parametrize("why, host, options", [
    ("check mode", dict(check_mode=True), {}),
    ("interval 0", {}, dict(interval=0)),
    ("no limit", {}, dict(limit=None)),
    ("winrm, psrp", dict(connection=dict(has_native_async=True, always_pipeline_modules=True)), {}),
    ("become to an unprivileged user", dict(unprivileged=True), {}),
])
def test_without_live_progress_the_module_is_called_directly(shown, why, host, options):
    h = Host(**host)
    assert h.run(**options) == RESULT, why
    assert h.plain == [dict(module_args=ARGS, wrap_async=False)]
    assert h.launches == [] and h.polls == [] and h.commands == [] and h.sleeps == [] and shown == []


def test_a_task_that_is_itself_async_is_left_to_ansibles_own_async(shown):
    h = Host(async_val=600)
    launched = h.run()
    assert launched["ansible_job_id"] == JID and h.polls == [] and h._task.async_val == 600
    assert h.launches == [dict(args=ARGS, async_val=600, wrap_async=True)]


def test_a_progress_file_the_task_gives_is_read_and_left_in_place(shown):
    h = Host(job=lambda t: running() if t < 3 else finished(RESULT), file=step)
    h._task.args["progress_file"] = "/var/lib/inferops/switch.json"
    assert h.run(interval=1) == RESULT
    assert h.launches[0]["args"]["progress_file"] == "/var/lib/inferops/switch.json"
    assert "date +%s && cat /var/lib/inferops/switch.json" in h.commands
    assert not any(cmd.startswith("rm ") for cmd in h.commands)
