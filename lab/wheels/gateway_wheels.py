"""The real gateway's wheels for the lab's offline installs: smg at the collection's pin
(``_gateway.PINNED``) and every dependency at its pin in the sglang_runtime role's lock
(``roles/sglang_runtime/files/constraints/smg-<version>.txt``), built for the lab hosts'
interpreter (CPython 3.11, x86_64, glibc: Debian bookworm's /usr/bin/python3).

They are downloaded from the package index once (``pip download --only-binary=:all:``, with
this Python's pip and its configuration) into the per-user cache, in a directory keyed by
the lock and this recipe, as .ci/venv.sh keys its venvs: a fresh clone on a machine that
fetched them once reuses them, and a changed lock fetches its own. A download that brings a
distribution the lock does not pin, or misses one it pins, fails. Prints the directory.

    python3 lab/wheels/gateway_wheels.py               # the wheels' directory
    python3 lab/wheels/gateway_wheels.py --into DIR    # and the same wheels in DIR (a wheelhouse)

Used by molecule/provision/prepare.yml (into its wheelhouse) and lab/playbooks/prepare.yml
(the lab hosts' gateway venv, through the role's gateway tasks).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GATEWAY = REPO / "plugins" / "module_utils" / "_gateway.py"
LOCKS = REPO / "roles" / "sglang_runtime" / "files" / "constraints"
# The lab hosts' interpreter: CPython 3.11 on x86_64 with glibc 2.36. manylinux2014
# (glibc 2.17; pip adds manylinux2010 and manylinux1 to it) is what the lock's wheels
# are built for (smg 1.13.0: cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64).
TARGET = ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
          "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
# Part of the key: a change to how the wheels are fetched fetches them again.
RECIPE = "1"


def pinned() -> str:
    """_gateway.PINNED, read from the file as the Makefile reads it."""
    match = re.search(r'^PINNED = "(.*)"$', GATEWAY.read_text(), re.M)
    if not match:
        raise SystemExit(f"gateway_wheels: no PINNED = \"...\" line in {GATEWAY}")
    return match.group(1)


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(lock: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a lock."""
    pins = {}
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)", line)
        if not match:
            raise SystemExit(f"gateway_wheels: {lock}: not a pin: {line!r}")
        pins[normalize(match.group(1))] = match.group(2)
    return pins


def wheel_of(filename: str) -> tuple[str, str]:
    """(normalized name, version) of a wheel's file name."""
    name, version = filename.split("-")[:2]
    return normalize(name), version


def check(wheels: list[str], pins: dict[str, str], lock: Path) -> None:
    """Fail unless the wheels are exactly the lock's pins, one wheel each."""
    got = dict(wheel_of(w) for w in wheels)
    problems = [f"{n} {v} (the lock pins {pins.get(n, 'nothing of it')})" for n, v in sorted(got.items())
                if pins.get(n) != v]
    problems += [f"no wheel of {n}=={v}" for n, v in sorted(pins.items()) if n not in got]
    if problems or len(got) != len(wheels):
        raise SystemExit(f"gateway_wheels: the download does not match the lock {lock}: " + "; ".join(problems)
                         + f" (wheels: {', '.join(sorted(wheels))})")


def cache_root() -> Path:
    """The per-user cache of .ci/venv.sh and lab/real/build.sh."""
    if os.environ.get("INFEROPS_CACHE_DIR"):
        return Path(os.environ["INFEROPS_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "inferops-sglang"


def key(lock: Path, version: str) -> str:
    data = "\n".join([version, *TARGET, f"recipe {RECIPE}", ""]).encode() + lock.read_bytes()
    return hashlib.sha256(data).hexdigest()[:12]


def download(version: str, lock: Path, root: Path) -> Path:
    """The cached directory of the wheels of smg==version with the lock, fetched when missing."""
    pins = locked(lock)
    if pins.get("smg") != version:
        raise SystemExit(f"gateway_wheels: the lock {lock} pins smg {pins.get('smg', '(none)')}, not {version}")
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"gateway-wheels-{key(lock, version)}"
    with open(root / "gateway-wheels.lock", "w", encoding="utf-8") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        # The directory appears whole (a rename) once its wheels are checked: only the wheels are in it
        if not out.is_dir():
            work = Path(tempfile.mkdtemp(prefix=".gateway-wheels-", dir=root))
            try:
                run = subprocess.run(
                    [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "-q",
                     *TARGET, "-c", str(lock), f"smg=={version}", "-d", str(work)],
                    capture_output=True, text=True, check=False)
                if run.returncode != 0:
                    sys.stderr.write(run.stdout + run.stderr)
                    raise SystemExit(f"gateway_wheels: pip download of smg=={version} failed ({run.returncode})")
                check([p.name for p in work.glob("*.whl")], pins, lock)
                work.chmod(0o755)
                work.rename(out)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        # Keys no longer asked for go, as .ci/venv.sh's do, and what a killed download left
        for old in [*root.glob("gateway-wheels-*"), *root.glob(".gateway-wheels-*")]:
            if old != out and old.is_dir() and re.fullmatch(r"\.?gateway-wheels-[0-9a-z_]+", old.name):
                shutil.rmtree(old, ignore_errors=True)
    return out


def place(wheels: Path, into: Path, lock: Path) -> None:
    """The wheels in ``into`` too (hard links, or copies across file systems); wheels there of
    the lock's distributions at other versions go (another lock's), the rest stays."""
    into.mkdir(parents=True, exist_ok=True)
    names = {p.name for p in wheels.glob("*.whl")}
    pins = locked(lock)
    for stale in into.glob("*.whl"):
        if stale.name not in names and wheel_of(stale.name)[0] in pins:
            stale.unlink()
    for name in sorted(names):
        target = into / name
        if target.is_file() and target.stat().st_size == (wheels / name).stat().st_size:
            continue
        part = into / f".{name}.part"
        part.unlink(missing_ok=True)
        try:
            os.link(wheels / name, part)
        except OSError:
            shutil.copyfile(wheels / name, part)
        part.chmod(0o644)
        part.replace(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", help="smg's version (default _gateway.PINNED)")
    parser.add_argument("--lock", type=Path, help="the lock (default the role's smg-<version>.txt)")
    parser.add_argument("--into", type=Path, help="a wheelhouse to put the wheels in as well")
    args = parser.parse_args()
    version = args.version or pinned()
    lock = (args.lock or LOCKS / f"smg-{version}.txt").resolve()
    if not lock.is_file():
        raise SystemExit(f"gateway_wheels: no lock {lock}")
    wheels = download(version, lock, cache_root())
    if args.into:
        place(wheels, args.into, lock)
    print(wheels)


if __name__ == "__main__":
    main()
