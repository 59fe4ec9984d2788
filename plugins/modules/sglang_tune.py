#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_tune
short_description: Search for the configuration of an SGLang variant that serves best on this host, beside the live service
version_added: 0.1.0
description:
  - Runs a tune (C(plugins/module_utils/_tune.py); C(docs/tune.md)) as one job on the host. Every point of the search
    space around O(base) is planned first by the memory planner, and a point that does not fit is never launched (the
    result says what binds). What fits is measured by successive halving; each measurement runs the candidate in the
    trial unit O(trials)' candidate and the base in the reference's, both beside the live service, in interleaved
    pairs of rounds, so its figures are ratios to the base with a 95 % interval. A candidate that dies has its
    readiness gate's verdict as its result.
  - With two trial slots (the trials' C(mode) V(two)) the live service is never stopped, restarted, or taken out of
    its gateway, nor with one (V(one), where the reference and each candidate take turns on one free GPU group, each measured
    alone, the reference before and after the candidates, ratios with Welch's interval). The trial units are started
    without being enabled, with Restart=no, and removed at the end; a run that was killed leaves them, and the next run
    removes them first.
  - In place (V(in_place), only where the operator allowed it and no GPU group is free), the trials take turns on the
    live service's GPUs and the live unit is stopped for the tune; a transient systemd timer armed first starts it
    again after the job's limit and a minute, whatever happens to the job; at the end the live unit is started and
    proven by the readiness gate (RV(restored)), and a live unit that does not come back fails the task.
  - What was measured is kept in O(store_dir), per host, model, SGLang version, build, base settings and load; a
    second run reuses it instead of launching again.
  - Returns the winner (RV(verdict) V(better)) as a variant table entry that inherits O(base_name), with its
    provenance, or says that nothing beats the base beyond noise; and the report (markdown) and a plot (SVG).
  - The action plugin runs the module as an async job and prints its progress every O(progress_interval) seconds.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.job
attributes:
  check_mode:
    description: Can run in check mode and return the changed status prediction without modifying the target.
    support: none
    details: A tune starts servers; the role skips it in check mode.
options:
  service:
    description: The service's unit (C(sglang-qwen.service)); names the trial units and the store's files.
    type: str
    required: true
  run_id:
    description: This run's id (the report's and the winner's provenance).
    type: str
    required: true
  base_name:
    description: The base variant's name.
    type: str
    required: true
  base:
    description: The base variant's resolved parameters (M(inferops.sglang.sglang_preflight)'s C(variant.params)).
    type: dict
    required: true
  trials:
    description:
      - The preflight's O(inferops.sglang.sglang_preflight#module:trials) result (C(role), C(unit), C(url), C(port),
        C(render), C(mode), in place C(live)), each with C(unit_text), its unit as the role rendered it.
    type: list
    elements: dict
    required: true
  objective:
    description:
      - The load and the service level (C(concurrency), C(requests), C(max_tokens), C(prompt_words), C(ttft_p95_ms),
        C(min_output_tokens_per_s), C(context_length)); see C(docs/tune.md).
    type: dict
    default: {}
  space:
    description: The settings to search and their values; null for the defaults around the base (C(docs/tune.md)).
    type: dict
  budget:
    description: C(trials) (launches, default 12) and C(minutes) (default 60).
    type: dict
    default: {}
  store_dir:
    description: Where measurements are kept between runs (root only).
    type: path
    required: true
  identity:
    description: What else a stored measurement is reused by (C(host), C(model), C(build)).
    type: dict
    default: {}
  winner_name:
    description: The winner's variant name; default C(<base_name>-tuned).
    type: str
  model_path:
    description: The model directory (the planner reads its config and weights' sizes).
    type: path
    required: true
  draft_model_path:
    description: The draft model directory, for a variant that runs one.
    type: path
  memory_assumptions:
    description: The planner's assumptions (the role's C(sglang_service_memory_assumptions)).
    type: dict
    default: {}
  check_gpus:
    description: Whether the host has GPUs to plan against; without, no candidate is planned (each is launched).
    type: bool
    default: true
  api_key:
    description: The service's API key, sent to the trial servers (only to the trial unit's own listener).
    type: str
  gate_timeout:
    description: Seconds each trial's readiness gate waits.
    type: float
    default: 900
  gate_settle:
    description: Seconds a ready trial must stay up.
    type: float
    default: 5
  gate_interval:
    description: Seconds between the gate's probes.
    type: float
    default: 1
  lock_lease:
    description: Seconds the lock's lease lasts.
    type: int
    default: 900
seealso:
  - module: inferops.sglang.sglang_preflight
  - module: inferops.sglang.sglang_switch
