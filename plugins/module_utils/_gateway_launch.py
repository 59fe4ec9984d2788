# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway unit's launcher: starts SGLang's gateway (``smg``, ``_gateway.PINNED``) in its own
venv with its keys and its workers, and the command line it runs with. It runs from the
collection's code installed on the host (``_host_code``: this file and the module_utils it
imports, standard library only) by the gateway venv's Python:
``python -s -m ...module_utils._gateway_launch ARGS`` (``command``'s).

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

smg keeps its workers in memory only: a gateway restarted (a crash, a reboot) would route to
nothing. The switch writes the live workers to a file the unit is handed as the credential
``workers``; ``launch`` registers them once smg answers, from a thread beside smg's own
``main``, so a restarted gateway routes again without a deploy.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from ansible_collections.inferops.sglang.plugins.module_utils import _gateway
from ansible_collections.inferops.sglang.plugins.module_utils import _http

# SGLang's /health is one real generation with a 20 s limit (HEALTH_CHECK_TIMEOUT, read in the
# real wheels: 0.5.11 srt/entrypoints/http_server.py:185, 0.5.23 :218): smg's 5 s default would mark a busy,
# healthy worker dead. The rest are smg 1.13.0's defaults but for the interval (60 s there).
HEALTH = dict(timeout=25, interval=10, failure_threshold=3, success_threshold=2, endpoint="/health")
CONTROL_KEY_ID = "inferops"
# How long the registration thread waits for smg to answer after its start
REGISTER_TIMEOUT = 120.0


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
            "--health-check-endpoint", checks["endpoint"],
            # a server the watchdog restarts comes back on the same URL: the gateway keeps it listed,
            # unhealthy, and routes to it again once its checks pass (smg 1.13.0 `smg launch --help`:
            # removal follows service discovery by default, which is off here; said explicitly)
            "--no-remove-unhealthy-workers"]


def _credential(directory: str, name: str, colon: bool = False) -> str:
    """A key from the credentials directory: one printable word (``colon``: it may hold ':')."""
    with open(f"{directory}/{name}", encoding="utf-8") as handle:
        value = handle.read().strip()
    if not value or any(c.isspace() for c in value) or (not colon and ":" in value):
        # smg splits --control-plane-api-keys at ':'; a control key with one would be cut silently
        raise LaunchError(f"the credential {name} is empty or holds whitespace" + ("" if colon else " or ':'"))
    return value


def workers_of(text: str) -> list[str]:
    """The worker URLs of a workers file (``{"workers": [URL, ...]}``, as the switch writes it)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise LaunchError(f"the credential workers is not JSON: {exc}") from None
    urls = doc.get("workers") if isinstance(doc, dict) else None
    if not isinstance(urls, list) or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
        raise LaunchError(f"the credential workers must be {{\"workers\": [URL, ...]}}, got {text[:200]!r}")
    return [_gateway.worker_url(u) for u in urls]


def register(gateway: _gateway.Gateway, workers: list[str], api_key: str | None, timeout: float) -> list[str]:
    """Once the gateway answers, add each of ``workers`` (already listed ones keep their id); their ids."""
    gateway.wait_up(timeout)
    return [gateway.add(url, api_key) for url in workers]


def _register_in_background(url: str, control_key: str, workers: list[str], api_key: str | None) -> None:
    try:
        ids = register(_gateway.Gateway(_http.Client(url, control_key, True, 10)), workers, api_key, REGISTER_TIMEOUT)
    except (_gateway.GatewayError, ValueError) as exc:
        sys.stderr.write(f"inferops gateway launcher: the workers were not registered: {exc}\n")
    else:
        sys.stderr.write(f"inferops gateway launcher: registered {len(ids)} worker(s): {', '.join(workers)}\n")


def launch(argv: list[str], environ: dict, smg_main, start_thread=None) -> None:
    """Run smg (``smg_main``: ``smg.cli.main``) with ``argv`` (``command``'s) and, from
    ``$CREDENTIALS_DIRECTORY``: ``control-key`` (the worker API, required), ``api-key`` (the servers'
    API key: it guards the serving routes and is sent to the workers, when present) and ``workers``
    (registered once smg answers, when present).
    ``start_thread(target, args)`` starts the registration (a daemon thread by default)."""
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise LaunchError("no $CREDENTIALS_DIRECTORY: the gateway's unit hands it its keys with LoadCredential=")
    control = _credential(directory, "control-key")
    keys = ["--control-plane-api-keys", f"{CONTROL_KEY_ID}:{CONTROL_KEY_ID}:admin:{control}"]
    api_key = None
    if os.path.exists(os.path.join(directory, "api-key")):
        api_key = _credential(directory, "api-key", colon=True)
        keys += ["--api-key", api_key]
    workers: list[str] = []
    path = os.path.join(directory, "workers")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            workers = workers_of(handle.read())
    if workers:
        # where this host reaches the gateway ``argv`` starts (a wildcard on its loopback), as a server's URL
        args = (_http.url_of(argv), control, workers, api_key)
        if start_thread is None:
            threading.Thread(target=_register_in_background, args=args, name="inferops-register", daemon=True).start()
        else:
            start_thread(_register_in_background, args)
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
