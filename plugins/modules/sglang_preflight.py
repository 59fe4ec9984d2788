#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_preflight
short_description: The deploy's checks on the host in one call, before anything changes
version_added: 0.1.0
description:
  - >-
    The C(sglang_service) role's preflight: four checks in one round trip to the host, in this order, the first that
    refuses failing the module with its own message (the messages of the modules that make each check on its own).
  - >-
    1. The deploy's input (M(inferops.sglang.sglang_inputs)): control characters, names that become paths, the API
    key, the settings in O(settings). All problems at once, checked on the controller before the host is
    contacted, and again on the host. The rotation hooks in O(settings) are checked on the controller only and
    never sent to the host: their URLs, headers and arguments hold the load balancer's credentials, and a module's
    options are logged in the host's journal and shown at C(-vvv).
  - >-
    Then the service's account, where it exists on the host: not root's (UID or GID 0) and not a login account
    (C(UID_MIN) of C(/etc/login.defs) and above), whose shell and home the role would rewrite.
  - >-
    2. The host manifest (M(inferops.sglang.sglang_host_manifest) with C(state=read)): the TP size, GPUs, python and
    the unit's environment, each from O(tp_size), O(gpu_devices), O(python) and O(environment) when set, else from
    what provisioning proved; each GPU's device node; a variant whose build has no passing probe verdict is refused.
  - >-
    3. The variant O(name) and the rollback O(baseline), resolved with the same options and checked against the host
    (M(inferops.sglang.sglang_variant)) with the settings of step 2: the model's C(config.json) and the sandbox's
    view of it, the GPUs, the installed SGLang and its C(--help), the credentials when O(api_key) is set, the memory
    plan.
  - >-
    4. The model's files, and the draft model's when the variant runs one (M(inferops.sglang.sglang_model_stage)
    with C(state=verified)): O(model_check) V(quick) checks sizes and safetensors headers, V(full) every sha256 too.
  - A server that listens beyond loopback (O(bind_host)) without O(api_key) is warned about.
  - It never changes anything.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
  - inferops.sglang.variant_table
