"""sglang_model_stage as Ansible runs it: a stage from a local mirror, check mode, the
verify-only mode (quick and full) on a good and on a damaged model, and its refusals."""

from __future__ import annotations

import json
import os
import shutil

from model_helpers import make_model, publish
from sim_helpers import run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _model_stage as ms
from ansible_collections.inferops.sglang.plugins.modules import sglang_model_stage


def test_stage_check_mode_verify_and_refusals(tmp_path, capsys):
    mirror = publish(make_model(tmp_path / "build"), tmp_path / "mirror", "r1")
    dest = tmp_path / "models" / "tiny"
    args = {"path": str(dest), "source": str(mirror), "revision": "r1"}
    rc, result, _out = run_module(sglang_model_stage.main, capsys, args, check_mode=True)
    assert rc == 0 and result["changed"] is True and "would stage" in result["msg"] and not dest.exists()
    rc, result, _out = run_module(sglang_model_stage.main, capsys, args)
    assert rc == 0 and result["changed"] is True and dest.is_symlink() and result["fetched_bytes"] == result["bytes"]
    rc, result, _out = run_module(sglang_model_stage.main, capsys, args)
    assert rc == 0 and result["changed"] is False

    rc, result, _out = run_module(sglang_model_stage.main, capsys, {"path": str(dest), "state": "verified",
                                                                    "verify": "full", "revision": "r1"})
    assert rc == 0 and result["changed"] is False and result["problems"] == [] and result["revision"] == "r1"
    assert "passes the full check (4 files" in result["msg"]

    # a shard cut short in place: the quick check (sizes, headers) refuses it
    shard = dest / "model-00002-of-00002.safetensors"
    real = shard.resolve()
    os.truncate(real, real.stat().st_size - 10)
    rc, result, _out = run_module(sglang_model_stage.main, capsys, {"path": str(dest), "state": "verified"})
    assert rc == 1 and "fails the quick check" in result["msg"] and "model-00002-of-00002.safetensors has" in result["msg"]
    rc, result, _out = run_module(sglang_model_stage.main, capsys, {"path": str(dest), "state": "verified",
                                                                    "revision": "r2"})
    assert rc == 1 and "it is revision r1, not r2" in result["msg"]

    # a stage needs a source and a revision; a revision the manifest does not name is refused
    rc, result, _out = run_module(sglang_model_stage.main, capsys, {"path": str(dest)})
    assert rc == 1 and "source" in result["msg"] and "revision" in result["msg"]
    rc, result, _out = run_module(sglang_model_stage.main, capsys, dict(args, revision="r7"))
    assert rc == 1 and "refused: the source's manifest is of revision r1, not r7" in result["msg"]
    shutil.rmtree(tmp_path / "build")
    assert json.loads((dest / ms.MARKER).read_text())["revision"] == "r1"
