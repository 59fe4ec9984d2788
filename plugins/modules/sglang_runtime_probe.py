#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_runtime_probe
short_description: Prove that the SGLang virtual environment matches the CUDA toolkit, before any unit starts
version_added: 0.1.0
description:
  - >-
    Runs its checks inside the interpreter of the SGLang virtual environment (O(python)), as a separate process
    with only the environment the service unit will have (C(env -i)): the toolkit's C(lib64), O(library_path)
    and O(environment). The module's own interpreter never imports torch or SGLang.
  - >-
    C(versions): the installed C(torch) and C(sglang) distributions (C(importlib.metadata)) equal O(torch_version)
    and O(sglang_version). A pin without a local label (C(0.5.11)) accepts any local label, as pip does; a pin
    with one (C(2.11.0+cu130)) needs exactly that build.
  - >-
    C(torch): C(import torch) works and C(torch.version.cuda) equals the toolkit major.minor O(cuda_version).
  - >-
    C(libraries): every library of O(libraries) and every library the installed DDTree build declares (the
    C(CUDA_LIBRARIES) list of O(ddtree_module), read from its source with C(ast), never imported) really loads
    with C(ctypes.CDLL). A library that does not load is reported with its name and the loader's reason, for
    example C(libcudart.so.12: cannot open shared object file: No such file or directory). A loaded CUDA runtime
    must report the major version its name promises (C(cudaRuntimeGetVersion): 13000 for C(libcudart.so.13)).
  - >-
    Before running anything the pins are checked against each other: the local label of O(torch_version) must
    be the CUDA build of O(cuda_version) (C(+cu130) for 13.0); a disagreement always fails, whatever
    O(fail_on_error) says.
  - It never changes anything. RV(needs_install) lists the pins that are not installed, for the install step.
