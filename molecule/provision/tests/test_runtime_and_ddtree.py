"""The SGLang runtime and the DDTree build on the provisioned ct129 stand-in
(molecule verify, pytest-testinfra; runs after the toolkit tests).

Converge made the venv from the offline wheelhouse (the SGLang simulator and the
torch stand-in, both test doubles) with the role's constraints file, and the
probe loaded the toolkit's libcudart.so.13 for real. ct129 has CUDA 13 user
space only; the lab's DDTree build (lab/ddtree/build.py) carries a gcc-built
ddtree_kernels.so that needs libcudart.so.12 (ELF DT_NEEDED), as the real
build's kernels did. The ddtree_build role applies it held, the runtime probe
reads its dependencies with the unit's environment and rejects it, naming the
library and the file, and the build is rolled back before any SGLang unit
exists: the field story's first-request crash, caught at provisioning. The
host manifest records the build's failed verdict. Reverting it provisions
cleanly: test_zz_cuda_toolkit_downgrade.py, whose run also moves the toolkit back.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import testinfra
from test_cuda_toolkit import playbook

HOST = testinfra.get_host("podman://prov-ct129")
VENV = "/opt/sglang/venv"
MANIFEST = "/var/lib/inferops-sglang/ddtree/manifest.json"
HOST_MANIFEST = "/etc/inferops-sglang/host.json"
PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
SPECULATIVE = f"{VENV}/lib/python3.11/site-packages/sglang/srt/speculative"
DDTREE_FILE = f"{SPECULATIVE}/ddtree_utils.py"
KERNELS = f"{SPECULATIVE}/ddtree_kernels.so"
CONSTRAINTS = PROJECT / "roles/sglang_runtime/files/constraints/sglang-0.5.11-cu130.txt"
# The lab's DDTree build, built (or reused from its keyed cache) on the controller
BUILT = subprocess.run([sys.executable, str(PROJECT / "lab/ddtree/build.py")], capture_output=True, text=True,
                       check=True).stdout.strip()
BUILD = [
    f"ddtree_build_src_dir={BUILT}",
    "ddtree_build_source=overlay",
    # ddtree_build_sglang_version and _venv: the role's defaults, what sglang_runtime installed (0.5.11+simulator)
]
OVERLAY = [*BUILD, "cuda_toolkit_package_version=13.0.2-1"]  # where test_cuda_toolkit_version_change.py left the toolkit


def venv_python(code: str) -> str:
    return HOST.check_output(f"{VENV}/bin/python -c '{code}'")


def test_venv_holds_the_pinned_runtime():
    assert HOST.file(VENV).user == "root"
    assert HOST.file(VENV).mode & 0o005 == 0o005  # the service user can read and enter it
    assert venv_python("import torch; print(torch.__version__, torch.version.cuda)") == "2.11.0+cu130 13.0"
    assert venv_python("import importlib.metadata as m; print(m.version(\"sglang\"))") == "0.5.11+simulator"
    assert not HOST.file(DDTREE_FILE).exists


def test_pip_installs_from_the_wheelhouse_only():
    conf = HOST.file(f"{VENV}/pip.conf")
    assert conf.mode == 0o600
    assert "no-index" in conf.content_string


def test_the_constraints_file_is_the_roles_for_the_pinned_release_and_cuda_build():
    f = HOST.file(f"{VENV}/inferops-constraints.txt")
    assert (f.user, f.group, f.mode) == ("root", "root", 0o644)
    assert f.content_string == CONSTRAINTS.read_text()


def test_ddtree_needing_cuda12_is_rejected_and_rolled_back_on_ct129():
    run = playbook(*OVERLAY)
    out = " ".join((run.stdout + run.stderr).split())
    assert run.returncode != 0, out[-4000:]
    assert (f"libcudart.so.12 needed by {KERNELS} (the DDTree build) does not resolve "
            "(LD_LIBRARY_PATH=/usr/local/cuda-13.0/lib64, RUNPATH=none)") in out, out[-4000:]
    assert "rolled back; SGLang's own files are in place (no DDTree build)." in out, out[-4000:]
    rejected = re.search(r"The DDTree build ([0-9a-f]{64}) was rejected by the runtime probe in /opt/sglang/venv", out)
    assert rejected, out[-4000:]
    # nothing of the build is left: SGLang's own files, no build manifest
    assert not HOST.file(DDTREE_FILE).exists and not HOST.file(KERNELS).exists
    assert not HOST.file(MANIFEST).exists
    assert not HOST.run("systemctl list-unit-files 'sglang*'").stdout.count(".service")
    # the host manifest records the rejected build's failed verdict, and SGLang's own
    # (probed after the rollback) passing: deploy.yml refuses the DDTree variants, deploys NEXTN
    host = json.loads(HOST.file(HOST_MANIFEST).content_string)
    assert host["ddtree"] is None, host["ddtree"]
    ddtree = host["builds"]["ddtree"]
    assert ddtree["ok"] is False and ddtree["build_id"] == rejected.group(1), ddtree
    needed = f"libcudart.so.12 needed by {KERNELS} (the DDTree build)"
    assert any(e.startswith(needed) for e in ddtree["errors"]), ddtree
    assert host["builds"]["sglang"]["ok"] is True, host["builds"]["sglang"]
