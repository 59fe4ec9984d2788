"""``python -m sglang.launch_server``: runs the SGLang simulator (test double)."""

import sys

from sglang_simulator.server import log, main
from sglang_simulator.versions import release

from sglang.version import __version__

if __name__ == "__main__":
    if release(__version__).free_form_spec_algorithm:
        log("WARNING: 'python -m sglang.launch_server' is deprecated; use 'sglang serve'.")
    main(sys.argv[1:], prog="launch_server.py")
