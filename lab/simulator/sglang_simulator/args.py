"""The server command line of the emulated SGLang release, parsed by argparse as
SGLang does, so rejected flags fail with argparse's real messages (exit 2)."""

from __future__ import annotations

import argparse
import importlib.util

from .memory import ServerConfig
from .versions import Release

UPSTREAM_ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]


def ddtree_build_installed() -> bool:
    """DDTree is not upstream: it exists only where the patched build's files
    were laid over the installed package (sglang/srt/speculative/ddtree_utils.py)."""
    try:
        return importlib.util.find_spec("sglang.srt.speculative.ddtree_utils") is not None
    except (ImportError, ValueError):
        return False


def spec_algorithms(release: Release, ddtree: bool) -> list[str]:
    algorithms = list(UPSTREAM_ALGORITHMS)
    if release.has_dflash:
        algorithms.insert(0, "DFLASH")
    if release.free_form_spec_algorithm:
        algorithms += ["DSPARK", "UNO"]
    if ddtree:
        algorithms.append("DDTREE")
    return algorithms


def build_parser(release: Release, prog: str, ddtree: bool | None = None) -> argparse.ArgumentParser:
    ddtree = ddtree_build_installed() if ddtree is None else ddtree
    p = argparse.ArgumentParser(prog=prog)
    add = p.add_argument
    add("--model-path", "--model", type=str, required=True)
    add("--tokenizer-path", type=str)
    add("--served-model-name", type=str)
    add("--host", type=str, default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--tp-size", "--tensor-parallel-size", "--tp", type=int, default=1, dest="tp_size")
    add("--dp-size", type=int, default=1)
    add("--pp-size", type=int, default=1)
    add("--context-length", type=int)
    add("--mem-fraction-static", type=float)
    add("--max-running-requests", type=int)
    add("--max-total-tokens", type=int)
    add("--chunked-prefill-size", type=int)
    add("--page-size", type=int, default=1)
    add("--dtype", type=str, default="auto")
    add("--kv-cache-dtype", type=str, default="auto")
    add("--trust-remote-code", action="store_true")
    add("--api-key", type=str)
    add("--skip-server-warmup", action="store_true")
    add("--disable-radix-cache", action="store_true")
    add("--log-level", type=str, default="info")
    add("--log-level-http", type=str)
    add("--watchdog-timeout", type=float, default=300)
    add("--enable-metrics", action="store_true")
    add("--attention-backend", type=str)
    add("--reasoning-parser", type=str)
    add("--tool-call-parser", type=str)
    add("--mamba-full-memory-ratio", type=float, default=0.9)
    add("--max-mamba-cache-size", type=int)
    add("--random-seed", type=int)
    if release.free_form_spec_algorithm:
        add("--speculative-algorithm", type=str)
    else:
        add("--speculative-algorithm", type=str, choices=spec_algorithms(release, ddtree))
    add("--speculative-draft-model-path", "--speculative-draft-model", type=str)
    add("--speculative-num-steps", type=int)
    add("--speculative-eagle-topk", type=int)
    add("--speculative-num-draft-tokens", type=int)
    if release.has_dflash:
        add("--speculative-dflash-block-size", type=int)
    if ddtree:
        # Flags of the team's patched DDTree build (not upstream SGLang).
        add("--speculative-ddtree-budget", type=int, default=32)
        add("--speculative-ddtree-shadow-linear", action="store_true")
    add("--disable-cuda-graph", action="store_true")
    if release.split_cuda_graph_flags:
        add("--cuda-graph-max-bs-decode", type=int)
        add("--cuda-graph-max-bs-prefill", type=int)
        add("--cuda-graph-backend-decode", type=str, default="cuda_graph")
        add("--cuda-graph-backend-prefill", type=str, default="cuda_graph")
    else:
        add("--cuda-graph-max-bs", type=int)
    return p


class ArgumentValidationError(Exception):
    """Raised after parsing, as SGLang's ServerArgs.__post_init__ raises ValueError."""


def validate(release: Release, args: argparse.Namespace, ddtree: bool | None = None) -> list[str]:
    """Checks SGLang runs after parsing. Returns warnings; raises on errors."""
    warnings = []
    ddtree = ddtree_build_installed() if ddtree is None else ddtree
    algo = args.speculative_algorithm
    if algo and release.free_form_spec_algorithm and algo not in spec_algorithms(release, ddtree):
        raise ArgumentValidationError(
            f"ValueError: Unknown speculative algorithm {algo!r}. "
            f"Available: {', '.join(spec_algorithms(release, ddtree))}"
        )
    if algo in ("DFLASH", "DDTREE") and not args.speculative_draft_model_path:
        raise ArgumentValidationError(
            "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path."
        )
    if args.mem_fraction_static is not None and not 0 < args.mem_fraction_static < 1:
        raise ArgumentValidationError(
            f"ValueError: mem_fraction_static must be in (0, 1), got {args.mem_fraction_static}"
        )
    if release.split_cuda_graph_flags and args.disable_cuda_graph:
        warnings.append(
            "--disable-cuda-graph is deprecated; use --cuda-graph-backend-decode=disabled "
            "--cuda-graph-backend-prefill=disabled"
        )
    if algo == "NEXTN":
        warnings.append("NEXTN is an alias of EAGLE with the model's MTP heads as the draft.")
    return warnings


def server_config(release: Release, args: argparse.Namespace) -> ServerConfig:
    if release.split_cuda_graph_flags:
        graph = not args.disable_cuda_graph and args.cuda_graph_backend_decode != "disabled"
        graph_bs = args.cuda_graph_max_bs_decode
    else:
        graph = not args.disable_cuda_graph
        graph_bs = args.cuda_graph_max_bs
    draft_tokens = args.speculative_num_draft_tokens
    if getattr(args, "speculative_dflash_block_size", None):
        draft_tokens = args.speculative_dflash_block_size
    return ServerConfig(
        tp_size=args.tp_size,
        mem_fraction_static=args.mem_fraction_static,
        context_length=args.context_length,
        max_running_requests=args.max_running_requests,
        max_total_tokens=args.max_total_tokens,
        chunked_prefill_size=args.chunked_prefill_size,
        cuda_graph=graph,
        cuda_graph_max_bs=graph_bs,
        speculative_algorithm=args.speculative_algorithm,
        num_draft_tokens=draft_tokens,
        disable_radix_cache=args.disable_radix_cache,
        mamba_full_memory_ratio=args.mamba_full_memory_ratio,
        max_mamba_cache_size=args.max_mamba_cache_size,
        page_size=args.page_size,
    )
