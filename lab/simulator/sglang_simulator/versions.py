"""Which SGLang release the simulator emulates, and what changed between releases.

The facts come from the collection's one table of SGLang release facts,
plugins/module_utils/_sglang_releases.py (each with its wheel file:line and a
check against the real wheels in tests/conformance/test_releases_wheels.py);
the wheel ships a copy of it (build_wheel.py), a run from the source tree reads
it from plugins/module_utils. tests/conformance/test_simulator_conformance.py
checks the simulator's switches against the wheels of 0.5.9 ... 0.5.23.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    from . import _sglang_releases as _table  # the copy build_wheel.py vendors
except ImportError:  # the source tree: the collection's own file
    _SOURCE = Path(__file__).resolve().parents[3] / "plugins" / "module_utils" / "_sglang_releases.py"
    _spec = importlib.util.spec_from_file_location(__name__.rpartition(".")[0] + "._sglang_releases", _SOURCE)
    _table = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _table
    _spec.loader.exec_module(_table)

DEFAULT_VERSION = "0.5.11"


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.5.11+simulator' -> (0, 5, 11); '0.5.12.post1' -> (0, 5, 12)."""
    match = re.match(r"^\s*(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        raise ValueError(f"not an SGLang version: {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


@dataclass(frozen=True)
class Release:
    """Behaviour switches of one emulated SGLang release: names over the facts of
    _sglang_releases (each fact's wheel file:line is in that table)."""

    version: tuple[int, int, int]

    @property
    def text(self) -> str:
        return ".".join(str(p) for p in self.version)

    def fact(self, name: str):
        """One fact of the release table for this release."""
        return _table.facts(self.version)[name]

    # -- speculative algorithms (srt/speculative/spec_info.py SpeculativeAlgorithm) --
    @property
    def has_dflash(self) -> bool:
        return self.fact("dflash")

    @property
    def free_form_spec_algorithm(self) -> bool:
        return self.fact("free_form_spec_algorithm")

    @property
    def has_frozen_kv_mtp(self) -> bool:
        return self.fact("frozen_kv_mtp")

    @property
    def has_dspark(self) -> bool:
        return self.fact("dspark")

    @property
    def has_uno(self) -> bool:
        return self.fact("uno")

    # -- CUDA graph flags --
    @property
    def split_cuda_graph_flags(self) -> bool:
        return self.fact("split_cuda_graph_flags")

    @property
    def disable_cuda_graph_deprecated(self) -> bool:
        return self.fact("split_cuda_graph_flags")

    @property
    def cuda_graph_max_bs_removed(self) -> bool:
        return not self.fact("cuda_graph_max_bs_flag")

    # -- memory pool --
    @property
    def draft_weights_in_pool(self) -> bool:
        return self.fact("draft_in_pool")

    @property
    def new_pool_error(self) -> bool:
        return self.fact("new_pool_error")

    # -- HTTP --
    @property
    def has_ready_endpoint(self) -> bool:
        return self.fact("ready_endpoint")

    @property
    def loads_aggregate(self) -> bool:
        return self.fact("loads_aggregate")

    @property
    def loads_accelerators(self) -> bool:
        return self.fact("loads_accelerators")

    @property
    def launch_server_warns(self) -> bool:
        return self.fact("launch_server_warns")

    @property
    def ready_skips_api_key(self) -> bool:
        return self.fact("ready_skips_api_key")

    # -- hybrid linear-attention models and radix cache --
    @property
    def has_mamba_scheduler_strategy(self) -> bool:
        return self.fact("mamba_scheduler_strategy_flag")

    @property
    def has_mamba_radix_cache_strategy(self) -> bool:
        return self.fact("mamba_radix_cache_strategy_flag")

    @property
    def radix_refuses_spec_on_hybrid(self) -> bool:
        return self.fact("hybrid_spec_radix") == "refuse"

    @property
    def radix_silently_disabled_for_spec(self) -> bool:
        return self.fact("hybrid_spec_radix") == "off"

    @property
    def radix_strategy_auto_extra_buffer(self) -> bool:
        return self.fact("hybrid_spec_radix") == "extra_buffer"

    # -- argument resolution --
    @property
    def parser_prog_sglang_serve(self) -> bool:
        return self.fact("parser_prog_sglang_serve")

    @property
    def has_resolve_once(self) -> bool:
        return self.fact("resolve_once")

    @property
    def ngram_devices(self) -> tuple[str, ...]:
        return self.fact("ngram_devices")

    # -- /server_info --
    @property
    def server_info_kv_events(self) -> bool:
        return self.fact("server_info_kv_events")

    @property
    def server_info_launch_command(self) -> bool:
        return self.fact("server_info_launch_command")

    @property
    def server_info_frontend(self) -> bool:
        return self.fact("server_info_frontend")

    @property
    def internal_state_world_size(self) -> bool:
        return self.fact("internal_state_world_size")

    @property
    def memory_usage_by_phase(self) -> bool:
        return self.fact("memory_usage_by_phase")

    @property
    def internal_state_decode_graph_bs(self) -> bool:
        return self.fact("internal_state_decode_graph_bs")

    # -- start-up log --
    @property
    def logs_init_parallel(self) -> bool:
        return self.fact("logs_init_parallel")

    @property
    def kv_cache_log_names_dtype(self) -> bool:
        return self.fact("kv_cache_log_names_dtype")

    @property
    def capture_log_names_phase(self) -> bool:
        return self.fact("capture_log_names_phase")

    @property
    def capture_log_num_tokens_per_req(self) -> bool:
        return self.fact("capture_log_num_tokens_per_req")

    @property
    def capture_log_bs_at_end(self) -> bool:
        return self.fact("capture_log_bs_at_end")

    # -- messages --
    @property
    def graph_hint_names_decode_flags(self) -> bool:
        return self.fact("graph_hint_names_decode_flags")


def release(text: str) -> Release:
    return Release(parse_version(text))