options:
  name:
    description: The variant to deploy (a name or an alias).
    type: str
    required: true
  baseline:
    description:
      - The variant a failed switch falls back to on a host with no saved known-good service. Resolved and checked
        as O(name) is; its problems are in C(variant.baseline.errors) of the result and do not fail the module.
    type: str
  service_name:
    description: The unit's name (checked as input).
    type: str
    required: true
  user:
    description: The service user (checked as input).
    type: str
    required: true
  group:
    description: The service group (checked as input).
    type: str
    required: true
  state_dir:
    description: Where attempts, the known-good service and the history are kept (checked as input).
    type: str
    required: true
  settings:
    description:
      - The settings the switch and the rollback use, by role variable name, checked as input (see the option of
        the same name of M(inferops.sglang.sglang_inputs)).
    type: dict
    default: {}
  api_key:
    description:
      - The server's API key (checked as input; never returned). When set, the host must deliver the unit's
        credentials to a service (a transient C(systemd-run) service that reads one back).
    type: str
  admin_api_key:
    description:
      - SGLang's admin API key (C(sglang_service_admin_api_key)), checked as O(api_key) is; the role hands it to
        SGLang in the same root-only C(--config) file, never on the command line.
    type: str
  model_path:
    description: The model directory on the host.
    type: str
    required: true
  draft_model_path:
    description: The draft model directory, for variants with C(draft_model=true).
    type: str
  served_model_name:
    description: The name the server lists in C(/v1/models).
    type: str
  bind_host:
    description: Address the server listens on.
    type: str
    default: 127.0.0.1
  port:
    description: Port the server listens on.
    type: int
    default: 30000
  gateway:
    description:
      - The host's gateway in front of the server (the sglang_service role's C(sglang_service_gateway)). The gateway
        then listens on O(bind_host) and O(port), the server on loopback on O(gateway.server_port); the result's
        C(variant.url) is the server's and C(variant.gateway) the gateway's address.
      - The credentials check runs (the gateway's unit gets its keys as credentials).
    type: dict
    suboptions:
      server_port:
        description: The server's port on loopback.
        type: int
        required: true
      metrics_port:
        description: The gateway's Prometheus port on loopback.
        type: int
        required: true
  slots:
    description:
      - Two server slots behind the host's gateway (the sglang_service role's C(sglang_service_slots)); needs O(gateway).
      - The live slot is read from C(current.json) in the service's directory and its unit; the candidate runs in the
        other slot, beside it, when the host manifest's usable GPUs hold O(tp_size) free ones the live slot does not
        use (nvidia-smi's memory.used under the release threshold), else in place in the live slot. The result's
        C(variant.slot) says which (C(mode), C(slot), C(unit), C(port), C(gpus), C(live), C(why)); C(variant.url) and
        C(settings.gpu_devices) are then the candidate slot's.
    type: dict
    suboptions:
      green_port:
        description: The green slot's server port on loopback (the blue slot's is O(gateway.server_port)).
        type: int
        required: true
  trials:
    description:
      - A tune's two trial servers (the playbook tune.yml). The reference (the variant O(name)) and the candidates run in
        units of their own, C(<service>-tune-reference.service) and C(<service>-tune-candidate.service), beside the
        live service, each on O(tp_size) of the host manifest's usable GPUs that the live slot does not use and that hold
        less than the release threshold now (C(mode) V(two)); with one such group, they take turns in it (V(one)); with
        none, they take turns on the live slot's GPUs with the live service stopped (V(in_place)), only where
        O(trials.in_place) allows it. Refused when the service was never deployed, or when there is no room.
      - The result's C(trials) lists both (C(role), C(unit), C(port), C(url), C(gpus), C(gpu_nodes), C(mode), C(live),
        C(why), and C(render), the variant rendered on that port with its memory plan on those GPUs); C(variant) is the
        reference's. In place, C(why) states the live service's downtime first (M(inferops.sglang.sglang_tune)).
    type: dict
    suboptions:
      ports:
        description: The reference's and the candidate's server ports on loopback.
        type: list
        elements: int
        required: true
      in_place:
        description: Whether a host without a free GPU group may tune in place of the live service (stopped for the tune).
        type: bool
        default: false
        version_added: 0.2.0
      minutes:
        description: The tune's budget in minutes, for the downtime stated in place; default the tune's (60).
        type: float
        version_added: 0.2.0
  gateway_url:
    description:
      - A fleet's gateway on another host in front of this server (the role's C(sglang_service_gateway_url)), checked
        to be a URL, with its control key, not beside O(gateway), and the server not on loopback only.
    type: str
  gateway_control_key:
    description: The control key of the gateway at O(gateway_url) (checked to be set; never returned).
    type: str
  metrics:
    description: Render C(--enable-metrics) (see M(inferops.sglang.sglang_variant)).
    type: bool
    default: false
  read_write_paths:
    description: The unit's C(ReadWritePaths=); each must be absolute and exist unless prefixed with C(-).
    type: raw
    default: []
  environment:
    description: Extra environment of the unit, laid over the manifest's proven environment.
    type: raw
    default: {}
  python:
    description: The venv's python set in the inventory or with C(-e); empty for the host manifest's.
    type: str
  watchdog_python:
    description:
      - The interpreter the watchdog's unit runs as root (C(sglang_service_watchdog_python)), checked here with the
        rest of the input (an absolute path, no control characters); the watchdog is installed later.
    type: str
  tp_size:
    description: The TP size set in the inventory or with C(-e); empty for the host manifest's.
    type: raw
  gpu_devices:
    description: The GPU indexes set in the inventory or with C(-e); empty for the host manifest's.
    type: raw
  manifest_path:
    description: The host manifest.
    type: path
    default: /etc/inferops-sglang/host.json
  manifest_required:
    description: Fail when the host has no manifest; without one O(tp_size) or O(gpu_devices) must be given.
    type: bool
    default: true
  manifest_environment:
    description: Give the unit the manifest's proven environment.
    type: bool
    default: true
  ddtree_manifest:
    description: The ddtree_build role's manifest; a build applied there is a build of the host manifest.
    type: path
    default: /var/lib/inferops-sglang/ddtree/manifest.json
  driver_proc_dir:
    description: The NVIDIA kernel module's directory in procfs, read for a GPU's device minor the manifest lacks.
    type: path
    default: /proc/driver/nvidia
  check_gpus:
    description: Query each GPU with C(nvidia-smi).
    type: bool
    default: true
  check_health:
    description:
      - With O(check_gpus), judge the variant's GPUs' health against the host manifest's (module C(inferops.sglang.gpu_facts)
        read it at provisioning) and refuse the variant on a GPU that logged a reset- or reboot-class Xid since then, has
        a row remap or page retirement pending, a remapping failure, or new uncorrectable ECC errors.
    type: bool
    default: true
  check_help:
    description:
      - Check the rendered flags against C(python -m sglang.launch_server --help) (one import of SGLang). The role
        turns it off when SGLang's own argument checks (M(inferops.sglang.sglang_server_args)) run.
    type: bool
    default: true
  memory_plan:
    description: Plan the variant's GPU memory and refuse a variant that cannot fit.
    type: bool
    default: true
  memory_override:
    description: Let a variant the planner says cannot fit pass anyway, with a warning.
    type: bool
    default: false
  memory_assumptions:
    description: Overrides of the planner's estimates, see M(inferops.sglang.sglang_memory_plan).
    type: dict
    default: {}
  model_check:
    description: The check of the model's files (step 4); V(off) skips it.
    type: str
    choices: ['off', quick, full]
    default: quick
