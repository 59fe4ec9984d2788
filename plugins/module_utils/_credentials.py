# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether systemd on this host hands a service its credentials.

The unit gives SGLang its ``--config`` file, which holds the API key, by
``LoadCredential=`` (systemd.exec(5), CREDENTIALS): systemd copies the file
into ``$CREDENTIALS_DIRECTORY`` (``%d``), readable by the service's user alone.
systemd 252 builds that directory in a child mount namespace and moves the
finished mount into place; the move reaches the service only where the root
mount propagates (shared). Running as PID 1 of a container, systemd leaves the
root mount as the container manager made it, and a privileged container's is
private: the service then finds an empty root-only directory, and real SGLang
0.5.11 dies at start with ``PermissionError: [Errno 13] Permission denied:
'/run/credentials/<unit>/<file>'`` (sglang/srt/server_args_config_parser.py:137,
seen on systemd 252.39 in a privileged podman container). An unprivileged
container cannot mount, and systemd falls back to a plain directory that works.

``problem(run_command)`` proves the mechanism the way the unit uses it: a
transient service run as ``nobody`` with one ``SetCredential=`` must read it
back. It changes nothing that outlives it (``--collect``).
"""

from __future__ import annotations

PROBE_ID = "inferops-credential-probe"
PROBE_VALUE = "delivered"
PROBE_USER = "nobody"
PROBE_TIMEOUT = 60

ARGV = [
    "timeout", str(PROBE_TIMEOUT), "systemd-run", "--wait", "--pipe", "--quiet", "--collect",
    "--description=inferops.sglang: does systemd hand a service its credentials?",
    "-p", f"SetCredential={PROBE_ID}:{PROBE_VALUE}", "-p", f"User={PROBE_USER}",
    "/bin/sh", "-c", f'cat "$CREDENTIALS_DIRECTORY/{PROBE_ID}"',
]


def problem(run_command) -> str | None:
    """None when a non-root service reads a credential systemd set for it; else why, for the preflight's message."""
    rc, out, err = run_command(ARGV)
    if rc == 0 and out.strip() == PROBE_VALUE:
        return None
    said = " ".join((err or out or "").split())[-300:] or "no output"
    return (
        f"systemd on this host does not hand a service its credentials: a transient service (User={PROBE_USER}, "
        f"SetCredential=) could not read its $CREDENTIALS_DIRECTORY (exit {rc}: {said}). The unit gives SGLang its "
        "--config file, which holds the API key, by LoadCredential=, so the server would die at start. Where systemd "
        "runs in a privileged container, make the root mount shared at boot (mount --make-rshared /) and try again")
