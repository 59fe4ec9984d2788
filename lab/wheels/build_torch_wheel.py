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
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simulator"))
from build_wheel import write_wheel  # noqa: E402 - the lab's wheel writer, a sibling tool

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
    return write_wheel(out, "torch", version, _files(version, cuda), summary=SUMMARY,
                       requires_python=">=3.8", top_level=["torch"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="2.11.0+cu130", help="torch version with its CUDA build label")
    parser.add_argument("--cuda", help="torch.version.cuda when it should differ from the label's (a broken build)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(build(args.version, args.out, args.cuda))


if __name__ == "__main__":
    main()
