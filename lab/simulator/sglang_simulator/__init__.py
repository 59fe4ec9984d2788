"""SGLang simulator: a TEST DOUBLE of the SGLang server for the inferops.sglang lab.

It is not SGLang. It accepts the real server's command line (``python -m
sglang.launch_server`` / ``sglang serve``), sizes the memory pools with the
formulas of the emulated SGLang release, logs the real milestone and error
lines, and serves the HTTP endpoints the collection depends on, so that the
collection's real systemd units and readiness gate can be exercised on hosts
without GPUs. The hardware it runs on is described by a per-host hardware file
(see ``hardware.py``), which also carries the faults to reproduce.
"""

from __future__ import annotations

SIMULATOR_NAME = "sglang-simulator"
