"""Memory planner against HAND-COMPUTED cases from SGLang's own accounting.

Every expected number below is written out as arithmetic from SGLang's source
(the published wheels, paths relative to sglang/srt/), never produced by a
_memplan helper or copied from a planner run:

* default mem_fraction_static: server_args.py ``_handle_gpu_memory_settings``
  (0.5.9 :1020-1063, 0.5.11 :1434-1480): tiers, reserved MiB, 10 GiB floor on
  >60 GiB GPUs, then the speculative term; ``adjust_mem_fraction_for_vlm``
  (0.5.11 :7137-7173) for models with a vision_config.
* KV pool: model_runner_kv_cache_mixin.py ``_profile_available_bytes``
  (0.5.11 :56-70) ``rest = post - pre * (1 - mfs)``, pool_configurator.py
  (0.5.11 :72-178) cell sizes and page rounding, speculative/dflash_utils.py
  ``scale_kv_cell_size_per_token_for_dflash`` (ceil((T + D) / T)).
* Gated DeltaNet state: configs/qwen3_next.py ``mamba2_cache_params``,
  configs/mamba_utils.py ``Mamba2StateShape.create`` / ``mamba_cache_per_req``
  and the mixin's ``handle_max_mamba_cache`` (0.5.11 :72-131).

The planner's own estimates of what lives outside the pool (ASSUMPTIONS) are
inputs: the tests pass them explicitly. "pre" (free memory before the weights
load) is memory.total less the assumed CUDA context (context_mib).
"""

from __future__ import annotations

import json
import math

import pytest
import yaml
from sim_helpers import MODELS, REPO

from ansible_collections.inferops.sglang.plugins.module_utils import _memplan
from ansible_collections.inferops.sglang.plugins.module_utils import _variants

GIB = 1 << 30
ASSUME = {"context_mib": 768, "workspace_mib": 512, "activation_factor": 1.0,
          "graph_base_mib": 256, "graph_per_token_mib": 2}
A100_80G = 81559   # memory.total (MiB) of an 80 GiB GPU
A6000 = 49140      # ct129
PRO6000 = 97887    # ct200

