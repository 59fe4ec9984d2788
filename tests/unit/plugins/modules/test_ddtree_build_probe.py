"""A DDTree build is proven before it is committed, and a build the probe
rejects is rolled back: the ddtree_build role's sequence (apply held, probe,
commit or roll back; roles/ddtree_build/tasks/build.yml), module by module, on
a virtual environment with the real SGLang 0.5.11 installed. The build is the
lab's (lab/ddtree/build.py): ddtree_utils.py and the gcc-built
ddtree_kernels.so that needs libcudart.so.12, as on ct129, where only the
CUDA 13 user space is installed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from ddtree_helpers import DDTREE_UTILS, SGLANG_VERSION, ddtree_overlay, overlay_inputs, patch_inputs, site_packages, tree
from sim_helpers import run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _ddtree as d
from ansible_collections.inferops.sglang.plugins.modules import ddtree_build, sglang_runtime_probe

KERNELS = "sglang/srt/speculative/ddtree_kernels.so"


def lab_files() -> list[dict]:
    return [{"path": i["name"], "src": i["src"], "sha256": i["sha256"]} for i in overlay_inputs(ddtree_overlay())]


def build(capsys, venv: Path, tmp_path: Path, **overrides) -> tuple[int, dict]:
    args = dict(venv=str(venv), source="overlay", sglang_version=SGLANG_VERSION, built_by="alice",
                manifest=str(tmp_path / "state" / "manifest.json"), files=lab_files())
    args.update(overrides)
    return run_module(ddtree_build.main, capsys, args)[:2]


def probe(capsys, venv: Path, tmp_path: Path, library_path: list[str] | None = None) -> dict:
    """The role's probe: the unit's environment (no LD_LIBRARY_PATH of this process), the build's manifest."""
    args = dict(python=str(venv / "bin" / "python"), cuda_version="13.0", cuda_home="/nonexistent/cuda-13.0",
                checks=["libraries", "dependencies"], libraries=["libc.so.6"], library_path=library_path or [],
                ddtree_manifest=str(tmp_path / "state" / "manifest.json"), fail_on_error=False)
    rc, result = run_module(sglang_runtime_probe.main, capsys, args)[:2]
    assert rc == 0, result
    return result


def manifest(tmp_path: Path) -> dict | None:
    path = tmp_path / "state" / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else None


def kernels_path(venv: Path) -> str:
    return os.path.join(os.path.realpath(site_packages(venv)), KERNELS)


def test_the_rejected_build_is_rolled_back_and_no_build_is_left(venv, tmp_path, capsys, monkeypatch, cuda12):
    site = site_packages(venv)
    before = tree(site)
    # This process finds a CUDA 12 runtime; the unit (and so the probe) is not given it.
    monkeypatch.setenv("LD_LIBRARY_PATH", str(cuda12))
    rc, held = build(capsys, venv, tmp_path, hold=True)
    assert rc == 0 and held["changed"] is True and held["held"] is True, held
    assert manifest(tmp_path)["state"] == "pending"
    assert tree(site)[KERNELS] and d.held(str(site.resolve()), str(tmp_path / "state" / "manifest.json")) is not None

    result = probe(capsys, venv, tmp_path)
    assert result["ok"] is False
    assert result["ddtree_build"]["state"] == "pending" and result["ddtree_build"]["build_id"] == held["build_id"]
    assert result["errors"] == [f"libcudart.so.12 needed by {kernels_path(venv)} (the DDTree build) does not resolve "
                                "(LD_LIBRARY_PATH=/nonexistent/cuda-13.0/lib64, RUNPATH=none)"]

    rc, rolled = build(capsys, venv, tmp_path, state="rollback")
    assert rc == 0 and rolled["changed"] is True, rolled
    assert sorted(rolled["recovered"]) == sorted([DDTREE_UTILS, KERNELS])
    assert tree(site) == before and manifest(tmp_path) is None
    assert not (tmp_path / "state" / "originals").exists() and not (site / d.WORK_DIR).exists()
    # Nothing is held any more: commit and rollback have nothing to do.
    for state in ("commit", "rollback"):
        rc, result = build(capsys, venv, tmp_path, state=state)
        assert rc == 0 and result["changed"] is False and result["msg"] == f"no build is held: nothing to {state}"


