"""tools/inferops_model_manifest.py: a mirror's manifest written for a model directory, and
the directory checked against it (what the sglang_model role and the deploy's preflight read)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from model_helpers import make_model
from sim_helpers import REPO

TOOL = REPO / "tools" / "inferops_model_manifest.py"


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, check=False)


def test_the_tool_writes_a_manifest_the_checks_read_and_finds_a_cut_file(tmp_path):
    model = make_model(tmp_path / "m")
    done = run(model, "--revision", "2026-11-30")
    assert done.returncode == 0 and "revision 2026-11-30, 4 files" in done.stdout
    manifest = json.loads((model / "inferops-manifest.json").read_text())
    assert manifest["revision"] == "2026-11-30" and "inferops-manifest.json" not in manifest["files"]
    assert run(model, "--check", "--full").returncode == 0
    os.truncate(model / "model-00001-of-00002.safetensors", 1000)
    checked = run(model, "--check")
    assert checked.returncode == 1 and "model-00001-of-00002.safetensors has 1000 bytes" in checked.stdout
    assert run(model).returncode == 2  # a manifest needs its revision
    refused = run(model, "--revision", "../up")
    assert refused.returncode == 2 and "revision '../up' must be" in refused.stderr and "Traceback" not in refused.stderr


def test_the_manifest_is_replaced_in_one_step_never_through_a_planted_link(tmp_path):
    """The tool used to write ``inferops-manifest.json.tmp`` then rename it: a link there sent the
    write elsewhere. The temporary file is created exclusively now (_state_files.write_atomic),
    and the manifest gets the mode a new file gets under the caller's umask."""
    model = make_model(tmp_path / "m")
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    planted = model / "inferops-manifest.json.tmp"
    planted.symlink_to(victim)
    done = subprocess.run([sys.executable, str(TOOL), str(model), "--revision", "2026-11-30"],
                          capture_output=True, text=True, check=False, umask=0o027)
    assert done.returncode == 0, done.stderr
    manifest = model / "inferops-manifest.json"
    assert json.loads(manifest.read_text())["revision"] == "2026-11-30" and not manifest.is_symlink()
    assert victim.read_text() == "someone else's file\n" and planted.is_symlink()
    assert oct(manifest.stat().st_mode & 0o777) == "0o640"
    assert not [name for name in os.listdir(model) if name.startswith(".inferops-manifest.json.")]