LLAMA_WEIGHTS = 16060522496
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192}
DSV2_LITE_WEIGHTS = 31_400_000_000
DSV2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "torch_dtype": "bfloat16",
             "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_size": 2048,
             "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
             "intermediate_size": 10944, "moe_intermediate_size": 1408, "vocab_size": 102400,
             "max_position_embeddings": 163840}

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
QWEN_WEIGHTS = 55_560_000_000   # lab/models/Qwen3.6-27B model.safetensors.index.json total_size
DFLASH_WEIGHTS = 3_460_000_000  # lab/models/Qwen3.6-27B-DFlash
# Gated DeltaNet state per request on one rank of TP 2 (mamba_utils.py Mamba2StateShape.create):
# conv_dim = linear_value_heads*value_dim + 2*key_heads*key_dim = 48*128 + 2*16*128 = 10240,
# conv (conv_dim/tp, kernel-1) in bf16, temporal (value_heads/tp, 128, 128) in fp32, x 48 linear layers.
QWEN_STATE_TP2 = ((48 * 128 + 2 * 16 * 128) // 2 * (4 - 1) * 2 + (48 // 2) * 128 * 128 * 4) * 48
# ct129, TP 2: pre and the target's weights per rank, in GiB
CT129_PRE = (A6000 - 768) / 1024
QWEN_W_TP2 = QWEN_WEIGHTS / 2 / GIB
# vision_config of Qwen3.6 has depth 27 but no num_hidden_layers -> 24; hidden 1152 (server_args.py:7147-7148)
VLM_FACTOR = 0.95 * min(max(1.0 - 0.1 * (24 * 1152 ** 2 / (24 * 1024 ** 2) - 1.0), 0.8), 1.05)


def llama():
    return _memplan.model_spec(LLAMA, LLAMA_WEIGHTS)


def qwen():
    return _memplan.read_model_dir(str(MODELS / "Qwen3.6-27B"))


def dflash():
    return _memplan.read_model_dir(str(MODELS / "Qwen3.6-27B-DFlash"))


def variant(name: str, **changes) -> dict:
    params = _variants.resolve(name, DEFAULTS["sglang_service_variants"], DEFAULTS["sglang_service_variant_aliases"])[1]
    params.update(changes)
    return params


def plan_qwen(name: str, version: str = "0.5.11", gpu: int = A6000, **changes) -> dict:
    params = variant(name, **changes)
    return _memplan.plan(qwen(), dflash() if params.get("draft_model") else None, [gpu], 2, version, params,
                         dict(ASSUME), search=False)


def hand_tokens(pre: float, weights: float, mfs: float, cell: int, page: int = 1, *deductions: float) -> int:
    """_profile_available_bytes: rest = post - pre*(1-mfs) [- mamba terms], tokens = bytes // cell // page * page."""
    rest = (pre - weights) - pre * (1 - mfs)
    for gib in deductions:
        rest -= gib
    return int(rest * GIB) // cell // page * page


# --------------------------------------------------------------------------- 1. plain MHA


@pytest.mark.parametrize("tp", [1, 2])
def test_mha_cell_and_tokens(tp):
    # pool_configurator.py:160-167: get_num_kv_heads(tp) * (head_dim + v_head_dim) * layers * kv_size
    cell = (8 // tp) * (128 + 128) * 32 * 2
    assert cell == {1: 131072, 2: 65536}[tp]
    result = _memplan.plan(llama(), None, [A100_80G], tp, "0.5.11", {"mem_fraction_static": 0.83}, ASSUME, search=False)
    pre = (A100_80G - 768) / 1024
    assert result["static"]["kv_cell_bytes"] == cell
    assert result["max_total_tokens"] == hand_tokens(pre, LLAMA_WEIGHTS / tp / GIB, 0.83, cell)
    assert result["fits"] and result["binding"] is None


def test_mha_fp8_kv_cache_and_page_size():
    # kv_cache_dtype fp8_e4m3 -> torch.float8_e4m3fn, 1 byte (model_runner.py kv_cache_dtype); --page-size 64
    cell = 8 * (128 + 128) * 32 * 1
    params = {"mem_fraction_static": 0.83, "kv_cache_dtype": "fp8_e4m3", "extra_args": ["--page-size", "64"]}
    result = _memplan.plan(llama(), None, [A100_80G], 1, "0.5.11", params, ASSUME, search=False)
    pre = (A100_80G - 768) / 1024
    assert result["static"]["kv_cell_bytes"] == cell == 65536
    tokens = hand_tokens(pre, LLAMA_WEIGHTS / GIB, 0.83, cell, 64)
    assert result["max_total_tokens"] == tokens and tokens % 64 == 0
    # twice the bf16 tokens of the same budget, less the page rounding
    assert tokens == hand_tokens(pre, LLAMA_WEIGHTS / GIB, 0.83, 2 * cell) * 2 // 64 * 64


@pytest.mark.parametrize("tp", [1, 2])
def test_default_mfs_mha_0_5_9(tp):
    # 0.5.9 server_args.py:935-989: 79.6 GiB < 90 GiB -> chunked_prefill_size 8192, cuda_graph_max_bs 256 (tp < 4);
    # :1020-1063 reserved = 512 + max(8192, 2048)*1.5 + 256*2 + tp/8*1024 (piecewise graphs off by default, :604)
    reserved = 512 + 8192 * 1.5 + 256 * 2 + tp / 8 * 1024
    reserved = max(reserved, 10 * 1024)  # gpu_mem > 60 GiB
    expected = round((A100_80G - reserved) / A100_80G, 3)
    assert expected == {1: 0.835, 2: 0.834}[tp]
    result = _memplan.plan(llama(), None, [A100_80G], tp, "0.5.9", {}, ASSUME, search=False)
    assert result["mem_fraction_static"] == expected
    assert result["mem_fraction_static_source"] == "SGLang default"
    assert result["max_total_tokens"] == hand_tokens((A100_80G - 768) / 1024, LLAMA_WEIGHTS / tp / GIB, expected,
                                                     (8 // tp) * 256 * 32 * 2)


# 0.5.11 turned piecewise CUDA graphs on by default (server_args.py:665 disable_piecewise_cuda_graph=False;
# _handle_piecewise_cuda_graph :1194-1260 turns them off only for multimodal, Qwen3Next, DP attention, ...),
# and reserves for them BEFORE the floor (:1462-1468): non-MLA len(piecewise_cuda_graph_tokens)*8 MiB, the
# token list (:1550-1566) capped by piecewise_cuda_graph_max_tokens = chunked_prefill_size (:1407-1414);
# MLA a flat 1.5 GiB. The planner's default_mfs leaves this term out.
PIECEWISE_TOKENS_8192 = len([s for s in (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
                                         + list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
                                         + list(range(4608, 8193, 512))) if s <= 8192])


@pytest.mark.parametrize("config,weights,tp,piecewise_mib", [
    (LLAMA, LLAMA_WEIGHTS, 1, PIECEWISE_TOKENS_8192 * 8),
    (LLAMA, LLAMA_WEIGHTS, 2, PIECEWISE_TOKENS_8192 * 8),
    (DSV2_LITE, DSV2_LITE_WEIGHTS, 1, 1.5 * 1024),
], ids=["mha-tp1", "mha-tp2", "mla-tp1"])
def test_default_mfs_0_5_11_counts_piecewise_cuda_graphs(config, weights, tp, piecewise_mib):
    assert PIECEWISE_TOKENS_8192 == 58
    reserved = max(512 + 8192 * 1.5 + 256 * 2 + tp / 8 * 1024 + piecewise_mib, 10 * 1024)
    expected = round((A100_80G - reserved) / A100_80G, 3)  # mha-tp1 0.830, mha-tp2 0.828, mla 0.816
    result = _memplan.plan(_memplan.model_spec(config, weights), None, [A100_80G], tp, "0.5.11", {}, ASSUME,
                           search=False)
    assert result["mem_fraction_static"] == expected


# --------------------------------------------------------------------------- 2. MLA


@pytest.mark.parametrize("tp", [1, 2])
def test_mla_cell_and_tokens(tp):
    # pool_configurator.py:121-126: (kv_lora_rank + qk_rope_head_dim) * layers * kv_size, the same on every rank
    cell = (512 + 64) * 27 * 2
    result = _memplan.plan(_memplan.model_spec(DSV2_LITE, DSV2_LITE_WEIGHTS), None, [A100_80G], tp, "0.5.11",
                           {"mem_fraction_static": 0.8}, ASSUME, search=False)
    assert result["static"]["kv_cell_bytes"] == cell == 31104
    assert result["max_total_tokens"] == hand_tokens((A100_80G - 768) / 1024, DSV2_LITE_WEIGHTS / tp / GIB, 0.8, cell)


# --------------------------------------------------------------------------- 3. hybrid Qwen3.6-27B on ct129


def test_qwen_model_facts():
    model = qwen()
    # configs/qwen3_next.py:255-281: full attention where (layer + 1) % 4 == 0 -> 16 full, 48 linear
    assert (model["kv_layers"], model["linear_layers"]) == (64 // 4, 64 - 64 // 4) == (16, 48)
    assert model["weight_bytes"] == QWEN_WEIGHTS and dflash()["weight_bytes"] == DFLASH_WEIGHTS


def test_nextn_linear_state_and_speculative_reserve():
    result = plan_qwen("nextn")
    assert QWEN_STATE_TP2 == 76972032  # half of 153,944,064 B at TP 1
    assert result["static"]["mamba_state_per_request_mib"] == pytest.approx(QWEN_STATE_TP2 / 2 ** 20, abs=1e-3)
    # handle_max_mamba_cache (0.5.11 mixin :77-92): per_req * max_running_requests * num_draft_tokens
    assert result["draft_tokens"] == 4
    assert result["static"]["spec_state_gib"] == pytest.approx(QWEN_STATE_TP2 * 16 * 4 / GIB, abs=1e-3)
    # radix cache off (0.5.11 refuses spec with it): slots = max_running_requests (:99-106)
    assert result["static"]["mamba_slots"] == 16
    # 4 KV heads / tp 2 * (256 + 256) * 16 full-attention layers * bf16; NEXTN does not scale the cell before 0.5.14
    cell = (4 // 2) * (256 + 256) * 16 * 2
    assert result["static"]["kv_cell_bytes"] == cell == 32768
    # the table's nextn disables radix cache itself, so 0.5.11 accepts it: no warning
    assert result["static"]["mamba_slots_per_request"] == 1
    assert not any("radix" in w for w in result["warnings"]), result["warnings"]


# --------------------------------------------------------------------------- radix cache on a hybrid model


def test_nextn_with_radix_cache_on_0_5_11_is_planned_as_the_fix_and_warned():
    """0.5.11 refuses it (server_args.py:2452-2456); the plan assumes radix off and says how to fix the variant."""
    fixed = plan_qwen("nextn")
    refused = plan_qwen("nextn", disable_radix_cache=False)
    assert refused["static"]["mamba_slots"] == fixed["static"]["mamba_slots"] == 16
    assert refused["max_total_tokens"] == fixed["max_total_tokens"]
    warning = next(w for w in refused["warnings"] if "radix" in w)
    assert "refuses speculative decoding on a hybrid model" in warning
    assert "disable_radix_cache: true" in warning and "mamba_radix_cache_strategy: extra_buffer" in warning
    # the same flag given the old way, in extra_args, counts as the parameter
    via_extra = plan_qwen("nextn", disable_radix_cache=False, extra_args=["--disable-radix-cache"])
    assert via_extra["max_total_tokens"] == fixed["max_total_tokens"] and not via_extra["warnings"]


@pytest.mark.parametrize("version,refused", [("0.5.9", False), ("0.5.10", True), ("0.5.13", True), ("0.5.14", False)])
def test_which_releases_refuse_radix_cache_with_speculative_decoding(version, refused):
    """0.5.10.post1 srt/server_args.py:2207 already refuses it, as 0.5.11 :2452-2456 and 0.5.13 do; 0.5.9 turns
    radix cache off by itself and 0.5.14 keeps it with extra_buffer: no warning there."""
    result = plan_qwen("nextn", version=version, disable_radix_cache=False)
    assert any("refuses speculative decoding on a hybrid model" in w for w in result["warnings"]) is refused


def test_extra_buffer_on_0_5_11_keeps_radix_cache_with_five_slots_per_request():
    """handle_max_mamba_cache (0.5.11 model_runner_kv_cache_mixin.py:77-131): speculative states for
    max_running_requests first, then slots = rest * r / (1 + r) // per_req (r = 0.9); _calculate_mamba_ratio
    (:180-192): 3 + 2 ping-pong slots per request with the overlap schedule on."""
    result = plan_qwen("nextn", disable_radix_cache=False, mamba_radix_cache_strategy="extra_buffer")
    assert not any("radix" in w for w in result["warnings"])
    # NEXTN: the target loads without its MTP layer, which the draft worker loads (outside the pool before 0.5.14)
    model = qwen()
    target_w = (QWEN_WEIGHTS - model["mtp_layers"] * _memplan.layer_weight_bytes(model)) / 2 / GIB
    rest = (CT129_PRE - target_w) - CT129_PRE * (1 - 0.88)
    spec = QWEN_STATE_TP2 * 16 * 4 / GIB
    slots = int((rest - spec) * 0.9 / 1.9 * GIB // QWEN_STATE_TP2)
    assert result["static"]["mamba_slots"] == slots
    assert result["static"]["mamba_slots_per_request"] == 5
    assert result["max_total_tokens"] == hand_tokens(CT129_PRE, target_w, 0.88, 32768, 1,
                                                     spec, slots * QWEN_STATE_TP2 / GIB)
    # keeping radix cache costs KV tokens against radix off
    assert result["max_total_tokens"] < plan_qwen("nextn")["max_total_tokens"]
    # the strategy flag in extra_args (either release's name) counts as the parameter
    for flag in ("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"):
        via_extra = plan_qwen("nextn", disable_radix_cache=False, extra_args=[flag, "extra_buffer"])
        assert via_extra["static"]["mamba_slots"] == slots


def test_radix_cache_off_keeps_sixteen_requests_on_0_5_23():
    """0.5.14+ keep radix cache with extra_buffer by themselves; on ct129 its slots cap the scheduler below the
    production envelope's 16 requests, which radix off keeps (slots = max_running_requests)."""
    fixed = plan_qwen("nextn", version="0.5.23")
    kept = plan_qwen("nextn", version="0.5.23", disable_radix_cache=False)
    assert fixed["max_running_requests"] == 16 and fixed["static"]["mamba_slots"] == 16
    assert kept["max_running_requests"] < 16 and kept["static"]["mamba_slots_per_request"] == 4
    assert kept["max_total_tokens"] < fixed["max_total_tokens"]


def test_shadow_dflash_cell_and_static_pool_failure():
    result = plan_qwen("shadow")
    # DFLASH (DDTree) verifies the draft's block: num_draft_tokens = block_size of the draft config = 16
    assert result["draft_tokens"] == 16
    # dflash_utils.py scale_kv_cell_size_per_token_for_dflash: ceil(cell * (16 + 5) / 16), 5 draft layers
    cell = (32768 * (16 + 5) + 16 - 1) // 16
    assert result["static"]["kv_cell_bytes"] == cell == 43008
    spec = QWEN_STATE_TP2 * 16 * 16 / GIB  # 18.35 GiB of speculative states for 16 requests
    assert result["static"]["spec_state_gib"] == pytest.approx(spec, abs=1e-3)
    rest = (CT129_PRE - QWEN_W_TP2) - CT129_PRE * (1 - 0.88)
    assert result["static"]["rest_before_kv_gib"] == pytest.approx(rest, abs=1e-3)
    assert rest - spec < 0  # the pool cannot even hold the speculative states
    assert not result["fits"] and result["binding"] == "static_pool" and result["max_total_tokens"] == 0
    assert "Not enough memory. Please try to increase --mem-fraction-static" in result["reason"]


def _qwen_small_static(mfs: float, pre: float = CT129_PRE) -> tuple[int, float, int]:
    """shadow-small's envelope (mrr 4, 16 draft tokens) on 0.5.11: tokens, GiB used in the pool, state slots.
    The DDTree build keeps radix cache on (its server_args does not refuse), so 0.5.11's ratio branch
    sizes the slots (model_runner_kv_cache_mixin.py:108-121) after the speculative states of every
    request (:73-91): slots = (rest - spec) * 0.9 / 1.9 // per_req."""
    rest = (pre - QWEN_W_TP2) - pre * (1 - mfs)
    spec = QWEN_STATE_TP2 * 4 * 16 / GIB
    slots = int(((rest - spec) * 0.9 / (1 + 0.9)) * GIB // QWEN_STATE_TP2)
    state = slots * QWEN_STATE_TP2 / GIB
    tokens = int((rest - spec - state) * GIB) // 43008
    return tokens, QWEN_W_TP2 + spec + state + tokens * 43008 / GIB, slots


def test_shadow_small_fails_outside_pool_on_draft_weights():
    result = plan_qwen("shadow-small")
    tokens, used, slots = _qwen_small_static(0.95)
    assert result["max_total_tokens"] == tokens and result["max_running_requests"] == 4
    assert result["static"]["mamba_slots"] == slots and result["static"]["mamba_slots_per_request"] == 3
    headroom = CT129_PRE - used
    dynamic = result["dynamic"]
    assert dynamic["headroom_gib"] == pytest.approx(headroom, abs=1e-3)
    # before 0.5.14 the draft loads after the pool is sized: 3.46 GB / 2 ranks = 1.61 GiB outside it
    draft = DFLASH_WEIGHTS / 2 / GIB
    assert dynamic["items"]["draft_weights"] == pytest.approx(draft, abs=1e-3) == pytest.approx(1.611, abs=1e-3)
    assert not result["fits"] and result["binding"] == "dynamic"
    assert dynamic["need_gib"] - draft < headroom < dynamic["need_gib"]  # the draft's weights tip it over


def test_shadow_balanced_fits():
    result = plan_qwen("shadow-balanced")
    tokens, used, _slots = _qwen_small_static(0.85)
    assert result["max_total_tokens"] == tokens
    assert result["warnings"] == []  # the DDTree build does not refuse radix cache
    assert result["full_context_requests"] == tokens // 32768
    assert result["cuda_graph"] is False and "cuda_graphs" not in result["dynamic"]["items"]
    assert result["dynamic"]["headroom_gib"] == pytest.approx(CT129_PRE - used, abs=1e-3)
    assert result["fits"] and result["binding"] is None


# --------------------------------------------------------------------------- 4. versions


def test_0_5_14_counts_draft_weights_in_pool():
    result = plan_qwen("shadow-small", "0.5.14")
    draft = DFLASH_WEIGHTS / 2 / GIB
    # scheduler.py:858-866 loads the draft before init_memory_pools: post excludes both
    assert result["static"]["draft_weights_in_pool_gib"] == pytest.approx(draft, abs=1e-3)
    assert result["static"]["post_gib"] == pytest.approx(CT129_PRE - QWEN_W_TP2 - draft, abs=1e-3)
    assert "draft_weights" not in result["dynamic"]["items"]
    assert "draft_weights" in plan_qwen("shadow-small", "0.5.11")["dynamic"]["items"]


def test_0_5_9_has_no_dflash():
    with pytest.raises(_memplan.PlanError, match="has no DFLASH"):
        plan_qwen("shadow", "0.5.9")


def test_default_mfs_vision_adjustment():
    # ct129, TP 2: 48 GiB < 60 -> (4096, 32); reserved = 512 + 4096*1.5 + 32*2 + 2/8*1024, no floor (< 60 GiB),
    # + 4 GiB NEXTN reserve (0.5.11 :1470-1476), rounded; then * 0.95 * f (not re-rounded)
    reserved = 512 + 4096 * 1.5 + 32 * 2 + 2 / 8 * 1024 + 4 * 1024
    base = round((A6000 - reserved) / A6000, 3)
    assert base == 0.775
    result = plan_qwen("nextn", mem_fraction_static=None)
    assert result["mem_fraction_static"] == pytest.approx(base * VLM_FACTOR, abs=1e-9)
    assert VLM_FACTOR == pytest.approx(0.95 * (1 - 0.1 * 0.265625))


@pytest.mark.parametrize("version,spec_mib", [("0.5.9", 2048), ("0.5.11", 4096), ("0.5.14", 0)])
def test_default_mfs_speculative_reserve_after_floor(version, spec_mib):
    # ct200 (95.6 GiB > 60): with chunked_prefill_size 2048 and cuda_graph_max_bs 8 the reserve is
    # 512 + 2048*1.5 + 8*2 + 2/8*1024 = 3856 MiB, floored to 10 GiB, and THEN the speculative term is added
    reserved = max(512 + 2048 * 1.5 + 8 * 2 + 2 / 8 * 1024, 10 * 1024) + spec_mib
    expected = round((PRO6000 - reserved) / PRO6000, 3) * VLM_FACTOR
    result = plan_qwen("nextn", version, PRO6000, mem_fraction_static=None, chunked_prefill_size=2048,
                       cuda_graph_max_bs=8)
    assert result["mem_fraction_static"] == pytest.approx(expected, abs=1e-9)
    # the spec term added before the floor would vanish under it: every version would give the same value
    assert (spec_mib == 0) == (expected == pytest.approx(round((PRO6000 - 10240) / PRO6000, 3) * VLM_FACTOR))


def test_0_5_23_vlm_cache_off_kv_budget():
    # kv_cache_configurator.py (0.5.23): rest = A - pre*(1-mfs) - SGLANG_VLM_CACHE_SIZE_MB (100) / 1024, multimodal only
    rest = (CT129_PRE - QWEN_W_TP2) - CT129_PRE * (1 - 0.88)
    params = {"mem_fraction_static": 0.88, "context_length": 32768}
    old = _memplan.plan(qwen(), None, [A6000], 2, "0.5.15", params, ASSUME, search=False)
    new = _memplan.plan(qwen(), None, [A6000], 2, "0.5.23", params, ASSUME, search=False)
    assert old["static"]["rest_before_kv_gib"] == pytest.approx(rest, abs=1e-3)
    assert new["static"]["rest_before_kv_gib"] == pytest.approx(rest - 100 / 1024, abs=1e-3)
    text = _memplan.plan(llama(), None, [A100_80G], 1, "0.5.23", {"mem_fraction_static": 0.83}, ASSUME, search=False)
    pre = (A100_80G - 768) / 1024
    assert text["static"]["rest_before_kv_gib"] == pytest.approx(pre * 0.83 - LLAMA_WEIGHTS / GIB, abs=1e-3)


# --------------------------------------------------------------------------- 5. the mfs interval


def _interval(target, draft, gpu, tp, params):
    return _memplan.plan(target, draft, [gpu], tp, "0.5.11", params, ASSUME)["mem_fraction_static_range"]


def _at(target, draft, gpu, tp, params, mfs):
    return _memplan.plan(target, draft, [gpu], tp, "0.5.11", dict(params, mem_fraction_static=mfs), ASSUME,
                         search=False)


@pytest.mark.parametrize("case", ["llama-tp1", "qwen-shadow-balanced"])
def test_mfs_interval_edges(case):
    if case == "llama-tp1":
        target, draft, gpu, tp, params = llama(), None, A100_80G, 1, {}
        # smallest mfs (in thousandths) with rest >= 2 cells: 2 tokens give max_running_requests tokens // 2 = 1
        need = LLAMA_WEIGHTS + 2 * 131072
    else:
        target, draft, gpu, tp, params = qwen(), dflash(), A6000, 2, variant("shadow-balanced")
        # weights/rank + speculative states (4 x 16) + what the ratio branch needs for 3 slots (one
        # request at 3 slots per request, mixin :44-46): 3 states = budget * 0.9 / 1.9 (:108-121)
        need = QWEN_WEIGHTS / 2 + QWEN_STATE_TP2 * 4 * 16 + QWEN_STATE_TP2 * 3 * (1 + 0.9) / 0.9
    pre_bytes = (gpu - 768) * 2 ** 20
    low_hand = math.ceil(need / pre_bytes * 1000) / 1000
    low, high = _interval(target, draft, gpu, tp, params)
    assert low == low_hand
    assert _at(target, draft, gpu, tp, params, low)["fits"]
    below = _at(target, draft, gpu, tp, params, round(low - 0.001, 3))
    assert not below["fits"] and below["binding"] == "static_pool"
    assert _at(target, draft, gpu, tp, params, high)["fits"]
    above = _at(target, draft, gpu, tp, params, round(high + 0.001, 3))
    assert not above["fits"] and above["binding"] == "dynamic"


# --------------------------------------------------------------------------- 6. bad input


def _missing_layers():
    _memplan.model_spec({k: v for k, v in LLAMA.items() if k != "num_hidden_layers"}, LLAMA_WEIGHTS)


def _unknown_dtype():
    _memplan.model_spec(dict(LLAMA, torch_dtype="float42"), LLAMA_WEIGHTS)


def _unknown_kv_dtype():
    _memplan.plan(llama(), None, [A100_80G], 1, "0.5.11", {"kv_cache_dtype": "int3"}, ASSUME)


def _hybrid_without_linear_shapes():
    text = {k: v for k, v in _load_qwen_text().items() if not k.startswith("linear_num_value")}
    _memplan.model_spec({"text_config": text}, QWEN_WEIGHTS)


def _load_qwen_text():
    return json.loads((MODELS / "Qwen3.6-27B" / "config.json").read_text())["text_config"]


@pytest.mark.parametrize("call,message", [
    (_missing_layers, "lacks 'num_hidden_layers'"),
    (_unknown_dtype, "unknown dtype 'float42'"),
    (_unknown_kv_dtype, "unknown dtype 'int3'"),
    (_hybrid_without_linear_shapes, "48 linear-attention layers but no linear_num_value_heads"),
    (lambda: _memplan.plan(llama(), None, [A100_80G], 1, "0.5.11", {"mem_fraction_static": 1.2}, ASSUME),
     r"mem_fraction_static must be in \(0, 1\), got 1.2"),
    (lambda: _memplan.plan(llama(), None, [A100_80G], 1, "0.5.11", {"mem_fraction_static": 0}, ASSUME),
     r"mem_fraction_static must be in \(0, 1\), got 0"),
    (lambda: _memplan.plan(llama(), None, [A100_80G], 0, "0.5.11", {}, ASSUME), "tp_size must be at least 1, got 0"),
    (lambda: _memplan.plan(llama(), None, [], 1, "0.5.11", {}, ASSUME), "no GPU memory given"),
    (lambda: _memplan.plan(qwen(), None, [A6000], 2, "0.5.11", variant("shadow"), ASSUME), "needs the draft model"),
    (lambda: _memplan.plan(llama(), None, [A100_80G], 1, "latest", {}, ASSUME), "cannot read an SGLang version"),
], ids=["missing-key", "dtype", "kv-dtype", "linear-shapes", "mfs-high", "mfs-zero", "tp0", "no-gpu", "no-draft",
        "version"])
def test_bad_input(call, message):
    with pytest.raises(_memplan.PlanError, match=message):
        call()
