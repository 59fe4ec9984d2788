# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A unit file read back as systemd reads it, for tests of rendered units.

Follows systemd.syntax(7) (systemd 252): lines starting with '#' or ';' are
comments; a line ending in a backslash is joined to the next with a space,
comment lines between are skipped; "[Section]" lines; "Key=value" with the
whitespace around the value stripped. Quoting (systemd.syntax(7) "QUOTING",
src/basic/extract-word.c extract_first_word with EXTRACT_UNQUOTE and
EXTRACT_CUNESCAPE): items split on unquoted whitespace, double or single quotes
wrap a whole item, C-style escapes (the table of systemd.syntax(7)) are
unescaped. Environment= (systemd.exec(5), src/core/load-fragment.c
config_parse_environ): each item is unquoted and unescaped, then its
specifiers are expanded ("%%" is "%"; %S, %C and %d, which the role writes on
purpose, are kept as written; any other is refused here), then NAME=VALUE is split at the first '='.
"""

from __future__ import annotations

import re

WHITESPACE = " \t\n\r"
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
                   '"': '"', "'": "'", "s": " "}


class SyntaxProblem(ValueError):
    """Something systemd would warn about or read differently from what the test expects."""


def lines(text: str) -> list[tuple[str, str, str]]:
    """(section, key, raw value) of every assignment, in order."""
    out: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for line in text.split("\n"):
        stripped = line.strip(WHITESPACE)
        if stripped.startswith(("#", ";")):
            continue  # a comment, between continuation lines too
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        stripped = (pending + stripped).strip(WHITESPACE)
        pending = ""
        if not stripped:
            continue
        if stripped.startswith("["):
            if not stripped.endswith("]"):
                raise SyntaxProblem(f"bad section line {stripped!r}")
            section = stripped[1:-1]
            continue
        if "=" not in stripped:
            raise SyntaxProblem(f"line without '=': {stripped!r}")
        key, value = stripped.split("=", 1)
        out.append((section, key.strip(WHITESPACE), value.strip(WHITESPACE)))
    if pending:
        raise SyntaxProblem("the file ends in a continued line")
    return out


def _cunescape_one(text: str, i: int) -> tuple[str, int]:
    """The character an escape at text[i] (after the backslash) stands for, and the index after it."""
    if i >= len(text):
        raise SyntaxProblem("a lone backslash at the end")
    c = text[i]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], i + 1
    for prefix, width, base in (("x", 2, 16), ("u", 4, 16), ("U", 8, 16)):
        if c == prefix:
            digits = text[i + 1:i + 1 + width]
            if len(digits) != width or not re.fullmatch(r"[0-9A-Fa-f]+", digits):
                raise SyntaxProblem(f"bad \\{prefix} escape")
            return chr(int(digits, base)), i + 1 + width
    if c in "01234567":
        digits = text[i:i + 3]
        if not re.fullmatch(r"[0-7]{3}", digits):
            raise SyntaxProblem("bad octal escape")
        return chr(int(digits, 8)), i + 3
    raise SyntaxProblem(f"unknown escape \\{c} (systemd warns and keeps it)")


def words(value: str) -> list[str]:
    """The items of a value as extract_first_word(EXTRACT_UNQUOTE | EXTRACT_CUNESCAPE) gives them."""
    out: list[str] = []
    i = 0
    n = len(value)
    while True:
        while i < n and value[i] in WHITESPACE:
            i += 1
        if i >= n:
            return out
        word = ""
        quote = None
        while i < n:
            c = value[i]
            if quote:
                if c == "\\":
                    char, i = _cunescape_one(value, i + 1)
                    word += char
                    continue
                if c == quote:
                    quote = None
                    i += 1
                    continue
                word += c
                i += 1
                continue
            if c in WHITESPACE:
                break
            if c in "\"'":
                quote = c
                i += 1
                continue
            if c == "\\":
                char, i = _cunescape_one(value, i + 1)
                word += char
                continue
            word += c
            i += 1
        if quote:
            raise SyntaxProblem(f"unterminated quote in {value!r}")
        out.append(word)


# The specifiers the role writes on purpose (systemd.unit(5) "SPECIFIERS": %S the state,
# %C the cache, %d the credentials directory): kept as written, unexpanded.
KNOWN_SPECIFIERS = ("%S", "%C", "%d")


def specifiers(text: str) -> str:
    """Specifier expansion: '%%' is '%', KNOWN_SPECIFIERS are kept, any other is a problem."""
    out = ""
    i = 0
    while i < len(text):
        if text[i:i + 2] in KNOWN_SPECIFIERS:
            out += text[i:i + 2]
            i += 2
            continue
        if text[i] == "%":
            if text[i + 1:i + 2] != "%":
                raise SyntaxProblem(f"a specifier %{text[i + 1:i + 2]} would be expanded in {text!r}")
            out += "%"
            i += 2
            continue
        out += text[i]
        i += 1
    return out


def environment(text: str) -> dict[str, str]:
    """The environment the unit's Environment= lines give (later assignments win)."""
    env: dict[str, str] = {}
    for section, key, value in lines(text):
        if section != "Service" or key != "Environment":
            continue
        for word in words(value):
            assignment = specifiers(word)
            name, sep, val = assignment.partition("=")
            if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise SyntaxProblem(f"invalid environment assignment {assignment!r}, systemd ignores it")
            env[name] = val
    return env
