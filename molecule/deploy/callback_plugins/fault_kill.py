# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TEST DEVICE of molecule/deploy (faults.yml): kill the controller, or the switch's job on the
host, when the switch on the host reaches a named state.

The switch runs as a job on the host (sglang_switch) whose marker, switch.json,
names the state entered at every transition from the pre-gate on
(plugins/module_utils/_switch.py). A thread of this callback reads the marker
every 0.2 s from the playbook's start, and when the switch has entered the named
state or one after it (in _switch.State's order), it kills:

- ``controller``: this ansible-playbook process and every process it started
  (SIGKILL at once: no task, handler, rescue or callback after that point runs),
  as an AWX pod evicted or a laptop closed; the job on the host goes on;
- ``job``: the switch's job on the host (SIGKILL, through INFEROPS_FAULT_KILL_JOB),
  as a host reboot or an OOM kill would end it; the controller goes on and sees
  the job lost. The run sets INFEROPS_FAULT_HOLD_AT to the same state (the
  sglang_switch action plugin hands it to the module as hold_at): the job stops
  moving once it has entered the state and written its marker, so the kill lands
  there and nowhere else (a state that lasts milliseconds, such as install,
  cannot slip between two reads).

Never enable it outside the fault matrix. It does nothing unless
INFEROPS_FAULT_KILL_STATE is set:

  INFEROPS_FAULT_KILL_STATE   the state's name (_switch.State: stop, install, gate, restore_gate, ...)
  INFEROPS_FAULT_KILL_WHO     "controller" (default) or "job"
  INFEROPS_FAULT_KILL_MARKER  a JSON argv that prints the host's switch.json (podman exec HOST cat PATH)
  INFEROPS_FAULT_KILL_JOB     a JSON argv that kills the job on the host (for "job")

It says on stderr where it kills ("inferops fault_kill: SIGKILL ..."), so the
test can tell the kill came at the named state; a switch that ended without
reaching it is missed and the test sees no kill.

Enable it for one run with ANSIBLE_CALLBACK_PLUGINS=<this directory> and
ANSIBLE_CALLBACKS_ENABLED=inferops.sglang.deploy_summary,fault_kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from ansible.plugins.callback import CallbackBase

from ansible_collections.inferops.sglang.plugins.module_utils._switch import State

DOCUMENTATION = r"""
name: fault_kill
type: aggregate
short_description: "TEST DEVICE: SIGKILL ansible-playbook or the switch's host job at a named state (molecule/deploy fault matrix)"
description:
  - Kills its own ansible-playbook process and every process it started, or the switch's job on the host, when the
    host's switch marker names a state at or after the named one. Configured by environment variables only (see the
    module's docstring); does nothing when INFEROPS_FAULT_KILL_STATE is unset.
requirements:
  - enable in configuration
"""

ORDER = [state.value for state in State]
POLL = 0.2


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
        self._state = os.environ.get("INFEROPS_FAULT_KILL_STATE", "")
        if self._state and self._state not in ORDER:
            raise ValueError(f"INFEROPS_FAULT_KILL_STATE must be one of {', '.join(ORDER)}, got {self._state!r}")
        self._who = os.environ.get("INFEROPS_FAULT_KILL_WHO", "controller")
        if self._who not in ("controller", "job"):
            raise ValueError(f"INFEROPS_FAULT_KILL_WHO must be 'controller' or 'job', got {self._who!r}")
        self._marker = json.loads(os.environ.get("INFEROPS_FAULT_KILL_MARKER", "[]"))
        self._job = json.loads(os.environ.get("INFEROPS_FAULT_KILL_JOB", "[]"))
        self._thread: threading.Thread | None = None

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

    def _reached(self) -> str | None:
        done = subprocess.run(self._marker, capture_output=True, text=True, check=False)
        try:
            state = json.loads(done.stdout).get("state") if done.returncode == 0 else None
        except (ValueError, AttributeError):
            return None
        if state in ORDER and ORDER.index(state) >= ORDER.index(self._state):
            return state
        return None

    def _watch(self) -> None:
        while True:
            state = self._reached()
            if state is not None:
                where = f"the switch on the host in state {state} (asked: {self._state})"
                if self._who == "controller":
                    self._kill(where)
                done = subprocess.run(self._job, capture_output=True, text=True, check=False)
                self._note(f"SIGKILL the switch's job on the host, {where}: exit {done.returncode}")
                return
            time.sleep(POLL)

    def v2_playbook_on_start(self, playbook):
        if self._state and self._thread is None:
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()
