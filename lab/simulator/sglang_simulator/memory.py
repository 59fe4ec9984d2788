"""GPU memory as the emulated SGLang release sizes it, per tensor-parallel rank.

The static pool follows SGLang's profile (0.5.11 ``_profile_available_bytes``
and ``handle_max_mamba_cache``; the same shape since 0.5.9)::

    pre   = free memory before the weights load            (GiB)
    post  = pre - weights/tp  (- draft weights/tp since 0.5.14)
    rest  = post - pre * (1 - mem_fraction_static)
    hybrid linear-attention models (Gated DeltaNet):
        rest -= mamba_per_req * max_running_requests * num_draft_tokens  (speculative, up to 0.5.12)
        mamba slots = max_mamba_cache_size | max_running_requests (radix cache off)
                      | rest * r / (1 + r) // mamba_per_req     (r = mamba_full_memory_ratio)
                        (0.5.13+ with speculation solved with the states of slots // ratio
                         requests; 0.5.17+ with the padding slot)
        rest -= slots * mamba_per_req
    cell  = max(1, kv_heads // tp) * (head_dim + v_head_dim) * full_layers * dtype_bytes
            DFLASH: cell * (target_layers + draft_layers) / target_layers (ceil);
                    from 0.5.18 cell + the draft's own cell
            EAGLE-family with a draft model path, from 0.5.14: + the draft's KV (folded)
    tokens = rest // cell, rounded down to page_size;  tokens <= 0 is SGLang's
             "Not enough memory. Please try to increase --mem-fraction-static."

What is left, about pre * (1 - mem_fraction_static), is the dynamic headroom.
SGLang does not budget it; the simulator charges it in SGLang's start order and
fails at the first consumer that does not fit. Those consumers are the
simulator's own estimates (SGLang has no formula for them): activations
(0.5 GiB + chunked_prefill_size * hidden * 24 bytes), CUDA graphs
(0.25 GiB + batch * 2 MiB * draft tokens), before 0.5.14 the draft model's
weights, and an EAGLE-family draft's KV pool of the same token count where it is
not folded into the cell (before 0.5.14, and NEXTN/MTP without a draft path).
Release facts come from versions.Release (the collection's _sglang_releases).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .model import ModelSpec
from .versions import Release

GIB = float(1 << 30)
MIB = float(1 << 20)

DFLASH_FAMILY = ("DFLASH", "DDTREE")
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")

# SGLang's MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
MAMBA_SLOTS_PER_REQUEST = 3


@dataclass
class ServerConfig:
    """The parsed server arguments the memory profile depends on."""

    tp_size: int = 1
    mem_fraction_static: float | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graph: bool = True
    cuda_graph_max_bs: int | None = None
    speculative_algorithm: str | None = None
    num_draft_tokens: int | None = None
    disable_radix_cache: bool = False
    mamba_full_memory_ratio: float = 0.9
    # no_buffer / extra_buffer; None or "auto": the release's choice (extra_buffer from 0.5.14)
    mamba_radix_cache_strategy: str | None = None
    max_mamba_cache_size: int | None = None
    page_size: int = 1


@dataclass
class Stage:
    """One consumer of GPU memory, charged in start order."""

    name: str
    gib: float
    static: bool


@dataclass
class MemoryPlan:
    gpu_total_gib: float
    pre_gib: float
    target_weights_gib: float
    draft_weights_gib: float
    mem_fraction_static: float
    rest_gib: float = 0.0
    mamba_per_req_bytes: int = 0
    mamba_intermediate_gib: float = 0.0
    mamba_slots: int = 0
    mamba_gib: float = 0.0
    cell_bytes: int = 0
    max_total_tokens: int = 0
    kv_gib: float = 0.0
    max_running_requests: int = 0
    chunked_prefill_size: int = 0
    cuda_graph_max_bs: int = 0
    headroom_gib: float = 0.0
    dynamic: list[Stage] = field(default_factory=list)
    failed_stage: str | None = None
    failed_need_gib: float = 0.0
    failed_free_gib: float = 0.0

    @property
    def fits(self) -> bool:
        return self.failed_stage is None


class PoolSizingError(Exception):
    """The static pool does not fit: SGLang's own error text."""


