"""The simulator's pool sizing against SGLang's formulas, on the field story's numbers."""

from __future__ import annotations

import pytest
from sim_helpers import MODELS
from sglang_simulator import memory, model, versions

TARGET = model.load(str(MODELS / "Qwen3.6-27B"))
DRAFT = model.load(str(MODELS / "Qwen3.6-27B-DFlash"))
A6000_MIB = 49140
FREE_MIB = A6000_MIB - 500
V0511 = versions.release("0.5.11")


def test_model_reading():
    assert TARGET.full_attention_layers == 16 and TARGET.linear_attention_layers == 48
    assert TARGET.weight_bytes == 55_560_000_000
    assert (TARGET.num_kv_heads, TARGET.head_dim) == (4, 256)
    assert DRAFT.block_size == 16 and DRAFT.num_layers == 5


def test_gated_deltanet_state_per_request_matches_sglang_shapes():
    # conv: (48*128 + 2*16*128)/tp * (4-1) bf16; ssm: 48/tp * 128 * 128 float32; 48 layers
    assert memory.mamba_per_request_bytes(TARGET, 2) == ((10240 // 2) * 3 * 2 + 24 * 128 * 128 * 4) * 48
    assert memory.mamba_per_request_bytes(TARGET, 4) == ((10240 // 4) * 3 * 2 + 12 * 128 * 128 * 4) * 48


def test_kv_cell_counts_only_full_attention_layers():
    assert memory.kv_cell_bytes(TARGET, 2) == 2 * 512 * 16 * 2
    assert memory.kv_cell_bytes(TARGET, 8) == 1 * 512 * 16 * 2  # at least one KV head per rank


def plan(tp=2, version=V0511, free=FREE_MIB, **kw):
    draft = DRAFT if kw.get("speculative_algorithm") in ("DDTREE", "DFLASH") else None
    return memory.plan(version, TARGET, draft, memory.ServerConfig(tp_size=tp, **kw), A6000_MIB, free)


NEXTN = dict(speculative_algorithm="NEXTN", mem_fraction_static=0.88, context_length=131072, max_running_requests=16)
SHADOW = dict(speculative_algorithm="DDTREE", mem_fraction_static=0.88, context_length=131072, max_running_requests=16)
SMALL = dict(speculative_algorithm="DDTREE", mem_fraction_static=0.95, context_length=32768, max_running_requests=4)
BALANCED = dict(speculative_algorithm="DDTREE", mem_fraction_static=0.85, context_length=32768,
                max_running_requests=4, cuda_graph=False)


def test_nextn_fits_with_room_for_a_full_context():
    p = plan(**NEXTN)
    assert p.fits
    assert p.max_total_tokens >= 131072
    assert p.max_running_requests == 16


def test_shadow_production_envelope_raises_sglangs_pool_error():
    # 16 requests x 16 DFlash draft tokens of Gated DeltaNet state do not fit at TP 2.
    with pytest.raises(memory.PoolSizingError, match=r"Not enough memory\. Please try to increase "
                       r"--mem-fraction-static\. Current value: mem_fraction_static=0\.88"):
        plan(**SHADOW)


def test_shadow_small_starves_the_draft_model():
    p = plan(**SMALL)
    assert p.failed_stage == "draft_weights"
    nograph = plan(**{**SMALL, "cuda_graph": False})
    assert nograph.failed_stage == "draft_weights"


def test_balanced_fits_memory():
    p = plan(**BALANCED)
    assert p.fits and p.headroom_gib > 7


def test_dflash_cell_counts_the_draft_layers():
    p = plan(**BALANCED)
    assert p.cell_bytes == (32768 * (16 + 5) + 15) // 16


def test_higher_fraction_means_more_tokens_less_headroom():
    low, high = plan(**{**BALANCED, "mem_fraction_static": 0.80}), plan(**BALANCED)
    assert high.max_total_tokens > low.max_total_tokens
    assert high.headroom_gib < low.headroom_gib


def test_tp4_would_have_fit_every_variant():
    for variant in (SHADOW, SMALL, BALANCED):
        assert plan(tp=4, **variant).fits


def test_other_processes_memory_shrinks_the_pool():
    assert plan(free=FREE_MIB - 8192, **NEXTN).max_total_tokens < plan(**NEXTN).max_total_tokens


def test_0_5_23_error_names_the_minimum_fraction():
    # at 0.55 the weights (target and draft, both in the profile from 0.5.14) take more than the
    # static budget: rest <= 0 (0.5.14 model_runner_kv_cache_mixin.py:103-118)
    with pytest.raises(memory.PoolSizingError, match=r"Loaded weights leave no GPU memory for the KV cache "
                       r"under --mem-fraction-static=0\.55\. Raise --mem-fraction-static above"):
        plan(version=versions.release("0.5.23"), **{**SHADOW, "mem_fraction_static": 0.55},)


def test_0_5_23_shadow_fits_with_fewer_requests():
    """The production envelope that 0.5.11 cannot hold (the states of 16 requests x 16 draft tokens
    come first) fits from 0.5.13: slots and states are solved together and the requests capped at
    slots // 4 (0.5.13.post1 mixin :132-160; 0.5.14+ extra_buffer, lazy with speculation)."""
    p = plan(version=versions.release("0.5.23"), **SHADOW)
    assert p.max_running_requests == p.mamba_slots // 4 < 16


def test_default_fraction_follows_sglang_tiers():
    # 48 GB tier, tp 2: reserved = 512 + 4096*1.5 + 32*2 + 2/8*1024 = 6976 MB
    assert memory.default_mfs(V0511, A6000_MIB / 1024, 2, 4096, 32) == round((A6000_MIB - 6976) / A6000_MIB, 3)
    assert memory.gpu_tier(95.6, 2) == (8192, 256)


def test_missing_model_path_is_sglangs_repo_id_error(tmp_path):
    with pytest.raises(model.ModelPathError, match="Repo id must be in the form"):
        model.load(str(tmp_path / "absent"))


def test_nextn_without_a_draft_path_keeps_its_own_kv_pool_from_0_5_14():
    """0.5.14+ fold an EAGLE-family draft's KV into the cell only with --speculative-draft-model-path
    (_sglang_releases eagle_draft_cell_fold); NEXTN's MTP draft keeps its own pool of the same token
    count outside the profile, as before 0.5.14."""
    new = plan(version=versions.release("0.5.14"), **NEXTN)
    assert new.cell_bytes == memory.kv_cell_bytes(TARGET, 2) == 2 * 512 * 16 * 2
    stages = {s.name: s.gib for s in new.dynamic}
    # the MTP draft: 1 layer of the target's 16 full-attention layers
    assert stages["draft_kv_pool"] == pytest.approx(new.max_total_tokens * (2 * 512 * 16 * 2) // 16 / (1 << 30))
    assert "draft_weights" not in stages  # in the profile from 0.5.14
    old = plan(**NEXTN)
    assert {"draft_weights", "draft_kv_pool"} <= {s.name for s in old.dynamic}


def test_eagle_with_a_draft_path_folds_the_draft_kv_from_0_5_14():
    cfg = memory.ServerConfig(tp_size=2, speculative_algorithm="EAGLE", mem_fraction_static=0.88,
                              context_length=32768, max_running_requests=4, disable_radix_cache=True)
    new = memory.plan(versions.release("0.5.14"), TARGET, DRAFT, cfg, A6000_MIB, FREE_MIB)
    # cell + cell * draft_layers / target_layers: 5 draft layers over 16
    assert new.cell_bytes == 32768 + 32768 * 5 // 16
    assert "draft_kv_pool" not in {s.name for s in new.dynamic}


@pytest.mark.parametrize("version,cell", [
    # ceil(32768 * (16 + 5) / 16) (dflash_utils.py scale_kv_cell_size_per_token_for_dflash)
    ("0.5.17", (32768 * 21 + 15) // 16),
    # 0.5.18+: + the draft's own cell, 8 KV heads / 2 * (128 + 128) * 5 layers * 2 bytes
    # (0.5.18 speculative/dflash_utils.py:139-152)
    ("0.5.18", 32768 + 4 * 256 * 5 * 2),
    ("0.5.23", 32768 + 4 * 256 * 5 * 2),
])
def test_dflash_cell_per_release(version, cell):
    p = plan(version=versions.release(version), **BALANCED)
    assert p.cell_bytes == cell == 43008


def test_dflash_cell_sum_differs_from_scaling_for_another_draft():
    """With a draft of 2 KV heads the sum (0.5.18+) and the scaling (before) differ."""
    import dataclasses

    small = dataclasses.replace(DRAFT, num_kv_heads=2)
    cfg = memory.ServerConfig(tp_size=2, **BALANCED)
    scaled = memory.plan(versions.release("0.5.17"), TARGET, small, cfg, A6000_MIB, FREE_MIB).cell_bytes
    summed = memory.plan(versions.release("0.5.18"), TARGET, small, cfg, A6000_MIB, FREE_MIB).cell_bytes
    assert scaled == (32768 * 21 + 15) // 16 and summed == 32768 + 1 * 256 * 5 * 2


@pytest.mark.parametrize("version,tier", [("0.5.11", (2048, 24)), ("0.5.19", (2048, 24)), ("0.5.20", (4096, 48))])
def test_small_gpu_tier_per_release(version, tier):
    # 20-35 GiB: 0.5.11 server_args.py _handle_gpu_memory_settings; 0.5.23 arg_groups/memory_hook.py:101-117
    assert memory.gpu_tier(24.0, 1, versions.release(version)) == tier


@pytest.mark.parametrize("version", ["0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.16", "0.5.17", "0.5.18", "0.5.20",
                                     "0.5.23"])
@pytest.mark.parametrize("gpu_mib", [A6000_MIB, 97887])
def test_pool_agrees_with_the_planner(version, gpu_mib):
    """The simulator and the collection's planner read the same release table: with the same CUDA
    context (hardware.py CUDA_CONTEXT_MIB) they size the same static pool for the DDTree variants
    and for the hybrid model without speculation."""
    from ansible_collections.inferops.sglang.plugins.module_utils import _memplan

    target = _memplan.read_model_dir(str(MODELS / "Qwen3.6-27B"))
    draft = _memplan.read_model_dir(str(MODELS / "Qwen3.6-27B-DFlash"))
    release = versions.release(version)
    cases = {"balanced": BALANCED, "small": SMALL, "plain": dict(mem_fraction_static=0.88, context_length=32768)}
    for name, kw in cases.items():
        params = dict(kw, draft_model=kw.get("speculative_algorithm") == "DDTREE")
        params.pop("max_running_requests", None)
        params["max_running_requests"] = kw.get("max_running_requests")
        planned = _memplan.plan(target, draft if params["draft_model"] else None, [gpu_mib] * 2, 2, version, params,
                                {"context_mib": 500}, search=False)
        try:
            sim = memory.plan(release, TARGET, DRAFT if params["draft_model"] else None,
                              memory.ServerConfig(tp_size=2, **kw), gpu_mib, gpu_mib - 500)
        except memory.PoolSizingError:
            assert planned["binding"] == "static_pool", (name, planned["reason"])
            continue
        assert (sim.max_total_tokens, sim.mamba_slots) == \
            (planned["max_total_tokens"], planned["static"]["mamba_slots"]), name
