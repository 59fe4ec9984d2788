"""lab/real/build.sh's parts are what they claim (that the venvs hold exactly the
role's constraints files is tests/conformance/test_runtime_install.py): the 0.5.11
file pins kernels below 0.13, the driver stand-in exports every driver call the real kernels
need and says "no device", and the tiny model is deterministic."""

from __future__ import annotations

import ctypes
import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from real_sglang import RELEASES, REPO, python, venv


def _lock(release: str) -> dict[str, str]:
    pins = {}
    for line in (REPO / f"roles/sglang_runtime/files/constraints/sglang-{release}-cu130.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_0_5_11_lock_pins_kernels_below_0_13():
    # sglang 0.5.11 leaves kernels unpinned; transformers 5.6.0 needs kernels<0.13, and
    # kernels 0.17 makes `import sglang` fail ("Either a revision or a version must be specified.")
    version = tuple(int(p) for p in _lock("0.5.11")["kernels"].split("."))
    assert (0, 12) <= version < (0, 13)
    assert _lock("0.5.11")["transformers"] == "5.6.0"


def _nm(path: Path, *flags: str) -> set[str]:
    out = subprocess.run(["nm", "-D", *flags, str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()}


@pytest.mark.parametrize("release", RELEASES)
def test_driver_stand_in_exports_every_driver_call_the_kernels_need(real, release):
    kernels = sorted((venv(real, release) / "lib/python3.11/site-packages/sgl_kernel").rglob("*.so"))
    assert kernels, "no sgl_kernel shared objects in the venv"
    needed = set()
    for so in kernels:
        needed |= {s for s in _nm(so, "--undefined-only") if re.match(r"cu[A-Z]", s)}
    exported = _nm(Path(real["INFEROPS_REAL_LIBCUDA_DIR"]) / "libcuda.so.1", "--defined-only")
    assert needed and not needed - exported, f"the stand-in lacks {sorted(needed - exported)}"


def test_driver_stand_in_says_no_device(real):
    lib = ctypes.CDLL(str(Path(real["INFEROPS_REAL_LIBCUDA_DIR"]) / "libcuda.so.1"))
    assert lib.cuInit(0) == 100  # CUDA_ERROR_NO_DEVICE
    count = ctypes.c_int(-1)
    assert lib.cuDeviceGetCount(ctypes.byref(count)) == 100
    text = ctypes.c_char_p()
    assert lib.cuGetErrorString(100, ctypes.byref(text)) == 0
    assert b"test double" in text.value


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir()) if p.is_file() and not p.name.startswith(".")}


def test_tiny_model_is_deterministic(real, tmp_path):
    subprocess.run([python(real, "0.5.11"), str(REPO / "lab/real/tiny_model.py"), str(tmp_path / "model")],
                   check=True, capture_output=True)
    assert _digest(tmp_path / "model") == _digest(Path(real["INFEROPS_REAL_MODEL"]))
