# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway unit's launcher: starts SGLang's gateway (``smg``, ``_gateway.PINNED``) in its own
venv with its keys, and the command line it runs with. Standard library only: a gateway host needs
this one file besides the venv (``python -m ...module_utils._gateway_launch launch ARGS``).

The gateway's keys never reach its command line: smg reads them only from
flags (``--api-key``, ``--control-plane-api-keys``; no environment variable,
no file), so ``launch`` runs in the gateway's own venv, reads them from the
files systemd hands the unit (``LoadCredential=``, ``$CREDENTIALS_DIRECTORY``)
and gives smg's own ``main`` the argument list in-process, where no other
user's ``ps`` can read it. smg 1.13.0 logs neither key (its startup lines
name the routing mode and policy only; checked at ``--log-level debug``).
By default smg binds its Prometheus listener on 0.0.0.0:29000 with no
authentication (its own start-up "SECURITY POSTURE" warning says so):
``command`` binds it to loopback on a port of the service's own.
"""

from __future__ import annotations

import os
import sys

# SGLang's /health is one real generation with a 20 s limit (HEALTH_CHECK_TIMEOUT, read in the
# real wheels: 0.5.11 srt/entrypoints/http_server.py:185, 0.5.23 :218): smg's 5 s default would mark a busy,
# healthy worker dead. The rest are smg 1.13.0's defaults but for the interval (60 s there).
HEALTH = dict(timeout=25, interval=10, failure_threshold=3, success_threshold=2, endpoint="/health")
CONTROL_KEY_ID = "inferops"


class LaunchError(Exception):
    """A key the unit must be given is missing or unusable; smg was not started."""


def command(host: str, port: int, metrics_port: int, health: dict | None = None) -> list[str]:
    """``smg launch``'s arguments for one service's gateway, without its keys (``launch`` adds
    them): the client address, Prometheus on loopback, health checks set for SGLang. Workers are
    added and removed at run time through the worker API, never on the command line."""
    checks = dict(HEALTH, **(health or {}))
    return ["launch", "--host", host, "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--health-check-timeout-secs", str(checks["timeout"]),
            "--health-check-interval-secs", str(checks["interval"]),
            "--health-failure-threshold", str(checks["failure_threshold"]),
            "--health-success-threshold", str(checks["success_threshold"]),
            "--health-check-endpoint", checks["endpoint"]]


def _credential(directory: str, name: str) -> str:
    with open(f"{directory}/{name}", encoding="utf-8") as handle:
        value = handle.read().strip()
    if not value or any(c.isspace() or c == ":" for c in value):
        # smg splits --control-plane-api-keys at ':'; a key with one would be cut silently
        raise LaunchError(f"the credential {name} is empty or holds whitespace or ':'")
    return value


def launch(argv: list[str], environ: dict, smg_main) -> None:
    """Run smg (``smg_main``: ``smg.cli.main``) with ``argv`` (``command``'s) and the keys from
    ``$CREDENTIALS_DIRECTORY``: ``control-key`` (the worker API, required) and ``api-key`` (the
    serving routes and the workers behind them, when present)."""
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise LaunchError("no $CREDENTIALS_DIRECTORY: the gateway's unit hands it its keys with LoadCredential=")
    keys = ["--control-plane-api-keys", f"{CONTROL_KEY_ID}:{CONTROL_KEY_ID}:admin:{_credential(directory, 'control-key')}"]
    try:
        keys += ["--api-key", _credential(directory, "api-key")]
    except FileNotFoundError:
        pass
    smg_main([*argv, *keys])


def main() -> int:
    """The gateway unit's entry, run by the gateway venv's Python with this collection's module_utils
    on its path: ``python -m ...module_utils._gateway_launch launch ARGS`` (``command``'s)."""
    from smg.cli import main as smg_main  # pylint: disable=import-outside-toplevel,import-error

    try:
        launch(sys.argv[1:], dict(os.environ), smg_main)
    except (LaunchError, OSError) as exc:
        sys.stderr.write(f"inferops gateway launcher: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
