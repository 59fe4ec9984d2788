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

The async job itself (launch, polls, lines, a lost or overrunning job, cleanup,
the plain call, the check of ``progress_interval``) is plugin_utils/_async_job.py's
run_job; what is the gate's stays here: the text of a line (masked, without the
text for a no_log task) and the async limit of ``timeout``.
"""

from __future__ import annotations

import math
import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.inferops.sglang.plugins.module_utils import _mask
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import ASYNC_STATUS  # noqa: F401 pylint: disable=unused-import
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import run_job
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import OVERRUN_GRACE
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import clip as _clip
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import number as _number

# Display is one object: the lines the job prints are this display's.
display = Display()

MODULE = "inferops.sglang.wait_for_sglang"
# The module's defaults (its argument_spec) of the two options read here.
DEFAULT_TIMEOUT = 900.0
# Seconds beyond the module's own deadline before async_wrapper kills the job: the
# module's start and its verdict (the journal read for the cause) after the deadline.
ASYNC_MARGIN = 60
# Seconds between status polls: how late the verdict can reach the controller.
POLL_PERIOD = 2.0
PROGRESS_NAME = "wait_for_sglang.progress.json"
# The progress file's figures that move with the host's clock: the module rewrites the file at
# each event and every 5 s (not at all while one HTTP request waits), so they are that much behind.
ELAPSED_KEYS = ("elapsed", "stage_elapsed")


def async_limit(args: dict) -> int | None:
    """async_wrapper's time limit (whole seconds) for the module's ``timeout``; None for a
    timeout the module will refuse, so that the module's own message says why."""
    timeout = DEFAULT_TIMEOUT if args.get("timeout") is None else _number(args.get("timeout"))
    if timeout is None or not timeout > 0 or math.isinf(timeout):
        return None
    return int(math.ceil(timeout)) + ASYNC_MARGIN


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


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_async = True
    _supports_check_mode = True

    # Seams for the tests of the poll loop.
    _clock = staticmethod(time.monotonic)
    _sleep = staticmethod(time.sleep)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(run_job(self, task_vars, MODULE, async_limit(self._task.args), PROGRESS_NAME, progress_line,
                              poll_period=POLL_PERIOD, overrun_grace=OVERRUN_GRACE, elapsed_keys=ELAPSED_KEYS,
                              limit_note=f"timeout + {ASYNC_MARGIN} s", outcome="the gate's verdict", own_key="ready",
                              no_limit_reason="the module refuses this timeout"))
        return result
