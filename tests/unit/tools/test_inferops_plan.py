"""tools/inferops_plan.py, run as a user runs it on a laptop (a subprocess,
no Ansible on the path it needs), and the planner against the lab's SGLang
simulator: two separate implementations of SGLang's accounting must reach the
same verdict on every variant of the field story on both hosts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from sim_helpers import LAB, MODELS, REPO

from ansible_collections.inferops.sglang.plugins.module_utils import _memplan, _variants

TOOL = REPO / "tools" / "inferops_plan.py"
QWEN, DFLASH = str(MODELS / "Qwen3.6-27B"), str(MODELS / "Qwen3.6-27B-DFlash")
VARIANTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())["sglang_service_variants"]


def tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "--model", QWEN, "--draft", DFLASH, *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_table_for_ct129_and_exit_code():
    done = tool("--gpu-mib", "49140", "--tp", "2", "--sglang", "0.5.11", "--host", "ct129", "--tp-candidates", "1", "2", "4")
    assert done.returncode == 1, done.stderr  # some variants do not fit
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["host", "variant", "fits"]
    rows = {line.split()[1]: line.split()[2] for line in lines[1:6]}
    assert rows == {"nextn": "yes", "shadow": "NO", "shadow-balanced": "yes", "shadow-nograph": "NO", "shadow-small": "NO"}
    assert "    fits with: tp_size 4 (4 GPUs): fits at mem_fraction_static 0.88" in done.stdout


def test_json_one_variant_that_fits():
    done = tool("--gpu-mib", "97887", "--tp", "2", "--sglang", "0.5.11", "--variant", "balanced", "--json",
                "--set", "mem_fraction_static=0.9", "--assume", "context_mib=1024")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert row["variant"] == "shadow-balanced" and row["plan"]["fits"]
    assert row["plan"]["mem_fraction_static"] == 0.9
    assert row["plan"]["assumptions"]["context_mib"] == 1024


@pytest.mark.parametrize("args,message", [
    (["--gpu-mib", "49140", "--tp", "2", "--sglang", "0.5.11", "--assume", "vram=3"], "unknown --assume ['vram']"),
    (["--gpu-mib", "49140", "--tp", "2", "--sglang", "0.5.11", "--set", "oops"], "--set takes key=value"),
])
def test_bad_arguments(args, message):
    done = tool(*args)
    assert done.returncode != 0 and message in done.stderr


def test_bad_variant_value_is_reported_per_row():
    done = tool("--gpu-mib", "49140", "--tp", "2", "--sglang", "0.5.11", "--variant", "nextn", "--set", "mem_fraction_static=1.2")
    assert done.returncode == 1
    assert "nextn: mem_fraction_static must be in (0, 1), got 1.2" in done.stdout


@pytest.mark.parametrize("host,mib", [("ct129", 49140), ("ct200", 97887)])
def test_planner_and_simulator_agree_on_the_field_story(host, mib):
    sys.path.insert(0, str(LAB / "simulator"))
    from sglang_simulator import memory, model, versions  # noqa: E402 - the lab's test double

    target, draft = model.load(QWEN), model.load(DFLASH)
    hardware = json.loads((LAB / "hosts" / host / "hardware.json").read_text())
    assert min(g["memory_total_mib"] for g in hardware["gpus"]) == mib
    for name in VARIANTS:
        params = _variants.resolve(name, VARIANTS)[1]
        cfg = memory.ServerConfig(tp_size=2, mem_fraction_static=params["mem_fraction_static"],
                                  context_length=params["context_length"], cuda_graph=params["cuda_graph"],
                                  max_running_requests=params["max_running_requests"],
                                  speculative_algorithm=params["speculative_algorithm"],
                                  num_draft_tokens=params.get("speculative_num_draft_tokens"))
        try:
            sim = memory.plan(versions.release("0.5.11"), target, draft if params["draft_model"] else None, cfg,
                              mib, mib - 500)
            simulated = None if sim.fits else "dynamic"
        except memory.PoolSizingError:
            simulated = "static_pool"
        planned = _memplan.plan_resolved(params, QWEN, DFLASH, [mib, mib], 2, "0.5.11", search=False)
        assert planned["binding"] == simulated, (host, name, planned["reason"])
