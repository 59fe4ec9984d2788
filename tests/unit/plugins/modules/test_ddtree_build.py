"""ddtree_build: the module on a virtual environment with the real SGLang
0.5.11 installed, for both forms of the test build: apply, idempotence, check
mode, refusals before any change, revert."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ddtree_helpers import (DDTREE_UTILS, SERVER_ARGS, SGLANG_VERSION, SPEC_INFO, import_in, overlay_dir, overlay_inputs,
                            patch_inputs, sha256, site_packages, tree)
from sim_helpers import run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _ddtree as d
from ansible_collections.inferops.sglang.plugins.modules import ddtree_build


def run(capsys, venv: Path, tmp_path: Path, check_mode: bool = False, **overrides) -> tuple[int, dict]:
    args = dict(venv=str(venv), source="patch", sglang_version=SGLANG_VERSION, built_by="alice",
                manifest=str(tmp_path / "state" / "manifest.json"),
                patches=[{"src": i["src"], "sha256": i["sha256"]} for i in patch_inputs()])
    args.update(overrides)
    return run_module(ddtree_build.main, capsys, args, check_mode)[:2]


def test_patch_build_check_mode_then_apply_then_nothing_to_do(venv, tmp_path, capsys):
    site = site_packages(venv)
    before = tree(site)
    rc, result = run(capsys, venv, tmp_path, check_mode=True)
    assert rc == 0 and result["changed"] is True, result
    assert {c["path"]: c["action"] for c in result["changes"]} == {
        SERVER_ARGS: "replace", SPEC_INFO: "replace", DDTREE_UTILS: "create"}
    assert result["manifest"]["state"] == "applied" and result["manifest"]["applied_by"] == "alice"
    assert tree(site) == before and not (tmp_path / "state").exists()

    rc, result = run(capsys, venv, tmp_path)
    assert rc == 0 and result["changed"] is True, result
    assert result["site_packages"] == str(site.resolve())
    written = json.loads((tmp_path / "state" / "manifest.json").read_text())
    assert result["manifest"] == written and written["state"] == "applied" and written["source"] == "patch"
    assert result["build_id"] == written["build_id"] == d.build_id("patch", written["inputs"])
    assert import_in(venv) == "DDTREE True ['libcudart.so.12']"

    rc, again = run(capsys, venv, tmp_path)
    assert rc == 0 and again["changed"] is False and again["changes"] == [], again
    assert again["manifest"] == written
    rc, again = run(capsys, venv, tmp_path, check_mode=True)
    assert again["changed"] is False


def test_overlay_build_and_revert(venv, pristine, tmp_path, capsys):
    site = site_packages(venv)
    before = tree(site)
    overlay = overlay_dir(site_packages(pristine), tmp_path / "overlay")
    files = [{"path": i["name"], "src": i["src"], "sha256": i["sha256"]} for i in overlay_inputs(overlay)]
    rc, result = run(capsys, venv, tmp_path, source="overlay", patches=None, files=files)
    assert rc == 0 and result["changed"] is True, result
    assert tree(site)[SPEC_INFO] == sha256(overlay / SPEC_INFO)
    assert import_in(venv) == "DDTREE True ['libcudart.so.12']"
    rc, result = run(capsys, venv, tmp_path, source="overlay", patches=None, files=files)
    assert result["changed"] is False

    rc, result = run(capsys, venv, tmp_path, check_mode=True, state="absent")
    assert rc == 0 and result["changed"] is True and result["manifest"]["state"] == "reverted"
    assert {c["path"]: c["action"] for c in result["changes"]} == {SPEC_INFO: "replace", DDTREE_UTILS: "remove"}
    assert tree(site) != before

    rc, result = run(capsys, venv, tmp_path, state="absent", built_by="carol")
    assert rc == 0 and result["changed"] is True, result
    assert tree(site) == before
    written = json.loads((tmp_path / "state" / "manifest.json").read_text())
    assert written["state"] == "reverted" and written["reverted_by"] == "carol" and written["applied_by"] == "alice"
    rc, result = run(capsys, venv, tmp_path, state="absent")
    assert rc == 0 and result["changed"] is False


@pytest.mark.parametrize("case, match", [
    ("checksum", "0002-spec-info-ddtree-algorithm.patch: checksum mismatch"),
    ("version", "the build is for SGLang 0.5.9 but .* has SGLang 0.5.11"),
    ("syntax", "the build's Python files do not compile: sglang/srt/speculative/ddtree_utils.py line 1"),
    ("mixed", "source=patch takes patches \\(and no files\\)"),
])
def test_refusals_change_nothing(venv, tmp_path, capsys, case, match):
    site = site_packages(venv)
    before = tree(site)
    overrides: dict = {}
    if case == "checksum":
        overrides["patches"] = [{"src": i["src"], "sha256": i["sha256"]} for i in patch_inputs()]
        overrides["patches"][1]["sha256"] = "f" * 64
    elif case == "version":
        overrides["sglang_version"] = "0.5.9"
    elif case == "syntax":
        bad = tmp_path / "ddtree_utils.py"
        bad.write_text("CUDA_LIBRARIES = [\n")
        overrides.update(source="overlay", patches=None, files=[{"path": DDTREE_UTILS, "src": str(bad), "sha256": sha256(bad)}])
    else:
        overrides["files"] = [{"path": DDTREE_UTILS, "src": "/nonexistent", "sha256": "0" * 64}]
    rc, result = run(capsys, venv, tmp_path, **overrides)
    assert rc == 1 and result["failed"] is True
    assert re.search(match, result["msg"]), result["msg"]
    assert tree(site) == before and not (tmp_path / "state").exists()


def test_an_interrupted_build_is_reported_in_check_mode_and_recovered_by_a_run(venv, tmp_path, capsys, monkeypatch):
    site = site_packages(venv)
    before = tree(site)
    real = d.os.replace

    def crash_after_one(src, dst):
        real(src, dst)
        raise KeyboardInterrupt  # not an Exception: nothing in the module catches it, like a kill

    monkeypatch.setattr(d, "replace_file", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        run(capsys, venv, tmp_path)
    capsys.readouterr()
    monkeypatch.setattr(d, "replace_file", real)
    half = tree(site)
    assert half != before and d.pending(str(site.resolve()), str(tmp_path / "state" / "manifest.json")) is not None

    rc, result = run(capsys, venv, tmp_path, check_mode=True)
    assert rc == 0 and result["changed"] is True and result["recovered"] == [SERVER_ARGS]
    assert "interrupted build is pending" in result["msg"] and tree(site) == half

    rc, result = run(capsys, venv, tmp_path)
    assert rc == 0 and result["changed"] is True and result["recovered"] == [SERVER_ARGS], result
    assert json.loads((tmp_path / "state" / "manifest.json").read_text())["state"] == "applied"
    assert import_in(venv) == "DDTREE True ['libcudart.so.12']"
    rc, result = run(capsys, venv, tmp_path, state="absent")
    assert rc == 0 and tree(site) == before
