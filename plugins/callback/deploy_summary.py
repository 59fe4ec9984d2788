# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: deploy_summary
type: aggregate
short_description: Summarise a rollout of deploy.yml, every host of it
version_added: 0.1.0
description:
  - At the end of a run of C(deploy.yml), prints one line per host of the rollout. For each host it shows what it
    runs now, the outcome (switched, unchanged, rolled back, failed before the switch, not reached), the readiness
    gate's verdict and the classified cause.
  - Hosts a stopped rollout never reached are listed as such, so an operator sees at once how far it went.
  - It reads the records the role C(inferops.sglang.sglang_service) publishes with C(set_stats)
    (C(inferops_deploy) and C(inferops_rollout)), and the failure message of hosts that failed before the role
    wrote a record (bad input, a memory plan refusal). Prints nothing for playbooks without them.
  - Enable it in C(ansible.cfg) (C(callbacks_enabled = inferops.sglang.deploy_summary)), as this repository does.
author:
  - inferops.sglang contributors (@inferops)
requirements:
  - enable in configuration
"""

from ansible.plugins.callback import CallbackBase

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy

OUTCOMES = _deploy.OUTCOMES


def _short(text: str, width: int = 150) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= width else text[: width - 3] + "..."


def summary_lines(rollout: dict, records: dict, failures: dict, processed: set) -> list[str]:
    """The summary: a header, one row per host, and how far the rollout went."""
    hosts = list(rollout.get("hosts") or [])
    hosts += sorted(h for h in set(records) | set(failures) if h not in hosts)
    rows = [("host", "outcome", "running now", "verdict", "perf", "cause")]
    notes = []
    for host in hosts:
        record = records.get(host)
        if record:
            rows.append((host, *_deploy.summary_row(record)))
            if record.get("outcome") not in ("switched", "unchanged"):  # a note for each host that did not get the variant
                notes.append(f"{host}: {_short((record.get('verdict') or {}).get('msg'))}")
        elif host in failures:
            rows.append((host, OUTCOMES["failed_before_switching"], "unchanged", "-", "-", "-"))
            notes.append(f"{host}: {_short(failures[host])}")
        elif host in processed:
            rows.append((host, "no record", "?", "-", "-", "-"))
        else:
            rows.append((host, OUTCOMES["not_reached"], "unchanged", "-", "-", "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    head = f"DEPLOY SUMMARY: variant {rollout.get('variant', '?')}"
    if rollout:
        head += (f", canary {rollout.get('canary')} then batches of {rollout.get('batch')}, "
                 f"stop above {rollout.get('max_fail_percentage')}% failed in a batch")
    unreached = [row[0] for row in rows[1:] if row[1] == OUTCOMES["not_reached"]]
    failed = [row[0] for row in rows[1:] if row[1] not in (OUTCOMES["switched"], OUTCOMES["unchanged"], OUTCOMES["not_reached"])]
    tail = []
    if unreached:
        tail.append(f"The rollout stopped after {', '.join(failed) or 'a failure'}: {len(unreached)} host(s) not reached "
                    f"and left as they were ({', '.join(unreached)}).")
    return [head] + lines + (["", *notes] if notes else []) + (["", *tail] if tail else [])


def failure_message(result: dict) -> str:
    """A failed task's message; for a loop, the first failed item's (not "One or more items failed")."""
    for item in result.get("results") or []:
        if isinstance(item, dict) and item.get("failed") and item.get("msg"):
            return str(item["msg"])
    return str(result.get("msg", "failed"))


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "inferops.sglang.deploy_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._failures: dict[str, str] = {}

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if not ignore_errors:
            self._failures[result._host.get_name()] = failure_message(result._result)

    def v2_runner_on_unreachable(self, result):
        self._failures[result._host.get_name()] = "unreachable: " + str(result._result.get("msg", ""))

    def v2_playbook_on_stats(self, stats):
        run = (stats.custom or {}).get("_run") or {}
        records = run.get("inferops_deploy") or {}
        rollout = run.get("inferops_rollout") or {}
        if not records and not rollout:
            return
        processed = set(stats.processed)
        failures = {h: m for h, m in self._failures.items() if h not in records}
        self._display.banner("INFEROPS DEPLOY SUMMARY")
        for line in summary_lines(rollout, records, failures, processed):
            self._display.display(line)
