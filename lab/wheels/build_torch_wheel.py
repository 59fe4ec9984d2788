"""Build the lab's torch stand-in wheel: a TEST DOUBLE of PyTorch's version
metadata, not PyTorch. Distribution ``torch``, version e.g. ``2.11.0+cu130``;
``import torch`` gives ``torch.__version__`` and ``torch.version.cuda`` (the
CUDA build named by the local label: cu130 -> "13.0", cu128 -> "12.8", cpu ->
None) and ``torch.TEST_DOUBLE = True``. Nothing else: no tensors, no CUDA.

It lets the runtime role and its probe be tested offline, from a wheelhouse,
with the real pip and a real virtual environment:

    python3 lab/wheels/build_torch_wheel.py --version 2.11.0+cu130 --out DIR
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import zipfile
from pathlib import Path

EPOCH = (2026, 1, 1, 0, 0, 0)  # fixed timestamps: same inputs, same wheel
SUMMARY = "torch stand-in: a test double of PyTorch version metadata for the inferops.sglang lab (not PyTorch)"


def cuda_of(version: str) -> str | None:
    """The CUDA version a local label names: 2.11.0+cu130 -> "13.0"; None for cpu or no label."""
    match = re.search(r"\+cu(\d+)(\d)$", version)
    return f"{int(match.group(1))}.{match.group(2)}" if match else None


def _files(version: str, cuda: str | None) -> dict[str, bytes]:
    init = (
        '"""torch stand-in (a test double of the inferops.sglang lab, not PyTorch):\n'
        'version metadata only."""\n\n'
        "from torch import version\n"
        "from torch.version import __version__\n\n"
        "TEST_DOUBLE = True\n\n"
        '__all__ = ["TEST_DOUBLE", "__version__", "version"]\n'
    )
    module = (
        '"""Version metadata of the torch stand-in (written by lab/wheels/build_torch_wheel.py)."""\n\n'
        f'__version__ = "{version}"\n'
        f"cuda = {cuda!r}\n"
        "hip = None\n"
        'git_version = "inferops-lab-test-double"\n'
    )
    return {"torch/__init__.py": init.encode(), "torch/version.py": module.encode()}


def build(version: str, out: Path, cuda: str | None = None) -> Path:
    """Write torch-<version>-py3-none-any.whl into ``out``; ``cuda`` defaults to the local
    label's (None, a CPU build, for +cpu)."""
    cuda = cuda if cuda is not None else cuda_of(version)
    dist_info = f"torch-{version}.dist-info"
    files = _files(version, cuda)
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\nSummary: {SUMMARY}\nRequires-Python: >=3.8\n"
    ).encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: inferops-lab build_torch_wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ).encode()
    files[f"{dist_info}/top_level.txt"] = b"torch\n"
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="2.11.0+cu130", help="torch version with its CUDA build label")
    parser.add_argument("--cuda", help="torch.version.cuda when it should differ from the label's (a broken build)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(build(args.version, args.out, args.cuda))


if __name__ == "__main__":
    main()
