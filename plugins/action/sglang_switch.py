# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller side of inferops.sglang.sglang_switch (documented with the module).

The switch runs as an async job on the host (plugin_utils/_async_job.py's
AsyncModuleJob, as the readiness gate does): a controller that dies mid-switch
leaves the job to finish the switch or the rollback and record it. This plugin
follows the job and prints, every ``progress_interval`` seconds, the state it is
in, the seconds spent there and in all, and the last event (the gate's last
line), masked. What stays here: the text of a line and the job's time limit,
the sum of every wait the switch can make plus a margin, so that async_wrapper
never kills a switch that is still within its own timeouts.

Around the job, on the controller, the rotation hooks (``rotation_out``,
``rotation_in``; plugin_utils/_rotation.py runs one): the module in check mode
says whether the job will drain a serving service; only then the out hook runs,
and a failed one ends the task before the job starts, with the in hook tried so
the host is not left half out. After the job, when the host may go back (the
known-good service serves, or nothing changed), the in hook, and its result is
added to the record the job wrote (sglang_deploy_state step=amend). ``failure``
says what fails the deploy (None when nothing does): the caller can publish the
record first and fail after.
"""

from __future__ import annotations

import math
import os
import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.inferops.sglang.plugins.module_utils import _mask
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import progress_interval, run_job, task_setting
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import clip as _clip
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import number as _number
from ansible_collections.inferops.sglang.plugins.plugin_utils import _rotation

display = Display()

MODULE = "inferops.sglang.sglang_switch"
# The fault tests hold the job at a state to kill it there (the module's hold_at)
HOLD_ENV = "INFEROPS_FAULT_HOLD_AT"
AMEND_MODULE = "inferops.sglang.sglang_deploy_state"
PROGRESS_NAME = "sglang_switch.progress.json"
ELAPSED_KEYS = ("elapsed", "state_elapsed")
# The job's first status poll, s after its launch (then doubling to the 2 s period): on a host
# with nothing to change the switch ends within a second or two.
FIRST_POLL = 0.25
# Seconds beyond the sum of the switch's own waits: its file work, the journal reads, the record.
ASYNC_MARGIN = 600
# The module's defaults (its argument_spec) of the waits summed here.
DEFAULTS = {"release_timeout": 120.0, "drain_timeout": 60.0, "gate_settle": 5.0}
DEFAULT_GATE_TIMEOUT = 900.0
PREGATE_TIMEOUT = 60.0
DEFAULT_GATEWAY_TIMEOUT = 60.0  # the module's (_switch.DEFAULT_GATEWAY_TIMEOUT)


def _gate_timeout(variant) -> float | None:
    params = (variant or {}).get("params") if isinstance(variant, dict) else None
    value = (params or {}).get("gate_timeout") if isinstance(params, dict) else None
    return DEFAULT_GATE_TIMEOUT if value in (None, "") else _number(value)


def async_limit(args: dict) -> int | None:
    """async_wrapper's limit: every wait the switch can make, summed, plus the margin; None
    where a setting is not a number (the module then says why, as a plain call)."""
    waits = [_number(args.get(k)) if args.get(k) is not None else v for k, v in DEFAULTS.items()]
    # the restored service is gated with its own timeout: the baseline's, or the running or
    # saved known-good service's (restore_gate_timeout, from the inspection), whichever is longer
    restore = [_gate_timeout(args.get("baseline"))]
    if args.get("restore_gate_timeout") not in (None, ""):
        restore.append(_number(args.get("restore_gate_timeout")))
    if any(x is None for x in restore):
        return None
    gates = [_gate_timeout(args.get("variant")), max(restore)]
    load = args.get("perf_load") if isinstance(args.get("perf_load"), dict) else {}
    budget = _number(load.get("budget")) if load.get("budget") is not None else 600.0
    parts = waits + gates + [budget]
    if any(x is None or x < 0 or math.isinf(x) for x in parts):
        return None
    release, drain, settle = waits
    # the drain, two benchmarks (the known-good's and the variant's), the pre-gate, two GPU waits, two gates and settles
    total = drain + 2 * budget + PREGATE_TIMEOUT + 2 * release + sum(gates) + 2 * settle
    gateway = args.get("gateway")
    if isinstance(gateway, dict):
        # out, in, and in again after a rollback, each bounded by the gateway's timeout
        timeout = _number(gateway.get("timeout")) if gateway.get("timeout") not in (None, "") else DEFAULT_GATEWAY_TIMEOUT
        if timeout is None or timeout < 0 or math.isinf(timeout):
            return None
        # and the recovery of a blue/green switch cut short routes the live slot again first
        total += 4 * timeout
    slot = args.get("slot")
    if isinstance(slot, dict):
        # blue/green: the soak, and its last probe (a generation, at most 30 s) beyond it
        soak = _number(slot.get("soak")) if slot.get("soak") not in (None, "") else 0.0
        if soak is None or soak < 0 or math.isinf(soak):
            return None
        total += soak + 30
    return int(math.ceil(total)) + ASYNC_MARGIN


def progress_line(host: str, progress: dict, secrets: tuple[str, ...] = (), with_text: bool = True) -> str | None:
    """``[ct129] sglang_switch: gate 42 s (130 s in all): [41.9s generation] ...``; None before the first state."""
    if not progress.get("state"):
        return None
    parts = [str(progress["state"])]
    in_state, elapsed = _number(progress.get("state_elapsed")), _number(progress.get("elapsed"))
    if in_state is not None:
        parts.append(f"{in_state:.0f} s")
    if elapsed is not None:
        parts.append(f"({elapsed:.0f} s in all)")
    line = f"[{host}] sglang_switch: " + " ".join(parts)
    text = progress.get("event")
    return line + (f": {_clip(_mask.mask(str(text), secrets))}" if text and with_text else "")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_async = True
    _supports_check_mode = True

    _clock = staticmethod(time.monotonic)
    _sleep = staticmethod(time.sleep)

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        given = self._task.args
        args = {k: v for k, v in given.items() if k not in _rotation.OPTIONS}
        if os.environ.get(HOLD_ENV):  # the fault tests' hold point (the module's hold_at); never in production
            args["hold_at"] = os.environ[HOLD_ENV]
        hooks = {name: given.get(option) or None for option, name in _rotation.OPTIONS.items()}
        host = str(task_vars.get("inventory_hostname") or "this host")
        check = bool(self._task.check_mode)
        progress_interval(args)  # a bad one fails here, before a hook or the job runs
        rotation: dict = {}
        if hooks["out"] and not check:
            plan = self._plan(args, task_vars)
            if plan.get("failed"):
                result.update(plan, failure=str(plan.get("msg")))
                return result
            if "drain" in (plan.get("would") or []):
                rotation["out"] = _rotation.run_hook(self, task_vars, hooks["out"])
                if not rotation["out"]["ok"]:
                    if hooks["in"]:
                        rotation["in"] = _rotation.run_hook(self, task_vars, hooks["in"])
                    msg = _rotation.out_failed_message(host, rotation, (plan.get("before") or {}).get("variant"))
                    result.update(failed=True, changed=True, msg=msg, failure=msg, rotation=rotation, before=plan.get("before"))
                    return result
        switched = run_job(self, task_vars, MODULE, async_limit(args), PROGRESS_NAME, progress_line,
                           module_args=dict(args, rotation=dict(rotation)), first_poll=FIRST_POLL, elapsed_keys=ELAPSED_KEYS,
                           limit_note=f"the switch's waits + {ASYNC_MARGIN} s",
                           outcome="the switch's outcome (the host's history.jsonl and switch.json say it)",
                           own_key="outcome", no_limit_reason="a wait setting is not a number")
        result.update(switched)
        if check:
            return result
        if rotation.get("out", {}).get("ok") and hooks["in"] and switched.get("outcome") in _rotation.BACK_IN:
            rotation["in"] = _rotation.run_hook(self, task_vars, hooks["in"])
            if switched.get("record") is not None:
                amended = self._execute_module(module_name=AMEND_MODULE, task_vars=task_vars, module_args={
                    "step": "amend", "service_dir": args.get("service_dir"), "record": switched["record"], "rotation": rotation})
                if amended.get("failed"):
                    display.warning(f"{host}: the rotation in hook's result was not added to the record: {amended.get('msg')}")
                else:
                    result.update(record=amended["record"], summary=amended["summary"])
        failure = _rotation.deploy_failure(host, str((args.get("variant") or {}).get("variant")), result, rotation,
                                           str(args.get("service_dir")))
        result.update(rotation=rotation, failure=failure, changed=bool(result.get("changed")) or bool(rotation))
        if failure is not None:
            result.update(failed=True, msg=failure)
        return result

    def _plan(self, args: dict, task_vars: dict) -> dict:
        """The module in check mode: what a run would do (``would``), the service before it."""
        with task_setting(self._task, "check_mode", True):
            return self._execute_module(module_name=MODULE, module_args=dict(args), task_vars=task_vars)
