# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller side of inferops.sglang.wait_for_sglang (documented with the module).

A model load can take many minutes, and a plain module call is one silent
task for all of them. So the module runs as an async job on the host (ansible's
async_wrapper, as for a task with ``async:``) that rewrites a progress file,
and this plugin polls the job and prints the gate's phase, SGLang's start-up
stage and the elapsed time every ``progress_interval`` seconds through
Display.display: a line in ansible-playbook's output, and a verbose event in
AWX's job output (ansible-runner turns what Display prints into events). The
task still ends with the module's own result, unchanged.

Nothing stays on the host when the controller dies mid-gate: the module has
its own deadline, the async job is killed by async_wrapper at ``timeout`` plus
a margin, and async_wrapper removes the job's temporary directory, which holds
the progress file, when the job ends.

With ``progress_interval: 0``, a task that is itself async, check mode, a
connection that runs modules its own way (winrm, psrp, PowerShell over SSH),
or become to an unprivileged user (the module could not write the progress
file into the connection user's temporary directory), the module is called as
any module is, without live progress.
"""

from __future__ import annotations

import json
import math
import shlex
import time

from ansible import constants as C
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.module_utils.common.validation import check_type_float
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.inferops.sglang.plugins.module_utils import _mask

display = Display()

MODULE = "inferops.sglang.wait_for_sglang"
ASYNC_STATUS = "ansible.legacy.async_status"
# The module's defaults (its argument_spec) of the two options read here.
DEFAULT_TIMEOUT = 900.0
DEFAULT_PROGRESS_INTERVAL = 15.0
# Seconds beyond the module's own deadline before async_wrapper kills the job: the
# module's start and its verdict (the journal read for the cause) after the deadline.
ASYNC_MARGIN = 60
# Seconds past the async limit after which a job still not finished is given up:
# async_wrapper checks its job every 5 s and writes the kill's record a second later.
OVERRUN_GRACE = 15.0
# Seconds between status polls: how late the verdict can reach the controller.
POLL_PERIOD = 2.0
# Seconds a job may be missing from the async directory right after its start
# (async_wrapper's fork writes the job file while the launch returns).
MISSING_GRACE = 10.0
PROGRESS_NAME = "wait_for_sglang.progress.json"
# Keys async_status adds to a finished job's record; the rest is the module's result.
ASYNC_STATUS_KEYS = ("finished", "ansible_job_id")
LINE_TEXT_MAX = 200


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def progress_interval(args: dict) -> float:
    """The seconds between progress lines; 0 is off. Checked here because a bad value
    must fail before anything runs on the host (the module ignores the option)."""
    raw = args.get("progress_interval")
    try:
        value = DEFAULT_PROGRESS_INTERVAL if raw is None else check_type_float(raw)
    except TypeError:
        value = -1.0
    if value < 0 or math.isnan(value):
        raise AnsibleActionFail(f"progress_interval must be 0 (no live progress) or a positive number of seconds, got {raw!r}")
    return value


def async_limit(args: dict) -> int | None:
    """async_wrapper's time limit (whole seconds) for the module's ``timeout``; None for a
    timeout the module will refuse, so that the module's own message says why."""
    timeout = DEFAULT_TIMEOUT if args.get("timeout") is None else _number(args.get("timeout"))
    if timeout is None or not timeout > 0 or math.isinf(timeout):
        return None
    return int(math.ceil(timeout)) + ASYNC_MARGIN


def _clip(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= LINE_TEXT_MAX else text[:LINE_TEXT_MAX - 3] + "..."


def progress_line(host: str, progress: dict, secrets: tuple[str, ...] = (), with_text: bool = True) -> str:
    """One line of where the gate is, e.g.
    ``[ct129] wait_for_sglang: 45 s, phase http, stage weights 32 s: Load weight begin. avail mem=...``;
    the text (the last log line, or else the last event) masked, and left out for a no_log task."""
    parts = []
    elapsed = _number(progress.get("elapsed"))
    if elapsed is not None:
        parts.append(f"{elapsed:.0f} s")
    if progress.get("phase"):
        parts.append(f"phase {progress['phase']}")
    if progress.get("stage"):
        stage_elapsed = _number(progress.get("stage_elapsed"))
        parts.append(f"stage {progress['stage']}" + (f" {stage_elapsed:.0f} s" if stage_elapsed is not None else ""))
    line = f"[{host}] wait_for_sglang: " + ", ".join(parts)
    text = progress.get("last_log_line") or progress.get("event")
    # a log line can hold a secret (SGLang logs its server_args, the API key among them)
    return line + (f": {_clip(_mask.mask(str(text), secrets))}" if text and with_text else "")


def up_to_date(progress: dict, now: float | None) -> dict:
    """The progress with its elapsed times moved on to the host's ``now``: the module rewrites
    the file at each event and every 5 s (not at all while one HTTP request waits), so its
    figures are that much behind; a line must not show a wait that seems to stand still."""
    written = _number(progress.get("time"))
    if now is None or written is None:
        return progress
    age = max(0.0, now - written)
    moved = dict(progress)
    for key in ("elapsed", "stage_elapsed"):
        value = _number(moved.get(key))
        if value is not None:
            moved[key] = value + age
    return moved


def _failed(msg: str) -> dict:
    return dict(failed=True, changed=False, msg=msg)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_async = True
    _supports_check_mode = True

    # Seams for the tests of the poll loop.
    _clock = staticmethod(time.monotonic)
    _sleep = staticmethod(time.sleep)

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        del tmp

        interval = progress_interval(self._task.args)
        limit = async_limit(self._task.args)
        reason = self._no_live_progress(interval, limit)
        if reason:
            display.vvv(f"wait_for_sglang: no live progress ({reason})")
            result.update(self._plain(task_vars))
            return result
        host = str(task_vars.get("inventory_hostname") or "this host")
        result.update(self._live(task_vars, interval, limit, host))
        return result

    def _no_live_progress(self, interval: float, limit: int | None) -> str | None:
        """Why this task runs the module as a plain call, or None for live progress."""
        if interval == 0:
            return "progress_interval is 0"
        if self._task.async_val:
            return "the task itself is async"
        if self._task.check_mode:
            return "check mode"
        if limit is None:
            return "the module refuses this timeout"
        if getattr(self._connection, "has_native_async", False) or getattr(self._connection, "always_pipeline_modules", False):
            return "the connection runs modules its own way"
        if self._is_become_unprivileged():
            return "become to an unprivileged user"
        return None

    def _plain(self, task_vars: dict) -> dict:
        """The module as any module is run (a task's own async as ansible's normal action does it)."""
        wrap_async = bool(self._task.async_val) and not self._connection.has_native_async
        return self._execute_module(module_name=MODULE, module_args=self._task.args, task_vars=task_vars, wrap_async=wrap_async)

    def _live(self, task_vars: dict, interval: float, limit: int, host: str) -> dict:
        """Launch the module as an async job writing a progress file, follow it, return its result."""
        own_file = not self._task.args.get("progress_file")
        tmpdir = self._connection._shell.tmpdir or self._make_tmp_path()
        path = self._task.args.get("progress_file") or self._connection._shell.join_path(tmpdir, PROGRESS_NAME)
        try:
            launched = self._launch(dict(self._task.args, progress_file=path), task_vars, limit)
            if launched.get("failed"):
                return launched
            jid = launched.get("ansible_job_id")
            if not jid:
                return _failed(f"wait_for_sglang on {host}: the async job started without a job id ({launched!r})")
            async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
            return self._follow(jid, async_dir, path, interval, limit, host, task_vars)
        finally:
            if own_file:
                self._remove_own_tmpdir(tmpdir)

    def _launch(self, module_args: dict, task_vars: dict, limit: int) -> dict:
        """Start the module under async_wrapper, killed after ``limit`` s; the task's own
        async_val is what _execute_module gives async_wrapper, so it is set only meanwhile
        (the task executor would poll the task itself if it stayed set)."""
        saved = self._task.async_val
        self._task.async_val = limit
        try:
            return self._execute_module(module_name=MODULE, module_args=module_args, task_vars=task_vars, wrap_async=True)
        finally:
            self._task.async_val = saved

    def _follow(self, jid: str, async_dir: str, path: str, interval: float, limit: int, host: str, task_vars: dict) -> dict:
        """Poll the job until it ends; print a progress line at most every ``interval`` s."""
        start = self._clock()
        next_line = start + interval
        secrets = (str(self._task.args.get("api_key") or ""),)
        seen = False
        while True:
            self._sleep(min(POLL_PERIOD, interval))
            status, error = self._status(jid, async_dir, "status", task_vars)
            now = self._clock()
            if status is not None and status.get("finished") and "started" in status:
                if status.get("msg") == "could not find job" and not seen and now - start < MISSING_GRACE:
                    continue
                return _failed(self._lost(jid, host, status, seen))
            if status is not None and status.get("finished"):
                self._status(jid, async_dir, "cleanup", task_vars)
                return self._verdict(status, jid, limit, host)
            seen = seen or status is not None
            if now - start > limit + OVERRUN_GRACE:
                return _failed(f"wait_for_sglang on {host}: the async job {jid} did not finish within its async limit of {limit} s "
                               f"(timeout + {ASYNC_MARGIN} s)" + (f"; its status could not be read: {error}" if error else ""))
            if status is not None and now >= next_line:
                progress = self._read_progress(path)
                if progress is not None:
                    display.display(progress_line(host, progress, secrets, with_text=not self._task.no_log))
                    next_line = now + interval

    def _status(self, jid: str, async_dir: str, mode: str, task_vars: dict) -> tuple[dict | None, str | None]:
        """async_status's answer, or None and why when it could not be read this time
        (a connection that bounced, an unparsable answer): the next poll tries again, as
        ansible's own async poll does."""
        args = dict(jid=jid, mode=mode, _async_dir=async_dir)
        try:
            status = self._execute_module(module_name=ASYNC_STATUS, module_args=args, task_vars=task_vars)
        except AnsibleError as exc:
            display.vvvv(f"wait_for_sglang: async_status {mode} of {jid} failed, retrying: {exc}")
            reset = getattr(self._connection, "reset", None)
            if callable(reset):
                try:
                    reset()
                except AnsibleError:
                    pass
            return None, str(exc)
        if not status.get("_ansible_parsed", True):
            return None, status.get("msg") or "async_status's answer could not be parsed"
        return status, None

    @staticmethod
    def _lost(jid: str, host: str, status: dict, seen: bool) -> str:
        """The message of a job whose record async_status cannot give."""
        if status.get("msg") == "could not find job":
            when = "while it ran" if seen else "right after its start"
            return (f"wait_for_sglang on {host}: the async job {jid} was lost {when}: async_status could not find it "
                    f"in {status.get('results_file') or 'the async directory'}; the gate's verdict is unknown")
        return f"wait_for_sglang on {host}: the result of the async job {jid} could not be read: {status.get('msg')}"

    @staticmethod
    def _verdict(status: dict, jid: str, limit: int, host: str) -> dict:
        """The module's result as it returned it, or the failure of a job async_wrapper killed."""
        result = {key: value for key, value in status.items() if key not in ASYNC_STATUS_KEYS}
        if "ready" not in result and result.get("msg") == "Timeout exceeded" and "child_pid" in result:
            return _failed(f"wait_for_sglang on {host}: the async job {jid} ran past its async limit of {limit} s "
                           f"(timeout + {ASYNC_MARGIN} s) and was killed on the host; the gate's verdict is unknown")
        return result

    def _read_progress(self, path: str) -> dict | None:
        """The progress file as of the host's clock now, or None when it is not there yet or
        is unreadable. A shell ``cat`` rather than the slurp module: one command on the open
        connection instead of a module shipped and started at every line; as the become
        user, since the module (run as that user) writes the file with mode 0600."""
        res = self._low_level_execute_command(f"date +%s && cat {shlex.quote(path)}", sudoable=True)
        if res.get("rc") != 0:
            return None
        clock, dummy, body = (res.get("stdout") or "").strip().partition("\n")
        try:
            progress = json.loads(body)
        except ValueError:
            return None
        return up_to_date(progress, _number(clock)) if isinstance(progress, dict) else None

    def _remove_own_tmpdir(self, tmpdir: str) -> None:
        """Remove the directory of the progress file now, whatever happened; async_wrapper
        also removes it when the job ends, which covers a controller that died. Not through
        _remove_tmp_path, which would forget the temporary directory of the status polls."""
        if C.DEFAULT_KEEP_REMOTE_FILES or "-tmp-" not in tmpdir:
            return
        res = self._low_level_execute_command(self._connection._shell.remove(tmpdir, recurse=True), sudoable=False)
        if res.get("rc", 0) != 0:
            display.warning(f"wait_for_sglang: could not remove {tmpdir}: {res.get('stderr') or res.get('rc')}")
        if self._connection._shell.tmpdir == tmpdir:
            self._connection._shell.tmpdir = None
