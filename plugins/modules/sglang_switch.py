#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_switch
short_description: Switch a host's SGLang service to a staged variant behind the readiness gate, rolling back on failure
version_added: 0.1.0
description:
  - Runs the whole switch of one systemd SGLang service on the host as one state machine
    (C(plugins/module_utils/_switch.py); C(docs/switch-state-machine.md) tells each state). In order, it does these.
    Inspect the service, decide (the staged files against the installed ones, an interrupted switch, an inactive
    unit), drain the running service, measure it for the performance gate, prove it healthy and save it as known-good,
    stop it, wait for its GPUs' memory, install the staged files, start, the readiness gate, the performance gate, then
    commit, or stop the failed variant and restore the known-good service (else the baseline staged in
    O(baseline_staging)) and gate the restored service as itself; then the record (C(history.jsonl)), the summary
    and node_exporter's textfile.
  - The action plugin runs the module as an async job on the host and prints where it is (the state, the seconds in
    it, the gate's last line) every O(progress_interval) seconds. A controller that dies does not stop the job; it
    finishes the switch or the rollback and records it.
  - From the pre-gate on, every state entered is written to the marker C(switch.json) in O(service_dir). A job that
    did not finish (a host rebooted) leaves it, and the next switch, finding it, switches again and records
    C(repaired_interrupted_run).
  - With O(lock_file), the job writes its pid, its start time and the host's boot id into this run's deploy lock (see
    M(inferops.sglang.sglang_deploy_lock)) and renews its lease as it goes, so a second deploy waits for the job even when
    this job's controller is gone, and a job that lost its lock does not start.
  - Around the job, on the controller, the rotation hooks O(rotation_out) and O(rotation_in) (a load balancer told
    that the host leaves and rejoins it). The out hook runs only when the module in check mode says the job will drain
    a serving service; a failed one fails the task before the job starts, with the in hook tried. The in hook runs when
    the out hook did and the known-good service serves (V(switched), V(rolled_back)) or nothing changed
    (V(failed_before_switching)); its result is added to the record (M(inferops.sglang.sglang_deploy_state)
    O(inferops.sglang.sglang_deploy_state#module:step=amend)). RV(failure) says what fails the deploy; a caller
    that publishes the record first sets C(failed_when) to false and fails on it after.
  - Nothing is rendered here; the role renders the variant into O(staging) and, for a first deploy, the baseline into
    O(baseline_staging), before the call.
  - In check mode, inspects and decides only and says what a run would do (RV(would), RV(switch), and the message); nothing changes.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
  - inferops.sglang.job
attributes:
  check_mode:
    details: Inspects and decides; nothing on the host changes.
options:
  service:
    description: The systemd unit.
    type: str
    required: true
  service_dir:
    description: The service's state directory (C(current.json), C(known-good/), C(attempts/), C(history.jsonl), C(staging/)).
    type: path
    required: true
  files:
    description:
      - The files that make the service, the unit first; each with C(name) (its name in C(staging/), C(known-good/) and
        C(attempts/)), C(src) (where it is installed) and C(mode) (its installed mode); C(template) false or null for
        one that is not staged (C(current.json)).
    type: list
    elements: dict
    required: true
  staging:
    description: This run's staged files of the variant (a directory under O(service_dir)/staging).
    type: path
    required: true
  baseline_staging:
    description: The baseline's staged files, rendered up front; a rollback with no known-good service installs them.
    type: path
    required: true
  variant:
    description: The variant, as M(inferops.sglang.sglang_variant) resolved it (variant, params, argv, sglang_version, memory_plan).
    type: dict
    required: true
  baseline:
    description: The baseline variant, resolved in the same call with the same settings (its C(baseline) result).
    type: dict
    required: true
  url:
    description: The URL the variant answers on.
    type: str
    required: true
  run_id:
    description: This run's id (the deploy lock's); a plain name.
    type: str
    required: true
  inventory_host:
    description: The host's name in the record.
    type: str
    default: localhost
  gpu_devices:
    description: The service's GPUs (indexes); their memory is waited for after each stop.
    type: list
    elements: int
    default: []
  check_gpus:
    description: Wait for the GPUs' memory after a stop (nvidia-smi).
    type: bool
    default: true
  check_health:
    description:
      - With O(check_gpus), read the kernel log's Xid events on the variant's GPUs over its start; one whose NVIDIA
        action is to restart the application, or worse, fails the variant though its gate passed (failure C(gpu_xid)),
        and the switch rolls back.
    type: bool
    default: true
  release_threshold_mib:
    description: A GPU holding less than this many MiB is released.
    type: int
    default: 1024
  release_timeout:
    description: Seconds to wait for the GPUs' memory after a stop.
    type: float
    default: 120
  gate_settle:
    description: Seconds the gated process must stay the same after its last generation.
    type: float
    default: 5
  gate_interval:
    description: Seconds between the gate's polls.
    type: float
    default: 1
  gate_generations:
    description: Real generations the gate asks for.
    type: int
    default: 1
  gate_stall_budgets:
    description: The gate's start-up stage budgets over its defaults (see M(inferops.sglang.wait_for_sglang)).
    type: dict
    default: {}
  drain_timeout:
    description: Seconds to wait for the running service's requests in flight before the stop.
    type: float
    default: 60
  drain_interval:
    description: Seconds between the drain's polls.
    type: float
    default: 1
  perf_gate:
    description: The performance gate (V(off), V(report), V(enforce)); see the role's C(sglang_service_perf_gate).
    type: str
    default: "off"
    choices: ["off", report, enforce]
  perf_load:
    description: The performance gate's load over its defaults (see the role's C(sglang_service_perf_load)).
    type: dict
    default: {}
  perf_thresholds:
    description: The performance gate's limits (the variant's own C(perf_thresholds) over them).
    type: dict
    default: {}
  keep_attempts:
    description: Attempt directories kept (the newest). At least 1.
    type: int
    default: 20
  changed_files:
    description: In check mode, the names of the staged files whose templates would change the installed ones.
    type: list
    elements: str
  ddtree_manifest:
    description: The DDTree build's manifest; the record names the build.
    type: path
  textfile_dir:
    description: node_exporter's textfile directory; the service's deploy state is rewritten there after the record.
    type: path
  lock_lease:
    description: Seconds of each lease renewal.
    type: int
    default: 1800
  lock:
    description:
      - The lock as acquired (M(inferops.sglang.sglang_deploy_lock)'s result), for the record, which keeps its
        C(run_id), C(holder), C(taken_over), C(previous) and C(waited).
    type: dict
  rotation:
    description: The rotation out hook's result (C(out) with ok and msg), for the record; set by the action plugin.
    type: dict
  rotation_out:
    description:
      - The out hook, run on the controller before a serving service is drained. A command (C(command), an argv run
        without a shell) or an HTTP call (C(url), C(method) (POST), C(headers), a JSON C(body), C(status_code) (200, or
        a list), C(timeout) (30 s); redirects are not followed), on the controller (C(where=controller), the default)
        or on the host (C(where=host)). As the sglang_service role's C(sglang_service_rotation_out) (checked by
        M(inferops.sglang.sglang_preflight)). Never sent to the job; its arguments appear in no result.
    type: dict
  rotation_in:
    description: The in hook, as O(rotation_out), run when the host may go back in rotation.
    type: dict
  plan_tolerance:
    description: The memory plan's tolerance, for the record's check of the plan against the server.
    type: float
  controller_user:
    description: Who runs the deploy, for the record.
    type: str
  api_key:
    description: This run's API key, sent where no C(--config) file holds one; masked in every result.
    type: str
  slot:
    description:
      - Two server slots (the sglang_service role's C(sglang_service_slots)); the preflight's decision, its result's
        C(variant.slot) (C(mode), C(slot), C(unit), C(port), C(gpus), C(live), C(why)), with C(soak), the seconds the old
        slot stays loaded after the cut-over. O(service), O(files), O(url) and O(gpu_devices) are the candidate slot's.
      - With C(mode=blue_green) the candidate starts in the free slot beside the live one, is gated, measured against
        it, routed by the host's O(gateway) beside it, then takes the traffic; the old slot is drained, soaked, stopped.
        A failure before the cut-over is the outcome V(refused) with the live slot untouched; after it, the traffic
        goes back to the old slot (V(rolled_back)).
      - With C(mode=in_place), the in-place switch of the live slot (current.json then names the slot and its unit).
    type: dict
  gateway:
    description:
      - The host's gateway in front of the server (the sglang_service role's C(sglang_service_gateway)), when it has
        one. The running server is taken out of it before its drain, and the variant is committed only once the
        gateway routes to it (after a rollback, the restored service is put back). The record's C(gateway) says how
        long clients had no server behind it.
      - Or a gateway on another host in front of several servers (the role's C(sglang_service_gateway_url)), with
        C(control_key) and C(worker_url) instead of C(control_key_file) and C(workers_file); a rolling deploy then
        takes each host out of it, switches it and puts it back once it serves.
      - Unset, the switch has no gateway part.
    type: dict
    suboptions:
      url:
        description: The gateway's URL (its client port).
        type: str
        required: true
      control_key_file:
        description: The host's own gateway, the file holding its control-plane key (root only).
        type: path
      workers_file:
        description:
          - The host's own gateway, the live workers' file, rewritten with the server's URL once the gateway routes to
            it; the gateway's unit is handed it, so a restarted gateway routes again.
        type: path
      metrics_url:
        description:
          - The host's own gateway, its Prometheus endpoint (loopback); read before and after the switch, the record's
            C(gateway.requests) says how many clients' requests it answered meanwhile and how many failed.
        type: str
      control_key:
        description: A gateway on another host, its control-plane key (masked in every result).
        type: str
      worker_url:
        description: A gateway on another host, the URL it reaches this host's server at.
        type: str
      timeout:
        description: Seconds the gateway may take to route to a ready server, or to forget a removed one.
        type: float
        default: 60
  restore_gate_timeout:
    description:
      - The longest gate timeout a restore may use besides the baseline's (the running and the saved known-good
        service's, as M(inferops.sglang.sglang_deploy_lock) inspected them). Only the action plugin reads it, for the
        job's time limit; the restore itself gates with the restore plan's.
    type: float
  hold_at:
    description:
      - "For the fault tests only: the job stops moving once it has entered this state and written its marker, and
        waits there until it is killed (or its time limit ends it), so that a test kills it at a known point as a
        reboot or an OOM kill would. The action plugin sets it from the controller's E(INFEROPS_FAULT_HOLD_AT);
        never set it on a production run."
      - A state the switch passes through (plugins/module_utils/_switch.py's State), not an outcome.
    type: str
seealso:
  - module: inferops.sglang.wait_for_sglang
  - module: inferops.sglang.sglang_deploy_lock
"""

EXAMPLES = r"""
- name: Switch sglang-qwen.service to the staged variant
  inferops.sglang.sglang_switch:
    service: sglang-qwen.service
    service_dir: /var/lib/inferops-sglang/sglang-qwen
    files: "{{ files }}"
    staging: "/var/lib/inferops-sglang/sglang-qwen/staging/{{ run_id }}"
    baseline_staging: "/var/lib/inferops-sglang/sglang-qwen/staging/{{ run_id }}/baseline"
    variant: "{{ resolved }}"
    baseline: "{{ resolved.baseline }}"
    url: "{{ resolved.url }}"
    run_id: "{{ run_id }}"
  register: switch
  failed_when: false
"""

RETURN = r"""
outcome:
  description:
    - V(unchanged), V(switched), V(rolled_back), V(rollback_failed), V(failed_before_switching) (the drain failed, or the
      live slot moved since the preflight; nothing changed) or V(refused) (blue/green, before the cut-over; the live
      slot untouched).
  returned: not check mode
  type: str
record:
  description: The deploy record, as appended to C(history.jsonl) (null for V(failed_before_switching)).
  returned: not check mode
  type: dict
summary:
  description: What the operator reads.
  returned: not check mode
  type: str
before:
  description: The service before the switch (active, loaded, variant, argv, url, interrupted, known_good, ...).
  returned: always
  type: dict
reasons:
  description: Why the service is switched; empty when it already is what was asked.
  returned: always
  type: list
  elements: str
trail:
  description: Every transition made, as [from, event, to].
  returned: not check mode
  type: list
  elements: list
would:
  description: In check mode, the states a run would act in, then its outcome.
  returned: check mode
  type: list
  elements: str
switch:
  description: In check mode, whether a run would switch.
  returned: check mode
  type: bool
warnings_text:
  description: What the record notes but does not fail on (GPUs slow to empty after the failed variant stopped).
  returned: not check mode
  type: list
  elements: str
failure:
  description: What fails the deploy, or null - the outcome's message when it is not V(switched) or V(unchanged), the
    failed out hook's, or that the in hook did not put the host back in rotation (the action plugin's).
  returned: not check mode
  type: str
rotation:
  description: The rotation hooks' results, C(out) and C(in) (each C(ok), C(msg)), masked; empty when none ran.
  returned: not check mode
  type: dict
gateway:
  description:
    - The gateway's part of the switch (with O(gateway)) as C(url), C(worker) (the server's URL as the gateway lists it),
      C(out) (C(removed), C(seconds)), C(in) (C(added), C(seconds)) and C(unavailable_s), the seconds from the running
      server's removal to the gateway routing to the variant (or to the restored service); null without a gateway,
      or when the switch ended before it.
  returned: not check mode
  type: dict
