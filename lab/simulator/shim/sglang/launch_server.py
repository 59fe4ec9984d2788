"""``python -m sglang.launch_server``: runs the SGLang simulator (test double)."""

import sys

from sglang_simulator.server import main
from sglang_simulator.versions import release

from sglang.version import __version__

if __name__ == "__main__":
    if release(__version__).launch_server_warns:
        # 0.5.12.post1 launch_server.py:54-60 (warnings.warn, on stderr)
        sys.stderr.write(
            f"{__file__}:54: UserWarning: 'python -m sglang.launch_server' is still supported, but "
            "'sglang serve' is the recommended entrypoint.\n  Example: sglang serve --model-path <model> [options]\n"
        )
    main(sys.argv[1:], prog="launch_server.py")
