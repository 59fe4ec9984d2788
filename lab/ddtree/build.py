# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build the lab's DDTree overlay: the committed sources in overlay/ plus the
tree-verify kernels stand-in, src/ddtree_kernels.c compiled with gcc into
sglang/srt/speculative/ddtree_kernels.so, with a SHA256SUMS listing both.

The shared object needs libcudart.so.12 (ELF DT_NEEDED), as the real build's
kernels did: it is linked against a soname-only libcudart.so.12 made here for
linking only (``-Wl,--no-as-needed``; no CUDA symbol is used). The build is
reproducible (no debug info, no absolute paths, a content build-id) and keyed
by its inputs (this script, the C source, the overlay's files, gcc's version):
the same inputs reuse the same directory, so the lab and the tests lay the very
same bytes. overlay/SHA256SUMS (the committed sources) is checked first.

    python3 lab/ddtree/build.py         build (or reuse), print the overlay directory
    python3 lab/ddtree/build.py --host-libs DIR libcudart.so.12 ...
                                        soname-only stand-ins of host libraries
                                        (test doubles: a lab host whose CUDA user
                                        space has the CUDA 12 runtime, ct200)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SOURCE = HERE / "src" / "ddtree_kernels.c"
OVERLAY = HERE / "overlay"
KERNELS = "sglang/srt/speculative/ddtree_kernels.so"
CUDART = "libcudart.so.12"
CACHE = REPO / ".cache" / "ddtree-overlay"
CFLAGS = ["-shared", "-fPIC", "-O2", "-g0", "-ffile-prefix-map=.=.", "-Wl,--build-id=sha1",
          "-Wl,-soname,ddtree_kernels.so"]


class BuildError(Exception):
    pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def overlay_files() -> dict[str, bytes]:
    """The committed overlay sources (path inside site-packages -> bytes), checked against overlay/SHA256SUMS."""
    files = {}
    for path in sorted(OVERLAY.rglob("*")):
        if path.is_file() and path.name != "SHA256SUMS" and "__pycache__" not in path.parts:
            files[path.relative_to(OVERLAY).as_posix()] = path.read_bytes()
    listed = {}
    for line in (OVERLAY / "SHA256SUMS").read_text().splitlines():
        if line.strip():
            listed[line[66:]] = line[:64]
    actual = {name: sha256(data) for name, data in files.items()}
    if listed != actual:
        raise BuildError(f"{OVERLAY}/SHA256SUMS does not match the overlay's files: listed {listed}, found {actual}")
    return files


def gcc_version(gcc: str) -> str:
    try:
        out = subprocess.run([gcc, "-dumpfullversion", "-dumpmachine"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"{gcc} is needed to build the DDTree kernels stand-in: {exc}") from exc
    return out.stdout.strip()


def key(gcc: str = "gcc") -> str:
    """One hash of every input of the build."""
    digest = hashlib.sha256()
    for name, data in [("build.py", Path(__file__).read_bytes()), ("ddtree_kernels.c", SOURCE.read_bytes()),
                       ("gcc", gcc_version(gcc).encode()), ("cflags", " ".join(CFLAGS).encode())]:
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    for name, data in overlay_files().items():
        digest.update(f"overlay/{name}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


def soname_stub(directory: Path, soname: str, gcc: str = "gcc", link_name: str | None = None) -> Path:
    """A shared object with only a SONAME (a test double of a host library)."""
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / ".stub.c"
    source.write_text(f'const char inferops_lab_stand_in[] = "inferops.sglang lab stand-in for {soname}";\n')
    out = directory / (link_name or soname)
    subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-g0", f"-Wl,-soname,{soname}", "-o", str(out), str(source)],
                   check=True)
    source.unlink()
    return out


def build(cache: Path = CACHE, gcc: str = "gcc") -> Path:
    """The overlay directory (reused when its inputs are unchanged): sources, ddtree_kernels.so, SHA256SUMS."""
    files = overlay_files()
    dest = Path(cache) / key(gcc)[:16]
    if (dest / "SHA256SUMS").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=dest.parent))
    try:
        link = work / "link"
        soname_stub(link, CUDART, gcc, link_name="libcudart.so")
        shutil.copy(SOURCE, work / "ddtree_kernels.c")
        out = work / "overlay"
        for name, data in files.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(data)
        (out / KERNELS).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([gcc, *CFLAGS, "-o", str(out / KERNELS), "ddtree_kernels.c",
                        "-L", "link", "-Wl,--no-as-needed", "-lcudart"],
                       cwd=work, check=True)
        (out / KERNELS).chmod(0o644)
        names = sorted([*files, KERNELS])
        (out / "SHA256SUMS").write_text("".join(f"{sha256((out / n).read_bytes())}  {n}\n" for n in names))
        try:
            os.rename(out, dest)
        except OSError:
            if not (dest / "SHA256SUMS").is_file():  # another build won the race: use it
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--cache", type=Path, default=CACHE, help="where built overlays are kept (default %(default)s)")
    parser.add_argument("--gcc", default="gcc")
    parser.add_argument("--host-libs", type=Path, metavar="DIR", help="make soname-only stand-ins of host libraries")
    parser.add_argument("names", nargs="*", help="sonames for --host-libs (default libcudart.so.12)")
    args = parser.parse_args(argv)
    try:
        if args.host_libs:
            for name in args.names or [CUDART]:
                print(soname_stub(args.host_libs, name, args.gcc))
            return 0
        print(build(args.cache, args.gcc))
    except (BuildError, subprocess.CalledProcessError) as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
