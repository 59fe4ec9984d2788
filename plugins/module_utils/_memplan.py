# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Memory planner: will a variant's envelope fit a host's GPUs, and why not.

Pure Python (no Ansible imports), so the module, the deploy preflight and the
command line (``tools/inferops_plan.py``) share it. All sizes are per
tensor-parallel rank, as SGLang sizes them.

Two sides, as in the field story:

* The static pool follows SGLang's own accounting for the installed release
  (the ``ModelRunner`` memory profile, read from the published wheels 0.5.9 ...
  0.5.23; what changed between releases is in ``_sglang_releases``)::

      pre   = free memory before the weights load (GPU total - CUDA context)
      post  = pre - target weights/tp  (- draft weights/tp from 0.5.14)
      rest  = post - pre * (1 - mem_fraction_static)  (- 100 MiB VLM cache, 0.5.18+)
      hybrid linear-attention (Gated DeltaNet) models, state_per_req = conv + SSM state:
        slots = max_mamba_cache_size | max_running_requests (radix cache off)
                | rest * r / (1 + r) // state_per_req             (r = mamba_full_memory_ratio)
                  (0.5.13+ with speculation: // (state_per_req * (1 + draft_tokens / ratio));
                   0.5.17+ less the padding slot first: (budget - state_per_req * (1 + draft_tokens)))
        rest -= state_per_req * requests * draft_tokens            (speculative states)
        rest -= slots * state_per_req
      cell  = MHA: max(1, kv_heads // tp) * (head_dim + v_head_dim) * kv_layers * elem
              MLA: (kv_lora_rank + qk_rope_head_dim) * kv_layers * elem
              DFLASH (0.5.11+): ceil(cell * (kv_layers + draft_layers) / kv_layers)
                     (0.5.18+: cell + the draft's own cell)
              EAGLE with a draft path (0.5.14+): cell * (1 + draft_layers / kv_layers)
      max_total_tokens = rest // cell, rounded down to page_size
      max_total_tokens <= 0: "Not enough memory. Please try to increase --mem-fraction-static."

* What SGLang allocates outside the pool after the profile (the dynamic side,
  about ``pre * (1 - mem_fraction_static)``) has no formula in SGLang. The
  planner estimates it from the model's shapes and the envelope: the attention
  backend's workspace, one prefill chunk's activations and the logits, CUDA
  graphs, the draft model's weights before 0.5.14, and an EAGLE-family draft's
  KV pool of the same token count when it is not folded into the cell (always
  for NEXTN/MTP without a draft path). Every estimate constant is in
  ASSUMPTIONS, can be overridden, and is returned with each plan.
"""

from __future__ import annotations

import functools
import math
import re

try:
    from ansible_collections.inferops.sglang.plugins.module_utils import _model_config
    from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_releases as releases
except ImportError:  # loaded from the tree (lab/bench/planner.py, tools/)
    import _model_config  # type: ignore[no-redef]
    import _sglang_releases as releases  # type: ignore[no-redef]

GIB = float(1 << 30)
MIB = float(1 << 20)

DTYPE_BYTES = {
    "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp4_e2m1": 0.5,
}
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "MTP")
DFLASH_FAMILY = ("DFLASH", "DDTREE")
# Algorithms of the team's patched DDTree build, which replaces server_args.py with a
# later source snapshot: it does not refuse speculative decoding on a hybrid model with
# radix cache on (0.5.10-0.5.13), so radix cache stays on with the no_buffer strategy.
PATCHED_BUILD_ALGORITHMS = ("DDTREE",)

# Estimates for what SGLang does not budget (per rank). Override with `assumptions`.
ASSUMPTIONS = {
    # CUDA context, cuBLAS handles and NCCL communicators, in use before the weights load.
    "context_mib": 768,
    # Attention backend workspace (FlashInfer's 384 MiB buffer plus the small ones).
    "workspace_mib": 512,
    # Live tensors per token of a prefill chunk, as a multiple of the largest layer's transient width.
    "activation_factor": 1.0,
    # CUDA graph memory pool: a fixed part per captured runner (target, and draft when speculative),
    "graph_base_mib": 256,
    # and a part per captured token (batch size x tokens verified per step).
    "graph_per_token_mib": 2,
}


class PlanError(Exception):
    """The inputs cannot be planned (missing model files, bad envelope)."""


# --------------------------------------------------------------------------- models


def read_model_dir(path: str) -> dict:
    """A model directory's config.json and weight size (the collection's one reader,
    _model_config), as model_spec() input."""
    model = _model_config.read(path, error=PlanError)
    return model_spec(model["config"], model["weight_bytes"], path)


def _dtype_bytes(name) -> float:
    name = str(name or "bfloat16").replace("torch.", "")
    if name not in DTYPE_BYTES:
        raise PlanError(f"unknown dtype {name!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
    return DTYPE_BYTES[name]


def model_spec(config: dict, weight_bytes: int, path: str = "") -> dict:
    """The numbers the memory profile depends on, from a Hugging Face config."""
    text = _model_config.text_config(config)
    try:
        layers = int(text["num_hidden_layers"])
        hidden = int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"config.json of {path or 'the model'} lacks {exc}") from exc
    layer_types = text.get("layer_types")
    if layer_types:
        kv_layers = sum(1 for t in layer_types if t in ("full_attention", "attention"))
    elif text.get("full_attention_interval"):
        kv_layers = layers // int(text["full_attention_interval"])
    else:
        kv_layers = layers
    head_dim = int(text.get("head_dim") or hidden // heads)
    mla = text.get("kv_lora_rank") is not None
    spec = {
        "path": path,
        "architecture": (config.get("architectures") or ["unknown"])[0],
        "model_type": str(config.get("model_type") or text.get("model_type") or ""),
        "dtype": str(text.get("torch_dtype") or config.get("torch_dtype") or text.get("dtype") or "bfloat16"),
        "weight_bytes": int(weight_bytes),
        "hidden_size": hidden,
        "intermediate_size": int(text.get("intermediate_size") or 4 * hidden),
        "moe_intermediate_size": int(text.get("moe_intermediate_size") or 0),
        "vocab_size": int(text.get("vocab_size") or 0),
        "num_layers": layers,
        "kv_layers": kv_layers,
        "linear_layers": layers - kv_layers,
        "num_attention_heads": heads,
        "num_kv_heads": int(text.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "v_head_dim": int(text.get("v_head_dim") or head_dim) if not mla else 0,
        "mla": mla,
        "kv_lora_rank": int(text.get("kv_lora_rank") or 0),
        "qk_rope_head_dim": int(text.get("qk_rope_head_dim") or 0),
        "linear_num_key_heads": int(text.get("linear_num_key_heads") or 0),
        "linear_num_value_heads": int(text.get("linear_num_value_heads") or 0),
        "linear_key_head_dim": int(text.get("linear_key_head_dim") or 0),
        "linear_value_head_dim": int(text.get("linear_value_head_dim") or 0),
        "linear_conv_kernel_dim": int(text.get("linear_conv_kernel_dim") or 4),
        "max_position_embeddings": int(text.get("max_position_embeddings") or 0),
        "mtp_layers": int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0),
        "block_size": int(config["block_size"]) if config.get("block_size") else None,
        "vision": config.get("vision_config") if isinstance(config.get("vision_config"), dict) else None,
    }
    spec["dtype_bytes"] = _dtype_bytes(spec["dtype"])
    if spec["linear_layers"] and not (spec["linear_num_value_heads"] and spec["linear_value_head_dim"]):
        raise PlanError(f"{path or 'the model'} has {spec['linear_layers']} linear-attention layers but no "
                        "linear_num_value_heads/linear_value_head_dim in config.json")
    return spec


def layer_weight_bytes(model: dict) -> int:
    """Weight bytes of one full-attention decoder layer (attention with its
    output gate where the model has one, and the dense FFN): what an MTP head
    costs besides the shared embedding and LM head, plus its fusion projection."""
    h, d = model["hidden_size"], model["head_dim"]
    q = model["num_attention_heads"] * d
    attn = h * q * 2 + h * model["num_kv_heads"] * d * 2 + q * h
    ffn = 3 * h * model["intermediate_size"]
    return int((attn + ffn + 2 * h * h) * model["dtype_bytes"])


# --------------------------------------------------------------------------- releases


def parse_version(text: str) -> tuple[int, int, int]:
    match = re.match(r"\s*v?(\d+)\.(\d+)\.(\d+)", str(text or ""))
    if not match:
        raise PlanError(f"cannot read an SGLang version from {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


@functools.lru_cache(maxsize=64)
def release(version: tuple[int, int, int]) -> dict:
    """What changed between SGLang releases that the profile depends on: the
    facts of _sglang_releases for this release (cached; do not change the dict)."""
    out = dict(releases.facts(version))
    out["version"] = tuple(version)
    out["rest_check"] = out["new_pool_error"]
    return out


# --------------------------------------------------------------------------- SGLang's own formulas


def gpu_tier(gpu_gib: float, tp: int, rel: dict) -> tuple[int, int]:
    """SGLang's defaults by GPU memory: (chunked_prefill_size, cuda_graph_max_bs)
    (the release's gpu_tiers: 0.5.11 server_args.py _handle_gpu_memory_settings,
    0.5.23 arg_groups/memory_hook.py:101-117)."""
    for bound, (chunked, small_tp, large_tp) in rel["gpu_tiers"]:
        if bound is None or gpu_gib < bound:
            return chunked, small_tp if tp < 4 else large_tp
    raise PlanError("gpu_tiers has no last tier")  # the table's last bound is None


def piecewise_graphs(rel: dict, algorithm: str | None, architecture: str, vision: dict | None,
                     cuda_graph: bool = True, mla: bool = False) -> bool:
    """Whether SGLang captures prefill ("piecewise") CUDA graphs by default, which the
    default mem_fraction_static reserves for (the release's piecewise_default): off in
    0.5.9 (server_args.py:604); torch.compile piecewise graphs 0.5.10-0.5.14, off with
    speculative decoding in 0.5.10 (0.5.10.post1 server_args.py:1088-1090), off for
    multimodal models and piecewise_disabled_archs (0.5.11 server_args.py:1200-1203,
    :1228-1230, configs/model_config.py; the reserve skipped at :1457-1464); breakable
    graphs from 0.5.15 (cuda_graph_config.py default_prefill_backend), off for multimodal
    models not in breakable_multimodal_archs and for MLA in 0.5.15-0.5.16. From 0.5.14 off
    with CUDA graphs off (prefill backend disabled, 0.5.14 server_args.py:3300)."""
    default = rel["piecewise_default"]
    if default == "off" or (default == "tc_no_spec" and algorithm):
        return False
    if not cuda_graph and rel["split_cuda_graph_flags"]:
        return False
    if default == "breakable":
        if mla and rel["breakable_mla_off"]:
            return False
        return vision is None or architecture in rel["breakable_multimodal_archs"]
    return vision is None and architecture not in rel["piecewise_disabled_archs"]


def piecewise_graph_sizes(max_tokens: int) -> list[int]:
    """The token counts SGLang captures piecewise (prefill) CUDA graphs for."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return [x for x in sizes if x <= max_tokens]


def default_mfs(gpu_mib: float, tp: int, chunked: int, max_bs: int, algorithm: str | None, rel: dict,
                vision: dict | None = None, mla: bool = False, architecture: str = "",
                cuda_graph: bool = True) -> float:
    """SGLang's mem_fraction_static when the flag is unset: GPU memory less a
    reserve for activations, graphs and (before 0.5.14) the draft model, then
    lowered for a multimodal model's vision encoder."""
    reserved_mb = 512 + max(chunked, 2048) * 1.5 + tp / 8 * 1024
    if cuda_graph or not rel["graph_reserve_needs_graphs"]:
        reserved_mb += max_bs * 2  # decode graphs (0.5.15+ only when captured, 0.5.23 memory_hook.py:364-368)
    if piecewise_graphs(rel, algorithm, architecture, vision, cuda_graph, mla):
        reserved_mb += 1.5 * 1024 if mla else len(piecewise_graph_sizes(chunked)) * 8
    if gpu_mib > 60 * 1024:
        reserved_mb = max(reserved_mb, 10240)
    if algorithm == "STANDALONE":
        reserved_mb += rel["standalone_reserve_mb"]
    elif algorithm and algorithm != "NGRAM":
        reserved_mb += rel["spec_reserve_mb"]
    mfs = round((gpu_mib - reserved_mb) / gpu_mib, 3)
    if vision is not None:
        # adjust_mem_fraction_for_vlm: vision layers default to 24, hidden size to 1024
        layers = int(vision.get("num_hidden_layers") or 24)
        hidden = int(vision.get("hidden_size") or 1024)
        ratio = layers * hidden ** 2 / (24 * 1024 ** 2)
        mfs = mfs * 0.95 * min(max(1.0 - 0.1 * (ratio - 1.0), 0.8), 1.05)
    return mfs


def mamba_state_bytes(model: dict, tp: int, ssm_bytes: int = 4) -> int:
    """Gated DeltaNet state one request holds on one rank (SGLang's
    Mamba2StateShape: the conv state in the model dtype, the recurrent SSM
    state in float32), over all linear-attention layers."""
    if not model["linear_layers"]:
        return 0
    groups = model["linear_num_key_heads"]
    if groups % tp:  # SGLang pads the key-head groups up to a multiple of tp
        groups += tp - groups % tp
    inner = model["linear_num_value_heads"] * model["linear_value_head_dim"]
    conv_dim = inner + 2 * groups * model["linear_key_head_dim"]
    conv = (conv_dim // tp) * (model["linear_conv_kernel_dim"] - 1) * model["dtype_bytes"]
    ssm = (model["linear_num_value_heads"] // tp) * model["linear_value_head_dim"] * model["linear_key_head_dim"] * ssm_bytes
    return int((conv + ssm) * model["linear_layers"])


def kv_cell_bytes(model: dict, tp: int, elem: float, layers: int | None = None) -> int:
    """KV bytes one token costs on one rank, over the layers that hold KV."""
    layers = model["kv_layers"] if layers is None else layers
    if model["mla"]:
        return int((model["kv_lora_rank"] + model["qk_rope_head_dim"]) * layers * elem)
    return int(max(1, model["num_kv_heads"] // tp) * (model["head_dim"] + model["v_head_dim"]) * layers * elem)


# --------------------------------------------------------------------------- the envelope


_EXTRA_INT = {"--page-size": "page_size", "--max-total-tokens": "max_total_tokens",
              "--max-mamba-cache-size": "max_mamba_cache_size"}
_EXTRA_FLOAT = {"--mamba-full-memory-ratio": "mamba_full_memory_ratio"}
_EXTRA_FLAG = {"--disable-radix-cache": "disable_radix_cache"}
# the strategy flag before 0.5.14 and from 0.5.14 (see _variants.MAMBA_RADIX_CACHE_STRATEGY_FLAG)
_EXTRA_STR = {"--mamba-scheduler-strategy": "mamba_radix_cache_strategy",
              "--mamba-radix-cache-strategy": "mamba_radix_cache_strategy"}


def envelope(params: dict) -> dict:
    """The variant parameters the profile depends on, with server flags from
    extra_args that change it (--page-size, --max-total-tokens, ...). Radix
    cache: the variant's disable_radix_cache and mamba_radix_cache_strategy,
    which the role renders as flags; the same flags in extra_args count too."""
    env = {k: params.get(k) for k in (
        "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
        "context_length", "max_running_requests", "mem_fraction_static", "chunked_prefill_size", "kv_cache_dtype",
        "cuda_graph_max_bs")}
    env["cuda_graph"] = params.get("cuda_graph", True)
    env.update(page_size=1, max_total_tokens=None, max_mamba_cache_size=None, mamba_full_memory_ratio=0.9,
               disable_radix_cache=bool(params.get("disable_radix_cache")),
               mamba_radix_cache_strategy=params.get("mamba_radix_cache_strategy"))
    extra = [str(x) for x in params.get("extra_args") or []]
    for i, arg in enumerate(extra):
        flag, _sep, inline = arg.partition("=")
        value = inline or (extra[i + 1] if i + 1 < len(extra) else "")
        try:
            if flag in _EXTRA_INT:
                env[_EXTRA_INT[flag]] = int(value)
            elif flag in _EXTRA_FLOAT:
                env[_EXTRA_FLOAT[flag]] = float(value)
        except ValueError as exc:
            raise PlanError(f"extra_args {flag} needs a number, got {value!r}") from exc
        if flag in _EXTRA_STR:
            env[_EXTRA_STR[flag]] = value
        if flag in _EXTRA_FLAG:
            env[_EXTRA_FLAG[flag]] = True
        elif flag in ("--disable-cuda-graph",):
            env["cuda_graph"] = False
    if env["speculative_algorithm"]:
        env["speculative_algorithm"] = str(env["speculative_algorithm"]).upper()
    return env


def _draft_tokens(env: dict, draft: dict | None) -> int:
    algo = env["speculative_algorithm"]
    if not algo:
        return 1
    if env.get("speculative_num_draft_tokens"):
        return int(env["speculative_num_draft_tokens"])
    if algo in DFLASH_FAMILY:
        return (draft or {}).get("block_size") or 16
    return 4  # SGLang's EAGLE-family default: steps 3, top-k 1, 4 draft tokens


# --------------------------------------------------------------------------- one plan


def _radix_off(env: dict, rel: dict, hybrid: bool) -> bool:
    """Whether the server runs without radix cache (which sizes the linear-attention slots)."""
    if env["disable_radix_cache"]:
        return True
    if not (hybrid and env["speculative_algorithm"]):
        return False
    # 0.5.9 turns radix cache off itself; 0.5.10-0.5.13 refuse to start unless the variant
    # disables it or keeps it with extra_buffer (0.5.11 server_args.py:2452-2456): the plan
    # assumes the variant is fixed the way the refusal suggests first (radix off) and warns.
    # The patched DDTree build does not refuse: radix cache stays on (ratio branch, 0.5.11
    # model_runner_kv_cache_mixin.py:108-121).
    if env["speculative_algorithm"] in PATCHED_BUILD_ALGORITHMS:
        return False
    return rel["hybrid_spec_radix"] == "off" or (rel["hybrid_spec_radix"] == "refuse"
                                                 and env["mamba_radix_cache_strategy"] != "extra_buffer")


def _slots_per_request(env: dict, rel: dict, radix_off: bool, spec: bool) -> int:
    """Linear-attention slots the scheduler keeps per running request."""
    if radix_off:
        return 1  # 0.5.11 model_runner_kv_cache_mixin.py:180-181
    strategy = env["mamba_radix_cache_strategy"]
    # 0.5.14+ resolve strategy auto to extra_buffer (0.5.14 server_args.py:4379-4392)
    extra = strategy == "extra_buffer" or (strategy in (None, "auto") and rel["hybrid_spec_radix"] == "extra_buffer")
    if not extra:
        return 3  # 0.5.11 mixin :44-46
    # the extra_buffer ping-pong pair (overlap schedule on), one slot with speculative
    # decoding from 0.5.14 (the lazy buffer, 0.5.14 mixin :274-293)
    return 3 + (1 if spec and rel["mamba_lazy_spec_buffer"] else 2)


def _fixed(model: dict, draft: dict | None, env: dict, tp: int, rel: dict, pre: float, assume: dict) -> dict:
    """Everything one plan's profile needs that does not depend on mem_fraction_static,
    computed once per (variant envelope, host) so the mfs search only redoes the rest."""
    algo = env["speculative_algorithm"]
    target_w = model["target_weight_bytes"] / tp / GIB
    draft_w = model["draft_weight_bytes"] / tp / GIB
    in_pool = draft_w if rel["draft_in_pool"] else 0.0
    elem = _dtype_bytes(env["kv_cache_dtype"]) if env["kv_cache_dtype"] not in (None, "auto") else model["dtype_bytes"]
    base_cell = kv_cell_bytes(model, tp, elem)
    cell = base_cell
    layers = model["kv_layers"]
    if algo in DFLASH_FAMILY and draft is not None and layers:
        if rel["dflash_cell_sum"]:
            cell += kv_cell_bytes(draft, tp, elem)
        else:  # scale_kv_cell_size_per_token_for_dflash: ceil(cell * (T + D) / T)
            cell = (cell * (layers + draft["num_layers"]) + layers - 1) // layers
    elif algo in EAGLE_FAMILY and draft is not None and rel["eagle_draft_cell_fold"] and layers:
        # with a draft model path, the EAGLE draft's KV is folded into the cell
        cell = int(cell * (1 + draft["num_layers"] / layers))
    hybrid = bool(model["linear_layers"])
    spec = bool(algo)
    fixed = {
        "model": model, "draft": draft, "env": env, "rel": rel, "pre": pre, "hybrid": hybrid, "spec": spec,
        "target_w": target_w, "draft_w": draft_w, "draft_w_in_pool": in_pool,
        "post": pre - target_w - in_pool,
        "vlm_gib": rel["vlm_cache_mb"] * MIB / GIB if model["vision"] is not None else 0.0,
        "elem": elem, "cell": cell, "draft_tokens": _draft_tokens(env, draft),
        "per_req": 0, "ratio": 0, "radix_off": False, "pad": 0, "joint": False,
        "mrr_given": env["max_running_requests"] or (48 if spec else None),
    }
    if hybrid:
        radix_off = _radix_off(env, rel, True)
        fixed.update(per_req=mamba_state_bytes(model, tp, env.get("ssm_bytes", 4)), radix_off=radix_off,
                     ratio=_slots_per_request(env, rel, radix_off, spec),
                     pad=1 if rel["mamba_padding_slot"] else 0, joint=spec and rel["mamba_joint_solve"])
    # the dynamic side's parts that depend only on the shapes and the envelope
    h = model["hidden_size"]
    inter = max(model["intermediate_size"], model["moe_intermediate_size"])
    mlp = 3 * inter // tp
    attn = (2 * model["num_attention_heads"] + 3 * model["num_kv_heads"]) * model["head_dim"] // tp
    linear = 0
    if hybrid:
        inner = model["linear_num_value_heads"] * model["linear_value_head_dim"]
        linear = (2 * inner + 2 * model["linear_num_key_heads"] * model["linear_key_head_dim"]) // tp
    fixed["per_token"] = (3 * h + max(mlp, attn, linear)) * model["dtype_bytes"] * assume["activation_factor"]
    fixed["steps"] = fixed["draft_tokens"] if spec else 1
    # an EAGLE-family draft's own KV pool (same token count) is outside the pool unless
    # it was folded into the cell (0.5.14+, and only with a draft model path)
    fixed["draft_cell"] = 0
    if algo in EAGLE_FAMILY and layers and not (draft is not None and rel["eagle_draft_cell_fold"]):
        fixed["draft_cell"] = base_cell * model["draft_kv_layers"] // layers
    return fixed


def _mamba(fixed: dict, rest: float, mrr: int) -> tuple:
    """The linear-attention state pool: (slots, speculative states GiB, slots GiB, what is left GiB)."""
    env, per_req, ratio, pad = fixed["env"], fixed["per_req"], fixed["ratio"], fixed["pad"]
    draft_tokens, joint = fixed["draft_tokens"], fixed["joint"]
    inter_reqs = 0
    if fixed["spec"] and not joint:
        # up to 0.5.12: the speculative states are reserved first, for every request
        inter_reqs = mrr
        rest -= per_req * mrr * draft_tokens / GIB
    if env["max_mamba_cache_size"] is not None:
        slots = env["max_mamba_cache_size"]
    elif fixed["radix_off"]:
        slots = mrr
    else:
        r = env["mamba_full_memory_ratio"]
        budget = rest * r / (1 + r) * GIB
        # 0.5.13+: slots and the speculative states of slots // ratio requests share the budget
        # (0.5.13.post1 mixin :132-160); 0.5.17+ count the padding slot in both buffers:
        # (budget - per_req * (1 + D)) // (per_req * (1 + D / ratio)), else (budget - per_req) // per_req
        # (0.5.17 kv_cache_configurator.py:1930-1955, 0.5.23 :3361-3385)
        if joint:
            slots = int((budget - pad * per_req * (1 + draft_tokens)) // (per_req * (1 + draft_tokens / ratio)))
        else:
            slots = int((budget - pad * per_req) // per_req)
    if joint:
        inter_reqs = min(mrr, slots // ratio) + pad
        rest -= per_req * inter_reqs * draft_tokens / GIB
    slots = max(slots, 0)
    rest -= (slots + pad) * per_req / GIB
    return slots, per_req * inter_reqs * draft_tokens / GIB, (slots + pad) * per_req / GIB, rest


def _core(fixed: dict, mfs: float, mrr: int) -> tuple:
    """SGLang's profile for one mem_fraction_static, as numbers: (rest before the
    linear-attention states, speculative states, state slots, slots GiB, rest for the
    KV cache, KV tokens). Sizes in GiB."""
    env = fixed["env"]
    rest = fixed["post"] - fixed["pre"] * (1 - mfs) - fixed["vlm_gib"]
    before = rest
    slots, spec_gib, slots_gib = 0, 0.0, 0.0
    if fixed["hybrid"]:
        slots, spec_gib, slots_gib, rest = _mamba(fixed, rest, mrr)
    tokens = int(rest * GIB) // fixed["cell"] if rest > 0 else 0
    page = env["page_size"]
    if page != 1:
        tokens = tokens // page * page
    if env["max_total_tokens"]:
        tokens = min(tokens, env["max_total_tokens"])
    return before, spec_gib, slots, slots_gib, rest, tokens


def _static(fixed: dict, mfs: float, mrr: int) -> dict:
    """SGLang's profile for one mem_fraction_static. Sizes in GiB."""
    pre, cell = fixed["pre"], fixed["cell"]
    before, spec_gib, slots, slots_gib, rest, tokens = _core(fixed, mfs, mrr)
    hybrid = fixed["hybrid"]
    return {"pre_gib": pre, "post_gib": fixed["post"], "budget_gib": pre * mfs, "target_weights_gib": fixed["target_w"],
            "draft_weights_in_pool_gib": fixed["draft_w_in_pool"],
            "mamba_state_per_request_mib": fixed["per_req"] / MIB if hybrid else 0.0, "spec_state_gib": spec_gib,
            "mamba_slots": slots, "mamba_gib": slots_gib, "mamba_slots_per_request": fixed["ratio"] if hybrid else 0,
            "rest_before_kv_gib": before, "kv_cell_bytes": cell, "kv_elem_bytes": fixed["elem"], "rest_gib": rest,
            "max_total_tokens": tokens, "kv_gib": tokens * cell / GIB}


def _requests(fixed: dict, tokens: int, context: int, slots: int) -> int:
    """max_running_requests as the scheduler ends up with it: the value given (48 for
    speculative decoding when unset) capped by the release's rule (mrr_set_cap), or
    the estimate from the KV tokens (between 2048 and 4096) and tokens // 2 when unset;
    then the linear-attention slots // slots per request."""
    given, cap = fixed["mrr_given"], fixed["rel"]["mrr_set_cap"]
    if given is None or cap == "estimate":
        estimated = int(tokens / context * 512)
        estimated = 4096 if estimated > 4096 else (2048 if estimated < 2048 else estimated)
    if given is None:
        mrr = min(estimated, tokens // 2)
    elif cap == "half_tokens":
        mrr = min(given, tokens // 2)
    elif cap == "estimate":
        mrr = min(given, estimated)
    else:
        mrr = given
    ratio = fixed["ratio"]
    if ratio and slots // ratio < mrr:
        mrr = slots // ratio
    return mrr if mrr > 0 else 0


def _dynamic_items(fixed: dict, mrr: int, graph_bs: int, tokens: int, chunked: int, assume: dict) -> dict:
    """Estimates of what must fit outside the pool, in SGLang's start order. GiB."""
    model, env = fixed["model"], fixed["env"]
    algo = env["speculative_algorithm"]
    rows = max(mrr * fixed["draft_tokens"], 1)
    logits = rows * model["vocab_size"] * 4 * 2  # float32 logits and the sampler's probabilities
    items = {
        "workspace": assume["workspace_mib"] * MIB / GIB,
        "activations": (chunked * fixed["per_token"] + logits) / GIB,
    }
    if env["cuda_graph"]:
        runners = 2 if algo else 1
        items["cuda_graphs"] = (runners * assume["graph_base_mib"]
                                + graph_bs * fixed["steps"] * assume["graph_per_token_mib"]) * MIB / GIB
    if algo and not fixed["rel"]["draft_in_pool"]:
        items["draft_weights"] = fixed["draft_w"]
    if fixed["draft_cell"]:
        items["draft_kv_pool"] = tokens * fixed["draft_cell"] / GIB
    return items


def _dynamic(fixed: dict, static: dict, mrr: int, chunked: int, graph_bs: int, assume: dict) -> dict:
    """The dynamic side: its items, their sum and the headroom the pool leaves. GiB."""
    items = _dynamic_items(fixed, mrr, graph_bs, static["max_total_tokens"], chunked, assume)
    used = static["target_weights_gib"] + static["draft_weights_in_pool_gib"] + static["spec_state_gib"] \
        + static["mamba_gib"] + static["kv_gib"]
    return {"items": items, "need_gib": sum(items.values()), "headroom_gib": static["pre_gib"] - used}


def _prepare(target: dict, draft: dict | None, env: dict) -> dict:
    """Weight split between the target and its draft, as SGLang loads them."""
    model = dict(target)
    algo = env["speculative_algorithm"]
    model["target_weight_bytes"] = target["weight_bytes"]
    model["draft_weight_bytes"] = 0
    model["draft_kv_layers"] = 0
    if not algo:
        return model
    if draft is not None:
        model["draft_weight_bytes"] = draft["weight_bytes"]
        model["draft_kv_layers"] = draft["num_layers"]
    elif algo in EAGLE_FAMILY and target["mtp_layers"]:
        # NEXTN: the draft is the checkpoint's own MTP layers, loaded by the draft
        # worker; the target skips them (embedding and LM head are shared).
        mtp = target["mtp_layers"] * layer_weight_bytes(target)
        model["draft_weight_bytes"] = mtp
        model["target_weight_bytes"] = max(target["weight_bytes"] - mtp, 0)
        model["draft_kv_layers"] = target["mtp_layers"]
    elif algo in EAGLE_FAMILY or algo in DFLASH_FAMILY:
        raise PlanError(f"speculative_algorithm {algo} needs a draft model (or MTP layers in the target's config)")
    return model


class _Evaluator:
    """One envelope on one host: its mfs-independent part computed once (``_fixed``),
    then per mem_fraction_static the whole evaluation or just one of the two verdicts
    the mfs search bisects on."""

    def __init__(self, fixed: dict, context: int, chunked: int, graph_bs_default: int, assume: dict) -> None:
        self.fixed, self.context, self.chunked, self.assume = fixed, context, chunked, assume
        env = fixed["env"]
        self.graph_bs_default = env["cuda_graph_max_bs"] or graph_bs_default
        # the value SGLang reserves speculative states for (48 when unset and speculative)
        self.mrr_reserved = env["max_running_requests"] or (48 if fixed["spec"] else 0)
        self.used_fixed = fixed["target_w"] + fixed["draft_w_in_pool"]

    def __call__(self, mfs: float) -> dict:
        fixed = self.fixed
        static = _static(fixed, mfs, self.mrr_reserved)
        mrr = _requests(fixed, static["max_total_tokens"], self.context, static["mamba_slots"])
        graph_bs = min(self.graph_bs_default, max(mrr, 1))
        dynamic = _dynamic(fixed, static, mrr, self.chunked, graph_bs, self.assume)
        hybrid = fixed["hybrid"]
        return {"static": static, "dynamic": dynamic, "max_running_requests": mrr, "cuda_graph_max_bs": graph_bs,
                "draft_tokens": fixed["draft_tokens"],
                "static_ok": static["max_total_tokens"] > 0 and mrr > 0 and (not hybrid or static["mamba_slots"] > 0),
                "dynamic_ok": dynamic["headroom_gib"] >= dynamic["need_gib"]}

    def static_check(self, mfs: float) -> tuple[bool, float]:
        """(the static pool fits, its margin in GiB: about linear in mfs, 0 near the edge):
        the KV room less two cells and, for a hybrid model, the state slots less one request's."""
        fixed = self.fixed
        _before, _spec, slots, _slots_gib, rest, tokens = _core(fixed, mfs, self.mrr_reserved)
        mrr = _requests(fixed, tokens, self.context, slots)
        margin = rest - 2 * fixed["cell"] / GIB
        if fixed["hybrid"] and not fixed["radix_off"] and fixed["env"]["max_mamba_cache_size"] is None:
            # slots from the ratio branch grow with mfs
            margin = min(margin, (slots - max(fixed["ratio"], 1)) * fixed["per_req"] / GIB)
        return tokens > 0 and mrr > 0 and (not fixed["hybrid"] or slots > 0), margin

    def static_floor(self) -> float:
        """An mfs below which the static pool cannot fit: where the pool holds only the weights
        (rest = post - pre * (1 - mfs) <= 0), rounded down to 0.001."""
        fixed = self.fixed
        return math.floor(1000 * (1 - (fixed["post"] - fixed["vlm_gib"]) / fixed["pre"])) / 1000

    def dynamic_check(self, mfs: float) -> tuple[bool, float]:
        """(what lives outside the pool fits, headroom less need in GiB: about linear in mfs)."""
        fixed = self.fixed
        _before, spec_gib, slots, slots_gib, _rest, tokens = _core(fixed, mfs, self.mrr_reserved)
        mrr = _requests(fixed, tokens, self.context, slots)
        items = _dynamic_items(fixed, mrr, min(self.graph_bs_default, max(mrr, 1)), tokens, self.chunked, self.assume)
        spare = fixed["pre"] - (self.used_fixed + spec_gib + slots_gib + tokens * fixed["cell"] / GIB) \
            - sum(items.values())
        return spare >= 0, spare


def _edge(check, low: float, high: float, want_low: bool) -> float | None:
    """The smallest (want_low) or largest mfs in [low, high] where check(mfs)[0], to 0.001,
    for a verdict that is monotone (rising for want_low, falling otherwise). check also
    returns a margin about linear in mfs that crosses 0 near the edge: the search guesses
    the edge from it (regula falsi, Illinois variant: the end kept twice has its margin
    halved), and bisects after 12 guesses."""
    lo, hi = int(round(low * 1000)), int(round(high * 1000))
    ok_lo, m_lo = check(lo / 1000)
    ok_hi, m_hi = check(hi / 1000)
    if want_low:
        if not ok_hi:
            return None
        if ok_lo:
            return lo / 1000
    else:
        if not ok_lo:
            return None
        if ok_hi:
            return hi / 1000
    # the verdict flips between lo and hi; the side that passes is hi for want_low, lo otherwise
    moved, steps = 0, 0
    while hi - lo > 1:
        steps += 1
        if steps > 12 or m_hi == m_lo:
            guess = (lo + hi) // 2
        else:
            guess = max(lo + 1, min(hi - 1, lo + int(-m_lo * (hi - lo) / (m_hi - m_lo) + 0.5)))
        ok, margin = check(guess / 1000)
        if ok == want_low:
            hi, m_hi = guess, margin
            if moved > 0:
                m_lo /= 2
            moved = 1
        else:
            lo, m_lo = guess, margin
            if moved < 0:
                m_hi /= 2
            moved = -1
    return (hi if want_low else lo) / 1000


def plan(target: dict, draft: dict | None, gpu_memory_mib: list, tp_size: int, version, params: dict,
         assumptions: dict | None = None, search: bool = True, tp_candidates: list | None = None) -> dict:
    """Plan one variant on one host. ``gpu_memory_mib``: memory.total of the
    GPUs the server uses (the smallest binds); ``params``: the variant's
    resolved parameters (see the role sglang_service); ``tp_candidates``: other
    tensor-parallel sizes the host could run (tried when the variant does not fit)."""
    if not gpu_memory_mib:
        raise PlanError("no GPU memory given: the plan needs the memory.total of each GPU the server uses")
    if tp_size < 1:
        raise PlanError(f"tp_size must be at least 1, got {tp_size}")
    version_t = parse_version(version) if isinstance(version, str) else tuple(version)
    rel = release(version_t)
    assume = dict(ASSUMPTIONS)
    assume.update(assumptions or {})
    env = envelope(params)
    algo = env["speculative_algorithm"]
    needs_draft = algo in DFLASH_FAMILY or algo in ("EAGLE3", "STANDALONE")
    if needs_draft and draft is None:
        raise PlanError(f"speculative_algorithm {algo} needs the draft model's config and weights")
    if algo in DFLASH_FAMILY and not rel["dflash"]:
        raise PlanError(f"SGLang {'.'.join(map(str, version_t))} has no DFLASH (it arrived in "
                        f"{'.'.join(map(str, releases.first('dflash')))})")
    model = _prepare(target, draft if needs_draft else None, env)
    draft = draft if needs_draft else None
    gpu_mib = float(min(gpu_memory_mib))
    gpu_gib = gpu_mib / 1024
    chunked_default, graph_bs_default = gpu_tier(gpu_gib, tp_size, rel)
    if rel["graph_bs_capped_by_mrr"] and env["max_running_requests"]:
        # 0.5.22+: the default decode graph batch capped at a max_running_requests the
        # user set (0.5.23 arg_groups/memory_hook.py:182-188), before the mfs reserve
        graph_bs_default = min(graph_bs_default, env["max_running_requests"])
    chunked = env["chunked_prefill_size"] or chunked_default
    context = env["context_length"] or target["max_position_embeddings"] or 4096
    pre = (gpu_mib - assume["context_mib"]) / 1024
    mfs_source = "variant"
    mfs = env["mem_fraction_static"]
    if mfs is None:
        mfs = default_mfs(gpu_mib, tp_size, chunked, env["cuda_graph_max_bs"] or graph_bs_default, algo, rel,
                          target["vision"], target["mla"], target["architecture"], env["cuda_graph"])
        mfs_source = "SGLang default"
    if not 0 < mfs < 1:
        raise PlanError(f"mem_fraction_static must be in (0, 1), got {mfs}")

    def evaluator(e: dict) -> _Evaluator:
        return _Evaluator(_fixed(model, draft, e, tp_size, rel, pre, assume), context, chunked, graph_bs_default,
                          assume)

    run = evaluator(env)
    found = run(mfs)
    static, dynamic = found["static"], found["dynamic"]
    tokens = static["max_total_tokens"]
    result = {
        "fits": found["static_ok"] and found["dynamic_ok"],
        "sglang_version": ".".join(map(str, version_t)),
        "tp_size": tp_size,
        "gpu_memory_gib": round(gpu_gib, 2),
        "mem_fraction_static": mfs,
        "mem_fraction_static_source": mfs_source,
        "context_length": context,
        "speculative_algorithm": algo,
        "draft_tokens": found["draft_tokens"],
        "max_running_requests": found["max_running_requests"],
        "cuda_graph": env["cuda_graph"],
        "cuda_graph_max_bs": found["cuda_graph_max_bs"] if env["cuda_graph"] else 0,
        "chunked_prefill_size": chunked,
        "max_total_tokens": tokens,
        "full_context_requests": tokens // context if context else 0,
        "static": _rounded(static),
        "dynamic": {"headroom_gib": round(dynamic["headroom_gib"], 3), "need_gib": round(dynamic["need_gib"], 3),
                    "items": {k: round(v, 3) for k, v in dynamic["items"].items()}},
        "assumptions": assume,
        "warnings": [],
    }
    if not found["static_ok"]:
        parts = [("weights", static["target_weights_gib"] + static["draft_weights_in_pool_gib"])]
        if static["spec_state_gib"]:
            parts.append((f"speculative linear-attention states ({found['draft_tokens']} draft tokens x "
                          f"{env['max_running_requests'] or 48} requests x {static['mamba_state_per_request_mib']:.1f} MiB)",
                          static["spec_state_gib"]))
        if static["mamba_gib"]:
            parts.append((f"linear-attention state slots ({static['mamba_slots']})", static["mamba_gib"]))
        taken = sum(v for _name, v in parts)
        result["binding"] = "static_pool"
        result["reason"] = (
            f"the static pool does not fit: at mem_fraction_static {mfs} the pool has {static['budget_gib']:.2f} GiB "
            f"per GPU; " + " + ".join(f"{k} {v:.2f}" for k, v in parts)
            + f" = {taken:.2f} GiB leave {max(static['budget_gib'] - taken, 0):.2f} GiB, not one KV cell of "
            f"{static['kv_cell_bytes']} bytes (short by {max(taken - static['budget_gib'], 0):.2f} GiB before any KV cache). "
            f"SGLang stops with \"{_pool_error(rel, mfs, static)}\"")
    elif not found["dynamic_ok"]:
        short = dynamic["need_gib"] - dynamic["headroom_gib"]
        biggest = sorted(dynamic["items"].items(), key=lambda kv: -kv[1])
        result["binding"] = "dynamic"
        result["reason"] = (
            f"too little memory outside the static pool: at mem_fraction_static {mfs} it leaves "
            f"{dynamic['headroom_gib']:.2f} GiB per GPU, and it needs an estimated {dynamic['need_gib']:.2f} GiB ("
            + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in biggest)
            + f"); short by {short:.2f} GiB ({int(short * GIB // static['kv_cell_bytes'])} KV tokens)")
    else:
        result["binding"] = None
        result["reason"] = (
            f"fits: {tokens} KV tokens ({result['full_context_requests']} full-context requests of {context}), "
            f"{dynamic['headroom_gib'] - dynamic['need_gib']:.2f} GiB spare outside the pool")
    if (algo and target["linear_layers"] and rel["hybrid_spec_radix"] == "refuse" and not env["disable_radix_cache"]
            and env["mamba_radix_cache_strategy"] != "extra_buffer" and algo not in PATCHED_BUILD_ALGORITHMS):
        result["warnings"].append(
            f"SGLang {result['sglang_version']} refuses speculative decoding on a hybrid model with radix cache on "
            "(\"not compatible with radix cache when using --mamba-scheduler-strategy no_buffer\"): set "
            "disable_radix_cache: true in the variant (the plan assumes it) or mamba_radix_cache_strategy: extra_buffer")
    if found["static_ok"] and tokens < context:
        result["warnings"].append(f"{tokens} KV tokens hold no full-context request of {context} tokens")
    if found["static_ok"] and env["max_running_requests"] and found["max_running_requests"] < env["max_running_requests"]:
        result["warnings"].append(f"SGLang will run at most {found['max_running_requests']} requests, not "
                                  f"{env['max_running_requests']} (limited by the KV tokens or linear-attention slots)")
    if search:
        result["mem_fraction_static_range"] = _mfs_range(run)
        if not result["fits"]:
            result["suggestions"] = _suggestions(evaluator, env, result)
            for tp in sorted(t for t in tp_candidates or [] if t > tp_size):
                wider = plan(target, draft, [gpu_mib] * tp, tp, version_t, params, assumptions, search=False)
                if wider["fits"]:
                    result["suggestions"].insert(0, f"tp_size {tp} ({tp} GPUs): fits at mem_fraction_static {mfs} "
                                                 f"with {wider['max_total_tokens']} KV tokens")
                    break
    return result


def _mfs_range(run) -> list | None:
    low = _edge(run.static_check, min(max(0.05, run.static_floor()), 0.99), 0.99, want_low=True)
    if low is None:
        return None
    # the largest mfs that fits outside the pool, searched from low (a high below low is no range)
    high = _edge(run.dynamic_check, low, 0.99, want_low=False)
    if high is None:
        return None
    return [low, high]


def _suggestions(evaluator, env: dict, result: dict) -> list[str]:
    """Envelope changes that make the variant fit, with the mfs range each opens."""
    out = []
    if result.get("mem_fraction_static_range"):
        low, high = result["mem_fraction_static_range"]
        out.append(f"set mem_fraction_static within [{low}, {high}]")
    mrr = env["max_running_requests"] or 48
    for cand in sorted({max(1, mrr // d) for d in (2, 4, 8, 16)}, reverse=True):
        if cand >= mrr:
            continue
        trial = dict(env, max_running_requests=cand)
        span = _mfs_range(evaluator(trial))
        if span:
            out.append(f"max_running_requests {cand} (from {mrr}) with mem_fraction_static within [{span[0]}, {span[1]}]")
            break
    if env["cuda_graph"]:
        trial = dict(env, cuda_graph=False)
        span = _mfs_range(evaluator(trial))
        if span:
            out.append(f"cuda_graph: false with mem_fraction_static within [{span[0]}, {span[1]}]")
    if not out:
        out.append("no change of mem_fraction_static, max_running_requests or CUDA graphs fits at this tp_size: "
                   "use more GPUs per server or GPUs with more memory")
    return out


def _pool_error(rel: dict, mfs: float, static: dict) -> str:
    if rel["new_pool_error"] and static["rest_before_kv_gib"] <= 0:
        pre, post = static["pre_gib"], static["post_gib"]
        minimum = 1 - post / pre if pre > 0 else 1.0
        return (f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={mfs}. "
                f"Raise --mem-fraction-static above {minimum:.3f}")
    return f"Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static={mfs}"


def _rounded(static: dict) -> dict:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in static.items()}


# --------------------------------------------------------------------------- tables


def table(rows: list[dict]) -> list[str]:
    """A readable table, one line per (host, variant) plan."""
    head = ("host", "variant", "fits", "mfs", "range", "KV tokens", "full ctx", "reqs", "headroom/need GiB", "binding")
    lines = [head]
    for row in rows:
        p = row.get("plan") or {}
        if row.get("error"):
            lines.append((row.get("host", ""), row.get("variant", ""), "ERROR", "", "", "", "", "", "", row["error"]))
            continue
        span = p.get("mem_fraction_static_range")
        lines.append((
            row.get("host", ""), row.get("variant", ""), "yes" if p["fits"] else "NO",
            f"{p['mem_fraction_static']:g}", f"{span[0]:g}-{span[1]:g}" if span else "none",
            str(p["max_total_tokens"]), str(p["full_context_requests"]), str(p["max_running_requests"]),
            f"{p['dynamic']['headroom_gib']:.2f}/{p['dynamic']['need_gib']:.2f}",
            {"static_pool": "static pool", "dynamic": "outside pool", None: "-"}[p["binding"]]))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    return ["  ".join(str(cell).ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]


def report(rows: list[dict]) -> list[str]:
    """The table, then each variant's reason with its suggestions and warnings."""
    lines = table(rows) + [""]
    for row in rows:
        found = row.get("plan")
        lines.append(f"{row.get('host') + ' ' if row.get('host') else ''}{row['variant']}: "
                     f"{row['error'] if not found else found['reason']}")
        for extra in (found or {}).get("suggestions", []):
            lines.append(f"    fits with: {extra}")
        for extra in (found or {}).get("warnings", []):
            lines.append(f"    warning: {extra}")
    return lines


# --------------------------------------------------------------------------- many plans


class ModelCache:
    """Reads each model directory once per run (a fleet plans every variant)."""

    def __init__(self) -> None:
        self._seen: dict = {}

    def get(self, path: str) -> dict:
        if path not in self._seen:
            try:
                self._seen[path] = read_model_dir(path)
            except PlanError as exc:
                self._seen[path] = exc
        found = self._seen[path]
        if isinstance(found, PlanError):
            raise found
        return found


def plan_resolved(params: dict, model_path: str, draft_model_path: str | None, gpu_memory_mib: list, tp_size: int,
                  version, assumptions: dict | None = None, cache: ModelCache | None = None, search: bool = True,
                  tp_candidates: list | None = None) -> dict:
    """plan() for a resolved variant, reading the model directories it names."""
    cache = cache or ModelCache()
    target = cache.get(model_path)
    draft = None
    if params.get("draft_model"):
        if not draft_model_path:
            raise PlanError("the variant needs a draft model but no draft model path is set")
        draft = cache.get(draft_model_path)
    return plan(target, draft, gpu_memory_mib, tp_size, version, params, assumptions, search, tp_candidates)
