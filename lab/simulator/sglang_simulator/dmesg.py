"""Fake ``dmesg`` for lab hosts (a test double): the lab's kernel log (``hardware.kernel_log``),
in dmesg's default format (``[seconds since boot] text``), after the line every real kernel
log starts with. A lab container's own journal has no kernel entries and its real ``dmesg``
would read the CI machine's kernel: this one stands in for the GPU host's."""

from __future__ import annotations

import platform
import sys

from . import hardware as hw


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        print(f"dmesg: the lab's dmesg takes no options (got {' '.join(argv)})", file=sys.stderr)
        return 1
    print(f"[    0.000000] Linux version {platform.release()} (the inferops.sglang lab's kernel log)")
    for line in hw.kernel_log():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
