#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_facts
short_description: NVIDIA GPU facts, the usable set and the tensor-parallel size, from nvidia-smi
version_added: 0.1.0
description:
  - Reads every GPU from C(nvidia-smi) (index, name, UUID, PCI bus id, memory total and used, compute capability)
    with the driver and CUDA versions. A GPU the tool cannot open (NVML "GPU is lost", exit 15) or that reads an
    error value is reported as unusable with its problem, never as a failure of the module.
  - From them, the usable set, its C(CUDA_VISIBLE_DEVICES), and the tensor-parallel sizes that work. A TP size must
    fit the usable (or requested) GPUs and divide the model's attention and KV head counts (and linear-attention
    head counts where the model has them), read from O(model_path)'s C(config.json) (C(text_config) for multimodal
    models). The default is the largest power of two among them; on a host with 7 usable GPUs and 24/4 heads, 4.
  - With O(health), each GPU's health too (M(inferops.sglang.gpu_facts) reads the kernel log's Xid events since boot
    and C(nvidia-smi -q -x)'s ECC, retired-page and row-remap state; docs/gpu-health.md tells each signal). A GPU with a
    reset- or reboot-class Xid since boot, a pending row remap or page retirement, a remapping failure, a recovery
    action asking for a reset or a reboot, or uncorrectable ECC errors new since O(health_baseline) is unusable with
    state C(sick) and the reason, as a lost GPU is, and the TP size is chosen without it. ECC disabled on a GPU that
    has it is a warning with the fix (O(ecc_disabled)). A kernel log neither C(journalctl -k) nor C(dmesg) can read
    (an LXC container) is a warning that Xid events were not checked.
  - In a container (LXC with passed-through GPUs; found by C(systemd-detect-virt --container), C(/run/systemd/container)
    or C(container=) in PID 1's environment) it checks that the user-space driver matches the hypervisor's kernel module
    (C(/proc/driver/nvidia/version)) and that C(/dev/nvidiactl), C(/dev/nvidia-uvm) and the node of each usable GPU exist.
    It never installs or loads a kernel driver.
  - 'The module fails, with every reason together, when: C(nvidia-smi) is missing or cannot talk to the driver; no GPU
    is usable; one of O(gpus) is absent or unusable; O(tp_size) cannot work; a container check fails.'
  - It only reads the host.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
options:
  nvidia_smi:
    description: The C(nvidia-smi) program, a path or a name looked up on C(PATH).
    type: str
    default: nvidia-smi
  model_path:
    description:
      - The model directory on the host; its C(config.json) gives the head counts the TP size must divide.
      - Without it, every size that fits the GPUs is valid.
    type: path
  tp_size:
    description:
      - The tensor-parallel size wanted. The module fails with the reason when it cannot work.
      - Default is the largest power of two among the valid sizes.
    type: int
  gpus:
    description:
      - The GPU indexes the server may use. Each must be present and usable; the TP size must fit them.
      - Default is every usable GPU.
    type: list
    elements: int
  container_checks:
    description:
      - When to check the user-space driver against the kernel module and the device nodes.
      - C(auto) in a container only; C(always); C(never).
    type: str
    choices: [auto, always, never]
    default: auto
  driver_proc_dir:
    description: The kernel driver's C(/proc) directory (its C(version) file and C(gpus/<bus id>/information)).
    type: path
    default: /proc/driver/nvidia
  device_dir:
    description: Where the C(nvidia*) device nodes are.
    type: path
    default: /dev
  health:
    description: Read each GPU's health and keep a sick GPU out of the usable set.
    type: bool
    default: true
  ecc_disabled:
    description: What ECC disabled on a GPU that supports it is, V(warn) or V(refuse) (the GPU is then unusable).
    type: str
    choices: [warn, refuse]
    default: warn
  dcgm:
    description:
      - With O(health), run DCGM's level-1 diagnostic (C(dcgmi diag -r 1), the level DCGM documents for every GPU
        class) when C(dcgmi) is installed (V(auto)), or never. A test that fails or warns is a warning with DCGM's
        words; the GPUs' usability is decided by the signals above.
    type: str
    choices: [auto, never]
    default: auto
  health_baseline:
    description:
      - The host manifest whose GPU counters the new ones are compared with (uncorrectable ECC errors new since the
        last provision make a GPU sick). A missing file is the first check.
    type: path
    default: /etc/inferops-sglang/host.json
