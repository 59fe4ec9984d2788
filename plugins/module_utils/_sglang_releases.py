# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One table of what differs between SGLang releases, read from the published wheels.

Each ``Fact`` holds one value of one named fact over a range of releases
(``since`` and ``until`` inclusive, ``until`` None for "and every later one";
``0.5.13.post1`` counts as ``(0, 5, 13)``). The entries of one name cover every
release from ``FIRST`` on, without gaps or overlaps (tests/unit checks it).

``source`` is the wheel file:line the value was read from. ``probe`` says how
tests/conformance/test_releases_wheels.py checks the range against the real
wheels: ``(paths, regex)``, the regex found in one of the files (relative to
the wheel's ``sglang/`` folder; a path ending in ``/`` means every ``.py``
file below it) of every release inside the range and of none outside it; or a
sentence saying why the range cannot be checked by text.

Used by the memory planner (``_memplan``), the command-line renderer
(``_variants``) and the lab's SGLang simulator (``lab/simulator``, which ships
a copy of this file in its wheel). Pure Python, standard library only, 3.9+.
"""

from __future__ import annotations

import functools
from collections import namedtuple

Fact = namedtuple("Fact", "name since until value source probe")

FIRST = (0, 5, 9)  # the oldest release the collection supports

_SRT = "srt/"
_ARGS = ("srt/server_args.py", "srt/arg_groups/")
_SPEC_INFO = ("srt/speculative/spec_info.py",)
_MIXIN = "srt/model_executor/model_runner_kv_cache_mixin.py"
_CONFIGURATOR = "srt/mem_cache/kv_cache_configurator.py"
_NEXT = "the next entry's text is checked absent here"

FACTS = (
    # ------------------------------------------------------------------ speculative algorithms
    Fact("dflash", FIRST, (0, 5, 10), False, "0.5.10.post1 srt/speculative/spec_info.py (no DFLASH)", _NEXT),
    Fact("dflash", (0, 5, 11), None, True, "0.5.11 srt/speculative/spec_info.py: DFLASH = auto()",
         (_SPEC_INFO, r"DFLASH = auto\(\)")),
    Fact("free_form_spec_algorithm", FIRST, (0, 5, 11), False,
         "0.5.11 srt/server_args.py:5365-5369: --speculative-algorithm choices", _NEXT),
    Fact("free_form_spec_algorithm", (0, 5, 12), None, True,
         "0.5.12.post1 srt/server_args.py:5786: no choices, 'Or any name registered via SpeculativeAlgorithm.register'",
         (_ARGS, r"any name registered via")),
    Fact("frozen_kv_mtp", FIRST, (0, 5, 11), False, "0.5.11 spec_info.py (no FROZEN_KV_MTP)", _NEXT),
    Fact("frozen_kv_mtp", (0, 5, 12), None, True, "0.5.12.post1 spec_info.py: FROZEN_KV_MTP = auto()",
         (_SPEC_INFO, r"FROZEN_KV_MTP = auto\(\)")),
    Fact("dspark", FIRST, (0, 5, 15), False, "0.5.15.post1 spec_info.py (no DSPARK)", _NEXT),
    Fact("dspark", (0, 5, 16), None, True, "0.5.16 srt/speculative/spec_info.py:38: DSPARK = auto()",
         (_SPEC_INFO, r"DSPARK = auto\(\)")),
    Fact("uno", FIRST, (0, 5, 19), False, "0.5.19 spec_info.py (no UNO)", _NEXT),
    Fact("uno", (0, 5, 20), None, True, "0.5.20 srt/speculative/spec_info.py:41: UNO = auto()",
         (_SPEC_INFO, r"UNO = auto\(\)")),
    # the devices NGRAM runs on
    Fact("ngram_devices", FIRST, (0, 5, 15), ("cuda",),
         "0.5.11 server_args.py:3557-3561; 0.5.13.post1 arg_groups/speculative_hook.py:389-391",
         "a condition on a device string, no text that one release has and the others lack"),
    Fact("ngram_devices", (0, 5, 16), (0, 5, 20), ("cuda", "cpu"), "0.5.16 arg_groups/speculative_hook.py:651-655",
         "a condition on a device string, no text that one release has and the others lack"),
    Fact("ngram_devices", (0, 5, 21), None, ("cuda", "cpu", "xpu"),
         "0.5.21 arg_groups/speculative_hook.py:1173-1178, 0.5.23 :1286-1290",
         "a condition on a device string, no text that one release has and the others lack"),

    # ------------------------------------------------------------------ server flags
    # --mamba-scheduler-strategy: the option 0.5.9-0.5.13, a deprecated alias of
    # --mamba-radix-cache-strategy 0.5.14-0.5.19 (0.5.14 server_args.py:6350-6356), gone in 0.5.20
    Fact("mamba_scheduler_strategy_flag", FIRST, (0, 5, 19), True, "0.5.11 srt/server_args.py:246 and the parser",
         (_ARGS, r'"--mamba-scheduler-strategy"')),
    Fact("mamba_scheduler_strategy_flag", (0, 5, 20), None, False, "0.5.20 arg_groups/fields (no such option)", _NEXT),
    Fact("mamba_radix_cache_strategy_flag", FIRST, (0, 5, 13), False, "0.5.13.post1 server_args.py (no such option)",
         _NEXT),
    Fact("mamba_radix_cache_strategy_flag", (0, 5, 14), None, True,
         "0.5.14 srt/server_args.py:6350-6356; 0.5.20+ the field mamba_radix_cache_strategy (arg_groups/fields)",
         (_ARGS, r"mamba_radix_cache_strategy")),
    # per-phase CUDA graph flags; --disable-cuda-graph a deprecated alias from 0.5.14
    # (0.5.14 server_args.py:6376-6380, a DeprecatedStoreTrueAction, still accepted in 0.5.23)
    Fact("split_cuda_graph_flags", FIRST, (0, 5, 13), False, "0.5.13.post1 server_args.py (no per-phase flags)",
         _NEXT),
    Fact("split_cuda_graph_flags", (0, 5, 14), None, True,
         "0.5.14 srt/server_args.py: --cuda-graph-max-bs-decode, --cuda-graph-backend-decode/-prefill",
         (_SRT, r"cuda-graph-backend-decode")),
    # --cuda-graph-max-bs: an option up to 0.5.19; from 0.5.20 (arg_groups/fields) it is only
    # a prefix of the per-phase options, which argparse calls ambiguous
    Fact("cuda_graph_max_bs_flag", FIRST, (0, 5, 19), True, "0.5.11 srt/server_args.py: --cuda-graph-max-bs",
         (_ARGS, r'"--cuda-graph-max-bs"')),
    Fact("cuda_graph_max_bs_flag", (0, 5, 20), None, False, "0.5.20 arg_groups/fields (no such option)", _NEXT),
    # argparse's program name in prepare_server_args
    Fact("parser_prog_sglang_serve", FIRST, (0, 5, 9), False, "0.5.9 server_args.py: ArgumentParser()", _NEXT),
    Fact("parser_prog_sglang_serve", (0, 5, 10), None, True, "0.5.11 srt/server_args.py:7276",
         (_SRT, r'prog="sglang serve"')),
    Fact("launch_server_warns", FIRST, (0, 5, 9), False, "0.5.9 launch_server.py (no warning)", _NEXT),
    Fact("launch_server_warns", (0, 5, 10), None, True, "0.5.12.post1 launch_server.py:54",
         (("launch_server.py",), r"is still supported, but")),
    Fact("resolve_once", FIRST, (0, 5, 18), False, "0.5.18 server_args.py: __post_init__ resolves", _NEXT),
    Fact("resolve_once", (0, 5, 19), None, True, "0.5.19 srt/server_args.py:3663-3673",
         (_ARGS, r"def resolve_once")),

    # ------------------------------------------------------------------ radix cache on hybrid models
    # speculative decoding on a hybrid linear-attention model with radix cache on:
    # "off" 0.5.9 turns radix cache off itself (0.5.9 server_args.py:1760-1764),
    # "refuse" 0.5.10-0.5.13 raise ValueError (0.5.11 server_args.py:2452-2456),
    # "extra_buffer" 0.5.14+ keep radix cache, strategy auto -> extra_buffer (0.5.14 :4379-4392)
    Fact("hybrid_spec_radix", FIRST, (0, 5, 9), "off", "0.5.9 srt/server_args.py:1760-1764",
         (_ARGS, r"Disabling radix cache since speculative decoding")),
    Fact("hybrid_spec_radix", (0, 5, 10), (0, 5, 13), "refuse", "0.5.11 srt/server_args.py:2452-2456",
         (_ARGS, r"is not compatible with radix cache when")),
    Fact("hybrid_spec_radix", (0, 5, 14), None, "extra_buffer", "0.5.14 srt/server_args.py:4379-4392",
         "the 0.5.14+ choice is code (strategy 'auto' resolved to extra_buffer), no message; both earlier "
         "messages are checked absent here"),
    # the extra_buffer strategy's ping-pong slots per request: 2, and 1 with speculative
    # decoding from 0.5.14 (the lazy buffer, MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP_LAZY)
    Fact("mamba_lazy_spec_buffer", FIRST, (0, 5, 13), False, "0.5.13.post1 model_runner_kv_cache_mixin.py:233-252",
         "which strategy is chosen (and so whether the lazy buffer is used) is code, not text"),
    Fact("mamba_lazy_spec_buffer", (0, 5, 14), None, True, "0.5.14 model_runner_kv_cache_mixin.py:274-293",
         "which strategy is chosen (and so whether the lazy buffer is used) is code, not text"),

    # ------------------------------------------------------------------ memory pool
    # the scheduler loads the draft's weights before the pools are sized (PR #23862)
    Fact("draft_in_pool", FIRST, (0, 5, 13), False, "0.5.11 model_runner.py: the draft loads after the profile",
         _NEXT),
    Fact("draft_in_pool", (0, 5, 14), None, True,
         "0.5.14 model_runner_kv_cache_mixin.py:103-118: 'draft weights are now counted'",
         ((_MIXIN, _CONFIGURATOR), r"draft weights are now counted")),
    # "Loaded weights leave no GPU memory for the KV cache" ValueError when rest <= 0
    # (else, and before, "Not enough memory. Please try to increase --mem-fraction-static")
    Fact("new_pool_error", FIRST, (0, 5, 13), False, "0.5.11 model_executor/pool_configurator.py:39-44", _NEXT),
    Fact("new_pool_error", (0, 5, 14), None, True,
         "0.5.14 model_runner_kv_cache_mixin.py:103-118, 0.5.16+ mem_cache/kv_cache_configurator.py",
         ((_MIXIN, _CONFIGURATOR), r"leave no GPU memory for the KV cache")),
    # DFLASH's KV: the target's cell scaled by (T + D) / T; from 0.5.18 the draft's own cell
    # (its KV heads, head dims and layers) added to the target's
    Fact("dflash_cell_sum", FIRST, (0, 5, 17), False,
         "0.5.11 speculative/dflash_utils.py scale_kv_cell_size_per_token_for_dflash (ceil(cell * (T + D) / T))",
         _NEXT),
    Fact("dflash_cell_sum", (0, 5, 18), None, True,
         "0.5.18 speculative/dflash_utils.py:139-152 dflash_draft_cell_size_per_token, "
         "model_executor/pool_configurator.py:216-232; 0.5.23 mem_cache/draft_kv_budget.py:14-44",
         (("srt/speculative/dflash_utils.py",), r"def dflash_draft_cell_size_per_token")),
    # EAGLE-family draft KV folded into the cell: only with --speculative-draft-model-path
    # (a NEXTN/MTP draft without a path keeps its own pool, outside the profile)
    Fact("eagle_draft_cell_fold", FIRST, (0, 5, 13), False, "0.5.11: the draft worker sizes its own pool", _NEXT),
    Fact("eagle_draft_cell_fold", (0, 5, 14), None, True,
         "0.5.14 model_runner_kv_cache_mixin.py (draft weights counted, cell scaled with a draft path)",
         ((_MIXIN, _CONFIGURATOR), r"draft weights are now counted")),
    # slots and speculative states of a hybrid model solved together:
    # slots = budget // (per_req * (1 + D / ratio)); before, the states of every request first
    Fact("mamba_joint_solve", FIRST, (0, 5, 12), False, "0.5.11 model_runner_kv_cache_mixin.py:73-91 "
         "(states of every request first, then slots = budget // per_req)",
         _NEXT),
    Fact("mamba_joint_solve", (0, 5, 13), None, True,
         "0.5.13.post1 model_executor/model_runner_kv_cache_mixin.py:132-160; 0.5.23 "
         "mem_cache/kv_cache_configurator.py:3361-3377",
         ((_MIXIN, _CONFIGURATOR), r"\(1 \+ D / ratio\)")),
    # the state pool's padding slot, counted in both buffers and in the budget:
    # joint  slots = (budget - per_req * (1 + D)) // (per_req * (1 + D / ratio)), states (capped + 1) * D
    # else   slots = (budget - per_slot) // per_slot
    Fact("mamba_padding_slot", FIRST, (0, 5, 16), False, "0.5.16 mem_cache/kv_cache_configurator.py:1808-1813",
         _NEXT),
    Fact("mamba_padding_slot", (0, 5, 17), None, True,
         "0.5.17 mem_cache/kv_cache_configurator.py:1905-1982; 0.5.23 :3350-3409",
         ((_CONFIGURATOR,), r"per_req \* \(1 \+ D\)")),
    # max_running_requests given: capped by the estimate (0.5.10-0.5.13), by tokens // 2 (0.5.14+)
    Fact("mrr_set_cap", FIRST, (0, 5, 9), "none", "0.5.9 model_runner.py (max_running_requests kept)",
         "a min() in code, not a message"),
    Fact("mrr_set_cap", (0, 5, 10), (0, 5, 13), "estimate", "0.5.11 model_executor/model_runner.py",
         "a min() in code, not a message"),
    Fact("mrr_set_cap", (0, 5, 14), None, "half_tokens", "0.5.14 model_runner_kv_cache_mixin.py",
         "a min() in code, not a message"),
    # SGLANG_VLM_CACHE_SIZE_MB (100) off the KV budget of a multimodal model
    Fact("vlm_cache_mb", FIRST, (0, 5, 17), 0, "0.5.17: the VLM cache is not taken off the KV budget", _NEXT),
    Fact("vlm_cache_mb", (0, 5, 18), None, 100,
         "0.5.18 mem_cache/kv_cache_configurator.py:130-150 mm_runtime_reservation_gb (0.5.23 :200-220), "
         "environ.py SGLANG_VLM_CACHE_SIZE_MB = EnvInt(100)",
         ((_CONFIGURATOR,), r"reserved_mb = envs\.SGLANG_VLM_CACHE_SIZE_MB\.get\(\)")),

    # ------------------------------------------------------------------ default mem_fraction_static
    # reserve for the draft (MiB), added after the 10 GiB floor; 0 from 0.5.14 (draft weights in the profile)
    Fact("spec_reserve_mb", FIRST, (0, 5, 9), 2048, "0.5.9 srt/server_args.py:1055-1057",
         (_ARGS, r"# eagle draft models and cuda graphs\s+reserved_mem \+= 2 \* 1024")),
    Fact("spec_reserve_mb", (0, 5, 10), (0, 5, 13), 4096,
         "0.5.10.post1 srt/server_args.py:1320-1322, 0.5.11 :1473-1475",
         (_ARGS, r"# eagle draft models and cuda graphs\s+reserved_mem \+= 4 \* 1024")),
    Fact("spec_reserve_mb", (0, 5, 14), None, 0, "0.5.14 server_args.py:3290-3320 (no speculative reserve)",
         "the absence of a reserve; both earlier texts are checked absent here"),
    Fact("standalone_reserve_mb", FIRST, (0, 5, 13), 6144, "0.5.11 srt/server_args.py:1470-1472",
         (_ARGS, r"# standalonedraft model and cuda graphs\s+reserved_mem \+= 6 \* 1024")),
    Fact("standalone_reserve_mb", (0, 5, 14), None, 0, "0.5.14 server_args.py (no speculative reserve)", _NEXT),
    # GPU tiers by memory.total (GiB bounds): (chunked_prefill_size, decode graph bs tp < 4, tp >= 4)
    # as ((upper_gib, (chunked, bs_small_tp, bs_large_tp)), ...), the last bound None
    Fact("gpu_tiers", FIRST, (0, 5, 19),
         ((20, (2048, 8, 8)), (35, (2048, 24, 80)), (60, (4096, 32, 160)), (160, (8192, 256, 512)),
          (None, (16384, 512, 512))),
         "0.5.11 srt/server_args.py:_handle_gpu_memory_settings; 0.5.19 arg_groups/memory_hook.py",
         (_ARGS, r"chunked_prefill_size 2k, (cuda_graph_)?max_bs 24 if tp < 4 else 80")),
    Fact("gpu_tiers", (0, 5, 20), None,
         ((20, (2048, 8, 8)), (35, (4096, 48, 160)), (60, (4096, 32, 160)), (160, (8192, 256, 512)),
          (None, (16384, 512, 512))),
         "0.5.20 srt/arg_groups/memory_hook.py; 0.5.23 :101-117",
         (_ARGS, r"chunked_prefill_size 4k, max_bs 48 if tp < 4 else 160")),
    # the default decode graph batch capped at a max_running_requests the user set
    Fact("graph_bs_capped_by_mrr", FIRST, (0, 5, 21), False, "0.5.21 arg_groups/memory_hook.py", _NEXT),
    Fact("graph_bs_capped_by_mrr", (0, 5, 22), None, True, "0.5.23 srt/arg_groups/memory_hook.py:182-188",
         (_ARGS, r"decode_max_bs_is_default\s+and cfg\.max_running_requests is not None")),
    # the decode graph reserve (max_bs * 2 MiB) skipped when decode graphs are off
    Fact("graph_reserve_needs_graphs", FIRST, (0, 5, 14), False, "0.5.14 srt/server_args.py:3284-3285 (always added)",
         _NEXT),
    Fact("graph_reserve_needs_graphs", (0, 5, 15), None, True,
         "0.5.15.post1 srt/server_args.py:3639-3643; 0.5.23 arg_groups/memory_hook.py:364-368",
         (_ARGS, r"decode_cuda_graph_config\.backend != Backend\.DISABLED\s*\):\s*"
                 r"reserved_mem \+= decode_cuda_graph_config\.max_bs \* 2")),
    # prefill ("piecewise") CUDA graphs by default, and their reserve in the default
    # mem_fraction_static (len(token sizes) * 8 MiB, MLA 1.5 GiB):
    # "off"        off unless --enable-piecewise-cuda-graph (0.5.9);
    # "tc_no_spec" torch.compile piecewise graphs, off with speculative decoding (0.5.10);
    # "tc"         the same without that rule (0.5.11-0.5.14); off for multimodal models and the
    #              architectures of piecewise_disabled_archs (configs/model_config.py);
    # "breakable"  breakable graphs on CUDA from 0.5.15 (no architecture list): off for multimodal
    #              models not in breakable_multimodal_archs, and for MLA while breakable_mla_off
    Fact("piecewise_default", FIRST, (0, 5, 9), "off", "0.5.9 srt/server_args.py:604, reserve :1043-1046",
         (("srt/server_args.py",), r"enable_piecewise_cuda_graph: bool = False")),
    Fact("piecewise_default", (0, 5, 10), (0, 5, 10), "tc_no_spec",
         "0.5.10.post1 srt/server_args.py:637, :1088-1090 (2. Speculative decoding), reserve :1304-1311",
         (("srt/server_args.py",), r"# 2\. Speculative decoding")),
    Fact("piecewise_default", (0, 5, 11), (0, 5, 14), "tc",
         "0.5.11 srt/server_args.py:1194-1262 (no speculative rule), reserve :1457-1464; 0.5.14 "
         "model_executor/cuda_graph_config.py:91 PhaseConfig(backend=Backend.TC_PIECEWISE), rules "
         "server_args.py:2997-3050, reserve :3299-3306",
         "the absence of a rule; the 0.5.10 rule and the 0.5.15 default are checked absent here"),
    Fact("piecewise_default", (0, 5, 15), None, "breakable",
         "0.5.15.post1 model_executor/cuda_graph_config.py default_prefill_backend; rules server_args.py "
         ":3340-3380 (0.5.23 arg_groups/cuda_graph_hook.py:170-240), reserve 0.5.23 arg_groups/memory_hook.py:380-389",
         (("srt/model_executor/cuda_graph_config.py",), r"return Backend\.BREAKABLE if is_cuda\(\)")),
    Fact("breakable_mla_off", FIRST, (0, 5, 13), False, "0.5.13.post1: no breakable prefill graphs",
         "the next entry's text is checked absent here"),
    # (0.5.14 has the rule for an opted-in breakable backend; the default is breakable from 0.5.15)
    Fact("breakable_mla_off", (0, 5, 14), (0, 5, 16), True, "0.5.15.post1 srt/server_args.py:3351-3352, 0.5.16 :3773-3774",
         (_ARGS, r'\("MLA attention", lambda')),
    Fact("breakable_mla_off", (0, 5, 17), None, False, "0.5.17 server_args.py (no MLA rule for breakable graphs)",
         "the 0.5.15-0.5.16 rule text is checked absent here"),
    Fact("breakable_multimodal_archs", FIRST, (0, 5, 15), (), "0.5.15.post1 server_args.py:3374 (every multimodal model)",
         "the lists' members are compared by the conformance test"),
    Fact("breakable_multimodal_archs", (0, 5, 16), (0, 5, 17),
         ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"),
         "0.5.16 srt/configs/model_config.py multimodal_breakable_cuda_graph_supported_model_archs",
         "the lists' members are compared by the conformance test"),
    Fact("breakable_multimodal_archs", (0, 5, 18), (0, 5, 18),
         ("InternS2MobiusForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
          "Qwen3_5MoeForConditionalGeneration", "MuseGlimmerForConditionalGeneration", "KimiK3ForConditionalGeneration",
          "KimiK25ForConditionalGeneration"), "0.5.18 srt/configs/model_config.py",
         "the lists' members are compared by the conformance test"),
    Fact("breakable_multimodal_archs", (0, 5, 19), (0, 5, 19),
         ("Cohere2VisionForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
          "PaddleOCRVLForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
          "MuseGlimmerForConditionalGeneration", "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration"),
         "0.5.19 srt/configs/model_config.py", "the lists' members are compared by the conformance test"),
    Fact("breakable_multimodal_archs", (0, 5, 20), (0, 5, 21),
         ("Cohere2VisionForConditionalGeneration", "Glm5NextForConditionalGeneration",
          "InternS2MobiusForConditionalGeneration", "PaddleOCRVLForConditionalGeneration",
          "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "MuseGlimmerForConditionalGeneration",
          "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration"),
         "0.5.20 srt/configs/model_config.py", "the lists' members are compared by the conformance test"),
    Fact("breakable_multimodal_archs", (0, 5, 22), (0, 5, 22),
         ("Cohere2VisionForConditionalGeneration", "Glm5NextForConditionalGeneration",
          "InternS2MobiusForConditionalGeneration", "PaddleOCRVLForConditionalGeneration",
          "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
          "MuseGlimmerForConditionalGeneration", "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration",
          "MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"),
         "0.5.22 srt/configs/model_config.py", "the lists' members are compared by the conformance test"),
    Fact("breakable_multimodal_archs", (0, 5, 23), None,
         ("MiniMaxM3SparseForConditionalGeneration", "Cohere2VisionForConditionalGeneration",
          "Glm5NextForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
          "PaddleOCRVLForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
          "Qwen4ExpForConditionalGeneration", "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration",
          "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration", "MiniMaxM3SparseForCausalLM",
          "MiniMaxM3SparseForConditionalGeneration"),
         "0.5.23 srt/configs/model_config.py:2501", "the lists' members are compared by the conformance test"),
    Fact("piecewise_disabled_archs", FIRST, (0, 5, 9), (), "0.5.9 (piecewise graphs off by default)",
         "0.5.9 has no list: checked by the next entry's text"),
    Fact("piecewise_disabled_archs", (0, 5, 10), (0, 5, 11),
         ("DeepseekV32ForCausalLM", "Qwen3NextForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeV2_5ForCausalLM",
          "LLaDAModelLM"), "0.5.11 srt/configs/model_config.py:piecewise_cuda_graph_disabled_model_archs",
         "the list's members are compared by the conformance test"),
    Fact("piecewise_disabled_archs", (0, 5, 12), (0, 5, 12),
         ("DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "Qwen3NextForCausalLM",
          "GlmMoeDsaForCausalLM", "BailingMoeV2_5ForCausalLM", "LLaDAModelLM"),
         "0.5.12.post1 srt/configs/model_config.py", "the list's members are compared by the conformance test"),
    Fact("piecewise_disabled_archs", (0, 5, 13), (0, 5, 15),
         ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "Qwen3NextForCausalLM", "BailingMoeV2_5ForCausalLM",
          "LLaDAModelLM"), "0.5.13.post1, 0.5.14 srt/configs/model_config.py",
         "the list's members are compared by the conformance test"),
    Fact("piecewise_disabled_archs", (0, 5, 16), (0, 5, 19),
         ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark",
          "Qwen3NextForCausalLM", "BailingMoeV2_5ForCausalLM", "LLaDAModelLM"),
         "0.5.16, 0.5.18 srt/configs/model_config.py", "the list's members are compared by the conformance test"),
    Fact("piecewise_disabled_archs", (0, 5, 20), None,
         ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark",
          "Qwen3NextForCausalLM", "Glm5NextForConditionalGeneration", "BailingMoeV2_5ForCausalLM", "LLaDAModelLM"),
         "0.5.20, 0.5.23 srt/configs/model_config.py", "the list's members are compared by the conformance test"),

    # ------------------------------------------------------------------ HTTP and /server_info
    Fact("ready_endpoint", FIRST, (0, 5, 19), False, "0.5.19 entrypoints/http_server.py (no /ready)", _NEXT),
    Fact("ready_endpoint", (0, 5, 20), None, True, "0.5.20 srt/entrypoints/http_server.py: @app.get('/ready')",
         (("srt/entrypoints/",), r'"/ready"')),
    Fact("ready_skips_api_key", FIRST, (0, 5, 19), False, "0.5.11 srt/utils/auth.py:100", _NEXT),
    Fact("ready_skips_api_key", (0, 5, 20), None, True, "0.5.20 srt/utils/auth.py:101-105",
         (("srt/utils/auth.py",), r"/ready")),
    # GET /v1/loads (every release: 0.5.9 srt/entrypoints/v1_loads.py:130, 0.5.11 :134, 0.5.23 :96),
    # per-rank num_running_reqs and num_waiting_reqs in "loads"; around them, until 0.5.12 an
    # "aggregate" (0.5.11 :173-179), from 0.5.17 the accelerator's name and count (0.5.23 :145-151)
    Fact("loads_aggregate", FIRST, (0, 5, 12), True, "0.5.11 srt/entrypoints/v1_loads.py:178",
         (("srt/entrypoints/v1_loads.py",), r'"aggregate": _compute_aggregate')),
    Fact("loads_aggregate", (0, 5, 13), None, False, "0.5.13.post1 srt/entrypoints/v1_loads.py (no aggregate)",
         "the previous entry's text is checked absent here"),
    Fact("loads_accelerators", FIRST, (0, 5, 16), False, "0.5.16 srt/entrypoints/v1_loads.py", _NEXT),
    Fact("loads_accelerators", (0, 5, 17), None, True, "0.5.23 srt/entrypoints/v1_loads.py:148-149",
         (("srt/entrypoints/v1_loads.py",), r'"num_accelerators"')),
    Fact("server_info_kv_events", FIRST, (0, 5, 12), False, "0.5.12.post1 http_server.py", _NEXT),
    Fact("server_info_kv_events", (0, 5, 13), None, True, "0.5.13.post1 srt/entrypoints/http_server.py:656",
         ((_SRT,), r'"kv_events"')),
    Fact("server_info_launch_command", FIRST, (0, 5, 19), False, "0.5.19 http_server.py", _NEXT),
    Fact("server_info_launch_command", (0, 5, 20), None, True, "0.5.20 srt/entrypoints/http_server.py:840",
         (("srt/entrypoints/http_server.py", "srt/entrypoints/engine.py"), r'"launch_command"')),
    Fact("server_info_frontend", FIRST, (0, 5, 20), False, "0.5.20 http_server.py", _NEXT),
    Fact("server_info_frontend", (0, 5, 21), None, True, "0.5.23 srt/entrypoints/http_server.py:889",
         (("srt/entrypoints/http_server.py",), r'"frontend"')),
    Fact("internal_state_world_size", FIRST, (0, 5, 18), False, "0.5.18 scheduler", _NEXT),
    Fact("internal_state_world_size", (0, 5, 19), None, True,
         "0.5.23 srt/managers/scheduler_components/internal_state.py:67",
         (("srt/managers/",), r'\["world_size"\]|"world_size":')),
    Fact("memory_usage_by_phase", FIRST, (0, 5, 16), False, "0.5.11 managers/scheduler.py:3372-3380", _NEXT),
    Fact("memory_usage_by_phase", (0, 5, 17), None, True, "0.5.17 model_executor/graph_memory_usage.py:5-12",
         ((_SRT,), r"GRAPH_MEMORY_USAGE_KEYS")),
    Fact("internal_state_decode_graph_bs", FIRST, (0, 5, 20), False, "0.5.20 scheduler", _NEXT),
    Fact("internal_state_decode_graph_bs", (0, 5, 21), None, True,
         "0.5.23 srt/managers/scheduler_components/internal_state.py:101-103",
         (("srt/managers/",), r'"decode_cuda_graph_bs"')),

    # ------------------------------------------------------------------ start-up log wording
    Fact("logs_init_parallel", FIRST, (0, 5, 20), False, "0.5.11 model_executor/model_runner.py:1103, :1236",
         _NEXT),
    Fact("logs_init_parallel", (0, 5, 21), None, True, "0.5.23 srt/distributed/bootstrap.py:115, :190, :220",
         ((_SRT,), r"Init parallel begin")),
    Fact("kv_cache_log_names_dtype", FIRST, (0, 5, 12), False, "0.5.11 model_runner.py:2256, memory_pool.py:735",
         "later releases reword the line; the 0.5.12 wording is checked instead"),
    Fact("kv_cache_log_names_dtype", (0, 5, 13), None, True, "0.5.13.post1 srt/mem_cache/memory_pool.py:819",
         "the dtype moves into the allocation line in 0.5.13.post1 and the line is reworded in 0.5.17"),
    Fact("capture_log_names_phase", FIRST, (0, 5, 13), False, "0.5.11 model_runner.py:2779", _NEXT),
    Fact("capture_log_names_phase", (0, 5, 14), None, True, "0.5.14 model_executor/model_runner.py:2563-2565",
         ((_SRT,), r"CUDA graph begin\. backend=|Capture target verify CUDA graph begin")),
    Fact("capture_log_num_tokens_per_req", FIRST, (0, 5, 15), False,
         "0.5.14 model_runner.py: num_tokens_per_bs=", _NEXT),
    Fact("capture_log_num_tokens_per_req", (0, 5, 16), None, True,
         "0.5.16 model_runner_components/cuda_graph_setup.py:312-315",
         (("srt/model_executor/",), r"num_tokens_per_req=")),
    Fact("capture_log_bs_at_end", FIRST, (0, 5, 21), False, "0.5.21 cuda_graph_setup.py",
         "where bs=[...] sits in a log line is layout, not a distinct text"),
    Fact("capture_log_bs_at_end", (0, 5, 22), None, True,
         "0.5.23 model_runner_components/cuda_graph_setup.py:759-761, :788-792",
         "where bs=[...] sits in a log line is layout, not a distinct text"),
    Fact("graph_hint_names_decode_flags", FIRST, (0, 5, 13), False, "0.5.11 cuda_graph_runner.py:1431-1438", _NEXT),
    Fact("graph_hint_names_decode_flags", (0, 5, 14), None, True, "0.5.14 runner_backend_utils/__init__.py:14-21",
         ((_SRT,), r"--cuda-graph-max-bs-decode to a smaller")),

    # ------------------------------------------------------------------ metrics (--enable-metrics)
    # the request counters and latency histograms gain an is_streaming label ("true"/"false"):
    # e2e_request_latency_seconds, time_to_first_token_seconds, prompt_tokens_total,
    # generation_tokens_total, num_requests_total (measured on real 0.5.11 and 0.5.23 servers:
    # lab/real/metrics-facts.md)
    Fact("metrics_is_streaming_label", FIRST, (0, 5, 16), False,
         "0.5.16 srt/observability/metrics_collector.py (no is_streaming label)", _NEXT),
    Fact("metrics_is_streaming_label", (0, 5, 17), None, True,
         "0.5.17 srt/observability/metrics_collector.py:1484-1489, 0.5.23 :1858,1863,1943,2046",
         (("srt/observability/", "srt/metrics/"), r'labelnames=.*"is_streaming"')),
    # --enable-metrics adds an HTTP middleware that names each request's route: up to 0.5.15 it
    # reads route.path of whatever route matches, and a router included with include_router
    # (GET /v1/loads, 0.5.11 srt/entrypoints/http_server.py:419) has none under the fastapi the
    # release's constraints pin (0.165.0: fastapi.routing._IncludedRouter), so /v1/loads answers
    # 500 (AttributeError, measured on real 0.5.11 with --enable-metrics); 0.5.16 reads it with getattr
    Fact("metrics_keep_v1_loads", FIRST, (0, 5, 15), False,
         "0.5.11 srt/utils/common.py:1511-1519 (_get_fastapi_request_path: return route.path, True)", _NEXT),
    Fact("metrics_keep_v1_loads", (0, 5, 16), None, True,
         "0.5.16 srt/utils/common.py:2416, 0.5.23 srt/observability/http_request_metrics.py:115",
         (("srt/utils/common.py", "srt/observability/"), r'getattr\(route, "path"')),
    # 0.5.17 also replaced the startup gauges engine_startup_time/engine_load_weights_time
    # (0.5.11 metrics_collector.py:851,857) by startup_time_seconds{phase} (0.5.17 :1469)
    Fact("metrics_startup_time_by_phase", FIRST, (0, 5, 16), False,
         "0.5.11 srt/observability/metrics_collector.py:851: sglang:engine_startup_time", _NEXT),
    Fact("metrics_startup_time_by_phase", (0, 5, 17), None, True,
         "0.5.17 srt/observability/metrics_collector.py:1469, 0.5.23 :1843: sglang:startup_time_seconds",
         (("srt/observability/", "srt/metrics/"), r'"sglang:startup_time_seconds"')),

    # ------------------------------------------------------------------ CUDA libraries
    # the CUDA libraries each release line's kernel package opens with ctypes ({major}: the
    # toolkit's CUDA major version); sgl-kernel preloads the runtime RTLD_GLOBAL on import
    # (_runtime_probe.default_libraries reads it)
    Fact("kernel_cuda_libraries", FIRST, None, ("libcudart.so.{major}",),
         "sgl_kernel/load_utils.py:217-240 of the kernel installed with 0.5.11 (:212-235 with 0.5.23): "
         "ctypes.CDLL(libcudart.so.{major}, RTLD_GLOBAL)",
         "in the kernel package's wheel, which is not among the sglang wheels checked"),
)


def parse(version) -> tuple:
    """(0, 5, 13) from '0.5.13.post1', '0.5.11+simulator', 'v0.5.9' or a tuple."""
    if isinstance(version, tuple):
        return tuple(int(x) for x in version[:3])
    text = str(version or "").strip().lstrip("v")
    parts = []
    for piece in text.split(".")[:3]:
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            raise ValueError(f"not an SGLang version: {version!r}")
        parts.append(int(digits))
        if len(digits) < len(piece):
            break
    if len(parts) < 3:
        raise ValueError(f"not an SGLang version: {version!r}")
    return tuple(parts)


def _index() -> dict:
    by_name: dict = {}
    for entry in FACTS:
        by_name.setdefault(entry.name, []).append(entry)
    return {name: sorted(entries, key=lambda e: e.since) for name, entries in by_name.items()}


BY_NAME = _index()
NAMES = tuple(BY_NAME)


def entry(name: str, version) -> Fact:
    """The entry of ``name`` that covers ``version`` (the first one for releases before FIRST)."""
    version = parse(version)
    entries = BY_NAME[name]
    for item in entries:
        if item.since <= version and (item.until is None or version <= item.until):
            return item
    return entries[0] if version < entries[0].since else entries[-1]


@functools.lru_cache(maxsize=256)
def _facts(version: tuple) -> dict:
    return {name: entry(name, version).value for name in NAMES}


def facts(version) -> dict:
    """Every fact's value for one release (cached per version; do not change the dict)."""
    return _facts(parse(version))


def fact(name: str, version):
    """One fact's value for one release."""
    return facts(version)[name]


def first(name: str, value=True) -> tuple:
    """The first release where ``name`` has ``value`` (for flags that switch once)."""
    for item in BY_NAME[name]:
        if item.value == value:
            return item.since
    raise KeyError(f"{name} never has the value {value!r}")
