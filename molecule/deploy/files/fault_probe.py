"""Read-only probe of the fault matrix (molecule/deploy/faults.yml): the TRUE state of
sglang-qwen.service on this lab host, as JSON on stdout.

What systemd runs (is-active, MainPID, the loaded ExecStart), the installed unit
(its checksum, its ExecStart and which variant of the default table those flags
are), the running server's own command line, the role's state files (current.json,
the last line of history.jsonl, switch.json, lock files, attempts/, known-good/)
and the simulated GPU ledger. Changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys

SERVICE = sys.argv[1] if len(sys.argv) > 1 else "sglang-qwen.service"
BASE = SERVICE.removesuffix(".service")
UNIT = f"/etc/systemd/system/{SERVICE}"
STATE = f"/var/lib/inferops-sglang/{BASE}"
LEDGER = "/run/inferops-lab/gpu"


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def load(path: str):
    text = read(path)
    try:
        return json.loads(text) if text is not None else None
    except ValueError:
        return {"unparsable": text[-300:]}


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None


def variant_of(args: list[str]) -> str | None:
    """The variant of the role's default table these server flags are (None: no server)."""
    algorithm = flag(args, "--speculative-algorithm")
    if algorithm is None:
        return None if not args else "no-speculative-algorithm"
    if algorithm == "NEXTN":
        return "nextn"
    if algorithm != "DDTREE":
        return algorithm.lower()
    if flag(args, "--context-length") == "131072":
        return "shadow"
    if flag(args, "--mem-fraction-static") == "0.85":
        return "shadow-balanced"
    return "shadow-nograph" if "--disable-cuda-graph" in args else "shadow-small"


def server_args(argv: list[str]) -> list[str]:
    """The flags after ``-m sglang.launch_server`` (or the launcher script)."""
    for i, arg in enumerate(argv):
        if arg in ("sglang.launch_server", "sglang.launch_server.py") or arg.endswith("launch_server.py"):
            return argv[i + 1:]
    return argv[1:]


def exec_start(text: str | None) -> list[str]:
    if not text:
        return []
    lines = text.replace("\\\n", " ").splitlines()
    for line in lines:
        if line.startswith("ExecStart="):
            return shlex.split(line.split("=", 1)[1].lstrip("-@+!:"))
    return []


def main() -> None:
    shown = run("systemctl", "show", SERVICE, "-p", "ActiveState", "-p", "SubState", "-p", "MainPID",
                "-p", "LoadState", "-p", "NRestarts", "-p", "Result")
    show = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    unit_text = read(UNIT)
    unit_argv = exec_start(unit_text)
    pid = int(show.get("MainPID", "0") or 0)
    proc_argv: list[str] = []
    if pid:
        raw = read(f"/proc/{pid}/cmdline") or ""
        proc_argv = [a for a in raw.split("\0") if a]
    history = (read(f"{STATE}/history.jsonl") or "").splitlines()
    tail = []
    for line in history[-3:]:
        try:
            tail.append(json.loads(line))
        except ValueError:
            tail.append({"unparsable": line[-300:]})
    last = tail[-1] if tail else None
    try:
        top = sorted(os.listdir(STATE))
    except OSError:
        top = []
    current = load(f"{STATE}/current.json")
    print(json.dumps({
        "active": run("systemctl", "is-active", SERVICE),
        "active_state": show.get("ActiveState"),
        "sub_state": show.get("SubState"),
        "result": show.get("Result"),
        "load_state": show.get("LoadState"),
        "main_pid": pid,
        "n_restarts": show.get("NRestarts"),
        "unit_exists": unit_text is not None,
        "unit_sha256": hashlib.sha256(unit_text.encode()).hexdigest() if unit_text is not None else None,
        "unit_algorithm": flag(server_args(unit_argv), "--speculative-algorithm"),
        "unit_variant": variant_of(server_args(unit_argv)),
        "unit_args": server_args(unit_argv),
        "proc_variant": variant_of(server_args(proc_argv)),
        "proc_algorithm": flag(server_args(proc_argv), "--speculative-algorithm"),
        "current": current,
        "current_variant": current.get("variant") if isinstance(current, dict) else None,
        "history_lines": len(history),
        "last": last,
        "records_tail": tail,
        "state_files": top,
        "switch_json": load(f"{STATE}/switch.json"),
        "locks": [name for name in top if name.endswith(".lock")],
        "attempts": sorted(os.listdir(f"{STATE}/attempts")) if os.path.isdir(f"{STATE}/attempts") else [],
        "known_good": sorted(os.listdir(f"{STATE}/known-good")) if os.path.isdir(f"{STATE}/known-good") else [],
        "ledger": sorted(os.listdir(LEDGER)) if os.path.isdir(LEDGER) else None,
    }))


if __name__ == "__main__":
    main()