notes:
  - The devices for the server are RV(ansible_facts.inferops_gpus.tp.devices), the first C(tp.chosen) of the selected GPUs.
  - A GPU's device node is C(nvidia<minor>), the minor from C(/proc/driver/nvidia/gpus/<bus id>/information), else its index.
"""

EXAMPLES = r"""
- name: Read the GPUs and choose the TP size for Qwen3.6-27B
  inferops.sglang.gpu_facts:
    model_path: /srv/models/Qwen3.6-27B

- name: Require TP 2 on GPUs 0 and 2 (fails naming the reason when it cannot work)
  inferops.sglang.gpu_facts:
    model_path: /srv/models/Qwen3.6-27B
    tp_size: 2
    gpus: [0, 2]

- name: Use the facts
  ansible.builtin.debug:
    msg: "CUDA_VISIBLE_DEVICES={{ ansible_facts.inferops_gpus.tp.cuda_visible_devices }} --tp-size {{ ansible_facts.inferops_gpus.tp.chosen }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: complex
  contains:
    inferops_gpus:
      description: The host's GPUs and what follows from them.
      returned: success
      type: complex
      contains:
        driver_version:
          description: The driver version nvidia-smi reports.
          type: str
          sample: 580.95.05
        cuda_version:
          description: The highest CUDA version the driver supports.
          type: str
          sample: "13.0"
        nvidia_smi_version:
          description: The version of the user-space C(nvidia-smi).
          type: str
          sample: 580.95.05
        kernel_module_version:
          description: The loaded kernel module version, when C(/proc/driver/nvidia/version) is readable.
          type: str
          sample: 580.95.05
        gpus:
          description:
            - Every GPU by index. C(state) is C(ok), C(lost) (the driver cannot open it), C(error)
              (it reads an error value) or C(sick) (its health, see O(health)); C(problem) says why it is not usable.
            - C(health) (with O(health)) its C(counters) (ECC mode, uncorrectable counts, retired pages, row remaps,
              recovery action), its C(xids) since boot (C(xid), C(time) in seconds since boot, C(action), C(name)),
              C(sick) and C(warnings).
            - Fields a lost GPU cannot report are null.
            - C(device_minor) is the minor of its C(/dev/nvidia<minor>) node from
              C(<driver_proc_dir>/gpus/<bus id>/information), null when that is not readable.
          type: list
          elements: dict
          sample:
            - index: 1
              name: null
              uuid: null
              pci_bus_id: "00000000:21:00.0"
              memory_total_mib: null
              memory_used_mib: null
              compute_capability: null
              device_minor: null
              usable: false
              state: lost
              problem: GPU is lost. Reboot the system to recover this GPU
        count:
          description: How many GPUs the host has, usable or not.
          type: int
          sample: 8
        usable:
          description: Indexes of the usable GPUs.
          type: list
          elements: int
          sample: [0, 2, 3, 4, 5, 6, 7]
        unusable:
          description: The GPUs that are not usable, with the reason.
          type: list
          elements: dict
          sample:
            - index: 1
              pci_bus_id: "00000000:21:00.0"
              state: lost
              problem: GPU is lost. Reboot the system to recover this GPU
        selected:
          description: The GPUs the server may use (O(gpus), or every usable GPU).
          type: list
          elements: int
        cuda_visible_devices:
          description: RV(ansible_facts.inferops_gpus.selected) as C(CUDA_VISIBLE_DEVICES).
          type: str
          sample: "0,2,3,4,5,6,7"
        model:
          description: The model's head counts the TP size must divide, or null without O(model_path).
          type: dict
          sample: {path: /srv/models/Qwen3.6-27B, num_attention_heads: 24, num_key_value_heads: 4}
        tp:
          description: The tensor-parallel size.
          type: complex
          contains:
            valid:
              description: The TP sizes that fit the selected GPUs and divide every head count.
              type: list
              elements: int
              sample: [1, 2, 4]
            chosen:
              description: O(tp_size), or the largest power of two among RV(ansible_facts.inferops_gpus.tp.valid).
              type: int
              sample: 4
            requested:
              description: O(tp_size), null when not given.
              type: int
            devices:
              description: The GPUs for the server, the first RV(ansible_facts.inferops_gpus.tp.chosen) selected ones.
              type: list
              elements: int
              sample: [0, 2, 3, 4]
            cuda_visible_devices:
              description: RV(ansible_facts.inferops_gpus.tp.devices) as C(CUDA_VISIBLE_DEVICES).
              type: str
              sample: "0,2,3,4"
        kernel_log:
          description:
            - Where the Xid events were read (C(source) V(journal), V(dmesg) or null when neither could), the boot
              (C(boot_id)) and C(time), the last Xid event's time in seconds since boot (0.0 with none), from which a
              deploy reads what is new. C(problem) when unread. Null without O(health).
          type: dict
          sample: {source: journal, boot_id: 5d2c1ba1c9e44d5c9a8c8b3e0c7f1e2a, time: 0.0, problem: null}
        dcgm:
          description: DCGM's level-1 diagnostic, when it ran (C(findings) the failed or warned tests, C(problem) when it could not run); null without C(dcgmi).
          type: dict
        health_warnings:
          description: What the health check found that leaves the GPUs usable (ECC disabled, an Xid to look into, an unread source).
          type: list
          elements: str
        container:
          description:
            - C(kind) the container type (C(lxc), C(podman), ...) or null on bare metal or a VM, C(detected_by) how.
            - C(checked) whether the container checks ran; C(user_space_version), C(kernel_module_version),
              C(device_nodes) the nodes checked; C(problems) what failed.
          type: dict
          sample: {kind: lxc, detected_by: systemd-detect-virt, checked: true, problems: []}
