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
EPOCH = (2026, 1, 1, 0, 0, 0)  # fixed timestamps: same sources, same wheel


def _files(version: str) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for root, prefix in ((HERE / "sglang_simulator", "sglang_simulator"), (HERE / "shim" / "sglang", "sglang")):
        for path in sorted(root.rglob("*.py")):
            files[f"{prefix}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    files["sglang/version.py"] = (
        f'"""Emulated SGLang version (written by build_wheel.py)."""\n\n__version__ = "{version}"\n'.encode()
    )
    return files


def build(emulated: str, out: Path) -> Path:
    version = f"{emulated}+simulator"
    dist_info = f"sglang-{version}.dist-info"
    files = _files(version)
    files[f"{dist_info}/METADATA"] = (
        "Metadata-Version: 2.1\n"
        "Name: sglang\n"
        f"Version: {version}\n"
        "Summary: SGLang simulator: a test double of the SGLang server for the inferops.sglang lab (not SGLang)\n"
        "Requires-Python: >=3.9\n"
    ).encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: inferops-lab build_wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ).encode()
    files[f"{dist_info}/entry_points.txt"] = b"[console_scripts]\nsglang = sglang.cli:main\n"
    files[f"{dist_info}/top_level.txt"] = b"sglang\nsglang_simulator\n"
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--version", default="0.5.11", help="SGLang release to emulate")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(build(args.version, args.out))


if __name__ == "__main__":
    main()
