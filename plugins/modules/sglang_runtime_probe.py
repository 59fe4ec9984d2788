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
    C(libraries): every library of O(libraries) (what SGLang's kernel package opens itself with C(ctypes), so no
    ELF file names it) really loads with C(ctypes.CDLL). A loaded CUDA runtime must report the major version its
    name promises (C(cudaRuntimeGetVersion): 13000 for C(libcudart.so.13)).
  - >-
    C(dependencies): the files are the truth. Every shared object (C(*.so), C(*.so.*)) the distributions of
    O(scan_distributions) installed (their C(RECORD)), the installed DDTree build's shared objects (from its
    manifest O(ddtree_manifest)) and O(scan_paths) is read (its ELF dynamic section: C(DT_NEEDED), C(DT_RUNPATH),
    C(DT_RPATH), C(DT_SONAME); 32- and 64-bit, either byte order, read with C(struct)). Each needed name is
    looked for as glibc's loader would, with the unit's environment: the RPATH of the object (only when it has
    no RUNPATH, C($ORIGIN) expanded) and of the objects that loaded it, C(LD_LIBRARY_PATH), the RUNPATH,
    C(/etc/ld.so.cache) (read directly, C(ldconfig -p) as fallback), then the default directories (the
    multiarch ones, C(/lib64), C(/usr/lib64), C(/lib), C(/usr/lib)); a file of another ELF class or machine is
    skipped. The libraries found are read in turn. A name that another object of the set provides (its
    C(SONAME), for example torch's C(libc10.so) for sgl-kernel, loaded by C(import torch) first) resolves.
  - >-
    Each name that does not resolve fails the probe, with every file that needs it and where the loader looked,
    for example C(libcudart.so.12 needed by .../sglang/srt/speculative/ddtree_kernels.so (the DDTree build) does
    not resolve (LD_LIBRARY_PATH=/usr/local/cuda-13.0/lib64, RUNPATH=none)).
  - >-
    The libraries of the NVIDIA driver (O(driver_libraries), C(libcuda.so.1) first) are looked for the same way
    and fail the same way, naming the driver: a GPU host must have them where the unit's loader looks. Only
    O(require_driver=false) (a host prepared before its driver, a CI machine) reports them without failing.
  - >-
    The checks run with exactly RV(environment) and no other variable; hand the unit that environment (its
    C(Environment=) lines), or what was proven is not what runs.
  - >-
    Before running anything the pins are checked against each other: the local label of O(torch_version) must
    be the CUDA build of O(cuda_version) (C(+cu130) for 13.0); a disagreement always fails, whatever
    O(fail_on_error) says.
  - It never changes anything. RV(needs_install) lists the pins that are not installed, for the install step.
author:
  - inferops.sglang maintainers (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
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
      - Libraries that must load with C(ctypes.CDLL) (names for the loader to search, or absolute paths).
      - Default, per SGLang release line of O(sglang_version), what its kernel package preloads, the CUDA runtime
        of the toolkit major (C(libcudart.so.13) for CUDA 13.x).
    type: list
    elements: str
  scan_distributions:
    description:
      - The distributions whose shared objects the C(dependencies) check reads (from their C(RECORD)); absent
        ones are skipped and RV(dependencies.distributions) says which were found.
      - Default SGLang, its kernel packages (C(sglang-kernel), C(sgl-kernel), C(sgl-deep-gemm), C(sgl-flash-mla),
        C(sgl-deep-ep)), flashinfer (C(flashinfer-python), C(flashinfer-cubin), C(flashinfer-jit-cache)) and C(torch).
    type: list
    elements: str
  scan_paths:
    description: Further shared objects, or directories of them, the C(dependencies) check reads.
    type: list
    elements: path
    default: []
  ddtree_manifest:
    description:
      - The DDTree build's manifest (inferops.sglang.ddtree_build). The shared objects of a build it records as
        applied, or held for this probe, are read by the C(dependencies) check and named as the DDTree build's.
      - Absent is fine (no build).
    type: path
    default: /var/lib/inferops-sglang/ddtree/manifest.json
  driver_libraries:
    description: The libraries the NVIDIA driver provides, not a package or the toolkit.
    type: list
    elements: str
    default: [libcuda.so.1, libnvidia-ml.so.1, libnvidia-ptxjitcompiler.so.1, libnvidia-nvvm.so.4, libcudadebugger.so.1]
  require_driver:
    description:
      - V(true) fails when a driver library does not resolve. V(false) reports it in RV(dependencies) only.
    type: bool
    default: true
  library_path:
    description: Directories of the unit's C(LD_LIBRARY_PATH), after the toolkit's C(lib64) (see RV(environment)).
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
    choices: [versions, torch, libraries, dependencies]
    default: [versions, torch, libraries, dependencies]
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
      libcudart.so.12 needed by
      /opt/sglang/venv/lib/python3.11/site-packages/sglang/srt/speculative/ddtree_kernels.so (the DDTree build)
      does not resolve (LD_LIBRARY_PATH=/usr/local/cuda-13.0/lib64, RUNPATH=none)
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
      description: C(configured) (O(libraries)).
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
dependencies:
  description: What the C(dependencies) check read and found.
  returned: when the dependencies check ran
  type: dict
  contains:
    distributions:
      description: Each scanned distribution found, with its number of shared objects.
      type: dict
      sample: {"sglang": 1, "sglang-kernel": 13, "torch": 13}
    build_files:
      description: The DDTree build's shared objects read (from O(ddtree_manifest)).
      type: list
      elements: str
    scanned:
      description: Shared objects read from the distributions, the build and O(scan_paths).
      type: int
    objects:
      description: All objects read, with the libraries found for them.
      type: int
    unresolved:
      description: Each name that does not resolve, with the file that needs it (C(needed_by)), its C(runpath) and
        C(rpath) (null when absent), and C(build) (C(ddtree) for a file of the DDTree build).
      type: list
      elements: dict
      sample: [{"name": "libcudart.so.12", "needed_by": "/opt/sglang/venv/lib/python3.11/site-packages/sglang/srt/speculative/ddtree_kernels.so",
                "runpath": null, "rpath": null, "build": "ddtree"}]
    errors:
      description: Files whose dynamic section cannot be read (C(path), C(error)).
      type: list
      elements: dict
    ld_cache_error:
      description: Why C(/etc/ld.so.cache) could not be read (C(ldconfig -p) was used then); null when it was.
      type: str
    seconds:
      description: How long the scan took.
      type: float
ddtree_build:
  description: The DDTree build the probe found in O(ddtree_manifest) (C(build_id), C(state)); null without one.
  returned: when the dependencies check ran
  type: dict
environment:
  description:
    - Every variable the checks ran with, and no other (C(env -i)), with its value. This is what was proven;
      the unit must be given exactly this environment (C(Environment=) lines), for example through the host
      manifest provisioning writes.
  returned: always
  type: dict
  sample: {"LANG": "C.UTF-8", "LD_LIBRARY_PATH": "/usr/local/cuda-13.0/lib64",
           "PATH": "/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "PYTHONDONTWRITEBYTECODE": "1"}
cuda_version:
  description: The toolkit major.minor the runtime was checked against.
  returned: always
  type: str
  sample: "13.0"
ld_library_path:
  description: The C(LD_LIBRARY_PATH) the checks ran with (also in RV(environment)).
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _runtime_probe as probe

# Reported, not pinned: SGLang's kernel package (sgl-kernel, renamed sglang-kernel: the 0.5.11 venv has sglang_kernel-0.4.2).
REPORTED = ("sgl-kernel", "sglang-kernel")


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", default="/opt/sglang/venv/bin/python"),
            cuda_version=dict(type="str", required=True),
            cuda_home=dict(type="path"),
            torch_version=dict(type="str"),
            sglang_version=dict(type="str"),
            libraries=dict(type="list", elements="str"),
            scan_distributions=dict(type="list", elements="str"),
            scan_paths=dict(type="list", elements="path", default=[]),
            ddtree_manifest=dict(type="path", default=probe.DDTREE_MANIFEST),
            driver_libraries=dict(type="list", elements="str", default=list(probe.DRIVER_LIBRARIES)),
            require_driver=dict(type="bool", default=True),
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
    env = probe.environment(python, ld_path, p["environment"])
    result = dict(changed=False, cuda_version=probe.cuda_text(cuda), ld_library_path=ld_path, environment=env,
                  venv_exists=os.path.isfile(python) and os.access(python, os.X_OK))

    if not result["venv_exists"]:
        installed = {name: None for name in list(pins) + list(REPORTED)}
        errors = [f"{python} does not exist: the SGLang virtual environment is not installed"]
        result.update(ok=False, errors=errors, installed=installed, needs_install=probe.needs_install(installed, pins))
        if p["fail_on_error"]:
            module.fail_json(msg=errors[0], **result)
        module.exit_json(**result)

    argv = probe.command(python, env, p["timeout"])
    build, build_manifest = probe.build_files(p["ddtree_manifest"]) if "dependencies" in p["checks"] else ([], None)
    scan = p["scan_distributions"] if p["scan_distributions"] is not None else list(probe.SCAN_DISTRIBUTIONS)
    data = probe.request(p["checks"], list(pins) + list(REPORTED), libraries, scan, build, p["scan_paths"])
    rc, out, err = module.run_command(argv, data=data)
    report = probe.parse_report(out)
    if report is None:
        reason = "timed out" if rc in (124, 137) else f"exit {rc}"
        module.fail_json(msg=f"the runtime probe did not complete in {python} ({reason}): {(err or out).strip()[-500:]}",
                         rc=rc, stdout=out, stderr=err, **result)

    errors = probe.evaluate(report, pins if "versions" in p["checks"] else {}, cuda, ld_path, where,
                            p["driver_libraries"], p["require_driver"])
    installed = report.get("installed") or {}
    result.update(ok=not errors, errors=errors, installed=installed, needs_install=probe.needs_install(installed, pins),
                  python={key: report.get(key) for key in ("executable", "prefix", "version")})
    for key in ("torch", "libraries", "dependencies"):
        if key in report:
            result[key] = report[key]
    if "dependencies" in report:
        result["ddtree_build"] = ({"build_id": build_manifest.get("build_id"), "state": build_manifest.get("state"),
                                   "manifest": p["ddtree_manifest"]} if build_manifest else None)
    if errors and p["fail_on_error"]:
        module.fail_json(msg=f"the SGLang runtime in {where} is not fit for CUDA {probe.cuda_text(cuda)}: "
                         + "; ".join(errors), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