"""

EXAMPLES = r"""
- name: Check everything a deploy of the balanced variant needs, before anything changes
  inferops.sglang.sglang_preflight:
    name: balanced
    baseline: nextn
    variants: "{{ sglang_service_variants }}"
    aliases: "{{ sglang_service_variant_aliases }}"
    service_name: sglang-qwen.service
    user: sglang
    group: sglang
    state_dir: /var/lib/inferops-sglang
    model_path: /srv/models/Qwen3.6-27B
  register: preflight
"""

RETURN = r"""
step:
  description: The check that refused (V(inputs), V(account), V(manifest), V(variant) or V(model)).
  returned: failure
  type: str
errors:
  description: Every problem the refusing check found.
  returned: failure
  type: list
  elements: str
path:
  description: The host manifest.
  returned: success
  type: str
exists:
  description: Whether the host has a manifest.
  returned: success
  type: bool
manifest:
  description: The host manifest (see M(inferops.sglang.sglang_host_manifest)).
  returned: success, when there is one
  type: dict
settings:
  description: The deploy's C(tp_size), C(gpu_devices), C(gpu_nodes), C(python) and C(environment).
  returned: success
  type: dict
sources:
  description: Where each setting came from (see M(inferops.sglang.sglang_host_manifest)).
  returned: success
  type: dict
build:
  description: The build the variant needs and its verdict in the host manifest.
  returned: success, when there is a manifest
  type: dict
variant:
  description:
    - The variant resolved and checked, with the same keys as M(inferops.sglang.sglang_variant)'s result
      (C(variant), C(params), C(argv), C(exec_args), C(sglang_version), C(max_position_embeddings), C(memory_plan),
      C(memory_warnings), C(url), C(baseline)), and C(gateway) and C(slot) (null without O(gateway), O(slots)).
  returned: success
  type: dict
trials:
  description: With O(trials), the reference's and the candidate's trial servers (see O(trials)).
  returned: success, with O(trials)
  type: list
  elements: dict
models:
  description: Each model directory checked (C(path), C(revision), C(files), C(bytes), C(msg)); empty with O(model_check=off).
  returned: success
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _host_manifest as hm
from ansible_collections.inferops.sglang.plugins.module_utils import _inputs
from ansible_collections.inferops.sglang.plugins.module_utils import _preflight
from ansible_collections.inferops.sglang.plugins.module_utils import _tune
from ansible_collections.inferops.sglang.plugins.module_utils import _variants as variants_mod


def run(module: AnsibleModule) -> dict:
    """The four checks in order; the first refusal fails the module (``step`` names it)."""
    p = module.params
    errors = _inputs.check(_preflight.input_values(p))
    if errors:
        module.fail_json(msg=_inputs.refusal(errors), errors=errors, step="inputs")
    refused = _preflight.account_problem(p["user"], p["group"])
    if refused:
        module.fail_json(msg=f"the service's account cannot be used, nothing was changed: {refused}", errors=[refused],
                         step="account")
    exposed = [w for w in (_preflight.exposure_warning(p["bind_host"], p["api_key"]),
                           _preflight.gateway_key_warning(p)) if w]
    step = "manifest"
    try:
        host, warnings = _preflight.manifest_read(dict(
            path=p["manifest_path"], ddtree_manifest=p["ddtree_manifest"], required=p["manifest_required"],
            tp_size=p["tp_size"], gpu_devices=p["gpu_devices"], python=p["python"], environment=p["environment"],
            use_environment=p["manifest_environment"], driver_proc_dir=p["driver_proc_dir"], name=p["name"],
            variants=p["variants"], aliases=p["aliases"], overrides=p["overrides"], common=p["common"]),
            module.run_command)
        step = "variant"
        tried = trials(module, host) if p["trials"] else None
        if tried is not None:
            variant = tried["variant"]
        else:
            variant = deploy_variant(module, host)
        warnings += variant["memory_warnings"]
        step = "model"
        models = []
        if p["model_check"] != "off":
            paths = [p["model_path"]] + ([p["draft_model_path"]] if variant["params"].get("draft_model") else [])
            models = [_preflight.model_verified(path, p["model_check"]) for path in paths]
    except _preflight.Refused as exc:
        module.fail_json(msg=exc.msg, step=step, **exc.result)
    for warning in exposed + warnings:
        module.warn(warning)
    return dict(host, variant=variant, models=models, **({"trials": tried["trials"]} if tried is not None else {}))


