"""Which SGLang release the simulator emulates, and what changed between releases.

Every switch below is checked against the real wheel of each release
0.5.9 ... 0.5.23 by tests/conformance/test_simulator_conformance.py
(file:line in the comments are into the wheel of the release named).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_VERSION = "0.5.11"


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.5.11+simulator' -> (0, 5, 11); '0.5.12.post1' -> (0, 5, 12)."""
    match = re.match(r"^\s*(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        raise ValueError(f"not an SGLang version: {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


@dataclass(frozen=True)
class Release:
    """Behaviour switches of one emulated SGLang release (facts from the wheels)."""

    version: tuple[int, int, int]

    @property
    def text(self) -> str:
        return ".".join(str(p) for p in self.version)

    # -- speculative algorithms (srt/speculative/spec_info.py SpeculativeAlgorithm) --
    @property
    def has_dflash(self) -> bool:
        # 0.5.11 spec_info.py: DFLASH = auto(); --speculative-algorithm choices
        # ["DFLASH", "EAGLE", ...] (0.5.11 server_args.py:5365-5369).
        return self.version >= (0, 5, 11)

    @property
    def free_form_spec_algorithm(self) -> bool:
        # 0.5.12.post1 server_args.py:5786: --speculative-algorithm has no choices
        # ("Or any name registered via SpeculativeAlgorithm.register"); the name is
        # checked by SpeculativeAlgorithm.from_string (spec_info.py:54).
        return self.version >= (0, 5, 12)

    @property
    def has_frozen_kv_mtp(self) -> bool:
        # 0.5.12.post1 spec_info.py: FROZEN_KV_MTP = auto().
        return self.version >= (0, 5, 12)

    @property
    def has_dspark(self) -> bool:
        # 0.5.16 spec_info.py:38 DSPARK = auto() (not 0.5.20 as real-sglang.md says).
        return self.version >= (0, 5, 16)

    @property
    def has_uno(self) -> bool:
        # 0.5.20 spec_info.py:41 UNO = auto().
        return self.version >= (0, 5, 20)

    # -- CUDA graph flags -------------------------------------------------------
    @property
    def split_cuda_graph_flags(self) -> bool:
        # 0.5.14 server_args.py: cuda_graph_max_bs_decode/_prefill and
        # cuda_graph_backend_decode/_prefill fields; --disable-cuda-graph becomes
        # a DeprecatedStoreTrueAction (server_args.py:6376-6380).
        return self.version >= (0, 5, 14)

    @property
    def disable_cuda_graph_deprecated(self) -> bool:
        return self.split_cuda_graph_flags

    @property
    def cuda_graph_max_bs_removed(self) -> bool:
        # 0.5.20 rewrote server args (srt/arg_groups/fields/*.py): no
        # --cuda-graph-max-bs, so argparse calls the prefix ambiguous.
        return self.version >= (0, 5, 20)

    # -- memory pool --------------------------------------------------------------
    @property
    def draft_weights_in_pool(self) -> bool:
        # Since 0.5.14 target and draft weights load before the single memory
        # profile and the pool error says so ("If using speculative decoding,
        # draft weights are now counted", 0.5.14 pool_configurator.py); before
        # that the draft loads afterwards, out of the (1 - mfs) headroom.
        return self.version >= (0, 5, 14)

    @property
    def new_pool_error(self) -> bool:
        # "Loaded weights leave no GPU memory for the KV cache" from 0.5.14
        # (pool_configurator.py), not 0.5.23.
        return self.version >= (0, 5, 14)

    # -- HTTP --------------------------------------------------------------------
    @property
    def has_ready_endpoint(self) -> bool:
        # @app.get("/ready") in entrypoints/http_server.py from 0.5.20.
        return self.version >= (0, 5, 20)

    @property
    def launch_server_warns(self) -> bool:
        # 0.5.10.post1+ launch_server.py (0.5.12.post1 :54): warnings.warn("'python -m
        # sglang.launch_server' is still supported, but 'sglang serve' is ...").
        return self.version >= (0, 5, 10)

    # -- hybrid linear-attention models and radix cache ----------------------------
    @property
    def has_mamba_scheduler_strategy(self) -> bool:
        # --mamba-scheduler-strategy: 0.5.9-0.5.13 choices auto/no_buffer/extra_buffer
        # (0.5.11 server_args.py), 0.5.14-0.5.19 a deprecated alias of
        # --mamba-radix-cache-strategy, gone in 0.5.20.
        return self.version < (0, 5, 20)

    @property
    def has_mamba_radix_cache_strategy(self) -> bool:
        return self.version >= (0, 5, 14)

    @property
    def radix_refuses_spec_on_hybrid(self) -> bool:
        # 0.5.10.post1-0.5.13.post1 raise ValueError("Speculative decoding for
        # {arch} is not compatible with radix cache when using
        # --mamba-scheduler-strategy no_buffer...") (0.5.11 server_args.py:2452-2456).
        return (0, 5, 10) <= self.version < (0, 5, 14)

    @property
    def radix_silently_disabled_for_spec(self) -> bool:
        # 0.5.9 server_args.py:1761-1764: "Disabling radix cache since speculative
        # decoding for {arch} is not supported with radix cache yet."
        return self.version < (0, 5, 10)

    @property
    def radix_strategy_auto_extra_buffer(self) -> bool:
        # 0.5.14 server_args.py:4383-4392: strategy "auto" becomes extra_buffer
        # when overlap scheduling is wanted and the model supports it.
        return self.version >= (0, 5, 14)

    # -- argument resolution ---------------------------------------------------------
    @property
    def parser_prog_sglang_serve(self) -> bool:
        # prepare_server_args builds ArgumentParser(prog="sglang serve") from
        # 0.5.10.post1 (0.5.11 server_args.py:7276), so argparse's messages read
        # "sglang serve: error: ..." whatever the entry point; 0.5.9's
        # ArgumentParser() takes the script's name (launch_server.py).
        return self.version >= (0, 5, 10)

    @property
    def has_resolve_once(self) -> bool:
        # 0.5.19 server_args.py:3663-3673: __post_init__ leaves the record raw and
        # ServerArgs.resolve_once() resolves it (launch_server.py:21); up to 0.5.18
        # __post_init__ resolves and validates inside prepare_server_args.
        return self.version >= (0, 5, 19)

    @property
    def ngram_devices(self) -> tuple[str, ...]:
        # The devices NGRAM speculative decoding runs on: "cuda" only up to
        # 0.5.15.post1 (0.5.11 server_args.py:3557-3561, not device.startswith("cuda");
        # 0.5.13.post1 arg_groups/speculative_hook.py:389-391), cuda or cpu 0.5.16-0.5.20
        # (0.5.16 speculative_hook.py:651-655), cuda, cpu or xpu from 0.5.21
        # (0.5.21 speculative_hook.py:1173-1178, 0.5.23 :1286-1290).
        if self.version >= (0, 5, 21):
            return ("cuda", "cpu", "xpu")
        if self.version >= (0, 5, 16):
            return ("cuda", "cpu")
        return ("cuda",)

    @property
    def ready_skips_api_key(self) -> bool:
        # decide_request_auth lets /health*, /metrics* and, from 0.5.20, /ready* through
        # without the key (0.5.11 utils/auth.py:100, 0.5.20 utils/auth.py:101-105).
        return self.version >= (0, 5, 20)

    # -- /server_info --------------------------------------------------------------
    @property
    def server_info_kv_events(self) -> bool:
        # "kv_events": the publisher descriptor, from 0.5.13.post1 (http_server.py:656).
        return self.version >= (0, 5, 13)

    @property
    def server_info_launch_command(self) -> bool:
        # "launch_command": the command line as given, from 0.5.20 (http_server.py:840).
        return self.version >= (0, 5, 20)

    @property
    def server_info_frontend(self) -> bool:
        # "frontend": "python", from 0.5.21 (0.5.23 http_server.py:889).
        return self.version >= (0, 5, 21)

    @property
    def internal_state_world_size(self) -> bool:
        # state["world_size"] from 0.5.19 (0.5.23 scheduler_components/internal_state.py:67).
        return self.version >= (0, 5, 19)

    @property
    def memory_usage_by_phase(self) -> bool:
        # memory_usage["graph"] is a dict over GRAPH_MEMORY_USAGE_KEYS and gains
        # startup_available / token_capacity_swa from 0.5.17
        # (model_executor/graph_memory_usage.py:5-12, scheduler_components/memory_usage.py:15-41);
        # before, one float rounded to 2 places (0.5.11 managers/scheduler.py:3372-3380).
        return self.version >= (0, 5, 17)

    @property
    def internal_state_decode_graph_bs(self) -> bool:
        # state["decode_cuda_graph_bs"], the decode batch sizes captured, from 0.5.21
        # (0.5.23 scheduler_components/internal_state.py:101-103).
        return self.version >= (0, 5, 21)

    # -- start-up log ------------------------------------------------------------------
    @property
    def logs_init_parallel(self) -> bool:
        # "Init parallel begin." / "Init parallel ends. elapsed=..." and "Memory baseline
        # taken. mem usage=..." (0.5.23 distributed/bootstrap.py:115, :190, :220) replace
        # "Init torch distributed begin." / "... ends. elapsed=..., mem usage=..." (0.5.11
        # model_executor/model_runner.py:1103, :1236) from 0.5.21.
        return self.version >= (0, 5, 21)

    @property
    def kv_cache_log_names_dtype(self) -> bool:
        # "KV Cache is allocated. dtype: ..., #tokens: ..." from 0.5.13.post1
        # (mem_cache/memory_pool.py:819); up to 0.5.12 a separate "Using KV cache
        # dtype: ..." line first (0.5.11 model_executor/model_runner.py:2256, memory_pool.py:735).
        return self.version >= (0, 5, 13)

    @property
    def capture_log_names_phase(self) -> bool:
        # "Capture target verify CUDA graph begin. backend=..., ..." from 0.5.14
        # (model_runner.py:2563-2565); up to 0.5.13 "Capture cuda graph begin. This can
        # take up to several minutes. avail mem=..." (0.5.11 model_runner.py:2779).
        return self.version >= (0, 5, 14)

    @property
    def capture_log_num_tokens_per_req(self) -> bool:
        # num_tokens_per_bs= (0.5.14-0.5.15) becomes num_tokens_per_req= in 0.5.16
        # (model_runner_components/cuda_graph_setup.py:312-315).
        return self.version >= (0, 5, 16)

    @property
    def capture_log_bs_at_end(self) -> bool:
        # the target's bs=[...] moves from the begin line to the end line in 0.5.22
        # (0.5.23 model_runner_components/cuda_graph_setup.py:759-761, :788-792).
        return self.version >= (0, 5, 22)

    # -- messages ------------------------------------------------------------------
    @property
    def graph_hint_names_decode_flags(self) -> bool:
        # CUDA_GRAPH_CAPTURE_FAILED_MSG: "2. set --cuda-graph-max-bs to a smaller
        # value" up to 0.5.13 (0.5.11 cuda_graph_runner.py:1431-1438),
        # "--cuda-graph-max-bs-decode" from 0.5.14 (runner_backend_utils/__init__.py:14-21).
        return self.version >= (0, 5, 14)


def release(text: str) -> Release:
    return Release(parse_version(text))