"""

EXAMPLES = r"""
- name: Tune around the balanced variant (tune.yml does this, the preflight and the trial units first)
  inferops.sglang.sglang_tune:
    service: sglang-qwen.service
    run_id: "{{ run_id }}"
    base_name: shadow-balanced
    base: "{{ preflight.variant.params }}"
    trials: "{{ trials_with_units }}"
    objective: {concurrency: 8, max_tokens: 128, ttft_p95_ms: 800}
    budget: {trials: 12, minutes: 60}
    store_dir: /var/lib/inferops-sglang/sglang-qwen/tune
    model_path: /srv/models/Qwen3.6-27B
"""

RETURN = r"""
run:
  description: This run's id (O(run_id)).
  returned: success
  type: str
verdict:
  description: V(better) (a winner meets the service level and beats the base beyond noise, or meets it where the base does not) or V(none).
  returned: success
  type: str
msg:
  description: The verdict in words, with the winner's changes and its ratio's interval.
  returned: success
  type: str
result:
  description: The whole tune (grid, dropped with why, rungs, launches, reused, deaths, every candidate's figures).
  returned: success
  type: dict
variant:
  description: The winner as a variant table entry (its name, then C(inherits), the changed settings, C(description), C(provenance)); null without one.
  returned: success
  type: dict
report:
  description: The report in markdown.
  returned: success
  type: str
plot:
  description: Output tokens/s against TTFT p95 of every measured candidate, as an SVG image.
  returned: success
  type: str
store:
  description: The file the measurements are kept in.
  returned: success
  type: str
mode:
  description: The trials' mode, V(two), V(one) or V(in_place).
  returned: success
  type: str
  version_added: 0.2.0
restored:
  description: In place, the live unit's return (C(unit), C(ready), C(seconds) to pass its readiness gate); null otherwise.
  returned: success
  type: dict
  version_added: 0.2.0
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _memplan
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files
from ansible_collections.inferops.sglang.plugins.module_utils import _switch
from ansible_collections.inferops.sglang.plugins.module_utils import _tune
from ansible_collections.inferops.sglang.plugins.module_utils import _tune_host
from ansible_collections.inferops.sglang.plugins.module_utils._job import Progress, claim_lock


def planner(p: dict, render: dict):
    """The memory planner on the trial GPUs' memory; without GPUs, every point passes unplanned."""
    memory = render.get("gpu_memory_mib") or []
    if not p["check_gpus"] or not memory:
        return lambda params: {"fits": True, "binding": None, "reason": "not planned: check_gpus is false"}
    cache = _memplan.ModelCache()

    def plan(params: dict) -> dict:
        return _memplan.plan_resolved(params, p["model_path"], p["draft_model_path"], memory, len(memory),
                                      render["sglang_version"], p["memory_assumptions"], cache=cache, search=False)
    return plan


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            service=dict(type="str", required=True),
            run_id=dict(type="str", required=True),
            base_name=dict(type="str", required=True),
            base=dict(type="dict", required=True),
            trials=dict(type="list", elements="dict", required=True),
            objective=dict(type="dict", default={}),
            space=dict(type="dict"),
            budget=dict(type="dict", default={}),
            store_dir=dict(type="path", required=True),
            identity=dict(type="dict", default={}),
            winner_name=dict(type="str"),
            model_path=dict(type="path", required=True),
            draft_model_path=dict(type="path"),
            memory_assumptions=dict(type="dict", default={}),
            check_gpus=dict(type="bool", default=True),
            api_key=dict(type="str", no_log=True),
            gate_timeout=dict(type="float", default=900),
            gate_settle=dict(type="float", default=5),
            gate_interval=dict(type="float", default=1),
            lock_file=dict(type="path"),
            lock_lease=dict(type="int", default=900),
            progress_file=dict(type="path"),
            progress_interval=dict(type="float", default=15),
        ),
        supports_check_mode=False,
    )
    p = module.params
    secrets = tuple(s for s in (p["api_key"],) if s)
    progress = Progress(module, secrets)
    host = _switch.SystemHost(p["service"], module.run_command, api_key=p["api_key"],
                              gate_options={"interval": p["gate_interval"]}, progress=lambda event: None)
    reference = next((t for t in p["trials"] if t.get("role") == "reference" and isinstance(t.get("render"), dict)), None)
    if reference is None:
        module.fail_json(msg="nothing was changed: the trials have no reference with its rendering (the preflight's trials)")
    try:
        goal = _tune.objective(p["objective"])
    except _tune.TuneError as exc:
        module.fail_json(msg=f"nothing was changed: {exc}")
    store_key = _tune.store_key(str(p["identity"].get("host") or ""), str(p["identity"].get("model") or p["model_path"]),
                                str(reference["render"].get("sglang_version")), p["identity"].get("build"), p["base"], goal)
    store_path = os.path.join(p["store_dir"], f"{store_key}.json")
    store = _state_files.read_json(store_path) or {}

    def keep() -> None:
        os.makedirs(p["store_dir"], mode=0o700, exist_ok=True)
        _state_files.write_atomic(store_path, json.dumps(store, sort_keys=True), 0o600)

    def report(event: dict) -> None:
        progress.text = _event_text(event)
        progress.write()
        progress.renew()
        if event.get("event") == "measured":
            keep()

    downtime = None
    try:
        budget = _tune.check_budget(p["budget"])
        if reference.get("mode") == "in_place":
            downtime = _tune.in_place_downtime(budget["minutes"], p["gate_timeout"], str((reference.get("live") or {}).get("unit")))
        trials = _tune_host.SystemTrials(host, p["trials"], {"timeout": p["gate_timeout"], "settle": p["gate_settle"]},
                                         progress=report, restore_after=downtime and downtime["at_most"])
        tune = _tune.Tune(p["base_name"], p["base"], goal, p["space"], budget, planner(p, reference["render"]),
                          trials, store=store)
    except (KeyError, ValueError, _tune_host.TrialError, _tune.TuneError) as exc:
        module.fail_json(msg=f"nothing was changed: {exc}")
    if p["lock_file"]:
        claim_lock(module)
    if downtime:
        report({"event": "in_place", "msg": downtime["msg"]})
    try:
        trials.install()
        result = tune.run()
    except (_switch.HostError, _tune_host.TrialError, OSError) as exc:
        module.fail_json(msg=f"the tune stopped: {exc}; {_cleanup(trials)}")
    except BaseException:
        # whatever else ends the run, the trial units go and, in place, the live service comes back first
        _cleanup(trials)
        raise
    try:
        trials.remove()
    except (_switch.HostError, _tune_host.TrialError, OSError) as exc:
        if trials.live_stopped:
            keep()
            module.fail_json(msg=f"the tune ended ({result['verdict']}: {result['msg']}), but {exc}; "
                                 f"the restore timer {_tune_host.restore_timer(trials.live['unit'])} starts it again "
                                 f"{downtime['at_most']} s after the tune began", result=result)
        module.warn(f"the trial units could not all be removed: {exc}")
    keep()
    name = p["winner_name"] or f"{p['base_name']}-tuned"
    variant = _tune.winner_variant(result, name, p["run_id"], {
        "host": p["identity"].get("host"), "model": p["identity"].get("model"), "build": p["identity"].get("build"),
        "sglang_version": reference["render"].get("sglang_version")})
    result.update(mode=trials.mode, restored=trials.restored, downtime=downtime)
    module.exit_json(changed=True, run=p["run_id"], verdict=result["verdict"], msg=result["msg"], result=result, variant=variant,
                     report=_tune.markdown(result, p["run_id"], str(p["identity"].get("host") or "this host")),
                     plot=_tune.svg(result), store=store_path, mode=trials.mode, restored=trials.restored)


