"""The memory planner per SGLang release family, against figures written out by hand
from each wheel's formulas (file:line into the wheel of the release named; the
switch points are _sglang_releases' entries, checked against the wheels by
tests/conformance/test_releases_wheels.py). Families: 0.5.9 | 0.5.10 | 0.5.11-0.5.12 |
0.5.13 | 0.5.14-0.5.16 | 0.5.17 | 0.5.18-0.5.19 | 0.5.20-0.5.21 | 0.5.22-0.5.23."""

from __future__ import annotations

import math

import pytest
import yaml
from sim_helpers import MODELS, REPO

from ansible_collections.inferops.sglang.plugins.module_utils import _memplan
from ansible_collections.inferops.sglang.plugins.module_utils import _variants

GIB = 1 << 30
ASSUME = {"context_mib": 768, "workspace_mib": 512, "activation_factor": 1.0,
          "graph_base_mib": 256, "graph_per_token_mib": 2}
A6000 = 49140     # ct129, 48 GiB: tier (4096, 32 | 160)
PRO6000 = 97887   # ct200
RTX4090 = 24564   # a 24 GB GPU: 20-35 GiB tier

LLAMA_WEIGHTS = 16060522496
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192}
# the token counts of piecewise graphs up to 4096 (0.5.11 server_args.py:1550-1566):
# 4..32 step 4 (8), 48..256 step 16 (14), 288..512 step 32 (8), 576..1024 step 64 (8), 1280..4096 step 256 (12)
PIECEWISE_4096 = 8 + 14 + 8 + 8 + 12
PIECEWISE_2048 = 8 + 14 + 8 + 8 + 4

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
QWEN_WEIGHTS = 55_560_000_000
DFLASH_WEIGHTS = 3_460_000_000
# Gated DeltaNet state per request, TP 2 (configs/mamba_utils.py Mamba2StateShape.create)
STATE = ((48 * 128 + 2 * 16 * 128) // 2 * (4 - 1) * 2 + (48 // 2) * 128 * 128 * 4) * 48


def llama(weights=LLAMA_WEIGHTS, **config):
    return _memplan.model_spec(dict(LLAMA, **config), weights)


def mfs_of(version, params=None, gpu=A6000, tp=1, **config):
    return _memplan.plan(llama(**config), None, [gpu], tp, version, params or {}, ASSUME,
                         search=False)["mem_fraction_static"]


def hand_mfs(gpu, reserved):
    return round((gpu - reserved) / gpu, 3)


# 48 GiB, TP 1, chunked 4096, decode graphs 32 (0.5.11 server_args.py:1320-1330):
# 512 + 4096 * 1.5 + 32 * 2 + 1/8 * 1024 (0.5.11 :1434-1456); no 10 GiB floor under 60 GiB
BASE_48 = 512 + 4096 * 1.5 + 32 * 2 + 1 / 8 * 1024


# --------------------------------------------------------------------------- a. piecewise graphs


@pytest.mark.parametrize("version,arch,params,reserved", [
    # 0.5.9: off unless --enable-piecewise-cuda-graph (0.5.9 server_args.py:604, reserve :1043-1046)
    ("0.5.9", "LlamaForCausalLM", {}, BASE_48),
    # 0.5.10.post1: on (server_args.py:637), off for speculative decoding (:1088-1090)
    ("0.5.10", "LlamaForCausalLM", {}, BASE_48 + PIECEWISE_4096 * 8),
    ("0.5.10", "LlamaForCausalLM", {"speculative_algorithm": "NEXTN"}, BASE_48 + 4096),
    # 0.5.11: on with speculative decoding too (:1194-1262 has no such rule), + 4 GiB spec reserve (:1473-1475)
    ("0.5.11", "LlamaForCausalLM", {"speculative_algorithm": "NEXTN"}, BASE_48 + PIECEWISE_4096 * 8 + 4096),
    # torch.compile piecewise graphs (0.5.10-0.5.14): off for the architecture list (0.5.11
    # server_args.py:1200-1203, configs/model_config.py; 0.5.14 :2997-3050)
    ("0.5.11", "Qwen3NextForCausalLM", {}, BASE_48),
    ("0.5.14", "Qwen3NextForCausalLM", {}, BASE_48),
    ("0.5.12", "DeepseekV4ForCausalLM", {}, BASE_48),
    ("0.5.11", "DeepseekV4ForCausalLM", {}, BASE_48 + PIECEWISE_4096 * 8),  # listed from 0.5.12.post1
    # breakable graphs by default on CUDA from 0.5.15 (model_executor/cuda_graph_config.py
    # default_prefill_backend): their rules have no architecture list (0.5.23 arg_groups/cuda_graph_hook.py:170-240)
    ("0.5.15", "Qwen3NextForCausalLM", {}, BASE_48 + PIECEWISE_4096 * 8),
    ("0.5.23", "Qwen3NextForCausalLM", {}, BASE_48 + PIECEWISE_4096 * 8),
    # --disable-cuda-graph keeps the piecewise reserve in 0.5.11 (:1457-1464 reads only
    # disable_piecewise_cuda_graph), drops it from 0.5.14 (prefill backend disabled, 0.5.14 :3300)
    ("0.5.11", "LlamaForCausalLM", {"cuda_graph": False}, BASE_48 + PIECEWISE_4096 * 8),
    ("0.5.14", "LlamaForCausalLM", {"cuda_graph": False}, BASE_48),
    # and from 0.5.15 the decode graph term too (0.5.15.post1 server_args.py:3639-3643)
    ("0.5.15", "LlamaForCausalLM", {"cuda_graph": False}, BASE_48 - 32 * 2),
    ("0.5.23", "LlamaForCausalLM", {}, BASE_48 + PIECEWISE_4096 * 8),
])
def test_default_mfs_piecewise_rule(version, arch, params, reserved):
    assert mfs_of(version, params, architectures=[arch], num_nextn_predict_layers=1) == hand_mfs(A6000, reserved)


# Qwen3.6's vision_config: depth 27 but no num_hidden_layers -> 24 layers, hidden 1152
# (adjust_mem_fraction_for_vlm, 0.5.11 server_args.py:7137-7173)
VLM_FACTOR = 0.95 * min(max(1.0 - 0.1 * (24 * 1152 ** 2 / (24 * 1024 ** 2) - 1.0), 0.8), 1.05)


@pytest.mark.parametrize("version,prefill_graphs", [
    ("0.5.14", False),  # multimodal: off (0.5.14 server_args.py:3022-3026)
    ("0.5.15", False),  # breakable, every multimodal model off (0.5.15.post1 server_args.py:3374)
    ("0.5.16", True),   # Qwen3_5ForConditionalGeneration on the breakable allowlist (0.5.16 configs/model_config.py)
    ("0.5.23", True),
])
def test_default_mfs_prefill_graphs_of_the_multimodal_hybrid(version, prefill_graphs):
    # ct129, TP 2, no speculation: 512 + 4096 * 1.5 + 32 * 2 + 2/8 * 1024 (+ 50 * 8 with prefill graphs), then the VLM factor
    reserved = 512 + 4096 * 1.5 + 32 * 2 + 2 / 8 * 1024 + (PIECEWISE_4096 * 8 if prefill_graphs else 0)
    result = _memplan.plan(qwen(), None, [A6000, A6000], 2, version, {"context_length": 32768}, ASSUME, search=False)
    assert result["mem_fraction_static"] == pytest.approx(hand_mfs(A6000, reserved) * VLM_FACTOR, abs=1e-9)


# --------------------------------------------------------------------------- b. GPU tiers


@pytest.mark.parametrize("version,tp,chunked,graph_bs", [
    # 20-35 GiB: (2048, 24 | 80) up to 0.5.19 (0.5.11 server_args.py, 0.5.19 arg_groups/memory_hook.py),
    # (4096, 48 | 160) from 0.5.20 (0.5.23 arg_groups/memory_hook.py:101-117)
    ("0.5.9", 1, 2048, 24), ("0.5.11", 4, 2048, 80), ("0.5.19", 1, 2048, 24),
    ("0.5.20", 1, 4096, 48), ("0.5.23", 1, 4096, 48), ("0.5.23", 4, 4096, 160),
])
def test_small_gpu_tier_per_release(version, tp, chunked, graph_bs):
    result = _memplan.plan(llama(), None, [RTX4090] * tp, tp, version, {}, ASSUME, search=False)
    assert (result["chunked_prefill_size"], result["cuda_graph_max_bs"]) == (chunked, graph_bs)


@pytest.mark.parametrize("gpu_gib,tier", [
    (19.9, (2048, 8)), (34.9, (4096, 48)), (59.9, (4096, 32)), (159.9, (8192, 256)), (180, (16384, 512)),
])
def test_every_tier_0_5_23(gpu_gib, tier):
    # 0.5.23 arg_groups/memory_hook.py:88-178 (< 20, < 35, < 60, < 90 and < 160 the same, else)
    assert _memplan.gpu_tier(gpu_gib, 1, _memplan.release((0, 5, 23))) == tier


# a 9B-class bf16 model: 18.5 GB of weights on a 24 GB GPU
NINE_B = 18_500_000_000


def test_24gb_gpu_0_5_23_refuses_what_0_5_11_fits():
    pre = (RTX4090 - 768) / 1024
    weights = NINE_B / GIB
    # 0.5.11: chunked 2048, graphs 24: 512 + 2048*1.5 + 24*2 + 1/8*1024 + 42*8 piecewise (server_args.py:1434-1464)
    old_mfs = hand_mfs(RTX4090, 512 + 2048 * 1.5 + 24 * 2 + 128 + PIECEWISE_2048 * 8)
    # 0.5.23: chunked 4096, graphs 48 (memory_hook.py:101-117), + 50*8 piecewise (reserve :309-325, :380-389)
    new_mfs = hand_mfs(RTX4090, 512 + 4096 * 1.5 + 48 * 2 + 128 + PIECEWISE_4096 * 8)
    assert (old_mfs, new_mfs) == (0.833, 0.704)
    old = _memplan.plan(llama(weights=NINE_B), None, [RTX4090], 1, "0.5.11", {}, ASSUME, search=False)
    new = _memplan.plan(llama(weights=NINE_B), None, [RTX4090], 1, "0.5.23", {}, ASSUME, search=False)
    assert (old["mem_fraction_static"], new["mem_fraction_static"]) == (old_mfs, new_mfs)
    # rest = post - pre * (1 - mfs) (0.5.11 model_runner_kv_cache_mixin.py:56-70)
    old_rest = (pre - weights) - pre * (1 - old_mfs)
    new_rest = (pre - weights) - pre * (1 - new_mfs)
    assert old_rest > 0 > new_rest
    assert old["max_total_tokens"] == int(old_rest * GIB) // (8 * 256 * 32 * 2)
    assert new["max_total_tokens"] == 0 and not new["fits"] and new["binding"] == "static_pool"
    # 0.5.14+ say so before the pool (kv_cache_configurator.py): minimum = 1 - post / pre
    assert "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.704" in new["reason"]
    assert f"Raise --mem-fraction-static above {1 - (pre - weights) / pre:.3f}" in new["reason"]


# --------------------------------------------------------------------------- c. 0.5.22+ graph cap, 0.5.17+ slots


@pytest.mark.parametrize("version,graph_bs", [("0.5.21", 32), ("0.5.22", 16), ("0.5.23", 16)])
def test_decode_graph_cap_at_a_set_max_running_requests(version, graph_bs):
    # 0.5.23 arg_groups/memory_hook.py:182-188: the default decode max_bs (32 here) capped at the set
    # max_running_requests (16) before the mfs reserve (:309-325) counts max_bs * 2
    result = _memplan.plan(llama(), None, [A6000], 1, version, {"max_running_requests": 16}, ASSUME, search=False)
    assert result["cuda_graph_max_bs"] == 16  # the plan's graph batch is capped by the requests anyway
    reserved = 512 + 4096 * 1.5 + graph_bs * 2 + 128 + PIECEWISE_4096 * 8
    assert result["mem_fraction_static"] == hand_mfs(A6000, reserved)


def qwen():
    return _memplan.read_model_dir(str(MODELS / "Qwen3.6-27B"))


def dflash():
    return _memplan.read_model_dir(str(MODELS / "Qwen3.6-27B-DFlash"))


def variant(name, **changes):
    params = _variants.resolve(name, DEFAULTS["sglang_service_variants"], DEFAULTS["sglang_service_variant_aliases"])[1]
    params.update(changes)
    return params


@pytest.mark.parametrize("version", ["0.5.16", "0.5.17", "0.5.23"])
def test_linear_attention_slots_without_speculation(version):
    """No speculative decoding, radix cache on: 0.5.14+ choose extra_buffer (5 slots per request).
    0.5.16 kv_cache_configurator.py:1795-1813 slots = budget // per_req, rest -= slots * per_req;
    0.5.17 :1948-1982 and 0.5.23 :3378-3385, :3405-3409: slots = (budget - per_slot) // per_slot and
    the pool's padding slot counted, rest -= (slots + 1) * per_slot. 0.5.18+ take the VLM cache
    (100 MiB) off the budget first (0.5.18 kv_cache_configurator.py:130-150)."""
    pre = (A6000 - 768) / 1024
    rest = (pre - QWEN_WEIGHTS / 2 / GIB) - pre * (1 - 0.88) - (100 / 1024 if version >= "0.5.18" else 0)
    budget = rest * 0.9 / 1.9 * GIB
    if version == "0.5.16":
        slots, counted = int(budget // STATE), int(budget // STATE)
    else:
        slots = int((budget - STATE) // STATE)
        counted = slots + 1
    tokens = int((rest - counted * STATE / GIB) * GIB) // ((4 // 2) * 512 * 16 * 2)
    result = _memplan.plan(qwen(), None, [A6000], 2, version, {"mem_fraction_static": 0.88, "context_length": 32768},
                           ASSUME, search=False)
    assert result["static"]["mamba_slots"] == slots and result["static"]["mamba_slots_per_request"] == 5
    assert result["max_total_tokens"] == tokens


# --------------------------------------------------------------------------- speculative decoding on the hybrid model


def shadow_balanced_by_hand(version: tuple) -> dict:
    """ct200 shadow-balanced (DDTREE with the DFlash draft: 16 draft tokens, 4 requests, mfs 0.85,
    radix cache on: the DDTree build does not refuse it) from each release's formulas."""
    pre = (PRO6000 - 768) / 1024
    post = pre - QWEN_WEIGHTS / 2 / GIB
    if version >= (0, 5, 14):  # the draft's weights in the profile (0.5.14 mixin :103-118)
        post -= DFLASH_WEIGHTS / 2 / GIB
    rest = post - pre * (1 - 0.85)
    if version >= (0, 5, 18):  # the VLM cache (0.5.18 kv_cache_configurator.py:130-150)
        rest -= 100 / 1024
    d, mrr = 16, 4
    # slots per request: 3 (no_buffer) up to 0.5.13; 0.5.14+ choose extra_buffer, lazy with spec: 3 + 1
    ratio = 4 if version >= (0, 5, 14) else 3
    if version < (0, 5, 13):
        # 0.5.11 mixin :73-91: the states of every request first, then the ratio branch :108-121
        rest -= STATE * mrr * d / GIB
        slots = int(rest * 0.9 / 1.9 * GIB // STATE)
        rest -= slots * STATE / GIB
    else:
        budget = rest * 0.9 / 1.9 * GIB
        if version >= (0, 5, 17):
            # 0.5.17 kv_cache_configurator.py:1930-1948: the padding slot in both buffers
            slots = int((budget - STATE * (1 + d)) // (STATE * (1 + d / ratio)))
            states = min(mrr, slots // ratio) + 1
            counted = slots + 1
        else:
            # 0.5.13.post1 mixin :132-160: joint solve
            slots = int(budget // (STATE * (1 + d / ratio)))
            states = min(mrr, slots // ratio)
            counted = slots
        rest -= STATE * states * d / GIB
        rest -= counted * STATE / GIB
    target_cell = (4 // 2) * (256 + 256) * 16 * 2
    if version >= (0, 5, 18):  # + the draft's own cell: 8 KV heads / 2 * (128 + 128) * 5 layers * 2 (dflash_utils.py:139-152)
        cell = target_cell + (8 // 2) * 256 * 5 * 2
    else:  # ceil(cell * (16 + 5) / 16) (dflash_utils.py scale_kv_cell_size_per_token_for_dflash)
        cell = math.ceil(target_cell * (16 + 5) / 16)
    return {"slots": slots, "ratio": ratio, "cell": cell, "tokens": int(rest * GIB) // cell}


@pytest.mark.parametrize("version", ["0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.16", "0.5.17", "0.5.18", "0.5.20",
                                     "0.5.23"])
def test_ddtree_on_the_hybrid_model_per_family(version):
    want = shadow_balanced_by_hand(_memplan.parse_version(version))
    result = _memplan.plan(qwen(), dflash(), [PRO6000, PRO6000], 2, version, variant("shadow-balanced"), ASSUME,
                           search=False)
    static = result["static"]
    assert (static["mamba_slots"], static["mamba_slots_per_request"], static["kv_cell_bytes"]) == \
        (want["slots"], want["ratio"], want["cell"])
    assert result["max_total_tokens"] == want["tokens"]
    assert result["warnings"] == [] and result["fits"]


def test_ct200_shadow_balanced_matches_the_simulator_0_5_11():
    """The lab's ct200 case: with the simulator's CUDA context (hardware.py CUDA_CONTEXT_MIB = 500) the plan
    is exactly what the simulator serves (663,576 tokens); with the planner's 768 MiB assumption 0.6 % less,
    well inside the deploy record's plan tolerance (sglang_service_plan_tolerance 0.1)."""
    params = variant("shadow-balanced")
    exact = _memplan.plan(qwen(), dflash(), [PRO6000] * 2, 2, "0.5.11", params, dict(ASSUME, context_mib=500),
                          search=False)
    assert exact["max_total_tokens"] == 663_576
    default = _memplan.plan(qwen(), dflash(), [PRO6000] * 2, 2, "0.5.11", params, search=False)
    assert abs(default["max_total_tokens"] - 663_576) / 663_576 < 0.01


@pytest.mark.parametrize("version,slots,state_requests", [
    # 0.5.9 turns radix cache off itself (server_args.py:1760-1764): slots = max_running_requests (mixin)
    ("0.5.9", 16, 16),
    # 0.5.10-0.5.13 refuse it; the plan assumes the fix the message names first (radix off) and warns
    ("0.5.11", 16, 16),
])
def test_nextn_radix_on_before_0_5_14(version, slots, state_requests):
    result = _memplan.plan(qwen(), None, [A6000], 2, version, variant("nextn", disable_radix_cache=False), ASSUME,
                           search=False)
    assert result["static"]["mamba_slots"] == slots and result["static"]["mamba_slots_per_request"] == 1
    assert result["static"]["spec_state_gib"] == pytest.approx(STATE * state_requests * 4 / GIB, abs=1e-3)
    refused = any("refuses speculative decoding" in w for w in result["warnings"])
    assert refused == (version == "0.5.11")


def test_nextn_radix_on_0_5_14_joint_extra_buffer():
    # 0.5.14: extra_buffer (auto), lazy with spec: 4 slots per request; joint solve (mixin :185-200),
    # NEXTN without a draft path keeps its own KV pool (the cell is not scaled)
    pre = (A6000 - 768) / 1024
    model = qwen()
    # the MTP draft's weights are part of the checkpoint; from 0.5.14 all of them load before the profile
    rest = (pre - QWEN_WEIGHTS / 2 / GIB) - pre * (1 - 0.88)
    budget = rest * 0.9 / 1.9 * GIB
    slots = int(budget // (STATE * (1 + 4 / 4)))
    states = min(16, slots // 4)
    tokens = int((rest - STATE * states * 4 / GIB - slots * STATE / GIB) * GIB) // ((4 // 2) * 512 * 16 * 2)
    result = _memplan.plan(model, None, [A6000], 2, "0.5.14", variant("nextn", disable_radix_cache=False), ASSUME,
                           search=False)
    assert result["static"]["mamba_slots"] == slots and result["static"]["mamba_slots_per_request"] == 4
    assert result["max_total_tokens"] == tokens
    assert result["static"]["kv_cell_bytes"] == (4 // 2) * 512 * 16 * 2
