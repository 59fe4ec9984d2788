"""The ``sglang`` console script of the simulator (test double): ``sglang serve ...``."""

import sys

from sglang_simulator.server import main as serve_main

from sglang.version import __version__


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["version"] or argv[:1] == ["--version"]:
        print(__version__)
        return
    if argv[:1] != ["serve"]:
        sys.stderr.write("usage: sglang {serve,version} ...\n")
        sys.exit(2)
    serve_main(argv[1:], prog="sglang serve")
