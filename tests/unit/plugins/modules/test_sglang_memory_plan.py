"""sglang_memory_plan: every variant planned on a ct129 stand-in: the fake
nvidia-smi (GPU 1 lost), the lab model directories and the SGLang version of
the simulator's installed package."""

from __future__ import annotations

import sys

import pytest
import yaml
from sim_helpers import MODELS, REPO, run_module

from ansible_collections.inferops.sglang.plugins.modules import sglang_memory_plan

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())


@pytest.fixture
def ct129(sim_install, hardware, monkeypatch, fake_nvidia_smi):
    monkeypatch.setenv("PYTHONPATH", str(sim_install("0.5.11")))
    for key, value in hardware("ct129").items():
        if key.startswith("SGLANG_SIM"):
            monkeypatch.setenv(key, value)
    fake_nvidia_smi()


def run(capsys, **overrides) -> tuple[int, dict]:
    args = dict(variants=DEFAULTS["sglang_service_variants"], aliases=DEFAULTS["sglang_service_variant_aliases"],
                python=sys.executable, model_path=str(MODELS / "Qwen3.6-27B"),
                draft_model_path=str(MODELS / "Qwen3.6-27B-DFlash"), tp_size=2, gpu_devices=[0, 2], host="ct129")
    args.update(overrides)
    return run_module(sglang_memory_plan.main, capsys, args)[:2]


def test_every_variant_on_ct129(ct129, capsys):
    rc, result = run(capsys)
    assert rc == 0 and result["changed"] is False
    assert result["sglang_version"] == "0.5.11+simulator"
    assert result["gpu_memory_mib"] == [49140, 49140]
    # 7 usable GPUs; the model's 24/4/16/48 heads allow 1, 2 and 4
    assert result["tp_candidates"] == [1, 2, 4]
    assert result["fits"] == {"nextn": True, "shadow": False, "shadow-small": False, "shadow-nograph": False,
                              "shadow-balanced": True}
    assert result["plans"]["shadow"]["binding"] == "static_pool"
    assert result["plans"]["shadow-small"]["binding"] == "dynamic"
    # the field team's eventual fix on this host would have been TP 4
    assert result["plans"]["shadow"]["suggestions"][0].startswith("tp_size 4 (4 GPUs): fits at mem_fraction_static 0.88")
    assert result["table"][0].split()[:4] == ["host", "variant", "fits", "mfs"]
    assert [line.split()[1] for line in result["table"][1:]] == sorted(DEFAULTS["sglang_service_variants"])
    assert any(line.startswith("ct129 shadow: the static pool does not fit") for line in result["report"])


def test_one_variant_by_alias_with_given_memory(capsys):
    """No host needed: memory and version given (what a controller-side plan does)."""
    rc, result = run(capsys, names=["balanced"], gpu_devices=[], gpu_memory_mib=[97887, 97887], sglang_version="0.5.11",
                     tp_candidates=[])
    assert rc == 0
    assert list(result["plans"]) == ["shadow-balanced"] and result["fits"]["shadow-balanced"]
    assert result["plans"]["shadow-balanced"]["gpu_memory_gib"] == 95.59


def test_lost_gpu_and_unknown_variant(ct129, capsys):
    rc, result = run(capsys, gpu_devices=[0, 1])
    assert rc == 1 and result["msg"].startswith("GPU 1 is not usable: ")
    rc, result = run(capsys, names=["turbo", "nextn"])
    assert rc == 0
    assert result["errors"]["turbo"].startswith("unknown variant 'turbo'")
    assert list(result["plans"]) == ["nextn"]
    assert any(line.split()[:3] == ["ct129", "turbo", "ERROR"] for line in result["table"])


def test_unknown_assumption(ct129, capsys):
    rc, result = run(capsys, assumptions={"context_gib": 1})
    assert rc == 1 and "unknown assumptions ['context_gib']" in result["msg"]


def test_check_mode_plans_too(ct129, capsys):
    result = run_module(sglang_memory_plan.main, capsys, dict(
        variants=DEFAULTS["sglang_service_variants"], python=sys.executable, model_path=str(MODELS / "Qwen3.6-27B"),
        draft_model_path=str(MODELS / "Qwen3.6-27B-DFlash"), tp_size=2, gpu_devices=[0, 2]), check_mode=True)[1]
    assert result["fits"]["nextn"] is True and result["changed"] is False
