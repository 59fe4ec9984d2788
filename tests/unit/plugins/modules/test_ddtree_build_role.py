"""The ddtree_build role through real ansible-playbook runs on localhost, on a
virtual environment with the real SGLang 0.5.11 installed: the lab's build
(its ddtree_kernels.so needs libcudart.so.12) is proven before it is committed;
the probe rejects it where the unit's environment has no CUDA 12 runtime (ct129),
the build is rolled back to the previous build or to none, and the role fails
naming the library and the file that needs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from ddtree_helpers import FIXTURES, SGLANG_VERSION, ddtree_overlay, site_packages, tree
from sim_helpers import REPO

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: The role under test
      block:
        - name: DDTree build
          ansible.builtin.include_role:
            name: inferops.sglang.ddtree_build
      always:
        - name: Keep the verdict
          ansible.builtin.copy:
            content: "{{ ddtree_build_facts | default({}) | to_json }}"
            dest: "{{ out }}"
            mode: "0600"
"""


def play(tmp_path: Path, venv: Path, **extra) -> tuple[int, str, dict]:
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = False\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
               ANSIBLE_LOCALHOST_WARNING="0", USER="alice")
    env.pop("LD_LIBRARY_PATH", None)
    variables = dict(ddtree_build_venv=str(venv), ddtree_build_state_dir=str(tmp_path / "state"),
                     ddtree_build_source="overlay", ddtree_build_src_dir=str(ddtree_overlay()),
                     ddtree_build_sglang_version=SGLANG_VERSION, ddtree_build_probe_cuda_home="/nonexistent/cuda-13.0",
                     # The libraries check loads libcudart.so.13 from this machine's loader cache, if any:
                     # the build's own check is the ELF one.
                     ddtree_build_probe_checks=["dependencies"], out=str(tmp_path / "verdict.json"))
    variables.update(extra)
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "play.yml", "-e", json.dumps(variables)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    verdict = json.loads((tmp_path / "verdict.json").read_text()) if (tmp_path / "verdict.json").exists() else {}
    (tmp_path / "verdict.json").unlink(missing_ok=True)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split()), verdict


def manifest(tmp_path: Path) -> dict | None:
    path = tmp_path / "state" / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else None


def kernels(venv: Path) -> str:
    return os.path.join(os.path.realpath(site_packages(venv)), "sglang/srt/speculative/ddtree_kernels.so")


def test_on_ct129_the_build_is_rejected_and_no_build_is_left(venv, tmp_path):
    before = tree(site_packages(venv))
    rc, out, verdict = play(tmp_path, venv)
    assert rc == 2, out[-3000:]
    assert (f"was rejected by the runtime probe in {venv} and rolled back; SGLang's own files are in place "
            "(no DDTree build).") in out, out[-3000:]
    assert (f"libcudart.so.12 needed by {kernels(venv)} (the DDTree build) does not resolve "
            "(LD_LIBRARY_PATH=/nonexistent/cuda-13.0/lib64, RUNPATH=none)") in out
    assert tree(site_packages(venv)) == before and manifest(tmp_path) is None
    assert verdict["verdict"] == "rejected" and verdict["restored"] is None and len(verdict["errors"]) == 1
    assert verdict["environment"]["LD_LIBRARY_PATH"] == "/nonexistent/cuda-13.0/lib64"


def test_where_the_unit_has_the_cuda_12_runtime_the_build_is_committed(venv, tmp_path, cuda12):
    rc, out, verdict = play(tmp_path, venv, ddtree_build_probe_library_path=[str(cuda12)])
    assert rc == 0, out[-3000:]
    assert manifest(tmp_path)["state"] == "applied"
    assert verdict["verdict"] == "passed" and verdict["build_id"] == manifest(tmp_path)["build_id"]
    assert verdict["environment"]["LD_LIBRARY_PATH"] == f"/nonexistent/cuda-13.0/lib64:{cuda12}"
    # Proven once, committed: a second run changes nothing and proves it again.
    rc, out, again = play(tmp_path, venv, ddtree_build_probe_library_path=[str(cuda12)])
    assert rc == 0, out[-3000:]
    assert "changed=1 " in out  # the verdict file this test keeps; nothing of the role's
    for task in ("replaces with a journal)", "Commit the build the probe proved"):
        assert re.search(re.escape(task) + r"\] \*+ ok: \[localhost\]", out), task
    assert again["verdict"] == "passed"
    # The same build on a host that lost the runtime is not left installed: it is reverted.
    rc, out, rejected = play(tmp_path, venv)
    assert rc == 2 and "and reverted; SGLang's own files are in place (no DDTree build)." in out, out[-3000:]
    assert manifest(tmp_path)["state"] == "reverted" and rejected["verdict"] == "rejected"


def test_the_rejected_build_is_rolled_back_to_the_previous_build(venv, tmp_path):
    # The previous build: the fixture's patch series (no shared object), proven and committed.
    rc, out, first = play(tmp_path, venv, ddtree_build_source="patch", ddtree_build_src_dir=str(FIXTURES / "patch"))
    assert rc == 0 and first["verdict"] == "passed", out[-3000:]
    with_previous = tree(site_packages(venv))
    previous = manifest(tmp_path)
    rc, out, verdict = play(tmp_path, venv)
    assert rc == 2, out[-3000:]
    assert f"rolled back; the previous build {previous['build_id']} is in place again." in out
    assert tree(site_packages(venv)) == with_previous and manifest(tmp_path) == previous
    assert verdict["restored"] == previous["build_id"]
