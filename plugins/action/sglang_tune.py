# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for inferops.sglang.sglang_tune.

The tune runs as an async job on the host (plugin_utils/_async_job.py), as the switch does: a
controller that dies leaves the job to finish and remove its trial units. This plugin follows
the job and prints, every ``progress_interval`` seconds, what it is doing (the candidate it
started, the ratio it measured, masked). Its time limit is _tune.job_limit's: the budget's
minutes, two gates (three in place) and a margin (the budget is checked before each launch, so
the last launch may run past it).
"""

from __future__ import annotations

import math

from ansible.plugins.action import ActionBase

from ansible_collections.inferops.sglang.plugins.module_utils import _mask
from ansible_collections.inferops.sglang.plugins.module_utils import _tune
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import run_job
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import clip as _clip
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import number as _number

MODULE = "inferops.sglang.sglang_tune"
PROGRESS_NAME = "sglang_tune.progress.json"
DEFAULT_MINUTES = float(_tune.BUDGET_DEFAULTS["minutes"])
DEFAULT_GATE = 900.0


def async_limit(args: dict) -> int | None:
    """_tune.job_limit of the task's budget and gate timeout (in place: the trials' mode); None where
    a setting is not a number (the module then says why, as a plain call)."""
    budget = args.get("budget") if isinstance(args.get("budget"), dict) else {}
    minutes = _number(budget.get("minutes")) if budget.get("minutes") is not None else DEFAULT_MINUTES
    gate = _number(args.get("gate_timeout")) if args.get("gate_timeout") is not None else DEFAULT_GATE
    if minutes is None or gate is None or minutes <= 0 or gate < 0 or math.isinf(minutes) or math.isinf(gate):
        return None
    trials = args.get("trials") if isinstance(args.get("trials"), list) else []
    in_place = any(isinstance(t, dict) and t.get("mode") == "in_place" for t in trials)
    return _tune.job_limit(minutes, gate, in_place)


def progress_line(host: str, progress: dict, secrets: tuple[str, ...] = (), with_text: bool = True) -> str | None:
    """``[ct129] sglang_tune (312 s): rung 1: 3f2a... ratio 1.12``; None before the first event."""
    text = progress.get("event")
    if not text:
        return None
    elapsed = _number(progress.get("elapsed"))
    line = f"[{host}] sglang_tune" + (f" ({elapsed:.0f} s)" if elapsed is not None else "")
    return line + (f": {_clip(_mask.mask(str(text), secrets))}" if with_text else "")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_async = True

    _clock = staticmethod(__import__("time").monotonic)
    _sleep = staticmethod(__import__("time").sleep)

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        result.update(run_job(self, task_vars, MODULE, async_limit(self._task.args), PROGRESS_NAME, progress_line,
                              limit_note=f"the budget's minutes + two gates (three in place) + {_tune.JOB_MARGIN} s",
                              outcome="the tune's verdict",
                              no_limit_reason="a budget or gate setting is not a number"))
        return result