errors:
  description: Every reason the module failed.
  returned: failure
  type: list
  elements: str
inferops_gpus:
  description: On failure, the facts read so far (the same keys as RV(ansible_facts.inferops_gpus)), when nvidia-smi answered.
  returned: failure
  type: dict
"""

import os
import stat

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _gpu as gpu_mod
from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
from ansible_collections.inferops.sglang.plugins.module_utils import _host_manifest as hm
from ansible_collections.inferops.sglang.plugins.module_utils import _model_config


def _read(path: str, binary: bool = False):
    try:
        with open(path, "rb" if binary else "r", **({} if binary else {"encoding": "utf-8"})) as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def _nvidia_smi(module: AnsibleModule) -> str:
    name = module.params["nvidia_smi"]
    if os.sep in name:
        if os.path.isfile(name) and os.access(name, os.X_OK):
            return name
        path = None
    else:
        path = module.get_bin_path(name)
    if not path:
        module.fail_json(msg=f"nvidia-smi not found ({name}): the NVIDIA driver's user space is not installed on this host. "
                             "Install the driver (on an LXC container, the user-space part matching the hypervisor's "
                             "kernel module); this collection never installs a kernel driver.",
                         errors=[f"nvidia-smi not found ({name})"])
    return path


def _model(path: str, errors: list[str]) -> dict | None:
    try:
        heads = gpu_mod.model_heads(_model_config.load_config(path, "model_path"))
    except (_model_config.ModelConfigError, gpu_mod.GpuError) as exc:
        errors.append(str(exc) if str(exc).startswith("model_path") else f"model_path {path}: {exc}")
        return None
    return dict(path=path, **heads)


def _minor(proc_dir: str, gpu: dict) -> int:
    minor = gpu_mod.device_minor(proc_dir, gpu)
    return gpu["index"] if minor is None else minor


def _container(module: AnsibleModule, versions: dict, gpus: list[dict]) -> dict:
    p = module.params
    detect = module.get_bin_path("systemd-detect-virt")
    detected = None
    if detect:
        rc, out, err = module.run_command([detect, "--container"])
        detected = out if rc in (0, 1) else None
    kind, source = gpu_mod.container_kind(detected, _read("/run/systemd/container"), _read("/proc/1/environ", binary=True))
    result = dict(kind=kind, detected_by=source, checked=False, problems=[])
    if p["container_checks"] == "never" or (p["container_checks"] == "auto" and not kind):
        return result
    kernel = gpu_mod.parse_kernel_module_version(_read(os.path.join(p["driver_proc_dir"], "version")) or "")
    user = versions.get("nvidia_smi_version") or versions.get("driver_version")
    nodes = ["nvidiactl", "nvidia-uvm"] + [f"nvidia{_minor(p['driver_proc_dir'], g)}" for g in gpus if g["usable"]]
    faults = {}
    for name in nodes:
        path = os.path.join(p["device_dir"], name)
        try:
            mode = os.stat(path).st_mode
        except OSError:
            faults[path] = "missing"
            continue
        if not stat.S_ISCHR(mode):
            faults[path] = "not a character device"
    result.update(checked=True, user_space_version=user, kernel_module_version=kernel,
                  device_nodes=[os.path.join(p["device_dir"], n) for n in nodes],
                  problems=gpu_mod.container_problems(user, kernel, faults, os.path.join(p["driver_proc_dir"], "version")))
    return result


def _health(module: AnsibleModule, smi: str, gpus: list[dict]) -> tuple[dict | None, dict | None, list[str]]:
    """Each GPU's health in ``gpus`` (a sick one made unusable); (the kernel log's cursor, DCGM's diagnostic, warnings)."""
    p = module.params
    kernel = _gpu_health.read_kernel_log(module.run_command)
    memory, problem = _gpu_health.read_memory_health(module.run_command, smi)
    try:
        baseline = (hm.read_optional(p["health_baseline"]) or {}).get("gpus")
    except hm.ManifestError as exc:
        module.warn(f"health_baseline: {exc}; the counters are judged without it")
        baseline = None
    warnings = [w for w in (kernel["problem"], problem and f"ECC and row-remap state not read: {problem}") if w]
    verdicts = _gpu_health.judge([g for g in gpus if g["state"] != "lost"], kernel, memory, baseline,
                                 ecc_disabled=p["ecc_disabled"])
    for gpu in gpus:
        verdict = verdicts.get(gpu["index"])
        if verdict is None:
            continue
        gpu["health"] = _gpu_health.summary(verdict)
        warnings.extend(f"GPU {gpu['index']} ({gpu['pci_bus_id']}): {w}" for w in verdict["warnings"])
        if verdict["sick"] and gpu["usable"]:
            gpu.update(usable=False, state="sick", problem="; ".join(verdict["sick"]))
    dcgmi = module.get_bin_path("dcgmi") if p["dcgm"] == "auto" else None
    dcgm = None
    if dcgmi:
        findings, problem = _gpu_health.read_dcgm(module.run_command, dcgmi)
        dcgm = dict(findings=findings, problem=problem)
        warnings.extend(findings + ([problem] if problem else []))
    return dict(_gpu_health.cursor(kernel), problem=kernel["problem"]), dcgm, warnings