textfile_changed:
  description: node_exporter's textfile was rewritten.
  returned: not check mode
  type: bool
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics
from ansible_collections.inferops.sglang.plugins.module_utils import _switch
from ansible_collections.inferops.sglang.plugins.module_utils._job import Progress, claim_lock

# What the record keeps of the lock as acquired (sglang_deploy_lock's result)
LOCK_KEYS = ("run_id", "holder", "taken_over", "previous", "waited")


def settings(p: dict) -> _switch.Settings:
    return _switch.Settings(
        service=p["service"], service_dir=p["service_dir"], files=p["files"], staging=p["staging"],
        baseline_staging=p["baseline_staging"], variant=p["variant"], baseline=p["baseline"], url=p["url"],
        run_id=p["run_id"], host=p["inventory_host"], gpus=list(p["gpu_devices"]), check_gpus=p["check_gpus"],
        check_health=p["check_health"],
        release_threshold_mib=p["release_threshold_mib"], release_timeout=p["release_timeout"],
        gate_settle=p["gate_settle"], drain_timeout=p["drain_timeout"], drain_interval=p["drain_interval"],
        perf_gate=p["perf_gate"], perf_load=p["perf_load"], perf_thresholds=p["perf_thresholds"],
        keep_attempts=p["keep_attempts"], changed_files=p["changed_files"], ddtree_manifest=p["ddtree_manifest"],
        lock={k: p["lock"].get(k) for k in LOCK_KEYS} if p["lock"] else None, rotation=p["rotation"], plan_tolerance=p["plan_tolerance"],
        controller_user=p["controller_user"], gateway=p["gateway"], slot=p["slot"])


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            service=dict(type="str", required=True),
            service_dir=dict(type="path", required=True),
            files=dict(type="list", elements="dict", required=True),
            staging=dict(type="path", required=True),
            baseline_staging=dict(type="path", required=True),
            variant=dict(type="dict", required=True),
            baseline=dict(type="dict", required=True),
            url=dict(type="str", required=True),
            run_id=dict(type="str", required=True),
            inventory_host=dict(type="str", default="localhost"),
            gpu_devices=dict(type="list", elements="int", default=[]),
            check_gpus=dict(type="bool", default=True),
            check_health=dict(type="bool", default=True),
            release_threshold_mib=dict(type="int", default=1024),
            release_timeout=dict(type="float", default=120),
            gate_settle=dict(type="float", default=5),
            gate_interval=dict(type="float", default=1),
            gate_generations=dict(type="int", default=1),
            gate_stall_budgets=dict(type="dict", default={}),
            drain_timeout=dict(type="float", default=60),
            drain_interval=dict(type="float", default=1),
            perf_gate=dict(type="str", default="off", choices=["off", "report", "enforce"]),
            perf_load=dict(type="dict", default={}),
            perf_thresholds=dict(type="dict", default={}),
            keep_attempts=dict(type="int", default=20),
            changed_files=dict(type="list", elements="str"),
            ddtree_manifest=dict(type="path"),
            textfile_dir=dict(type="path"),
            lock_file=dict(type="path"),
            lock_lease=dict(type="int", default=1800),
            lock=dict(type="dict"),
            rotation=dict(type="dict"),
            rotation_out=dict(type="dict", no_log=True),
            rotation_in=dict(type="dict", no_log=True),
            plan_tolerance=dict(type="float"),
            controller_user=dict(type="str"),
            api_key=dict(type="str", no_log=True),
            slot=dict(type="dict"),
            gateway=dict(type="dict", options=dict(
                url=dict(type="str", required=True),
                control_key_file=dict(type="path", no_log=False),
                workers_file=dict(type="path"),
                metrics_url=dict(type="str"),
                control_key=dict(type="str", no_log=True),
                worker_url=dict(type="str"),
                timeout=dict(type="float", default=60),
            )),
            restore_gate_timeout=dict(type="float"),
            progress_file=dict(type="path"),
            progress_interval=dict(type="float", default=15),
            hold_at=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    secrets = tuple(s for s in (p["api_key"],) if s)
    if p["lock_lease"] < 60:
        module.fail_json(msg=f"lock_lease must be at least 60 seconds, got {p['lock_lease']}")
    progress = Progress(module, secrets)
    gate_options = {"interval": p["gate_interval"], "generations": p["gate_generations"],
                    "stall_budgets": p["gate_stall_budgets"] or None}
    host = _switch.SystemHost(p["service"], module.run_command, api_key=p["api_key"], gate_options=gate_options,
                              progress=progress)
    try:
        hold_at = _switch.State(p["hold_at"]) if p["hold_at"] else None
    except ValueError:
        module.fail_json(msg=f"nothing was changed: hold_at must be one of the switch's states, got {p['hold_at']!r}")
    try:
        switch = _switch.Switch(settings(p), host, stop_at=hold_at)
    except _switch.SwitchError as exc:
        module.fail_json(msg=f"nothing was changed: {exc}")
    if module.check_mode:
        try:
            plan = switch.plan()
        except _switch.HostError as exc:
            module.fail_json(msg=f"could not inspect the service: {exc}")
        module.exit_json(**plan)
    if p["lock_file"]:
        claim_lock(module)
    try:
        result = switch.run()
    except _switch.Interrupted:
        # hold_at (the fault tests): the marker names the state; wait here to be killed
        while True:
            time.sleep(60)
    except (_switch.HostError, _switch.SwitchError) as exc:
        # a host error outside the steps that roll back (inspect, decide, the record): the marker says where it stopped
        module.fail_json(msg=f"the switch stopped in {switch.state.value if switch.state else 'its start'}: {exc}",
                         state=switch.state.value if switch.state else None, before=switch.before, reasons=switch.reasons,
                         trail=[list(t) for t in switch.trail])
    textfile_changed = False
    if p["textfile_dir"] and result["record"] is not None:
        try:
            # named by the service's own unit whichever slot is live
            textfile_changed = _deploy_metrics.refresh(p["service_dir"], (p["slot"] or {}).get("service") or p["service"],
                                                       p["textfile_dir"])
        except OSError as exc:
            module.warn(f"the deploy state for node_exporter was not written to {p['textfile_dir']}: {exc}")
    check = (result["record"] or {}).get("plan_check") or {}
    if check.get("differs"):
        module.warn(f"{p['inventory_host']}: {p['variant'].get('variant')}: {check['msg']} (tolerance {check['tolerance']:.0%}): "
                    "the memory plan does not describe this server; check the planner's inputs for this release")
    for warning in result["warnings"]:
        module.warn(warning)
    module.exit_json(
        changed=result["changed"] or textfile_changed, failed=result["failed"], msg=result["msg"],
        outcome=result["outcome"], record=result["record"], summary=result["summary"], before=result["before"],
        reasons=result["reasons"], trail=[list(t) for t in result["trail"]], attempt=result["attempt"],
        warnings_text=result["warnings"], gateway=result["gateway"], textfile_changed=textfile_changed)


if __name__ == "__main__":
    main()
