# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TEST DEVICE of molecule/deploy (faults.yml): SIGKILL this ansible-playbook at a named point.

It plays a controller that dies in the middle of a deploy (an AWX job pod
killed, an operator's laptop losing power): the ansible-playbook process and
every process it started (its forked workers and their connection processes)
get SIGKILL at once, so no task, handler, rescue or callback after the kill
point runs. What runs on the target host is left as a dead controller leaves
it (a module already running there goes on until it ends).

Never enable it outside the fault matrix. It does nothing unless
INFEROPS_FAULT_KILL_TASK is set:

  INFEROPS_FAULT_KILL_TASK   a Python regular expression searched in the task's
                             name, without the role prefix, as the banner shows
                             it ("Gate shadow-balanced"); the first task that
                             matches is the kill point
  INFEROPS_FAULT_KILL_AT     "after": when that task has completed (ok or
                             changed; a loop task: after its last item), before
                             the next task starts; "during": INFEROPS_FAULT_KILL_DELAY
                             seconds after the task starts (default "after")
  INFEROPS_FAULT_KILL_DELAY  seconds, for "during" (default 2)

It says on stderr where it kills ("inferops fault_kill: SIGKILL ..."), so the
test can tell the kill came at the named point. A "during" kill point whose
task ends before the delay, and an "after" one that is skipped or fails, are
missed: it says so and the run goes on (the test then sees no kill).

Enable it for one run with ANSIBLE_CALLBACK_PLUGINS=<this directory> and
ANSIBLE_CALLBACKS_ENABLED=inferops.sglang.deploy_summary,fault_kill.
Standard library only.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: fault_kill
type: aggregate
short_description: "TEST DEVICE: SIGKILL ansible-playbook at a named task (molecule/deploy fault matrix)"
description:
  - Kills its own ansible-playbook process and every process it started with SIGKILL, after a named task
    completes or a few seconds into it, as a dying controller would. Configured by environment variables only
    (see the module's docstring); does nothing when INFEROPS_FAULT_KILL_TASK is unset.
requirements:
  - enable in configuration
"""


def _descendants(root: int) -> list[int]:
    """Every live process below ``root``, read from /proc (children before the root is killed)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2:].split()
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "fault_kill"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        pattern = os.environ.get("INFEROPS_FAULT_KILL_TASK", "")
        self._pattern = re.compile(pattern) if pattern else None
        self._at = os.environ.get("INFEROPS_FAULT_KILL_AT", "after")
        if self._at not in ("after", "during"):
            raise ValueError(f"INFEROPS_FAULT_KILL_AT must be 'after' or 'during', got {self._at!r}")
        self._delay = float(os.environ.get("INFEROPS_FAULT_KILL_DELAY", "2"))
        self._armed: str | None = None  # the matching task's uuid, once it started
        self._timer: threading.Timer | None = None
        self._done = False

    @staticmethod
    def _name(task) -> str:
        return str(task.name or task.get_name())

    def _note(self, text: str) -> None:
        sys.stdout.flush()
        sys.stderr.write(f"inferops fault_kill: {text}\n")
        sys.stderr.flush()

    def _kill(self, where: str) -> None:
        me = os.getpid()
        others = _descendants(me)
        self._note(f"SIGKILL ansible-playbook (pid {me}) and the {len(others)} process(es) it started, {where}")
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os.kill(me, signal.SIGKILL)

    def v2_playbook_on_task_start(self, task, is_conditional):
        if self._pattern is None or self._done or self._armed:
            return
        name = self._name(task)
        if not self._pattern.search(name):
            return
        self._armed = task._uuid
        if self._at == "during":
            where = f"{self._delay:g} s into task '{name}'"
            self._timer = threading.Timer(self._delay, self._kill, args=(where,))
            self._timer.daemon = True
            self._timer.start()

    def _ended(self, result, completed: bool) -> None:
        if not self._armed or self._done or result._task._uuid != self._armed:
            return
        name = self._name(result._task)
        self._done = True
        if self._at == "after" and completed:
            self._kill(f"after task '{name}' completed")
        elif self._at == "during" and self._timer is not None:
            self._timer.cancel()
            self._note(f"missed: task '{name}' ended before {self._delay:g} s; not killed")
        else:
            self._note(f"missed: task '{name}' did not complete; not killed")

    def v2_runner_on_ok(self, result):
        self._ended(result, True)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._ended(result, False)

    def v2_runner_on_skipped(self, result):
        # A skipped task is no kill point: wait for the next task that matches
        if self._armed and not self._done and result._task._uuid == self._armed:
            if self._timer is not None:
                self._timer.cancel()
            self._armed, self._timer = None, None

    def v2_runner_on_unreachable(self, result):
        self._ended(result, False)
