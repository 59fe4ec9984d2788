# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The server's credentials: whether systemd on this host hands a service its
credentials, and the API key of the server's ``--config`` file.

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

``api_key_from_config(path)`` reads the key back from that ``--config`` file (the
gate's modules, through ``module_api_key``, and the watchdog, which runs this file
on the host: standard library only).
"""

from __future__ import annotations

import json
import re

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


# -- the API key of the server's --config file ------------------------------------

_API_KEY_LINE = re.compile(r"^(?:api-key|api_key)\s*:\s*(.*?)\s*$")


def module_api_key(module, api_key: str | None, api_key_file: str | None) -> str | None:
    """The key a module sends: the one of ``api_key_file`` (an SGLang ``--config`` file) when
    given, else ``api_key``. A key read from the file is masked in everything the module
    returns, as a no_log option is; a file that cannot be read fails the module."""
    if not api_key_file:
        return api_key
    try:
        key = api_key_from_config(api_key_file)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"api_key_file {api_key_file}: {exc}")
    if key:
        module.no_log_values.add(key)
    return key


def api_key_from_config(path: str) -> str | None:
    """The ``api-key`` of an SGLang ``--config`` YAML file (SGLang reads its
    top-level keys as the flags of the same name: 0.5.11
    srt/server_args.py:7282-7285, prepare_server_args -> ConfigArgumentMerger), or None
    when it sets none. The role writes the value as a JSON string, which YAML
    reads the same; a plain or single-quoted scalar is read as YAML would."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    for line in lines:
        match = _API_KEY_LINE.match(line)
        if not match:
            continue
        value = match.group(1)
        if value.startswith('"'):
            return str(json.loads(value))
        if value.startswith("'") and value.endswith("'") and len(value) >= 2:
            return value[1:-1].replace("''", "'")
        value = value.split(" #", 1)[0].strip()
        return value or None
    return None