def test_the_rejected_build_is_rolled_back_to_the_previous_build(venv, tmp_path, capsys):
    site = site_packages(venv)
    pristine_tree = tree(site)
    patches = [{"src": i["src"], "sha256": i["sha256"]} for i in patch_inputs()]
    rc, previous = build(capsys, venv, tmp_path, source="patch", files=None, patches=patches)
    assert rc == 0 and previous["held"] is False and manifest(tmp_path)["state"] == "applied"
    with_previous = tree(site)
    previous_manifest = manifest(tmp_path)

    rc, held = build(capsys, venv, tmp_path, hold=True)
    assert rc == 0 and held["held"] is True and held["build_id"] != previous["build_id"]
    assert probe(capsys, venv, tmp_path)["ok"] is False
    rc, rolled = build(capsys, venv, tmp_path, state="rollback")
    assert rc == 0 and rolled["changed"] is True
    assert tree(site) == with_previous and manifest(tmp_path) == previous_manifest
    assert rolled["manifest"]["build_id"] == previous["build_id"] and rolled["manifest"]["state"] == "applied"
    # The previous build's kept originals survived the rollback: it still reverts byte for byte.
    rc, reverted = build(capsys, venv, tmp_path, state="absent")
    assert rc == 0 and reverted["changed"] is True and tree(site) == pristine_tree


def test_the_build_the_probe_proves_is_committed(venv, tmp_path, capsys, cuda12):
    rc, held = build(capsys, venv, tmp_path, hold=True)
    assert rc == 0 and held["held"] is True
    result = probe(capsys, venv, tmp_path, library_path=[str(cuda12)])
    assert result["ok"] is True, result["errors"]
    assert result["dependencies"]["build_files"] == [kernels_path(venv)]
    assert result["environment"]["LD_LIBRARY_PATH"] == f"/nonexistent/cuda-13.0/lib64:{cuda12}"
    rc, committed = build(capsys, venv, tmp_path, state="commit")
    assert rc == 0 and committed["changed"] is True and committed["manifest"]["state"] == "applied"
    assert manifest(tmp_path) == committed["manifest"]
    assert d.pending(str(site_packages(venv).resolve()), str(tmp_path / "state" / "manifest.json")) is None
    # The same build again: nothing to apply, nothing held.
    rc, again = build(capsys, venv, tmp_path, hold=True)
    assert rc == 0 and again["changed"] is False and again["held"] is False
    # The kernels the probe read are the ones the simulator's first decode opens, for real.
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('u', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(m.accept_length([1, 2, 3, 9], [1, 2, 3, 4]))\n")
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(cuda12)}
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code, str(site_packages(venv) / DDTREE_UTILS)],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "3"


def test_a_held_build_nobody_proved_is_rolled_back_by_the_next_run(venv, tmp_path, capsys):
    site = site_packages(venv)
    before = tree(site)
    rc, held = build(capsys, venv, tmp_path, hold=True)
    assert rc == 0 and held["held"] is True
    # The play died between the apply and the probe: the next run of any kind rolls the build back first.
    rc, result = build(capsys, venv, tmp_path, state="absent")
    assert rc == 0 and sorted(result["recovered"]) == sorted([DDTREE_UTILS, KERNELS])
    assert tree(site) == before and manifest(tmp_path) is None


def test_check_mode_commit_and_rollback_change_nothing(venv, tmp_path, capsys):
    site = site_packages(venv)
    rc, held = build(capsys, venv, tmp_path, hold=True)
    during = tree(site)
    for state in ("commit", "rollback"):
        args = dict(venv=str(venv), state=state, manifest=str(tmp_path / "state" / "manifest.json"))
        rc, result = run_module(ddtree_build.main, capsys, args, check_mode=True)[:2]
        assert rc == 0 and result["changed"] is True
        assert tree(site) == during and manifest(tmp_path)["state"] == "pending"
    assert result["manifest"] is None  # rolled back, no build would be left


def test_a_file_changed_while_the_build_was_held_is_not_committed(venv, tmp_path, capsys):
    site = site_packages(venv)
    rc, held = build(capsys, venv, tmp_path, hold=True)
    (site / DDTREE_UTILS).write_text("# edited while the probe ran\n")
    rc, result = build(capsys, venv, tmp_path, state="commit")
    assert rc == 1 and "changed while the build was held for its probe" in result["msg"]
    assert manifest(tmp_path)["state"] == "pending"
