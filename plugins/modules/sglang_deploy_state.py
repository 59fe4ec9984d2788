#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_state
short_description: The deploy state machine of the sglang_service role, step by step, on the host
version_added: 0.3.0
description:
  - One module for the decisions of a switch, so that the role and the C(deploy_summary) callback take them from one
    place (C(plugins/module_utils/_deploy.py)).
  - O(step=inspect) reads the service's state before a deploy (active, loaded, the variant recorded as running, an
    interrupted switch's marker, a saved known-good service). Read-only.
  - O(step=decide) compares the files staged for this run with the installed ones and says whether the service must
    be switched, and why. Read-only.
  - O(step=restore) plans what a failed switch restores (the known-good copy, else the baseline variant rendered from
    the table) and how the restored service is gated (its own URL and C(--config) file). Read-only.
  - O(step=record) composes the deploy record, empties C(staging/) (run under the host's deploy lock, it holds only this
    run's files and those of killed runs), and with O(history) appends the
    record to C(history.jsonl) (root only), clears the switch marker unless the rollback failed and keeps only the
    newest O(keep_attempts) attempt directories.
  - O(step=figures) resolves the performance gate's load for the variant (O(variant_params), O(load)) and finds the
    running service's figures under that load in C(history.jsonl), the newest measurement of the same command line,
    release and GPUs (O(service)). Read-only.
author:
  - inferops.sglang contributors (@inferops)
attributes:
  check_mode:
    description: Can run in check mode and return the changed status prediction without modifying the target.
    support: full
    details: O(step=record) writes nothing in check mode.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
options:
  step:
    description: The step of the switch.
    type: str
    required: true
    choices: [inspect, decide, restore, record, figures]
  service_dir:
    description: The service's state directory (C(current.json), C(switch.json), C(known-good/), C(attempts/), C(staging/)).
    type: path
    required: true
  unit:
    description: The systemd unit (O(step=inspect)).
    type: str
  files:
    description:
      - The files that make the service, the unit first, each with C(name) (in staging/, attempts/, known-good/),
        C(src) (installed path) and C(mode) (installed mode); other keys are ignored.
      - For O(step=decide), only the files that are staged (rendered from a template).
    type: list
    elements: dict
    default: []
  run_id:
    description: This run's id; its staged files are in C(staging/RUN_ID/) (O(step=decide), O(step=record)).
    type: str
  active:
    description: The service is active (O(step=decide)).
    type: bool
    default: false
  interrupted:
    description: An earlier switch was interrupted (O(step=decide)).
    type: bool
    default: false
  changed_files:
    description:
      - In check mode, the names of the files whose templates would change the installed ones (O(step=decide));
        outside check mode the staged copies are compared with the installed ones instead.
    type: list
    elements: str
    default: []
  saved_this_run:
    description: The running service passed the pre-gate and was saved as known-good in this run (O(step=restore)).
    type: bool
    default: false
  baseline:
    description: The variant rendered when no known-good service was saved (O(step=restore)).
    type: str
  url:
    description: The URL of this run's settings, for a restored service whose flags do not say (O(step=restore)).
    type: str
  baseline_gate_timeout:
    description:
      - The baseline variant's own gate timeout (seconds), the restored service's when no record of it says
        otherwise (O(step=restore)).
    type: float
  fields:
    description: The record's fields (O(step=record)); see RV(record).
    type: dict
  keep_attempts:
    description: Attempt directories kept after O(step=record) (the newest). At least 1.
    type: int
    default: 20
  history:
    description:
      - Append the record to C(history.jsonl), clear the marker and prune (O(step=record)); V(false) composes it and removes
        C(staging/) only (an unchanged host).
    type: bool
    default: true
  textfile_dir:
    description:
      - node_exporter's textfile directory (O(step=record)); the service's deploy state is written there as
        C(inferops_sglang_<service>.prom), rewritten from C(history.jsonl) and the watchdog's history, also for an
        unchanged host. Unset, nothing is written.
    type: path
  service:
    description: The running service as recorded (C(argv), C(sglang_version), C(gpu_devices); RV(before)) (O(step=figures)).
    type: dict
  variant_params:
    description: The variant's parameters; its C(max_running_requests) and C(context_length) give the default load (O(step=figures)).
    type: dict
    default: {}
  load:
    description: The operator's load settings laid over the defaults (see the role's C(sglang_service_perf_load)) (O(step=figures)).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Read the service's state
  inferops.sglang.sglang_deploy_state:
    step: inspect
    service_dir: /var/lib/inferops-sglang/sglang-qwen
    unit: sglang-qwen.service
  register: before
