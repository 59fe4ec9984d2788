"""The SGLang runtime and the DDTree build on the provisioned ct129 stand-in
(molecule verify, pytest-testinfra; runs after the toolkit tests).

Converge made the venv from the offline wheelhouse (the SGLang simulator and the
torch stand-in, both test doubles) and the probe loaded the toolkit's
libcudart.so.13 for real. ct129 has CUDA 13 user space only; the DDTree build
declares the CUDA 12 runtime its kernels open, so provisioning it there must
fail at the probe, naming the library, before any SGLang unit exists: the field
story's first-request crash, caught at provisioning. Reverting the build makes
the host provision cleanly again.
"""

from __future__ import annotations

import json
import os

import testinfra
from test_cuda_toolkit import playbook

HOST = testinfra.get_host("podman://prov-ct129")
VENV = "/opt/sglang/venv"
MANIFEST = "/var/lib/inferops-sglang/ddtree/manifest.json"
HOST_MANIFEST = "/etc/inferops-sglang/host.json"
DDTREE_FILE = f"{VENV}/lib/python3.11/site-packages/sglang/srt/speculative/ddtree_utils.py"
OVERLAY = [
    f"ddtree_build_src_dir={os.environ['MOLECULE_PROJECT_DIRECTORY']}/lab/ddtree/overlay",
    "ddtree_build_source=overlay",
    "ddtree_build_sglang_version=0.5.11+simulator",
    "cuda_toolkit_package_version=13.0.2-1",  # where test_cuda_toolkit_version_change.py left the toolkit
]


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


def test_ddtree_needing_cuda12_fails_provisioning_on_ct129_before_any_unit():
    run = playbook(*OVERLAY)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-4000:]
    assert "libcudart.so.12: cannot open shared object file: No such file or directory" in out, out[-4000:]
    assert "declared by the DDTree build" in out, out[-4000:]
    manifest = json.loads(HOST.file(MANIFEST).content_string)
    assert (manifest["state"], manifest["source"], manifest["sglang_version"]) == ("applied", "overlay", "0.5.11+simulator")
    assert HOST.file(DDTREE_FILE).exists
    assert not HOST.run("systemctl list-unit-files 'sglang*'").stdout.count(".service")
    # the host manifest records the failed verdict of the build, not of SGLang itself,
    # so deploy.yml refuses the DDTree variants and still deploys NEXTN
    host = json.loads(HOST.file(HOST_MANIFEST).content_string)
    assert host["ddtree"]["build_id"] == manifest["build_id"]
    ddtree = host["builds"]["ddtree"]
    assert ddtree["ok"] is False and ddtree["name"] == f"ddtree {manifest['build_id'][:12]}"
    assert any("libcudart.so.12" in e for e in ddtree["errors"]), ddtree
    assert host["builds"]["sglang"]["ok"] is True, host["builds"]["sglang"]


def test_reverting_the_build_provisions_cleanly_again():
    run = playbook(*OVERLAY, "ddtree_build_state=absent")
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert not HOST.file(DDTREE_FILE).exists
    assert json.loads(HOST.file(MANIFEST).content_string)["state"] == "reverted"
    host = json.loads(HOST.file(HOST_MANIFEST).content_string)
    assert host["ddtree"] is None and set(host["builds"]) == {"sglang"} and host["builds"]["sglang"]["ok"] is True
    again = playbook(*OVERLAY, "ddtree_build_state=absent")
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-4000:]