def _select(requested: list[int] | None, gpus: list[dict], errors: list[str]) -> list[int]:
    usable = gpu_mod.usable(gpus)
    if requested is None:
        return usable
    by_index = {g["index"]: g for g in gpus}
    if len(set(requested)) != len(requested):
        errors.append(f"gpus must be distinct GPU indexes, got {requested}")
    for index in requested:
        if index not in by_index:
            errors.append(f"GPU {index} is not present (this host has GPUs {', '.join(str(i) for i in sorted(by_index))})")
        elif not by_index[index]["usable"]:
            gpu = by_index[index]
            errors.append(f"GPU {index} is {'lost' if gpu['state'] == 'lost' else 'not usable'}: {gpu['problem']}")
    return [i for i in dict.fromkeys(requested) if i in usable]


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            model_path=dict(type="path"),
            tp_size=dict(type="int"),
            gpus=dict(type="list", elements="int"),
            container_checks=dict(type="str", default="auto", choices=["auto", "always", "never"]),
            driver_proc_dir=dict(type="path", default="/proc/driver/nvidia"),
            device_dir=dict(type="path", default="/dev"),
            health=dict(type="bool", default=True),
            ecc_disabled=dict(type="str", default="warn", choices=["warn", "refuse"]),
            health_baseline=dict(type="path", default=hm.DEFAULT_PATH),
            dcgm=dict(type="str", default="auto", choices=["auto", "never"]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    smi = _nvidia_smi(module)
    read = gpu_mod.read_inventory(module.run_command, smi)
    if read["error"]:
        module.fail_json(msg=read["error"], errors=[read["error"]], rc=read["rc"])
    gpus = read["gpus"]
    for gpu in gpus:
        gpu["device_minor"] = gpu_mod.device_minor(p["driver_proc_dir"], gpu)
    versions = gpu_mod.read_versions(module.run_command, smi)
    errors: list[str] = []
    kernel_log, dcgm, health_warnings = _health(module, smi, gpus) if p["health"] else (None, None, [])
    for warning in health_warnings:
        module.warn(warning)

    usable = gpu_mod.usable(gpus)
    if not usable:
        errors.append(f"no usable GPU on this host ({gpu_mod.describe_unusable(gpus)})")
    selected = _select(p["gpus"], gpus, errors)
    model = _model(p["model_path"], errors) if p["model_path"] else None
    heads = {k: v for k, v in model.items() if k != "path"} if model else None

    valid = gpu_mod.valid_tp(heads, len(selected))
    chosen = gpu_mod.choose_tp(valid)
    if p["tp_size"] is not None:
        if p["gpus"] is None:
            problems = gpu_mod.tp_problems(p["tp_size"], heads, len(selected), "usable", gpu_mod.describe_unusable(gpus))
        else:
            problems = gpu_mod.tp_problems(p["tp_size"], heads, len(selected), "selected", f"gpus {p['gpus']}")
        if problems:
            valid_text = ", ".join(str(v) for v in valid) or "none"
            errors.append("; ".join(problems) + f" (valid tp_size here: {valid_text})")
        chosen = p["tp_size"]
    devices = selected[:chosen] if chosen and chosen <= len(selected) else []

    driver = next((g["driver_version"] for g in gpus if g["driver_version"]), None) or versions["driver_version"]
    container = _container(module, versions, gpus)
    errors.extend(f"container check: {problem}" for problem in container["problems"])

    facts = dict(
        driver_version=driver,
        cuda_version=versions["cuda_version"],
        nvidia_smi_version=versions["nvidia_smi_version"],
        kernel_module_version=container.get("kernel_module_version"),
        gpus=[{k: v for k, v in g.items() if k != "driver_version"} for g in gpus],
        count=len(gpus),
        usable=usable,
        unusable=[{k: g[k] for k in ("index", "pci_bus_id", "state", "problem")} for g in gpus if not g["usable"]],
        selected=selected,
        cuda_visible_devices=gpu_mod.cuda_visible_devices(selected),
        model=model,
        tp=dict(valid=valid, chosen=chosen, requested=p["tp_size"], devices=devices,
                cuda_visible_devices=gpu_mod.cuda_visible_devices(devices)),
        container=container,
        kernel_log=kernel_log,
        dcgm=dcgm,
        health_warnings=health_warnings,
    )
    if errors:
        module.fail_json(msg="GPU preflight failed: " + "; ".join(errors), errors=errors, inferops_gpus=facts)
    module.exit_json(changed=False, ansible_facts=dict(inferops_gpus=facts))


if __name__ == "__main__":
    main()
