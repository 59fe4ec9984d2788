"""GET /server_info as the emulated release shapes it, filled from the simulator's plan.

Real SGLang returns the resolved server arguments at the top level, then the
scheduler's hand-shake info, one internal state per DP rank and the version
(0.5.11 entrypoints/http_server.py:631-645; 0.5.20 :818-850 resolved_dict();
0.5.23 :863-892 build_server_info, utils/common.py:3584-3593):

    {**server_args, "status": "ready", "max_total_num_tokens": N, "max_req_input_len": N,
     "internal_states": [{**server_args, "effective_max_running_requests_per_dp": N,
                          "last_gen_throughput": X, "memory_usage": {...}, ...}],
     "version": "0.5.11"}

The simulator models only some arguments, so the argument part holds those
(by their real names, with the values SGLang resolves: mem_fraction_static,
chunked_prefill_size, the CUDA graph batch sizes); keys it cannot fill are left
out, never made up. The API key is there in clear, as in real SGLang.
"""

from __future__ import annotations

import argparse

from .memory import MemoryPlan, capture_batch_sizes
from .versions import Release

# 0.5.11 managers/scheduler.py:1482-1485 (0.5.23 :1944-1947): the hand-shake info.
STATUS_READY = "ready"
# model_executor/graph_memory_usage.py:5-12 (0.5.17-0.5.23)
GRAPH_PHASES = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend")
# 0.5.23 scheduler_components/internal_state.py:31, summed into decode_cuda_graph_memory_gb
DECODE_GRAPH_PHASES = ("decode", "target_verify", "draft_decode", "draft_extend")


def resolved_args(release: Release, args: argparse.Namespace, plan: MemoryPlan | None) -> dict:
    """The server arguments after SGLang's resolution, as far as the plan knows them."""
    out = {k: v for k, v in vars(args).items() if k != "config"}
    if plan is None:
        return out
    out["mem_fraction_static"] = plan.mem_fraction_static
    out["chunked_prefill_size"] = plan.chunked_prefill_size
    if args.speculative_algorithm and args.max_running_requests is None:
        out["max_running_requests"] = 48  # what memory.plan assumes SGLang sets for speculative decoding
    sizes = capture_batch_sizes(plan.cuda_graph_max_bs, bool(args.speculative_algorithm))
    if release.split_cuda_graph_flags:
        # 0.5.14+ cuda_graph_config: per phase backend / max_bs / bs (model_executor/cuda_graph_config.py:72-92);
        # the prefill phase is not modelled, so it is left out.
        out["cuda_graph_config"] = {"decode": {"backend": "full" if graph_enabled(release, args) else "disabled",
                                               "max_bs": plan.cuda_graph_max_bs, "bs": sizes}}
    else:
        # up to 0.5.13 cuda_graph_max_bs and cuda_graph_bs (0.5.11 server_args.py:1386, :1497-1528),
        # filled whether or not graphs are captured (the real 0.5.11 /server_info with --disable-cuda-graph).
        out["cuda_graph_max_bs"] = plan.cuda_graph_max_bs
        out["cuda_graph_bs"] = sizes
    return out


def graph_enabled(release: Release, args: argparse.Namespace) -> bool:
    if args.disable_cuda_graph:
        return False
    return not (release.split_cuda_graph_flags and args.cuda_graph_backend_decode == "disabled")


def memory_usage(release: Release, plan: MemoryPlan, figures: dict) -> dict:
    """memory_usage of one scheduler: 0.5.11 managers/scheduler.py:3372-3380 (graph one float);
    0.5.17+ scheduler_components/memory_usage.py:15-41 (graph per phase, rounded to 3 places).
    figures["graph_usage"]: GiB per phase as the simulator's captures took it."""
    taken = figures["graph_usage"]
    if not release.memory_usage_by_phase:
        return {"weight": round(plan.target_weights_gib, 2), "kvcache": round(plan.kv_gib, 2),
                "token_capacity": int(plan.max_total_tokens), "graph": round(sum(taken.values()), 2)}
    graph = {phase: round(taken.get(phase, 0.0), 3) for phase in GRAPH_PHASES}
    return {"weight": round(plan.target_weights_gib, 3), "kvcache": round(plan.kv_gib, 3),
            "startup_available": round(figures["available_gib"], 3), "token_capacity": int(plan.max_total_tokens),
            "token_capacity_swa": None, "graph": graph}


def internal_state(release: Release, args: argparse.Namespace, plan: MemoryPlan, top: dict, figures: dict) -> dict:
    """One scheduler's get_internal_state (0.5.11 managers/scheduler.py:3370-3394;
    0.5.23 scheduler_components/internal_state.py:45-104)."""
    state = dict(top)
    speculative = bool(args.speculative_algorithm)
    if release.internal_state_world_size:
        state["world_size"] = args.tp_size * args.pp_size
    state["last_gen_throughput"] = figures["last_gen_throughput"]
    state["memory_usage"] = memory_usage(release, plan, figures)
    state["effective_max_running_requests_per_dp"] = plan.max_running_requests
    if release.internal_state_decode_graph_bs:
        captured = capture_batch_sizes(plan.cuda_graph_max_bs, speculative) if graph_enabled(release, args) else []
        state["decode_cuda_graph_bs"] = captured
        phases = state["memory_usage"]["graph"]
        state["decode_cuda_graph_memory_gb"] = round(sum(phases[p] for p in DECODE_GRAPH_PHASES), 3)
    if speculative and figures.get("avg_spec_accept_length") is not None:
        state["avg_spec_accept_length"] = figures["avg_spec_accept_length"]
    return state


def build(release: Release, args: argparse.Namespace, plan: MemoryPlan | None, context_len: int, argv: list[str],
          figures: dict) -> dict:
    """The whole /server_info body; figures: last_gen_throughput, available_gib (after start-up),
    graph_usage (GiB per graph phase), avg_spec_accept_length (None before the first generation)."""
    top = resolved_args(release, args, plan)
    body = dict(top)
    if release.server_info_launch_command:
        body["launch_command"] = " ".join(argv)
    if plan is not None:
        # max_req_len = min(context_len - 1, pool - 1); input = that - 5 (0.5.11 managers/tp_worker.py:302-306)
        body.update(status=STATUS_READY, max_total_num_tokens=plan.max_total_tokens,
                    max_req_input_len=min(context_len - 1, plan.max_total_tokens - 1) - 5)
        ranks = max(1, args.dp_size)
        body["internal_states"] = [internal_state(release, args, plan, top, figures) for _rank in range(ranks)]
    body["version"] = release.text
    if release.server_info_kv_events:
        body["kv_events"] = None  # no --kv-events-config: publishing disabled
    if release.server_info_frontend:
        body["frontend"] = "python"
    return body
