# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A module that runs as a job on the host for minutes (the switch, the tune): its progress file for
the action plugin's live lines (plugin_utils/_async_job.py), and the deploy lock claimed for the job
and its lease renewed while it runs."""

from __future__ import annotations

import json
import os
import time

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_lock
from ansible_collections.inferops.sglang.plugins.module_utils import _mask
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files

RENEW_EVERY = 60.0
TEXT_MAX = 300


class Progress:
    """The job's progress: the progress file (for the action plugin's lines) and the lease renewals."""

    def __init__(self, module, secrets: tuple[str, ...], clock=time.monotonic, wall=time.time) -> None:
        p = module.params
        self.module, self.secrets, self.clock, self.wall = module, secrets, clock, wall
        self.path, self.lock_file, self.run_id, self.lease = p["progress_file"], p["lock_file"], p["run_id"], p["lock_lease"]
        self.start = self.state_start = clock()
        self.state, self.text = None, ""
        self.renewed = clock()
        self.lost = None

    def __call__(self, event: dict) -> None:
        if event.get("state"):
            self.state, self.state_start = event["state"], self.clock()
            self.text = f"{event.get('from') or 'start'} -> {event['state']} ({event.get('event') or 'begin'})"
        elif event.get("gate"):
            self.text = str(event["gate"])
        self.write()
        self.renew()

    def write(self) -> None:
        if not self.path:
            return
        now = self.clock()
        text = " ".join(_mask.mask(self.text, self.secrets).split())[:TEXT_MAX]
        doc = {"time": self.wall(), "state": self.state, "elapsed": round(now - self.start, 1),
               "state_elapsed": round(now - self.state_start, 1), "event": text}
        try:
            _state_files.write_atomic(self.path, json.dumps(doc), 0o600, sync=False)
        except OSError:
            pass  # progress lines only: the switch goes on

    def renew(self, force: bool = False) -> None:
        if not self.lock_file or (not force and self.clock() - self.renewed < RENEW_EVERY):
            return
        self.renewed = self.clock()
        try:
            result = _deploy_lock.renew(self.lock_file, self.run_id, self.lease)
        except _deploy_lock.LockError as exc:
            self.module.warn(f"the deploy lock could not be renewed: {exc}")
            return
        if result["lost"] and not self.lost:
            holder = result.get("holder")
            self.lost = _deploy_lock.describe(holder) if holder else "nobody (it was removed)"
            self.module.warn(f"this run lost the deploy lock {self.lock_file} while it ran; it is held by {self.lost}")


def claim_lock(module) -> None:
    """The job holds this run's lock from here: its pid in it, the lease renewed. A lost lock stops the switch."""
    p = module.params
    try:
        result = _deploy_lock.claim_for_job(p["lock_file"], p["run_id"], os.getpid(), p["lock_lease"])
    except _deploy_lock.LockError as exc:
        module.fail_json(msg=f"the deploy lock: {exc}; nothing was changed")
    if result["lost"]:
        holder = result.get("holder")
        module.fail_json(msg=(f"this run ({p['run_id']}) no longer holds the deploy lock {p['lock_file']} "
                              f"(held by {_deploy_lock.describe(holder) if holder else 'nobody'}); nothing was changed"))
