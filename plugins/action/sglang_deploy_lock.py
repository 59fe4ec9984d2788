# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller side of inferops.sglang.sglang_deploy_lock (documented with the module).

It says who deploys (this controller's user, host name and ansible-playbook
process, the AWX job), gives the run its id (one per play and host), and for
state=acquired calls the module on the host until it has the lock or the
timeout has passed, then fails naming the holder. Between polls, a holder
that ran on this controller and whose ansible-playbook process is gone is
taken over (the module re-checks that the lock still holds that run).
"""

from __future__ import annotations

import getpass
import os
import socket
import time
import uuid

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_lock as lock

display = Display()

MODULE = "inferops.sglang.sglang_deploy_lock"
# uuid5 namespace of the run ids (fixed, so one play's tasks on a host derive the same id).
RUN_ID_NAMESPACE = uuid.UUID("6f1d7c52-3b8e-4a8e-9c1f-2d5e8b7a4c10")


def controller_pid() -> int:
    """The ansible-playbook process: a task runs in a worker process forked from it
    (ansible.executor.process.worker.WorkerProcess, fork start method), so it is the
    worker's parent. Outside a worker (the action called in-process) it is this process."""
    try:
        from ansible.executor.process import worker
    except ImportError:  # pragma: no cover - ansible-core always has it
        return os.getpid()
    if getattr(worker, "current_worker", None) is not None:
        return os.getppid()
    return os.getpid()


def controller_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def awx_job_id(task_vars: dict) -> str | None:
    for name in ("awx_job_id", "tower_job_id"):
        value = task_vars.get(name)
        if value not in (None, ""):
            return str(value)
    return None


def play_run_id(task, inventory_hostname: str, host: str, pid: int) -> str:
    """One id per play and host of this ansible-playbook run. Each task runs in a new
    forked worker, so an id kept in memory would not reach the next task: it is
    derived from what they share (the play's unique id, the ansible-playbook
    process, the controller and the inventory host)."""
    play = task.get_play() if hasattr(task, "get_play") else None
    play_id = getattr(play, "_uuid", None)
    if not play_id:
        return uuid.uuid4().hex
    return uuid.uuid5(RUN_ID_NAMESPACE, f"{host}/{pid}/{play_id}/{inventory_hostname}").hex


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    # Seams for the tests of the wait loop.
    _clock = staticmethod(time.monotonic)
    _sleep = staticmethod(time.sleep)
    _alive = staticmethod(lock.pid_alive)

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        del tmp

        dummy, args = self.validate_argument_spec(argument_spec=lock.ARGUMENT_SPEC)
        if args["timeout"] < 0:
            raise AnsibleActionFail(f"timeout must be 0 (try once) or more seconds, got {args['timeout']}")
        if args["poll"] <= 0:
            raise AnsibleActionFail(f"poll must be a positive number of seconds, got {args['poll']}")
        if args["lease"] <= 0:
            raise AnsibleActionFail(f"lease must be a positive number of seconds, got {args['lease']}")

        host = socket.gethostname()
        pid = controller_pid()
        inventory_hostname = str(task_vars.get("inventory_hostname") or "this host")
        run_id = args["run_id"] or play_run_id(self._task, inventory_hostname, host, pid)
        holder = dict(args["holder"] or {})
        holder.update(controller_user=controller_user(), controller_host=host, controller_pid=pid)
        for key in ("service", "variant"):
            if args[key] is not None:
                holder[key] = args[key]
        if not holder.get("service") and args["state"] == "acquired":
            holder["service"] = lock.default_service(args["path"])
        job = awx_job_id(task_vars)
        if job is not None or "awx_job_id" not in holder:
            holder["awx_job_id"] = job
        module_args = dict(args, run_id=run_id, holder={key: holder.get(key) for key in lock.HOLDER_FIELDS})

        if args["state"] != "acquired":
            outcome = self._execute_module(module_name=MODULE, module_args=module_args, task_vars=task_vars)
            result.update(outcome)
            result.update(run_id=run_id, waited=0.0)
            return result
        result.update(self._acquire(module_args, task_vars, inventory_hostname, host))
        result["run_id"] = run_id
        return result

    def _acquire(self, module_args: dict, task_vars: dict, inventory_hostname: str, host: str) -> dict:
        """Call the module until it has the lock, the timeout has passed, or (check mode) once."""
        timeout, poll, path = module_args["timeout"], module_args["poll"], module_args["path"]
        check = bool(self._task.check_mode)
        start = self._clock()
        deadline = start + timeout
        take_over = module_args.get("take_over_run_id")
        tried: set[str] = set()
        gone_reason = None
        announced = False
        changed = False
        while True:
            outcome = self._execute_module(module_name=MODULE, module_args=dict(module_args, take_over_run_id=take_over),
                                           task_vars=task_vars)
            changed = changed or bool(outcome.get("changed"))
            outcome["changed"] = changed
            outcome["waited"] = round(self._clock() - start, 1)
            if outcome.get("failed") or outcome.get("acquired"):
                previous = outcome.get("previous") or {}
                if outcome.get("taken_over") and gone_reason and previous.get("run_id") == take_over:
                    display.warning(f"{'a real run would take' if check else 'took'} over the deploy lock {path} on "
                                    f"{inventory_hostname} of run {take_over}: {gone_reason}")
                return outcome
            current = outcome.get("holder") or {}
            gone = lock.holder_gone(current, host, self._alive) if current.get("run_id") else None
            if gone and current["run_id"] not in tried:
                tried.add(current["run_id"])
                take_over, gone_reason = current["run_id"], gone
                continue
            if check:
                return outcome
            now = self._clock()
            if now >= deadline:
                waited = now - start
                if current.get("run_id"):
                    msg = lock.contention_message(current, inventory_hostname, waited, path)
                else:
                    msg = (f"the deploy lock {path} on {inventory_hostname} kept changing while this run tried to take it; "
                           f"waited {int(waited)} s (sglang_service_lock_timeout)")
                outcome.update(failed=True, waited=round(waited, 1), msg=msg)
                return outcome
            if not announced and current.get("run_id"):
                announced = True
                display.display(f"{current.get('service') or module_args.get('service')} on {inventory_hostname} is being "
                                f"deployed by {lock.describe(current)} (run {current.get('run_id')}); "
                                f"waiting up to {timeout} s for its deploy lock")
            self._sleep(min(poll, max(deadline - now, 0.0)))