"""

RETURN = r"""
before:
  description: O(step=inspect). C(active), C(loaded), C(variant) (recorded as running, or null), C(interrupted),
    C(argv) and C(url) (its recorded flags and the URL they give, or null), C(api_key_file) (the installed --config file, or null),
    C(marker) (the interrupted switch's marker), C(known_good) (a known-good unit is saved), C(known_good_variant), C(known_good_argv),
    C(sglang_version) and C(gpu_devices) (as recorded).
  returned: step is inspect
  type: dict
switch:
  description: O(step=decide). The service must be switched.
  returned: step is decide
  type: bool
reasons:
  description: O(step=decide). Why; empty when it is already what was asked.
  returned: step is decide
  type: list
  elements: str
plan:
  description: O(step=restore). C(source) (known_good or baseline), C(variant), C(files) to copy back from known-good/,
    C(url), C(api_key_file) and C(gate_timeout) to gate the restored service with.
  returned: step is restore
  type: dict
record:
  description: O(step=record). The deploy record, as appended to C(history.jsonl).
  returned: step is record
  type: dict
summary:
  description: O(step=record). What the operator reads.
  returned: step is record
  type: str
load:
  description: O(step=figures). The load the performance gate sends (requests, concurrency, max_tokens, rounds, warmup, timeout, budget).
  returned: step is figures
  type: dict
known_good:
  description: O(step=figures). The running service's newest figures under that load (with variant, time, load), or null.
  returned: step is figures
  type: dict
textfile_changed:
  description: O(step=record). The deploy state's textfile was rewritten (O(textfile_dir)).
  returned: step is record
  type: bool
pruned:
  description: O(step=record). Attempt directories removed (beyond O(keep_attempts)).
  returned: step is record
  type: list
  elements: str
"""

import hashlib
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _bench
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics
from ansible_collections.inferops.sglang.plugins.module_utils._state_files import append_line, read_json, read_jsonl


def _sha1(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha1(handle.read()).hexdigest()
    except OSError:
        return None


def _inspect(module: AnsibleModule) -> dict:
    p = module.params
    active = loaded = False
    if p["unit"]:
        rc, out, _err = module.run_command(["systemctl", "show", "-p", "ActiveState,LoadState", "--", p["unit"]])
        props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if rc == 0 else {}
        active, loaded = props.get("ActiveState") == "active", props.get("LoadState") == "loaded"
    current = read_json(os.path.join(p["service_dir"], "current.json"))
    marker_path = os.path.join(p["service_dir"], "switch.json")
    unit_name = p["files"][0]["name"] if p["files"] else None
    known_good = bool(unit_name) and os.path.exists(os.path.join(p["service_dir"], "known-good", unit_name))
    known_good_record = read_json(os.path.join(p["service_dir"], "known-good", "current.json"))
    config = [f["src"] for f in p["files"] if f["src"].endswith((".yaml", ".yml")) and os.path.isfile(f["src"])]
    return {"before": {
        "active": active,
        "loaded": loaded,
        "variant": (current or {}).get("variant"),
        "argv": (current or {}).get("argv"),
        "url": _deploy.url_of((current or {}).get("argv")),
        "api_key_file": config[0] if config else None,
        "interrupted": os.path.exists(marker_path),
        "marker": read_json(marker_path),
        "known_good": known_good,
        "known_good_variant": (known_good_record or {}).get("variant") if known_good else None,
        "known_good_argv": (known_good_record or {}).get("argv") if known_good else None,
        "sglang_version": (current or {}).get("sglang_version"),
        "gpu_devices": (current or {}).get("gpu_devices"),
    }}


def _decide(module: AnsibleModule) -> dict:
    p = module.params
    names = [f["name"] for f in p["files"]]
    if module.check_mode:
        # check mode renders the templates onto the installed files without writing: what would change
        differ = [n for n in names if n in p["changed_files"]]
    else:
        staging = os.path.join(p["service_dir"], "staging", p["run_id"])
        differ = _deploy.differing(names, [_sha1(os.path.join(staging, n)) for n in names], [_sha1(f["src"]) for f in p["files"]])
    reasons = _deploy.switch_reasons(differ, p["active"], p["interrupted"])
    return {"switch": bool(reasons), "reasons": reasons}


def _restore(module: AnsibleModule) -> dict:
    p = module.params
    kg = os.path.join(p["service_dir"], "known-good")
    present = {f["name"]: os.path.isfile(os.path.join(kg, f["name"])) for f in p["files"]}
    plan = _deploy.restore_plan(present, read_json(os.path.join(kg, "current.json")), p["saved_this_run"],
                                p["baseline"], [{k: f[k] for k in ("name", "src", "mode")} for f in p["files"]], p["url"],
                                p["baseline_gate_timeout"])
    return {"plan": plan}


def _record(module: AnsibleModule) -> dict:
    p = module.params
    try:
        rec = _deploy.record(dict(p["fields"] or {}, run_id=p["run_id"]))
    except _deploy.DeployStateError as exc:
        module.fail_json(msg=f"deploy record: {exc}")
    result = {"record": rec, "summary": _deploy.summary_text(rec, p["service_dir"]), "pruned": [], "changed": False,
              "textfile_changed": False}
    check = rec.get("plan_check") or {}
    if check.get("differs"):
        module.warn(f"{rec.get('host')}: {rec.get('variant')}: {check['msg']} (tolerance {check['tolerance']:.0%}): "
                    "the memory plan does not describe this server; check the planner's inputs for this release")
    if module.check_mode:
        return result
    # The run holds the host's deploy lock: everything in staging/ is this run's
    # scratch space or left by a run that was killed (or by the older shared layout).
    staging = os.path.join(p["service_dir"], "staging")
    for name in sorted(os.listdir(staging)) if os.path.isdir(staging) else []:
        path = os.path.join(staging, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    if p["history"]:
        _append_history(p, rec, result)
    if p["textfile_dir"]:
        try:
            result["textfile_changed"] = _deploy_metrics.refresh(p["service_dir"], str(rec.get("service")), p["textfile_dir"])
        except OSError as exc:
            module.warn(f"the deploy state for node_exporter was not written to {p['textfile_dir']}: {exc}")
        result["changed"] = result["changed"] or result["textfile_changed"]
    return result


def _append_history(p: dict, rec: dict, result: dict) -> None:
    """Append the record, clear the marker (unless the rollback failed), prune the attempts."""
    append_line(os.path.join(p["service_dir"], "history.jsonl"), json.dumps(rec, sort_keys=False))
    result["changed"] = True
    if rec["outcome"] != "rollback_failed":
        marker = os.path.join(p["service_dir"], "switch.json")
        if os.path.exists(marker):
            os.unlink(marker)
    attempts = os.path.join(p["service_dir"], "attempts")
    names = sorted(os.listdir(attempts)) if os.path.isdir(attempts) else []
    for name in _deploy.attempts_to_prune(names, p["keep_attempts"]):
        shutil.rmtree(os.path.join(attempts, name))
        result["pruned"].append(name)


def _figures(module: AnsibleModule) -> dict:
    p = module.params
    params = p["variant_params"] or {}
    try:
        load = _bench.plan_load(params.get("max_running_requests"), params.get("context_length"), p["load"])
    except _bench.BenchError as exc:
        module.fail_json(msg=f"sglang_service_perf_load: {exc}")
    records = read_jsonl(os.path.join(p["service_dir"], "history.jsonl")) if p["service"] else []
    return {"load": load, "known_good": _bench.known_good(records, p["service"] or {}, load)}


STEPS = {"inspect": _inspect, "decide": _decide, "restore": _restore, "record": _record, "figures": _figures}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            step=dict(type="str", required=True, choices=list(STEPS)),
            service_dir=dict(type="path", required=True),
            unit=dict(type="str"),
            files=dict(type="list", elements="dict", default=[]),
            run_id=dict(type="str"),
            active=dict(type="bool", default=False),
            interrupted=dict(type="bool", default=False),
            changed_files=dict(type="list", elements="str", default=[]),
            saved_this_run=dict(type="bool", default=False),
            baseline=dict(type="str"),
            url=dict(type="str"),
            fields=dict(type="dict"),
            keep_attempts=dict(type="int", default=20),
            history=dict(type="bool", default=True),
            textfile_dir=dict(type="path"),
            service=dict(type="dict"),
            variant_params=dict(type="dict", default={}),
            load=dict(type="dict", default={}),
            baseline_gate_timeout=dict(type="float"),
        ),
        required_if=[("step", "decide", ["run_id"]), ("step", "restore", ["baseline", "url", "baseline_gate_timeout"]),
                     ("step", "record", ["fields"])],
        supports_check_mode=True,
    )
    p = module.params
    if p["keep_attempts"] < 1:
        module.fail_json(msg=f"keep_attempts must be at least 1, got {p['keep_attempts']}")
    if p["run_id"] is not None and (not p["run_id"] or "/" in p["run_id"] or p["run_id"].startswith(".")):
        module.fail_json(msg=f"run_id must be a plain name, got {p['run_id']!r}")
    for item in p["files"]:
        missing = [k for k in ("name", "src", "mode") if not item.get(k)]
        if missing:
            module.fail_json(msg=f"each of files needs name, src and mode; {item!r} lacks {', '.join(missing)}")
    result = STEPS[p["step"]](module)
    result.setdefault("changed", False)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