def deploy_variant(module: AnsibleModule, host: dict) -> dict:
    """The variant of a deploy, in its slot when the service has two (the slot decided first)."""
    p, settings = module.params, host["settings"]
    # two slots: the candidate's slot, port and GPUs, decided before anything is rendered
    slot = _preflight.slot_decision(p, host, module.run_command)
    if slot and slot["gpus"] is not None and slot["gpus"] != settings["gpu_devices"]:
        settings["gpu_devices"] = slot["gpus"]
        settings["gpu_nodes"], host["sources"]["gpu_nodes"] = hm.gpu_nodes(
            slot["gpus"], hm.device_minors(host.get("manifest")),
            _preflight.probed_minors(module.run_command, p["driver_proc_dir"], slot["gpus"]))
        host["sources"]["gpu_devices"] = "slot"
    return _preflight.variant(dict(
        p, slot=slot, health_baseline=(host.get("manifest") or {}).get("gpus"), python=settings["python"],
        tp_size=settings["tp_size"], gpu_devices=settings["gpu_devices"],
        read_write_paths=list(p["read_write_paths"] or []),
        credentials=bool(p["api_key"] or p["admin_api_key"] or p["gateway"])), module.run_command)


def trials(module: AnsibleModule, host: dict) -> dict:
    """A tune's two trial servers (``trials``): each the variant rendered on its own port and GPUs (its GPU
    nodes for the unit, its memory plan on those GPUs); ``variant`` is the reference's."""
    p, settings = module.params, host["settings"]
    out = []
    for trial in _preflight.trial_decision(p, host, module.run_command):
        gpus = trial["gpus"]
        nodes, _source = hm.gpu_nodes(gpus, hm.device_minors(host.get("manifest")),
                                      _preflight.probed_minors(module.run_command, p["driver_proc_dir"], gpus))
        render = _preflight.variant(dict(
            p, trial=trial, health_baseline=(host.get("manifest") or {}).get("gpus"), baseline=None,
            python=settings["python"], tp_size=settings["tp_size"], gpu_devices=gpus,
            read_write_paths=list(p["read_write_paths"] or []),
            credentials=bool(p["api_key"] or p["admin_api_key"] or p["gateway"])), module.run_command)
        why = trial["why"]
        if trial["mode"] == "in_place":
            minutes = p["trials"].get("minutes") or _tune.BUDGET_DEFAULTS["minutes"]
            why += ". " + _tune.in_place_downtime(minutes, render["params"]["gate_timeout"], trial["live"]["unit"])["msg"]
        out.append(dict(trial, why=why, gpu_nodes=nodes, url=render["url"], render=render))
    return {"variant": out[0]["render"], "trials": out}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            baseline=dict(type="str"),
            **variants_mod.TABLE_ARGS,
            service_name=dict(type="str", required=True),
            user=dict(type="str", required=True),
            group=dict(type="str", required=True),
            state_dir=dict(type="str", required=True),
            settings=dict(type="dict", default={}),
            api_key=dict(type="str", no_log=True),
            admin_api_key=dict(type="str", no_log=True),
            model_path=dict(type="str", required=True),
            draft_model_path=dict(type="str"),
            served_model_name=dict(type="str"),
            bind_host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", default=30000),
            gateway=dict(type="dict", options=dict(server_port=dict(type="int", required=True),
                                                   metrics_port=dict(type="int", required=True))),
            slots=dict(type="dict", options=dict(green_port=dict(type="int", required=True))),
            trials=dict(type="dict", options=dict(ports=dict(type="list", elements="int", required=True),
                                                  in_place=dict(type="bool", default=False),
                                                  minutes=dict(type="float"))),
            gateway_url=dict(type="str"),
            gateway_control_key=dict(type="str", no_log=True),
            metrics=dict(type="bool", default=False),
            read_write_paths=dict(type="raw", default=[]),
            environment=dict(type="raw", default={}),
            python=dict(type="str"),
            watchdog_python=dict(type="str"),
            tp_size=dict(type="raw"),
            gpu_devices=dict(type="raw"),
            manifest_path=dict(type="path", default=hm.DEFAULT_PATH),
            manifest_required=dict(type="bool", default=True),
            manifest_environment=dict(type="bool", default=True),
            ddtree_manifest=dict(type="path", default=hm.DDTREE_MANIFEST),
            driver_proc_dir=dict(type="path", default="/proc/driver/nvidia"),
            check_gpus=dict(type="bool", default=True),
            check_health=dict(type="bool", default=True),
            check_help=dict(type="bool", default=True),
            memory_plan=dict(type="bool", default=True),
            memory_override=dict(type="bool", default=False),
            memory_assumptions=dict(type="dict", default={}),
            model_check=dict(type="str", default="quick", choices=["off", "quick", "full"]),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **run(module))


if __name__ == "__main__":
    main()