author:
  - inferops.sglang maintainers (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.READ_ONLY
options:
  python:
    description: The Python of the SGLang virtual environment.
    type: path
    default: /opt/sglang/venv/bin/python
  cuda_version:
    description: The CUDA toolkit version on the host (major.minor is used, C(13.0.2) means C(13.0)).
    type: str
    required: true
  cuda_home:
    description: The toolkit's directory; its C(lib64) comes first in the library path. Default C(/usr/local/cuda-<major.minor>).
    type: path
  torch_version:
    description: The torch pin, with the CUDA build as local label. Unset, the installed torch is not compared.
    type: str
  sglang_version:
    description: The SGLang pin. Unset, the installed SGLang is not compared.
    type: str
  libraries:
    description:
      - CUDA libraries that must load (names for the loader to search, or absolute paths).
      - Default, per SGLang release line of O(sglang_version), the CUDA runtime of the toolkit major
        (C(libcudart.so.13) for CUDA 13.x).
    type: list
    elements: str
  ddtree_module:
    description: The module of the DDTree build that declares its CUDA libraries in C(CUDA_LIBRARIES). Absent is fine.
    type: str
    default: sglang.srt.speculative.ddtree_utils
  library_path:
    description: Directories of the unit's C(LD_LIBRARY_PATH), after the toolkit's C(lib64).
    type: list
    elements: path
    default: []
  environment:
    description: Further environment variables of the unit (its C(Environment=) lines). An C(LD_LIBRARY_PATH) here comes last in the path.
    type: dict
    default: {}
  checks:
    description: The checks to run.
    type: list
    elements: str
    choices: [versions, torch, libraries]
    default: [versions, torch, libraries]
  fail_on_error:
    description:
      - Fail when a check finds a problem. V(false) only reports (RV(ok), RV(errors), RV(needs_install)); a role
        uses it to decide what to install.
    type: bool
    default: true
  timeout:
    description: Seconds the probe process may run (importing a real torch takes a few).
    type: int
    default: 300
"""

EXAMPLES = r"""
- name: Prove the runtime before any unit starts
  inferops.sglang.sglang_runtime_probe:
    python: /opt/sglang/venv/bin/python
    cuda_version: "13.0"
    torch_version: 2.11.0+cu130
    sglang_version: 0.5.11

- name: What is installed, and what would have to be (never fails on a mismatch)
  inferops.sglang.sglang_runtime_probe:
    python: /opt/sglang/venv/bin/python
    cuda_version: "13.0"
    torch_version: 2.11.0+cu130
    sglang_version: 0.5.11
    checks: [versions]
    fail_on_error: false
  register: runtime
"""

RETURN = r"""
ok:
  description: Every check passed.
  returned: success
  type: bool
errors:
  description: Every problem found, each naming the package or library and the reason.
  returned: always
  type: list
  elements: str
  sample:
    - >-
      libcudart.so.12 (declared by the DDTree build sglang.srt.speculative.ddtree_utils
      (/opt/sglang/venv/lib/python3.11/site-packages/sglang/srt/speculative/ddtree_utils.py)) does not load with
      ctypes.CDLL: libcudart.so.12: cannot open shared object file: No such file or directory
      (LD_LIBRARY_PATH=/usr/local/cuda-13.0/lib64)
venv_exists:
  description: Whether O(python) exists and is executable.
  returned: always
  type: bool
python:
  description: The interpreter the checks ran in.
  returned: when the probe ran
  type: dict
  contains:
    executable:
      description: Its C(sys.executable).
      type: str
    prefix:
      description: Its C(sys.prefix) (the virtual environment).
      type: str
    version:
      description: Its Python version.
      type: str
installed:
  description: Installed version of C(torch) and C(sglang) (and the kernel package C(sgl-kernel)); null when absent.
  returned: always
  type: dict
  sample: {"torch": "2.11.0+cu130", "sglang": "0.5.11", "sgl-kernel": null}
needs_install:
  description: Requirement strings for the pins that are not installed (empty when all are).
  returned: always
  type: list
  elements: str
  sample: ["torch==2.11.0+cu130"]
torch:
  description: What C(import torch) gave.
  returned: when the torch check ran
  type: dict
  contains:
    version:
      description: C(torch.__version__).
      type: str
    cuda:
      description: C(torch.version.cuda); null for a CPU build.
      type: str
    error:
      description: Why C(import torch) failed; null when it worked.
      type: str
libraries:
  description: Each library loaded with C(ctypes.CDLL).
  returned: when the library check ran
  type: list
  elements: dict
  contains:
    name:
      description: The library name.
      type: str
    source:
      description: C(configured) (O(libraries)) or C(ddtree) (declared by the DDTree build).
      type: str
    loaded:
      description: Whether it loaded.
      type: bool
    path:
      description: The file the loader opened.
      type: str
    error:
      description: The loader's reason when it did not load.
      type: str
    runtime_version:
      description: C(cudaRuntimeGetVersion) of a CUDA runtime (13000 for 13.0).
      type: int
ddtree:
  description: The DDTree build's declaration (C(path) null when no DDTree build is installed).
  returned: when the library check ran
  type: dict
  sample: {"module": "sglang.srt.speculative.ddtree_utils", "path": null, "libraries": [], "error": null}
cuda_version:
  description: The toolkit major.minor the runtime was checked against.
  returned: always
  type: str
  sample: "13.0"
ld_library_path:
  description: The C(LD_LIBRARY_PATH) the checks ran with.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _runtime_probe as probe

# Reported, not pinned: SGLang's kernel package.
REPORTED = ("sgl-kernel",)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", default="/opt/sglang/venv/bin/python"),
            cuda_version=dict(type="str", required=True),
            cuda_home=dict(type="path"),
            torch_version=dict(type="str"),
            sglang_version=dict(type="str"),
            libraries=dict(type="list", elements="str"),
            ddtree_module=dict(type="str", default=probe.DDTREE_MODULE),
            library_path=dict(type="list", elements="path", default=[]),
            environment=dict(type="dict", default={}),
            checks=dict(type="list", elements="str", choices=list(probe.CHECKS), default=list(probe.CHECKS)),
            fail_on_error=dict(type="bool", default=True),
            timeout=dict(type="int", default=300),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        cuda = probe.cuda_major_minor(p["cuda_version"])
    except probe.ProbeError as exc:
        module.fail_json(msg=str(exc), errors=[str(exc)])
    pins = {"torch": p["torch_version"], "sglang": p["sglang_version"]}
    errors = probe.pin_errors(p["torch_version"], cuda)
    if p["timeout"] < 1:
        errors.append(f"timeout must be at least 1 second, got {p['timeout']}")
    if errors:
        module.fail_json(msg="the runtime pins disagree: " + "; ".join(errors), errors=errors, cuda_version=probe.cuda_text(cuda))

    cuda_home = p["cuda_home"] or f"/usr/local/cuda-{probe.cuda_text(cuda)}"
    ld_path = probe.library_path(cuda_home, p["library_path"], p["environment"])
    libraries = p["libraries"] if p["libraries"] is not None else probe.default_libraries(p["sglang_version"], cuda)
    python = p["python"]
    where = os.path.dirname(os.path.dirname(python)) or python
    result = dict(changed=False, cuda_version=probe.cuda_text(cuda), ld_library_path=ld_path,
                  venv_exists=os.path.isfile(python) and os.access(python, os.X_OK))

    if not result["venv_exists"]:
        installed = {name: None for name in list(pins) + list(REPORTED)}
        errors = [f"{python} does not exist: the SGLang virtual environment is not installed"]
        result.update(ok=False, errors=errors, installed=installed, needs_install=probe.needs_install(installed, pins))
        if p["fail_on_error"]:
            module.fail_json(msg=errors[0], **result)
        module.exit_json(**result)

    argv = probe.command(python, ld_path, p["environment"], p["timeout"])
    data = probe.request(p["checks"], list(pins) + list(REPORTED), libraries, p["ddtree_module"])
    rc, out, err = module.run_command(argv, data=data)
    report = probe.parse_report(out)
    if report is None:
        reason = "timed out" if rc in (124, 137) else f"exit {rc}"
        module.fail_json(msg=f"the runtime probe did not complete in {python} ({reason}): {(err or out).strip()[-500:]}",
                         rc=rc, stdout=out, stderr=err, **result)

    errors = probe.evaluate(report, pins if "versions" in p["checks"] else {}, cuda, ld_path, where)
    installed = report.get("installed") or {}
    result.update(ok=not errors, errors=errors, installed=installed, needs_install=probe.needs_install(installed, pins),
                  python={key: report.get(key) for key in ("executable", "prefix", "version")})
    for key in ("torch", "libraries", "ddtree"):
        if key in report:
            result[key] = report[key]
    if errors and p["fail_on_error"]:
        module.fail_json(msg=f"the SGLang runtime in {where} is not fit for CUDA {probe.cuda_text(cuda)}: "
                         + "; ".join(errors), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
