#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_memory_plan
short_description: Plan whether SGLang service variants fit this host's GPU memory, and why not
version_added: 0.1.0
description:
  - For each variant of the table (or those in O(names)), computes per GPU what SGLang's memory profile will do with it
    on this host, before anything starts. It reads the model's and the draft model's C(config.json) and weight size
    (C(model.safetensors.index.json) C(metadata.total_size)), each GPU's C(memory.total) from C(nvidia-smi), and the
    installed SGLang version.
  - >-
    The static pool follows SGLang's own accounting for that version. Weights, the per-token KV cell (MHA, MLA, and
    hybrid models where only full-attention layers hold KV), the linear-attention state pool with the speculative
    intermediate states, the draft model outside the pool before 0.5.14 and inside it from 0.5.14, and SGLang's
    defaults for unset values. What SGLang allocates outside the pool (attention workspace, activations, CUDA graphs,
    an older release's draft) has no formula in SGLang; the module estimates it from the model's shapes. Its constants
    are returned and can be overridden with O(assumptions).
  - Each plan says whether the variant fits, the binding constraint in plain words (which side fails and by how much,
    in GiB and KV tokens), the KV tokens and how many full-context requests they hold, the interval of
    C(mem_fraction_static) that works for the envelope, and otherwise the envelope change that would fit.
  - It changes nothing. The deploy preflight (module M(inferops.sglang.sglang_variant)) uses the same planner.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
  - inferops.sglang.variant_table
options:
  names:
    description: Variants (names or aliases) to plan. Default, every variant of O(variants).
    type: list
    elements: str
    default: []
  model_path:
    description: The model directory on the host.
    type: path
    required: true
  draft_model_path:
    description: The draft model directory, for variants with C(draft_model=true).
    type: path
  tp_size:
    description: Tensor-parallel size (GPUs per server).
    type: int
    required: true
  gpu_devices:
    description:
      - The GPU indexes the server uses. C(nvidia-smi) lists every GPU of the host; these must be usable, and their
        C(memory.total) is used (the smallest binds).
    type: list
    elements: int
    default: []
  gpu_memory_mib:
    description: The GPUs' C(memory.total) in MiB instead of asking C(nvidia-smi).
    type: list
    elements: int
    default: []
  tp_candidates:
    description:
      - Other tensor-parallel sizes to try for a variant that does not fit (a suggestion names the first that fits).
      - Default, with O(gpu_devices), the sizes that fit the host's usable GPUs and divide the model's heads.
    type: list
    elements: int
  python:
    description: The Python of the environment SGLang is installed in (its version selects the accounting).
    type: path
    default: /opt/sglang/venv/bin/python
  sglang_version:
    description: The SGLang version to plan for instead of reading it from O(python).
    type: str
  assumptions:
    description:
      - Overrides of the planner's estimates for memory outside the static pool (MiB unless named otherwise).
      - C(context_mib) CUDA context and communicators before the weights load (768), C(workspace_mib) attention
        workspace (512), C(activation_factor) (1.0), C(graph_base_mib) per captured runner (256),
        C(graph_per_token_mib) per captured token (2).
    type: dict
    default: {}
  host:
    description: The name the table shows for this host.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Plan every variant on this host
  inferops.sglang.sglang_memory_plan:
    variants: "{{ sglang_service_variants }}"
    aliases: "{{ sglang_service_variant_aliases }}"
    model_path: /srv/models/Qwen3.6-27B
    draft_model_path: /srv/models/Qwen3.6-27B-DFlash
    tp_size: 2
    gpu_devices: [0, 2]
    host: "{{ inventory_hostname }}"
  register: plan

- name: Show it
  ansible.builtin.debug:
    msg: "{{ plan.table }}"
"""

RETURN = r"""
plans:
  description: Variant name to its plan (see docs/planner.md for every field).
  returned: success
  type: dict
  sample:
    shadow:
      fits: false
      binding: static_pool
      reason: "the static pool does not fit: ..."
      max_total_tokens: 0
      mem_fraction_static_range: null
      suggestions: ["max_running_requests 8 (from 16) with mem_fraction_static within [0.742, 0.927]"]
fits:
  description: Variant name to whether it fits.
  returned: success
  type: dict
table:
  description: The plans as a table for humans, one line per variant.
  returned: success
  type: list
  elements: str
report:
  description: RV(table), then each variant's reason, the envelope changes that would fit and warnings.
  returned: success
  type: list
  elements: str
tp_candidates:
  description: The other tensor-parallel sizes tried for a variant that does not fit.
  returned: success
  type: list
  elements: int
errors:
  description: Variant name to why it could not be planned (unknown variant, missing model files).
  returned: success
  type: dict
sglang_version:
  description: The SGLang version planned for.
  returned: success
  type: str
gpu_memory_mib:
  description: The GPUs' memory.total used.
  returned: success
  type: list
  elements: int
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _gpu as gpu_mod
from ansible_collections.inferops.sglang.plugins.module_utils import _model_config
from ansible_collections.inferops.sglang.plugins.module_utils import _memplan
from ansible_collections.inferops.sglang.plugins.module_utils import _variants as variants_mod


def _host_gpus(module: AnsibleModule, devices: list[int]) -> tuple[list[int], int]:
    """(memory.total of the server's GPUs, number of usable GPUs on the host) from nvidia-smi."""
    read = gpu_mod.read_inventory(module.run_command)
    if read["error"]:
        module.fail_json(msg=f"cannot read the GPUs: {read['error']}", errors=[read["error"]])
    gpus = {g["index"]: g for g in read["gpus"]}
    problems = [f"GPU {d} is not on this host (nvidia-smi lists {sorted(gpus)})" for d in devices if d not in gpus]
    problems += [f"GPU {d} is not usable: {gpus[d]['problem']}" for d in devices if d in gpus and not gpus[d]["usable"]]
    if problems:
        module.fail_json(msg="; ".join(problems), errors=problems)
    return [gpus[d]["memory_total_mib"] for d in devices], len(gpu_mod.usable(list(gpus.values())))


def _tp_sizes(model_path: str, usable: int) -> list[int]:
    """The tensor-parallel sizes the host's usable GPUs and the model's heads allow."""
    try:
        return gpu_mod.valid_tp(gpu_mod.model_heads(_model_config.load_config(model_path)), usable)
    except (_model_config.ModelConfigError, gpu_mod.GpuError):
        return []  # the plan itself reports the unreadable model


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            names=dict(type="list", elements="str", default=[]),
            **variants_mod.TABLE_ARGS,
            model_path=dict(type="path", required=True),
            draft_model_path=dict(type="path"),
            tp_size=dict(type="int", required=True),
            gpu_devices=dict(type="list", elements="int", default=[]),
            gpu_memory_mib=dict(type="list", elements="int", default=[]),
            tp_candidates=dict(type="list", elements="int"),
            python=dict(type="path", default="/opt/sglang/venv/bin/python"),
            sglang_version=dict(type="str"),
            assumptions=dict(type="dict", default={}),
            host=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    memory = list(p["gpu_memory_mib"])
    candidates = p["tp_candidates"]
    if not memory and not p["gpu_devices"]:
        module.fail_json(msg="name the server's GPUs (gpu_devices) or give their memory (gpu_memory_mib)")
    if not memory:
        memory, usable = _host_gpus(module, p["gpu_devices"])
        if candidates is None:
            candidates = _tp_sizes(p["model_path"], usable)
    version = p["sglang_version"]
    if not version:
        version, problem = variants_mod.installed_version(module.run_command, p["python"])
        if problem:
            module.fail_json(msg=problem)
    unknown = [k for k in p["assumptions"] if k not in _memplan.ASSUMPTIONS]
    if unknown:
        module.fail_json(msg=f"unknown assumptions {unknown} (known: {', '.join(sorted(_memplan.ASSUMPTIONS))})")

    cache = _memplan.ModelCache()
    plans, errors, rows = {}, {}, []
    for wanted in p["names"] or sorted(p["variants"]):
        try:
            name, params = variants_mod.resolve(wanted, p["variants"], p["aliases"], p["overrides"], p["common"])
            problems = variants_mod.check(params)
            if problems:
                raise _memplan.PlanError("; ".join(problems))
            plans[name] = _memplan.plan_resolved(params, p["model_path"], p["draft_model_path"], memory, p["tp_size"],
                                                 version, p["assumptions"], cache, tp_candidates=candidates)
            rows.append(dict(host=p["host"], variant=name, plan=plans[name]))
        except (variants_mod.VariantError, _memplan.PlanError) as exc:
            errors[wanted] = str(exc)
            rows.append(dict(host=p["host"], variant=wanted, error=str(exc)))
    module.exit_json(changed=False, plans=plans, fits={k: v["fits"] for k, v in plans.items()}, errors=errors,
                     table=_memplan.table(rows), report=_memplan.report(rows), sglang_version=version,
                     gpu_memory_mib=memory, tp_candidates=candidates or [])


if __name__ == "__main__":
    main()
