#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_host_manifest
short_description: Write the host manifest provisioning proved, or read it for a deploy and refuse what it does not prove
version_added: 0.1.0
description:
  - >-
    O(state=present) (the end of C(provision.yml)) writes the host manifest, a JSON file (root, 0644, no secrets):
    the usable GPUs (index, UUID, name, memory, PCI bus id, compute capability, device minor), the unusable ones
    with the reason, the valid TP sizes and the chosen one with its devices, C(CUDA_VISIBLE_DEVICES), the CUDA
    toolkit, the venv, the installed versions, the exact environment the runtime probe ran with, and the probe's
    verdict per build. The builds are the plain SGLang runtime (C(sglang <version>)) and, when the ddtree_build
    role's manifest says a DDTree build is applied, that build (C(ddtree <build id>)); an error of the probe that
    names a file of the DDTree build fails that build only, any other fails both.
  - >-
    The file is written atomically and only when what it says changes: provenance (when, which run) and the
    verdict times aside, a second run that finds the same host changes nothing.
  - >-
    O(state=read) (the deploy's preflight, before anything on the host changes) reads and validates it, and
    returns the settings of the deploy. Per setting, a value given in O(tp_size), O(gpu_devices), O(python)
    (the inventory or C(-e) set it) wins over the manifest's; O(environment) is laid over the manifest's proven
    environment variable by variable. With O(name), the variant is resolved and refused when its build has no
    passing verdict, or when the DDTree build in place is not the one that was probed.
  - >-
    O(state=read) also gives the device node of each of those GPUs (C(settings.gpu_nodes), the unit's
    C(DeviceAllow=)): C(/dev/nvidia<minor>), the device minor the manifest recorded, else the one in
    C(<driver_proc_dir>/gpus/<bus id>/information) now (the bus id from C(nvidia-smi)), else the GPU index.
    The index orders GPUs for C(CUDA_VISIBLE_DEVICES); the minor the driver gave a GPU can differ from it.
  - A host without a manifest fails the read unless O(required=false).
author:
  - inferops.sglang contributors (@inferops)
options:
  state:
    description: C(present) writes the manifest, C(read) reads it for a deploy.
    type: str
    choices: [present, read]
    default: read
  path:
    description: The host manifest.
    type: path
    default: /etc/inferops-sglang/host.json
  ddtree_manifest:
    description: The ddtree_build role's manifest; a build applied there is a build of the host manifest.
    type: path
    default: /var/lib/inferops-sglang/ddtree/manifest.json
  gpus:
    description: O(state=present). The gpu_facts module's C(inferops_gpus) facts; omitted on a host without GPUs.
    type: dict
  cuda:
    description: O(state=present). The CUDA toolkit, C(version) and C(home).
    type: dict
    default: {}
  runtime:
    description: O(state=present). The sglang_runtime role's C(sglang_runtime_facts) (C(python), C(venv), C(installed)).
    type: dict
    default: {}
  probe:
    description:
      - O(state=present). The runtime probe's result (module sglang_runtime_probe), run with the builds in place.
      - Its C(environment) is recorded as the proven environment; a probe result without it records its
        C(ld_library_path) and O(probe_environment). Omitted or skipped, every build's verdict is unknown (C(ok) null).
    type: dict
  probe_environment:
    description: O(state=present). The extra environment the probe was given, for a probe result without C(environment).
    type: dict
    default: {}
  probe_checks:
    description: O(state=present). The checks the probe ran, recorded with each verdict; default every check (C(all)).
    type: list
    elements: str
  ddtree_rejected:
    description:
      - >-
        O(state=present). The ddtree_build role's C(ddtree_build_facts) on a DDTree build its probe rejected and
        rolled back (C(verdict=rejected), C(build_id), C(errors), C(restored), C(checks)); other verdicts are ignored.
      - >-
        The rollback took the build out of O(ddtree_manifest): with no build in place the DDTree build's verdict is
        this build's failure, with its id and errors, so a deploy refuses the DDTree variants with that reason; with
        the previous build restored the verdict is the probe's on that build. Either way C(ddtree_rejected) in the
        manifest names the rejected build and why.
    type: dict
  provenance:
    description: O(state=present). Who wrote it (run id, playbook, controller user and host), recorded under C(written).
    type: dict
    default: {}
  required:
    description: O(state=read). Fail when the host has no manifest; without one the settings must all be given.
    type: bool
    default: true
  tp_size:
    description: O(state=read). The TP size set in the inventory or with C(-e); empty for the manifest's.
    type: raw
  gpu_devices:
    description: O(state=read). The GPU indexes set in the inventory or with C(-e); empty for the manifest's.
    type: raw
  python:
    description: O(state=read). The venv's python set in the inventory or with C(-e); empty for the manifest's.
    type: str
  environment:
    description: O(state=read). Extra environment of the unit, laid over the manifest's proven environment.
    type: dict
    default: {}
  use_environment:
    description: O(state=read). Give the unit the manifest's proven environment.
    type: bool
    default: true
  driver_proc_dir:
    description:
      - O(state=read). The NVIDIA kernel module's directory in procfs, read for the device minor of a GPU the
        manifest has none for (a deploy without a manifest).
    type: path
    default: /proc/driver/nvidia
  name:
    description:
      - O(state=read). The variant to deploy (a name or an alias); refused when its build has no passing verdict.
      - A name that does not resolve is not checked here (inferops.sglang.sglang_variant says why).
    type: str
  variants:
    description: O(state=read). The variant table (see inferops.sglang.sglang_variant).
    type: dict
    default: {}
  aliases:
    description: O(state=read). Variant aliases.
    type: dict
    default: {}
  overrides:
    description: O(state=read). Per-variant parameter overrides.
    type: dict
    default: {}
  common:
    description: O(state=read). Overrides for every variant.
    type: dict
    default: {}
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
attributes:
  check_mode:
    details: O(state=present) reports whether the file would change and writes nothing.
  diff_mode:
    support: full
    details: The manifest before and after, as JSON.
"""

EXAMPLES = r"""
- name: Write the host manifest at the end of provisioning
  inferops.sglang.sglang_host_manifest:
    state: present
    gpus: "{{ ansible_facts.inferops_gpus }}"
    cuda: {version: "{{ cuda_toolkit_version }}", home: "{{ cuda_toolkit_home }}"}
    runtime: "{{ sglang_runtime_facts }}"
    probe: "{{ __sglang_runtime_probe }}"

- name: Read it for a deploy of the balanced variant
  inferops.sglang.sglang_host_manifest:
    state: read
    name: balanced
    variants: "{{ sglang_service_variants }}"
    aliases: "{{ sglang_service_variant_aliases }}"
  register: host
"""

RETURN = r"""
path:
  description: The host manifest.
  returned: always
  type: str
exists:
  description: Whether the host has a manifest (for O(state=present), before this run).
  returned: always
  type: bool
manifest:
  description:
    - The manifest (O(state=present), as written or as it would be written). Keys C(schema), C(written) (C(at) and
      the provenance), C(gpus) (C(usable), C(unusable) with C(reason), C(selected), C(cuda_visible_devices), C(tp)
      with C(valid), C(chosen), C(devices), C(cuda_visible_devices)), C(cuda), C(venv) (C(path), C(python)),
      C(installed), C(environment), C(environment_source) (C(probe), C(reconstructed) or C(none)), C(ddtree)
      (the build in place, or null), C(ddtree_rejected) (a build this run rejected and rolled back, when there is
      one) and C(builds) (C(sglang), C(ddtree), each with C(name), C(ok), C(errors), C(checks),
      C(proved_at)).
  returned: when there is one
  type: dict
settings:
  description:
    - O(state=read). The deploy's C(tp_size), C(gpu_devices), C(python) and C(environment), and C(gpu_nodes)
      (the device node of each GPU of C(gpu_devices), by its device minor).
  returned: success and O(state=read)
  type: dict
  sample: {tp_size: 2, gpu_devices: [0, 2], gpu_nodes: [/dev/nvidia0, /dev/nvidia3], python: /opt/sglang/venv/bin/python,
           environment: {LD_LIBRARY_PATH: /usr/local/cuda-13.0/lib64}}
sources:
  description:
    - O(state=read). Where each setting came from (C(manifest), C(override), C(gpu_devices), C(default)).
    - C(gpu_nodes) is a list, one per GPU, C(manifest), C(procfs) or C(index) (where its minor came from).
  returned: success and O(state=read)
  type: dict
variant:
  description: O(state=read) with O(name). The canonical variant name.
  returned: when O(name) resolves
  type: str
build:
  description: O(state=read) with O(name). The build the variant needs (C(sglang) or C(ddtree)) and its verdict.
  returned: when O(name) resolves and there is a manifest
  type: dict
errors:
  description: Every reason the module failed.
  returned: failure
  type: list
  elements: str
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _host_manifest as hm
from ansible_collections.inferops.sglang.plugins.module_utils import _preflight


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _present(module: AnsibleModule) -> None:
    p = module.params
    path = p["path"]
    try:
        old = hm.read_optional(path)
    except hm.ManifestError as exc:
        old = None
        module.warn(f"replacing an unusable host manifest: {exc}")
    new = hm.build(p["gpus"], p["cuda"], p["runtime"], p["probe"], _preflight.ddtree_manifest(p["ddtree_manifest"]), p["provenance"],
                   _now(), p["probe_environment"], p["probe_checks"], p["ddtree_rejected"])
    exists = os.path.exists(path)
    changed = not hm.same(old, new)
    mode_ok = True
    if exists and not changed:
        st = os.stat(path)
        mode_ok = (st.st_mode & 0o777) == 0o644 and st.st_uid == 0
    if not changed:
        new = old
    result = dict(changed=changed or not mode_ok, path=path, exists=exists, manifest=new)
    if module._diff:
        result["diff"] = {"before": hm.dumps(old) if old else "", "after": hm.dumps(new),
                          "before_header": path, "after_header": path}
    if module.check_mode:
        module.exit_json(**result)
    try:
        if changed:
            hm.write(path, new)
        elif not mode_ok:
            os.chmod(path, 0o644)
            os.chown(path, 0, 0)
    except OSError as exc:
        module.fail_json(msg=f"cannot write the host manifest {path}: {exc}", errors=[str(exc)], **result)
    module.exit_json(**result)


def _read(module: AnsibleModule) -> None:
    try:
        result, warnings = _preflight.manifest_read(module.params, module.run_command)
    except _preflight.Refused as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    for warning in warnings:
        module.warn(warning)
    module.exit_json(changed=False, **result)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="read", choices=["present", "read"]),
            path=dict(type="path", default=hm.DEFAULT_PATH),
            ddtree_manifest=dict(type="path", default=hm.DDTREE_MANIFEST),
            gpus=dict(type="dict"),
            cuda=dict(type="dict", default={}),
            runtime=dict(type="dict", default={}),
            probe=dict(type="dict"),
            probe_environment=dict(type="dict", default={}),
            probe_checks=dict(type="list", elements="str"),
            ddtree_rejected=dict(type="dict"),
            provenance=dict(type="dict", default={}),
            required=dict(type="bool", default=True),
            tp_size=dict(type="raw"),
            gpu_devices=dict(type="raw"),
            python=dict(type="str"),
            environment=dict(type="dict", default={}),
            use_environment=dict(type="bool", default=True),
            driver_proc_dir=dict(type="path", default="/proc/driver/nvidia"),
            name=dict(type="str"),
            variants=dict(type="dict", default={}),
            aliases=dict(type="dict", default={}),
            overrides=dict(type="dict", default={}),
            common=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    if module.params["state"] == "present":
        _present(module)
    else:
        _read(module)


if __name__ == "__main__":
    main()
