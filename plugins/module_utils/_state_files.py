# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading and writing the small state files on a host: a JSON object, a JSON-lines history,
a file replaced in one step.

Shared by the deploy state module, the watchdog (which runs on the host from a copy of
module_utils, so this file uses the standard library only) and the model stager.
"""

from __future__ import annotations

import json
import os


def read_json(path: str) -> dict | None:
    """The JSON object in ``path``; None when it is missing, unreadable, not JSON or not an object."""
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_jsonl(path: str) -> list[dict]:
    """The objects of a JSON-lines file, oldest first; a line that does not parse (a write cut
    short) or is not an object is skipped; a missing file is empty."""
    records = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    records.append(value)
    except OSError:
        return []
    return records


def append_line(path: str, line: str, mode: int = 0o600) -> None:
    """Append one line and sync it: a history survives a crash of the host right after."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, (line.rstrip("\n") + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def replace(path: str, text: str, mode: int = 0o600) -> bool:
    """Write ``text`` to ``path`` in one step (a temporary file beside it, then rename), so a
    reader sees the old content or the new, never half; nothing is written when the content
    and mode are already those. Returns whether the file changed."""
    data = text.encode("utf-8")
    try:
        with open(path, "rb") as handle:
            same = handle.read() == data
        same = same and (os.stat(path).st_mode & 0o7777) == mode
    except OSError:
        same = False
    if same:
        return False
    temp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    return True