def gpu_tier(gpu_mem_gib: float, tp: int, release: Release | None = None) -> tuple[int, int]:
    """SGLang's defaults by GPU memory: (chunked_prefill_size, cuda_graph_max_bs), the
    release's gpu_tiers (the newest release's when none is given)."""
    tiers = (release or Release((9, 9, 9))).fact("gpu_tiers")
    for bound, (chunked, small_tp, large_tp) in tiers:
        if bound is None or gpu_mem_gib < bound:
            return chunked, small_tp if tp < 4 else large_tp
    raise ValueError("gpu_tiers has no last tier")


def capture_batch_sizes(max_bs: int, speculative: bool) -> list[int]:
    """The decode batch sizes SGLang captures CUDA graphs for, up to max_bs (0.5.11
    server_args.py:1497-1528, 0.5.23 arg_groups/cuda_graph_hook.py:500-531: the same
    rule; speculative decoding pads less at small sizes)."""
    if speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [bs for bs in sizes if bs <= max_bs]
    return sizes if max_bs in sizes else [*sizes, max_bs]


def mamba_per_request_bytes(model: ModelSpec, tp: int) -> int:
    """Bytes of Gated DeltaNet state one request holds on one rank (SGLang's
    Mamba2StateShape: conv state in bf16, SSM state in float32)."""
    if not model.hybrid_linear:
        return 0
    n_groups = model.linear_num_key_heads
    if n_groups % tp:
        n_groups += tp - n_groups
    intermediate = model.linear_value_head_dim * model.linear_num_value_heads
    conv_dim = intermediate + 2 * n_groups * model.linear_key_head_dim
    conv = (conv_dim // tp) * (model.linear_conv_kernel_dim - 1) * 2
    ssm = (model.linear_num_value_heads // tp) * model.linear_value_head_dim * model.linear_key_head_dim * 4
    return (conv + ssm) * model.linear_attention_layers


def mamba_slots_per_request(release: Release, cfg: ServerConfig) -> int:
    """State slots the scheduler keeps per running request: 1 without radix cache
    (0.5.11 model_runner_kv_cache_mixin.py:180-181), 3 with it (:44-46), plus the
    extra_buffer ping-pong pair, one slot with speculative decoding from 0.5.14 (the
    lazy buffer, 0.5.14 mixin :274-293); 0.5.14+ choose extra_buffer for "auto"."""
    if cfg.disable_radix_cache:
        return 1
    strategy = cfg.mamba_radix_cache_strategy
    extra = strategy == "extra_buffer" or (strategy in (None, "auto") and release.radix_strategy_auto_extra_buffer)
    if not extra:
        return MAMBA_SLOTS_PER_REQUEST
    return MAMBA_SLOTS_PER_REQUEST + (1 if cfg.speculative_algorithm and release.fact("mamba_lazy_spec_buffer") else 2)


def kv_cell_bytes(model: ModelSpec, tp: int, kv_dtype_bytes: int | None = None) -> int:
    elem = kv_dtype_bytes or model.dtype_bytes
    return max(1, model.num_kv_heads // tp) * (2 * model.head_dim) * model.full_attention_layers * elem


def default_num_draft_tokens(algorithm: str | None, draft: ModelSpec | None) -> int:
    if not algorithm:
        return 1
    if algorithm in DFLASH_FAMILY:
        return (draft.block_size if draft and draft.block_size else 16)
    return 4  # SGLang's EAGLE-family default (steps 3, topk 1, draft tokens 4)


def draft_weight_bytes(algorithm: str | None, model: ModelSpec, draft: ModelSpec | None) -> int:
    if not algorithm:
        return 0
    if draft is not None:
        return draft.weight_bytes
    if algorithm in EAGLE_FAMILY and model.mtp_layers:
        # NEXTN/MTP: the draft is the checkpoint's own MTP layers.
        return model.mtp_layers * model.decoder_layer_bytes()
    return 0


def plan(
    release: Release,
    model: ModelSpec,
    draft: ModelSpec | None,
    cfg: ServerConfig,
    gpu_total_mib: float,
    gpu_free_mib: float,
) -> MemoryPlan:
    """Size the pools of one rank. Raises PoolSizingError as SGLang does."""
    tp = cfg.tp_size
    gpu_total_gib = gpu_total_mib / 1024.0
    chunked_default, graph_bs_default = gpu_tier(gpu_total_gib, tp, release)
    mfs = cfg.mem_fraction_static if cfg.mem_fraction_static is not None else default_mfs(
        release, gpu_total_gib, tp, chunked_default, graph_bs_default
    )
    pre = gpu_free_mib * MIB / GIB
    spec = cfg.speculative_algorithm
    target_w = model.weight_bytes / tp / GIB
    draft_w = draft_weight_bytes(spec, model, draft) / tp / GIB
    result = MemoryPlan(
        gpu_total_gib=gpu_total_gib,
        pre_gib=pre,
        target_weights_gib=target_w,
        draft_weights_gib=draft_w,
        mem_fraction_static=mfs,
        chunked_prefill_size=cfg.chunked_prefill_size or chunked_default,
    )
    post = pre - target_w - (draft_w if release.draft_weights_in_pool else 0.0)
    rest = post - pre * (1 - mfs)
    if model.has_vision:
        # SGLANG_VLM_CACHE_SIZE_MB off the KV budget from 0.5.18 (kv_cache_configurator.py:130-150)
        rest -= release.fact("vlm_cache_mb") / 1024.0
    draft_tokens = cfg.num_draft_tokens or default_num_draft_tokens(spec, draft)
    mrr = cfg.max_running_requests
    if spec and mrr is None:
        mrr = 48  # SGLang resets it to 48 for speculative decoding when unset
    if model.hybrid_linear:
        per_req = mamba_per_request_bytes(model, tp)
        result.mamba_per_req_bytes = per_req
        ratio = mamba_slots_per_request(release, cfg)
        pad = 1 if release.fact("mamba_padding_slot") else 0
        joint = bool(spec) and release.fact("mamba_joint_solve")
        states = 0
        if spec and not joint:
            # up to 0.5.12 the states of every request first (0.5.11 mixin :73-91)
            states = mrr or 0
            rest -= per_req * states * draft_tokens / GIB
        if cfg.max_mamba_cache_size is not None:
            slots = cfg.max_mamba_cache_size
        elif cfg.disable_radix_cache and mrr is not None:
            slots = mrr
        else:
            r = cfg.mamba_full_memory_ratio
            budget = rest * r / (1 + r) * GIB
            if joint:
                # 0.5.13+ slots and states solved together (0.5.13.post1 mixin :132-160), 0.5.17+ with the
                # padding slot in both buffers (0.5.17 kv_cache_configurator.py:1930-1948)
                slots = int((budget - pad * per_req * (1 + draft_tokens)) // (per_req * (1 + draft_tokens / ratio)))
            else:
                slots = int((budget - pad * per_req) // per_req)
        if joint:
            states = min(mrr or 0, slots // ratio) + pad
            rest -= per_req * states * draft_tokens / GIB
        slots = max(slots, 0)
        result.mamba_intermediate_gib = per_req * states * draft_tokens / GIB
        result.mamba_slots = slots
        result.mamba_gib = (slots + pad) * per_req / GIB
        rest -= result.mamba_gib
    result.rest_gib = rest

    cell = kv_cell_bytes(model, tp)
    if spec in DFLASH_FAMILY and release.has_dflash and draft is not None:
        if release.fact("dflash_cell_sum"):
            # 0.5.18+: the target's cell plus the draft's own (0.5.18 speculative/dflash_utils.py:139-152,
            # model_executor/pool_configurator.py:216-232)
            cell += kv_cell_bytes(draft, tp)
        else:  # scale_kv_cell_size_per_token_for_dflash: ceil(cell * (T + D) / T)
            layers = model.full_attention_layers
            cell = (cell * (layers + draft.num_layers) + layers - 1) // layers
    elif spec in EAGLE_FAMILY and draft is not None and release.fact("eagle_draft_cell_fold"):
        # 0.5.14+ fold an EAGLE-family draft's KV into the cell only with --speculative-draft-model-path;
        # NEXTN/MTP from the checkpoint's own layers keeps its pool outside the profile
        cell += kv_cell_bytes(model, tp) * draft.full_attention_layers // max(1, model.full_attention_layers)
    result.cell_bytes = cell
    tokens = int(rest * GIB) // cell if rest > 0 else 0
    tokens = tokens // cfg.page_size * cfg.page_size
    if cfg.max_total_tokens:
        tokens = min(tokens, cfg.max_total_tokens)
    result.max_total_tokens = tokens
    if tokens <= 0:
        raise PoolSizingError(pool_error_text(release, mfs, pre, post, rest))
    result.kv_gib = tokens * cell / GIB

    context = cfg.context_length or model.max_position_embeddings
    estimated = max(min(int(tokens / context * 512), 4096), 2048)
    cap = release.fact("mrr_set_cap")
    if cfg.max_running_requests is None:
        max_reqs = min(mrr or estimated, estimated, tokens // 2)
    elif cap == "half_tokens":  # 0.5.14+
        max_reqs = min(cfg.max_running_requests, tokens // 2)
    elif cap == "estimate":  # 0.5.10-0.5.13
        max_reqs = min(cfg.max_running_requests, estimated)
    else:  # 0.5.9 keeps the value given
        max_reqs = cfg.max_running_requests
    if model.hybrid_linear and result.mamba_slots:
        max_reqs = min(max_reqs, max(1, result.mamba_slots // mamba_slots_per_request(release, cfg)))
    result.max_running_requests = max_reqs
    result.cuda_graph_max_bs = min(cfg.cuda_graph_max_bs or graph_bs_default, max_reqs)

    used_static = target_w + result.mamba_gib + result.mamba_intermediate_gib + result.kv_gib
    if release.draft_weights_in_pool:
        used_static += draft_w
    result.headroom_gib = pre - used_static
    result.dynamic = dynamic_stages(release, model, draft, cfg, result, draft_tokens)
    free = result.headroom_gib
    for stage in result.dynamic:
        if stage.gib > free:
            result.failed_stage = stage.name
            result.failed_need_gib = stage.gib
            result.failed_free_gib = max(free, 0.0)
            break
        free -= stage.gib
    return result


def dynamic_stages(
    release: Release,
    model: ModelSpec,
    draft: ModelSpec | None,
    cfg: ServerConfig,
    result: MemoryPlan,
    draft_tokens: int,
) -> list[Stage]:
    """What the headroom must hold, in SGLang's start order."""
    spec = cfg.speculative_algorithm
    stages = [
        Stage(
            "activations",
            0.5 + result.chunked_prefill_size * model.hidden_size * 24 / GIB,
            False,
        )
    ]
    graph_tokens = draft_tokens if spec else 1
    if cfg.cuda_graph:
        stages.append(
            Stage("cuda_graph", 0.25 + result.cuda_graph_max_bs * 2 * MIB * graph_tokens / GIB, False)
        )
    if spec and not release.draft_weights_in_pool:
        stages.append(Stage("draft_weights", result.draft_weights_gib, False))
    if spec in EAGLE_FAMILY and not (draft is not None and release.fact("eagle_draft_cell_fold")):
        # the draft's own KV pool of the same token count, outside the profile
        draft_layers = draft.full_attention_layers if draft else model.mtp_layers
        draft_cell = kv_cell_bytes(model, cfg.tp_size) * draft_layers // max(1, model.full_attention_layers)
        stages.append(Stage("draft_kv_pool", result.max_total_tokens * draft_cell / GIB, False))
    if spec and cfg.cuda_graph:
        stages.append(Stage("draft_cuda_graph", 0.1 + result.cuda_graph_max_bs * MIB * graph_tokens / GIB, False))
    return stages


def default_mfs(release: Release, gpu_gib: float, tp: int, chunked: int, max_bs: int) -> float:
    """SGLang's derived mem_fraction_static when the flag is unset (reserved-memory tiers)."""
    reserved_mb = 512 + max(chunked, 2048) * 1.5 + max_bs * 2 + tp / 8 * 1024
    gpu_mb = gpu_gib * 1024
    if gpu_gib > 60:
        reserved_mb = max(reserved_mb, 10240)
    return round((gpu_mb - reserved_mb) / gpu_mb, 3)


def pool_error_text(release: Release, mfs: float, pre: float, post: float, rest: float) -> str:
    """0.5.14+ raise a ValueError when the loaded weights leave nothing
    (0.5.14 model_runner_kv_cache_mixin.py:103-118); otherwise, and before
    0.5.14, the pool's own RuntimeError (0.5.11 pool_configurator.py:39-44)."""
    if release.new_pool_error and rest <= 0:
        minimum = 1 - post / pre if pre > 0 else 1.0
        suggested = math.ceil(minimum * 1000) / 1000
        return (
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={mfs}. Raise --mem-fraction-static above {suggested:.3f} "
            f"(minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative "
            "decoding, draft weights are now counted."
        )
    if release.version < (0, 5, 10):  # 0.5.9 model_executor/model_runner.py:417-418: f"{...=}"
        return ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                f"Current value: self.server_args.mem_fraction_static={mfs}")
    else:  # 0.5.11 model_executor/pool_configurator.py:39-44
        return (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={mfs}"
        )
