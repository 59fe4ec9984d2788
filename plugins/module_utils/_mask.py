# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Secrets masked out of text the collection shows or writes: one grammar for every place.

SGLang logs all its server arguments at start-up with the API key in clear
(``server_args=ServerArgs(..., api_key='...', admin_api_key=...)``), a process's command
line holds ``--api-key VALUE``, the HTTP client sends ``Authorization: Bearer KEY``. Such
text reaches places Ansible's no_log does not cover: the gate's progress file and its live
progress lines (wait_for_sglang's action plugin), the listener's command line in a verdict,
the watchdog's journal lines and history. ``mask`` is what all of them apply; ``redact_argv``
is the same for an argv list, where a flag's value is the next element whole. ``printable``
takes terminal control out of text a server wrote (its log lines, its answers).

Used by the action plugin on the controller and by the watchdog on the host, which runs from a
copy of the module_utils it imports (sglang_watchdog): standard library only.
"""

from __future__ import annotations

import json
import re

MASK = "********"

# A secret's name: one of these words, alone or joined to others by - or _ (key, api_key,
# --admin-api-key, X-API-Key, api_key_file, hf-token); never part of a word (tokens, monkey).
# What comes before and after the word is bounded, so a long identifier costs linear time
# (a longer one is masked from a later - or _ on).
_WORDS = r"(?:key|token|secret|password|passwd)"
_NAME = rf"[\w-]{{0,64}}?(?<![^\W_]){_WORDS}(?![^\W_])[\w-]{{0,64}}"
# A value: quoted ('...', "..." with JSON's escapes) or up to a space, a comma or a closing
# bracket (a repr's ``)``, a dict's ``}``; kept, so masking twice changes nothing more).
_VALUE = r"'[^']*'|\"(?:[^\"\\]|\\.)*\"|[^\s,)}\]]+"
_SECRETS = re.compile(
    # name=value, name: value, name = value, a repr's api_key='...', JSON's "api_key": "..."
    rf"(?<![^\W_])(?P<name>{_NAME})(?P<sep>[\"']?\s*[=:]\s*)(?P<value>{_VALUE})"
    # a flag and its value after a space: --api-key VALUE
    rf"|(?<![\w-])(?P<flag>--{_NAME})(?P<space>\s+)(?P<flag_value>'[^']*'|\"(?:[^\"\\]|\\.)*\"|\S+)"
    # an HTTP authorization: Bearer TOKEN
    r"|(?<![\w-])(?P<scheme>bearer)(?P<blank>\s+)(?P<token>[^\s\"']+)",
    re.IGNORECASE,
)
# An argv element that is a secret flag whose value is the next element (or after its =).
_SECRET_FLAG = re.compile(rf"--?{_NAME}", re.IGNORECASE)


# A terminal's escape sequences (CSI ESC [ ... final, OSC ESC ] ... BEL or ESC \\, and any other ESC and the
# character after it), then any C0 control but the tab, DEL and the C1 controls (0x80-0x9f).
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?|[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` without terminal control: escape sequences removed, every other control character
    but the tab (C0, DEL, C1) shown as ``?``. A server's log line or answer reaches a terminal, AWX
    and the records through the collection's messages: it must not move the cursor, set a window
    title, clear a screen or hide what follows it."""
    return _ESCAPES.sub(lambda m: "" if m.group(0).startswith("\x1b") else "?", text)


def _masked_match(match: re.Match) -> str:
    if match.group("name") is not None:
        return match.group("name") + match.group("sep") + MASK
    if match.group("flag") is not None:
        return match.group("flag") + match.group("space") + MASK
    return match.group("scheme") + match.group("blank") + MASK


def mask(text: str, secrets=()) -> str:
    """``text`` with every secret replaced by ``MASK``: each of ``secrets`` (the API key and the
    like, known to the caller; also as JSON escapes it) wherever it appears, and the value of
    every secret-looking name: ``name=value``, ``name: value``, ``api_key='...'``,
    ``"api_key": "..."``, ``--api-key VALUE``, ``--api-key=VALUE``, ``Bearer TOKEN``.
    A quoted value is masked with its quotes. Nothing else in the text changes."""
    known = set()
    for secret in secrets or ():
        if secret:
            secret = str(secret)
            known.add(secret)
            known.add(json.dumps(secret)[1:-1])
    for secret in sorted(known, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _SECRETS.sub(_masked_match, text)


def redact_argv(argv: list[str], secrets=()) -> list[str]:
    """argv with secrets masked: the value of a secret flag, the next element whole
    (``--api-key VALUE``) or after its ``=`` (``--api-key=VALUE``); every other element
    through ``mask``."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide:
            out.append(MASK)
            hide = False
            continue
        flag, eq, _value = arg.partition("=")
        if _SECRET_FLAG.fullmatch(flag):
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(arg)
                hide = True
            continue
        out.append(mask(arg, secrets))
    return out
