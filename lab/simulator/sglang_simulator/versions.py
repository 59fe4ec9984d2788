"""Which SGLang release the simulator emulates, and what changed between releases."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_VERSION = "0.5.11"


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.5.11+simulator' -> (0, 5, 11)."""
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

    @property
    def has_dflash(self) -> bool:
        # DFLASH is upstream since 0.5.11 (PR #22077).
        return self.version >= (0, 5, 11)

    @property
    def free_form_spec_algorithm(self) -> bool:
        # 0.5.23 takes any string and validates it after parsing (plugins).
        return self.version >= (0, 5, 23)

    @property
    def split_cuda_graph_flags(self) -> bool:
        # 0.5.20 rewrote server args: --cuda-graph-max-bs is gone,
        # --disable-cuda-graph is a deprecated alias.
        return self.version >= (0, 5, 20)

    @property
    def draft_weights_in_pool(self) -> bool:
        # Since 0.5.14 target and draft weights load before the single memory
        # profile (PR #23862); before that the draft loads afterwards, out of
        # the (1 - mem_fraction_static) headroom.
        return self.version >= (0, 5, 14)

    @property
    def new_pool_error(self) -> bool:
        # 0.5.23 replaced "Not enough memory" with a ValueError naming the minimum.
        return self.version >= (0, 5, 23)

    @property
    def has_ready_endpoint(self) -> bool:
        return self.version >= (0, 5, 23)


def release(text: str) -> Release:
    return Release(parse_version(text))
