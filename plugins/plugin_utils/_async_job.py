# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A module run as an async job on the host, with live progress lines on the controller.

For the collection's action plugins whose module runs for minutes (the readiness
gate ``wait_for_sglang``, and the service switch run as one job on the host):
a plain module call is one silent task for all that time, and a controller that
dies mid-call leaves the host's work half done. So ``AsyncModuleJob`` runs the
module under ansible's async_wrapper (as a task with ``async:`` does), killed
after a time limit; the module rewrites a progress file (a JSON object); the
job is polled with async_status every ``poll_period`` seconds, and every
``interval`` seconds the progress file is read and the caller's ``line``
callback turns it into a line printed through Display.display (a line in
ansible-playbook's output, a verbose event in AWX's job output). The task ends
with the module's own result, as the module returned it. If the controller
dies, the job carries on on the host to its end (or to async_wrapper's kill at
the limit), and async_wrapper removes the job's temporary directory, which
holds the progress file, when it ends.

Handled here: a job missing from the async directory right after its launch
(async_wrapper's fork writes its job file while the launch returns), for up to
``missing_grace`` seconds; a job lost later, or whose record cannot be read; a
job killed by async_wrapper at its limit, and one that has not finished
``overrun_grace`` seconds past its limit; async_status polls that fail (a
connection that bounced is reset and retried); the removal of the job's record
and of the progress file's own temporary directory.

The module is called as any module is, without live progress, for an
``interval`` of 0, no time limit, a task that is itself async (ansible's own
async then), check mode, a connection that runs modules its own way (winrm,
psrp, PowerShell over SSH) and become to an unprivileged user (the module could
not write the progress file into the connection user's temporary directory).

What a line says (and what it masks, or leaves out for a no_log task) and the
module's time limit are the caller's; ``run_job`` is an action plugin's whole
run (the ``progress_interval`` option checked, a line's host, secrets and
no_log, the job), ``clip`` folds and cuts a line's text. The progress file's
convention: ``time`` is the host's epoch second it was written at, and the keys
in ``elapsed_keys`` are seconds that move with the clock; they are moved on to
the host's clock when the file is read, so that a line never shows a wait that
seems to stand still. The module receives the file's path in its
``progress_option`` argument (where the task gave one, that file is read and
left in place).

``clock`` and ``sleep`` (time.monotonic and time.sleep) are parameters so that
tests drive the poll loop without waiting.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from contextlib import contextmanager

from ansible import constants as C
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.utils.display import Display

ASYNC_STATUS = "ansible.legacy.async_status"
# Seconds between progress lines when the task gives no progress_interval; a line's text at most
DEFAULT_PROGRESS_INTERVAL = 15.0
LINE_TEXT_MAX = 200
# Seconds past the async limit after which a job still not finished is given up:
# async_wrapper checks its job every 5 s and writes the kill's record a second later.
OVERRUN_GRACE = 15.0
# Seconds between status polls: how late the result can reach the controller. With
# first_poll, the first poll comes that many seconds after the launch and each wait doubles
# up to the poll period: a job that often ends at once (sglang_switch on a host with
# nothing to change) is not waited for a whole period.
POLL_PERIOD = 2.0
# Seconds a job may be missing from the async directory right after its start
# (async_wrapper's fork writes the job file while the launch returns).
MISSING_GRACE = 10.0
# Keys async_status adds to a finished job's record; the rest is the module's result.
ASYNC_STATUS_KEYS = ("finished", "ansible_job_id")
# What async_wrapper writes as the record of a job it killed at its limit.
KILLED_MSG = "Timeout exceeded"


def number(value) -> float | None:
    """``value`` as a float, or None."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def progress_interval(args: dict) -> float:
    """The task's ``progress_interval``: seconds between progress lines, 0 for none. Checked
    on the controller because a bad value must fail before anything runs on the host (the
    modules ignore the option)."""
    raw = args.get("progress_interval")
    value = DEFAULT_PROGRESS_INTERVAL if raw is None else number(raw)
    if value is None or value < 0 or math.isnan(value):
        raise AnsibleActionFail(f"progress_interval must be 0 (no live progress) or a positive number of seconds, got {raw!r}")
    return value


def clip(text: str, limit: int = LINE_TEXT_MAX) -> str:
    """``text`` on one line, cut to ``limit`` characters with "..." where it was longer."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def run_job(action, task_vars: dict, module_name: str, limit: int | None, progress_name: str, progress_line,
            module_args: dict | None = None, **options) -> dict:
    """An action plugin's run of ``module_name`` as an AsyncModuleJob, with ``module_args`` (the
    task's arguments by default): ``progress_line(host, progress, secrets, with_text=...)`` gives
    a line, with the api_key argument as the secret to mask and no text for a no_log task;
    ``options`` go to AsyncModuleJob. The action's ``_clock`` and ``_sleep`` are the job's.
    Returns the module's result."""
    task_vars = task_vars or {}
    args = action._task.args if module_args is None else module_args  # pylint: disable=protected-access
    interval = progress_interval(args)
    host = str(task_vars.get("inventory_hostname") or "this host")
    secrets = (str(args.get("api_key") or ""),)
    with_text = not action._task.no_log  # pylint: disable=protected-access

    def line(progress: dict):
        return progress_line(host, progress, secrets, with_text=with_text)

    job = AsyncModuleJob(action, task_vars, module_name, args, limit, progress_name, interval, line,
                         clock=action._clock, sleep=action._sleep, **options)  # pylint: disable=protected-access
    return job.run()


def up_to_date(progress: dict, now: float | None, keys=("elapsed",)) -> dict:
    """The progress with its ``keys`` (seconds) moved on from when it was written (its
    ``time``) to the host's ``now``: a module rewrites its file at its own pace, so its
    figures are that much behind."""
    written = number(progress.get("time"))
    if now is None or written is None:
        return progress
    age = max(0.0, now - written)
    moved = dict(progress)
    for key in keys:
        value = number(moved.get(key))
        if value is not None:
            moved[key] = value + age
    return moved


@contextmanager
def task_setting(task, name: str, value):
    """The task's attribute ``name`` set to ``value`` while the block runs (the module calls made
    meanwhile read it: async_val, check_mode, no_log), then put back whatever happened."""
    saved = getattr(task, name)
    setattr(task, name, value)
    try:
        yield
    finally:
        setattr(task, name, saved)


def failed(msg: str) -> dict:
    return dict(failed=True, changed=False, msg=msg)


class AsyncModuleJob:
    """One run of ``module_name`` with ``module_args`` for the action plugin ``action``
    (its ActionBase instance): ``run()`` returns the module's result.

    ``limit``: async_wrapper's time limit in whole seconds (None: a plain call, saying
    ``no_limit_reason``). ``progress_name``: the progress file's name in the task's
    temporary directory. ``interval``: seconds between progress lines (0: a plain call).
    ``line(progress)``: the line for a progress dict, or None for no line this time.
    The messages name the job as ``label`` on the host (the module's short name by
    default), the limit with ``limit_note`` (e.g. ``timeout + 60 s``) and what a lost
    job leaves unknown as ``outcome``. ``own_key``: a key every result of the module
    has, which tells its result from async_wrapper's kill record."""

    def __init__(self, action, task_vars: dict, module_name: str, module_args: dict, limit: int | None, progress_name: str,
                 interval: float, line, *, poll_period: float = POLL_PERIOD, first_poll: float | None = None, progress_option: str = "progress_file",
                 elapsed_keys=("elapsed",), label: str | None = None, limit_note: str | None = None, outcome: str = "its result",
                 own_key: str | None = None, no_limit_reason: str = "no time limit for the job",
                 missing_grace: float = MISSING_GRACE, overrun_grace: float = OVERRUN_GRACE, clock=time.monotonic, sleep=time.sleep) -> None:
        self.action = action
        self.task_vars = task_vars or {}
        self.module_name = module_name
        self.module_args = dict(module_args)
        self.limit = limit
        self.progress_name = progress_name
        self.interval = interval
        self.line = line
        self.poll_period = poll_period
        self.first_poll = poll_period if first_poll is None else first_poll
        self.progress_option = progress_option
        self.elapsed_keys = tuple(elapsed_keys)
        self.label = label or module_name.rsplit(".", 1)[-1]
        self.limit_note = limit_note
        self.outcome = outcome
        self.own_key = own_key
        self.no_limit_reason = no_limit_reason
        self.missing_grace = missing_grace
        self.overrun_grace = overrun_grace
        self.clock = clock
        self.sleep = sleep
        self.host = str(self.task_vars.get("inventory_hostname") or "this host")
        self.display = Display()

    # -- the two ways to run it

    def run(self) -> dict:
        """The module's result: from an async job followed with progress lines, or from a
        plain call where live progress cannot be had."""
        reason = self.no_live_progress()
        if reason:
            self.display.vvv(f"{self.label}: no live progress ({reason})")
            return self.plain()
        return self.live()

    def no_live_progress(self) -> str | None:
        """Why the module runs as a plain call, or None for live progress."""
        task, connection = self.action._task, self.action._connection
        if self.interval == 0:
            return "progress_interval is 0"
        if task.async_val:
            return "the task itself is async"
        if task.check_mode:
            return "check mode"
        if self.limit is None:
            return self.no_limit_reason
        if getattr(connection, "has_native_async", False) or getattr(connection, "always_pipeline_modules", False):
            return "the connection runs modules its own way"
        if self.action._is_become_unprivileged():
            return "become to an unprivileged user"
        return None

    def plain(self) -> dict:
        """The module as any module is run (a task's own async as ansible's normal action does it)."""
        wrap_async = bool(self.action._task.async_val) and not self.action._connection.has_native_async
        return self.action._execute_module(module_name=self.module_name, module_args=self.module_args, task_vars=self.task_vars,
                                           wrap_async=wrap_async)

    def live(self) -> dict:
        """Launch the module as an async job writing a progress file, follow it, return its result."""
        shell = self.action._connection._shell
        given = self.module_args.get(self.progress_option)
        tmpdir = shell.tmpdir or self.action._make_tmp_path()
        path = given or shell.join_path(tmpdir, self.progress_name)
        try:
            launched = self.launch(dict(self.module_args, **{self.progress_option: path}))
            if launched.get("failed"):
                return launched
            jid = launched.get("ansible_job_id")
            if not jid:
                return failed(f"{self.label} on {self.host}: the async job started without a job id ({launched!r})")
            async_dir = self.action._remote_expand_user(self.action.get_shell_option("async_dir", default="~/.ansible_async"))
            return self.follow(jid, async_dir, path)
        finally:
            if not given:
                self.remove_own_tmpdir(tmpdir)

    # -- the job

    def launch(self, module_args: dict) -> dict:
        """Start the module under async_wrapper, killed after ``limit`` s; the task's own
        async_val is what _execute_module gives async_wrapper, so it is set only meanwhile
        (the task executor would poll the task itself if it stayed set)."""
        with task_setting(self.action._task, "async_val", self.limit):
            return self.action._execute_module(module_name=self.module_name, module_args=module_args, task_vars=self.task_vars, wrap_async=True)

    def follow(self, jid: str, async_dir: str, path: str) -> dict:
        """Poll the job until it ends; print a progress line at most every ``interval`` s."""
        start = self.clock()
        next_line = start + self.interval
        seen = False
        wait = self.first_poll
        while True:
            self.sleep(min(wait, self.poll_period, self.interval))
            wait *= 2
            status, error = self.status(jid, async_dir, "status")
            now = self.clock()
            if status is not None and status.get("finished") and "started" in status:
                if status.get("msg") == "could not find job" and not seen and now - start < self.missing_grace:
                    continue
                return failed(self.lost(jid, status, seen))
            if status is not None and status.get("finished"):
                self.status(jid, async_dir, "cleanup")
                return self.verdict(status, jid)
            seen = seen or status is not None
            if now - start > self.limit + self.overrun_grace:
                return failed(f"{self.label} on {self.host}: the async job {jid} did not finish within its async limit of {self.limit} s"
                              + self.note() + (f"; its status could not be read: {error}" if error else ""))
            if status is not None and now >= next_line:
                progress = self.read_progress(path)
                if progress is not None:
                    text = self.line(progress)
                    if text is not None:
                        self.display.display(text)
                    next_line = now + self.interval

    def status(self, jid: str, async_dir: str, mode: str) -> tuple[dict | None, str | None]:
        """async_status's answer, or None and why when it could not be read this time
        (a connection that bounced, an unparsable answer): the next poll tries again, as
        ansible's own async poll does."""
        args = dict(jid=jid, mode=mode, _async_dir=async_dir)
        try:
            status = self.action._execute_module(module_name=ASYNC_STATUS, module_args=args, task_vars=self.task_vars)
        except AnsibleError as exc:
            self.display.vvvv(f"{self.label}: async_status {mode} of {jid} failed, retrying: {exc}")
            reset = getattr(self.action._connection, "reset", None)
            if callable(reset):
                try:
                    reset()
                except AnsibleError:
                    pass
            return None, str(exc)
        if not status.get("_ansible_parsed", True):
            return None, status.get("msg") or "async_status's answer could not be parsed"
        return status, None

    def note(self) -> str:
        return f" ({self.limit_note})" if self.limit_note else ""

    def lost(self, jid: str, status: dict, seen: bool) -> str:
        """The message of a job whose record async_status cannot give."""
        if status.get("msg") == "could not find job":
            when = "while it ran" if seen else "right after its start"
            return (f"{self.label} on {self.host}: the async job {jid} was lost {when}: async_status could not find it "
                    f"in {status.get('results_file') or 'the async directory'}; {self.outcome} is unknown")
        return f"{self.label} on {self.host}: the result of the async job {jid} could not be read: {status.get('msg')}"

    def verdict(self, status: dict, jid: str) -> dict:
        """The module's result as it returned it, or the failure of a job async_wrapper killed."""
        result = {key: value for key, value in status.items() if key not in ASYNC_STATUS_KEYS}
        killed = result.get("msg") == KILLED_MSG and "child_pid" in result
        if killed and (self.own_key is None or self.own_key not in result):
            return failed(f"{self.label} on {self.host}: the async job {jid} ran past its async limit of {self.limit} s{self.note()} "
                          f"and was killed on the host; {self.outcome} is unknown")
        return result

    # -- the progress file

    def read_progress(self, path: str) -> dict | None:
        """The progress file as of the host's clock now, or None when it is not there yet or
        is unreadable. A shell ``cat`` rather than the slurp module: one command on the open
        connection instead of a module shipped and started at every line; as the become
        user, since the module (run as that user) writes the file with mode 0600."""
        res = self.action._low_level_execute_command(f"date +%s && cat {shlex.quote(path)}", sudoable=True)
        if res.get("rc") != 0:
            return None
        clock, dummy, body = (res.get("stdout") or "").strip().partition("\n")
        try:
            progress = json.loads(body)
        except ValueError:
            return None
        return up_to_date(progress, number(clock), self.elapsed_keys) if isinstance(progress, dict) else None

    def remove_own_tmpdir(self, tmpdir: str) -> None:
        """Remove the directory of the progress file now, whatever happened; async_wrapper
        also removes it when the job ends, which covers a controller that died. Not through
        _remove_tmp_path, which would forget the temporary directory of the status polls."""
        shell = self.action._connection._shell
        if C.DEFAULT_KEEP_REMOTE_FILES or "-tmp-" not in tmpdir:
            return
        res = self.action._low_level_execute_command(shell.remove(tmpdir, recurse=True), sudoable=False)
        if res.get("rc", 0) != 0:
            self.display.warning(f"{self.label}: could not remove {tmpdir}: {res.get('stderr') or res.get('rc')}")
        if shell.tmpdir == tmpdir:
            shell.tmpdir = None
