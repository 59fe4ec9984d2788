"""Build the SGLang simulator wheel: distribution ``sglang``, version
``<emulated>+simulator`` (a PEP 440 local label, so ``sglang==0.5.11`` pins
match it and ``pip show sglang`` says what it is).

    python3 lab/simulator/build_wheel.py --version 0.5.11 --out DIR
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The collection's table of SGLang release facts, which the simulator's versions.py reads.
RELEASE_FACTS = HERE.parents[1] / "plugins" / "module_utils" / "_sglang_releases.py"
EPOCH = (2026, 1, 1, 0, 0, 0)  # fixed timestamps: same sources, same wheel


def _files(version: str) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for root, prefix in ((HERE / "sglang_simulator", "sglang_simulator"), (HERE / "shim" / "sglang", "sglang")):
        for path in sorted(root.rglob("*.py")):
            files[f"{prefix}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    files["sglang_simulator/_sglang_releases.py"] = RELEASE_FACTS.read_bytes()
    files["sglang/version.py"] = (
        f'"""Emulated SGLang version (written by build_wheel.py)."""\n\n__version__ = "{version}"\n'.encode()
    )
    return files


def write_wheel(out: Path, name: str, version: str, files: dict[str, bytes], summary: str,
                requires_python: str, top_level: list[str], entry_points: str = "") -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` into ``out``: ``files`` plus the
    dist-info (METADATA, WHEEL, RECORD with each file's hash), fixed timestamps.
    Shared with lab/wheels/build_torch_wheel.py."""
    dist_info = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\nRequires-Python: {requires_python}\n"
    ).encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: inferops-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ).encode()
    if entry_points:
        files[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    files[f"{dist_info}/top_level.txt"] = "".join(f"{t}\n" for t in top_level).encode()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return wheel


def build(emulated: str, out: Path) -> Path:
    version = f"{emulated}+simulator"
    return write_wheel(
        out, "sglang", version, _files(version),
        summary="SGLang simulator: a test double of the SGLang server for the inferops.sglang lab (not SGLang)",
        requires_python=">=3.9", top_level=["sglang", "sglang_simulator"],
        entry_points="[console_scripts]\nsglang = sglang.cli:main\n",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--version", default="0.5.11", help="SGLang release to emulate")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(build(args.version, args.out))


if __name__ == "__main__":
    main()
