"""``sglang.srt.server_args`` of the SGLang simulator (a test double): the entry point
real SGLang resolves its server arguments through, with the simulator's parser and
checks (sglang_simulator.args), so a preflight on a lab host asks it as it asks real
SGLang on a real host:

    server_args = prepare_server_args(argv)   # argparse: exit 2, "sglang serve: error: ..."
    server_args.resolve_once()                # 0.5.19+ only, as real
    server_args.check_server_args()

As real, the refusals the simulator knows are raised as ``ValueError`` with the
release's own message: where real raises them, in ``prepare_server_args``
(``ServerArgs.__post_init__``, up to 0.5.18: 0.5.11 srt/server_args.py:7265-7299)
or in ``resolve_once`` (0.5.19+: 0.5.23 srt/server_args.py:244). The fields are the
parsed arguments; the simulator resolves only what it models before start-up (the
device, radix cache and the mamba strategy): SGLang's memory defaults are decided
later, by the simulated server (sglang_simulator.memory), and read None here.
``check_server_args`` checks nothing the simulator models.
"""

from __future__ import annotations

import argparse

from sglang_simulator.args import build_parser, ddtree_build_installed, merge_config, parser_prog, resolve
from sglang_simulator.versions import Release, release as make_release

from sglang.version import __version__

__all__ = ["ServerArgs", "prepare_server_args"]


class ServerArgs:
    """The parsed arguments of one command line, resolved as the simulator models it."""

    def __init__(self, args: argparse.Namespace, release: Release, ddtree: bool) -> None:
        self._args = args
        self._release = release
        self._ddtree = ddtree
        self._resolution_finished = False
        self._resolution_failed = False
        self._publish()

    def _publish(self) -> None:
        """The arguments as fields, under the release's names: the mamba strategy is
        mamba_scheduler_strategy up to 0.5.13 (0.5.11 server_args.py),
        mamba_radix_cache_strategy from 0.5.14 (the parser's dest for both flags)."""
        for key, value in vars(self._args).items():
            if key == "mamba_radix_cache_strategy" and not self._release.has_mamba_radix_cache_strategy:
                key = "mamba_scheduler_strategy"
            setattr(self, key, value)

    def _resolve(self) -> None:
        if self._resolution_finished:
            return
        try:
            resolve(self._release, self._args, self._ddtree)
        except ValueError as exc:
            # SGLang raises a plain ValueError; the simulator's own exception types stay inside
            self._resolution_failed = True
            raise ValueError(str(exc)) from None
        # the device SGLang resolves when --device is not given: the simulator's hosts have GPUs
        self._args.device = self._args.device or "cuda"
        self._publish()
        self._resolution_finished = True

    def check_server_args(self) -> None:
        """0.5.11 server_args.py:6773: its asserts cover nothing the simulator models."""

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()) if not k.startswith("_") and k != "api_key")
        return f"ServerArgs({shown})"


class ResolvingServerArgs(ServerArgs):
    """0.5.19+: construction leaves the record raw; resolve_once resolves it."""

    def resolve_once(self) -> None:
        if self._resolution_failed:
            # 0.5.23 server_args.py:252-258
            raise RuntimeError(
                "resolution already failed on this ServerArgs; the handlers that "
                "ran left their writes on the record, and a second pass would "
                "read that partial output as fresh input. Build a new record "
                "from the corrected arguments."
            )
        self._resolve()


def prepare_server_args(argv: list[str]) -> ServerArgs:
    """argparse with the release's parser (``--config`` merged first, as real), then, up
    to 0.5.18, the resolution ServerArgs.__post_init__ runs."""
    rel = make_release(__version__)
    ddtree = ddtree_build_installed()
    parser = build_parser(rel, parser_prog(rel, None), ddtree)
    argv = merge_config(parser, list(argv))
    namespace = parser.parse_args(argv)  # exits 2 with argparse's message
    if rel.has_resolve_once:
        return ResolvingServerArgs(namespace, rel, ddtree)
    server_args = ServerArgs(namespace, rel, ddtree)
    server_args._resolve()  # noqa: SLF001 - ServerArgs.__post_init__
    return server_args
