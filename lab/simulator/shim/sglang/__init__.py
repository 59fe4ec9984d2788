"""SGLang simulator (a test double for the inferops.sglang lab), installed under
the name ``sglang`` so that ``python -m sglang.launch_server`` and ``sglang
serve`` run it unchanged. See ``sglang_simulator``."""

from sglang.version import __version__

SIMULATOR = True

__all__ = ["SIMULATOR", "__version__"]
