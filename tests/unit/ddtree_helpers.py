"""The real SGLang package for the DDTree build tests: the 0.5.11 wheel from
PyPI (downloaded once into .cache/ddtree/), installed without its dependencies
into a throwaway virtual environment, and the test build in tests/fixtures/ddtree/."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sim_helpers import LAB, REPO

SGLANG_VERSION = "0.5.11"
FIXTURES = REPO / "tests" / "fixtures" / "ddtree"
WHEEL_CACHE = REPO / ".cache" / "ddtree"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
SERVER_ARGS = "sglang/srt/server_args.py"
DDTREE_UTILS = "sglang/srt/speculative/ddtree_utils.py"


@functools.lru_cache(maxsize=None)
def lab_ddtree():
    """lab/ddtree/build.py as a module (the lab's DDTree overlay builder)."""
    spec = importlib.util.spec_from_file_location("inferops_lab_ddtree_build", LAB / "ddtree" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def ddtree_overlay() -> Path:
    """The lab's built DDTree overlay: its sources, ddtree_kernels.so (gcc-built, DT_NEEDED
    libcudart.so.12) and SHA256SUMS, reused while its inputs are unchanged."""
    return lab_ddtree().build()


def wheel() -> Path:
    """The SGLang wheel, from the cache or PyPI; skips the test when PyPI cannot be reached."""
    pattern = f"sglang-{SGLANG_VERSION}-*.whl"
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    # the test workers (pytest -n) share the cache: one downloads, the others wait for it
    # rather than read a wheel pip is still writing
    with open(WHEEL_CACHE / ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(WHEEL_CACHE.glob(pattern))
        if not found:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                                   "-d", str(WHEEL_CACHE), f"sglang=={SGLANG_VERSION}"],
                                  capture_output=True, text=True, timeout=600, check=False)
            found = sorted(WHEEL_CACHE.glob(pattern))
            if proc.returncode != 0 or not found:
                pytest.skip(f"the SGLang {SGLANG_VERSION} wheel is not cached in {WHEEL_CACHE} and PyPI cannot be reached: "
                            f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    return found[0]


def make_venv(root: Path) -> Path:
    """A virtual environment with SGLang installed (no dependencies, as the issue says it installs here)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    purelib = site_packages(root)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                    "--no-deps", "--no-compile", "--target", str(purelib), str(wheel())], check=True)
    return root


def site_packages(venv: Path) -> Path:
    version = sysconfig.get_python_version()
    return venv / "lib" / f"python{version}" / "site-packages"


def copy_venv(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest, symlinks=True)
    return dest


def tree(site: Path) -> dict[str, str]:
    """Path -> SHA-256 of every file of the installed package (what a half-applied build would show)."""
    out = {}
    for root, dirs, files in os.walk(site / "sglang"):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = Path(root) / name
            out[str(path.relative_to(site))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sums(directory: Path) -> list[tuple[str, str]]:
    """The (sha256, name) lines of a SHA256SUMS file."""
    lines = (directory / "SHA256SUMS").read_text().splitlines()
    return [(line[:64], line[66:]) for line in lines if line.strip()]


def patch_inputs(directory: Path = FIXTURES / "patch") -> list[dict]:
    return [{"name": name, "src": str(directory / name), "sha256": sha} for sha, name in sums(directory)]


def overlay_dir(pristine_site: Path, dest: Path) -> Path:
    """The fixture overlay plus a patched spec_info.py made from the installed one (so no SGLang source is kept
    in the repository), with its SHA256SUMS."""
    shutil.copytree(FIXTURES / "overlay", dest)
    text = (pristine_site / SPEC_INFO).read_text()
    for old, new in (("    NONE = auto()\n", "    NONE = auto()\n    DDTREE = auto()\n"),
                     ("        return self == SpeculativeAlgorithm.DFLASH\n",
                      "        return self == SpeculativeAlgorithm.DFLASH\n\n    def is_ddtree(self) -> bool:\n"
                      "        return self == SpeculativeAlgorithm.DDTREE\n")):
        assert text.count(old) == 1
        text = text.replace(old, new)
    (dest / SPEC_INFO).write_text(text)
    lines = [f"{sha256(dest / name)}  {name}" for name in (DDTREE_UTILS, SPEC_INFO)]
    (dest / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return dest


def overlay_inputs(directory: Path) -> list[dict]:
    return [{"name": name, "src": str(directory / name), "sha256": sha} for sha, name in sums(directory)]


IMPORT_PROBE = (
    "import importlib.util, sys\n"
    "def load(name, path):\n"
    "    spec = importlib.util.spec_from_file_location(name, path)\n"
    "    module = importlib.util.module_from_spec(spec)\n"
    "    spec.loader.exec_module(module)\n"
    "    return module\n"
    "site = sys.argv[1]\n"
    "spec_info = load('spec_info', site + '/sglang/srt/speculative/spec_info.py')\n"
    "utils = load('ddtree_utils', site + '/sglang/srt/speculative/ddtree_utils.py')\n"
    "algo = spec_info.SpeculativeAlgorithm.from_string('ddtree')\n"
    "print(algo.name, algo.is_ddtree(), utils.CUDA_LIBRARIES)\n"
)


def import_in(venv: Path) -> str:
    """Import the patched modules with the venv's own Python. They are loaded from their files: importing the
    sglang package runs its __init__, which needs the dependencies the tests do not install."""
    site = site_packages(venv)
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", IMPORT_PROBE, str(site)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (links not followed): its kind and mode, a file's SHA-256, a link's target.
    Two equal snapshots mean nothing under ``root`` was created, removed, replaced, re-linked or chmod'ed."""
    out: dict[str, tuple] = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(base, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                detail = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                detail = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            else:
                detail = None
            out[os.path.relpath(path, root)] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), detail)
    return out