def _cleanup(trials: _tune_host.SystemTrials) -> str:
    """The trial units removed after a failed tune (in place: the live service restored), said in words."""
    try:
        trials.remove()
    except (_switch.HostError, _tune_host.TrialError, OSError) as exc:
        if trials.live_stopped:
            return f"and {exc}; the restore timer {_tune_host.restore_timer(trials.live['unit'])} starts it again"
        return f"the trial units could not all be removed: {exc}"
    if trials.restored:
        return f"{trials.restored['unit']} is serving again (ready in {trials.restored['seconds']:g} s); the trial units are removed"
    return "the live service was not touched, the trial units are removed"


# A progress event's line, by its kind (the job's live progress); an unknown kind as JSON.
EVENT_TEXTS = {
    "planned": lambda e: f"planned: grid {e['grid']}, dropped {e['dropped']}, fit {e['fit']}",
    "start": lambda e: f"rung pairs {e['pairs']}: starting {e['key']} {json.dumps(e.get('changes'), sort_keys=True)}",
    "in_place": lambda e: f"in place: {e.get('msg')}",
    "reference": lambda e: f"the base alone, {e.get('when')}: {e.get('msg')}",
    "live_stopped": lambda e: f"{e['unit']} stopped for the tune (a timer starts it again in {e['restore_after']} s at the latest)",
    "live_restored": lambda e: f"{e['unit']} serving again, ready in {e['seconds']} s",
    "more pairs": lambda e: f"last rung: {e['pairs']} pairs, ratio {e.get('ratio')} [{e.get('low')}, {e.get('high')}]",
    "measured": lambda e: f"rung {e['rung']}: {e['key']} ratio {e.get('ratio')} {'; '.join(e.get('missed') or [])}",
}


def _event_text(event: dict) -> str:
    text = EVENT_TEXTS.get(str(event.get("event")))
    return text(event) if text else json.dumps(event, sort_keys=True, default=str)


if __name__ == "__main__":
    main()
