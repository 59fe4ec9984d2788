# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One step of `make lab`, told as a line of the story; its whole output goes to the log.

    python lab/step.py --begin                                  a new log, the clock starts
    python lab/step.py [--expect N] "what it shows" -- COMMAND...

Prints `[mm:ss] what it shows ... ok (N s)` (the clock since --begin), then what the step
says to a reader: the deploy summary of a deploy (one line per host, and why a host did not
switch), the message of each check (`msg:` of a passed assert or debug), nothing else. The
command's whole output is appended to the log (.cache/lab/make-lab.log, or $INFEROPS_LAB_LOG).
A step that exits other than N (default 0) prints its last lines and the log's path, and
fails `make lab`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOG = Path(os.environ.get("INFEROPS_LAB_LOG", REPO / ".cache" / "lab" / "make-lab.log"))
CLOCK = LOG.with_suffix(".start")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def elapsed() -> str:
    try:
        start = float(CLOCK.read_text())
    except (OSError, ValueError):
        start = time.time()
    minutes, seconds = divmod(int(time.time() - start), 60)
    return f"[{minutes:2d}:{seconds:02d}]"


def summary(lines: list[str]) -> list[str]:
    """The deploy summary callback's block: after its banner, up to the next banner or the end."""
    banners = [i for i, line in enumerate(lines) if line.startswith("INFEROPS DEPLOY SUMMARY")]
    if not banners:
        return []
    block = []
    for line in lines[banners[-1] + 1:]:
        if re.match(r"^[A-Z][A-Z ]+\*{3,}", line):
            break
        if line.strip():
            block.append(line.rstrip())
    return block


def _scalar(text: str) -> str:
    return text.strip().strip("'\"").replace("''", "'")


def messages(lines: list[str]) -> list[str]:
    """The `msg:` of each ok result (a passed assert's success_msg, a debug's message or list of
    messages), a line each, prefixed with its host unless it names it."""
    out, index = [], 0
    while index < len(lines):
        match = re.match(r"^ok: \[([^\]]+)\] =>", lines[index])
        index += 1
        if not match:
            continue
        host = match.group(1)
        while index < len(lines) and lines[index].startswith(" "):
            found = re.match(r"^(\s+)msg: ?(.*)$", lines[index])
            index += 1
            if not found:
                continue
            indent, first = len(found.group(1)), found.group(2)
            items: list[list[str]] = [] if first in ("", "|", "|-", ">", ">-") else [[first]]
            while index < len(lines) and lines[index].strip() and (
                    len(lines[index]) - len(lines[index].lstrip()) > indent
                    or lines[index].lstrip().startswith("- ") and len(lines[index]) - len(lines[index].lstrip()) >= indent):
                text = lines[index].strip()
                if text.startswith("- ") and len(lines[index]) - len(lines[index].lstrip()) <= indent + 2:
                    items.append([text[2:]])
                elif items:
                    items[-1].append(text)
                else:
                    items.append([text])
                index += 1
            for item in items:
                text = " ".join(_scalar(part) for part in item if _scalar(part))
                if text:
                    out.append(text if host in text else f"{host}: {text}")
    return out


def main(argv: list[str]) -> int:
    LOG.parent.mkdir(parents=True, exist_ok=True)
    if argv == ["--begin"]:
        LOG.write_text("")
        CLOCK.write_text(str(time.time()))
        print(f"make lab: each step's whole output is in {LOG}")
        return 0
    expect = 0
    if argv[:1] == ["--expect"]:
        expect, argv = int(argv[1]), argv[2:]
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    title, command = argv[0], argv[2:]
    print(f"{elapsed()} {title} ...", flush=True)
    start = time.monotonic()
    with LOG.open("a") as log:
        log.write(f"\n===== {title}\n===== $ {' '.join(command)}\n")
        log.flush()
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1"), check=False)
        log.write(proc.stdout)
        log.write(f"===== exit {proc.returncode}\n")
    lines = ANSI.sub("", proc.stdout).splitlines()
    seconds = round(time.monotonic() - start)
    if proc.returncode != expect:
        print(f"        FAILED: exit {proc.returncode}, expected {expect} ({seconds} s); its last lines:")
        print("\n".join(f"        | {line}" for line in lines[-40:]))
        print(f"        the whole output: {LOG}")
        return 1
    said = summary(lines) or messages(lines)
    print(f"        ok{f' (exit {expect}, as expected)' if expect else ''} ({seconds} s)")
    if said:
        print("\n".join(f"        {line}" for line in said))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
