"""The runtime probe's dependency check on the real SGLang venvs (0.5.11, the
pinned release, and 0.5.23) from lab/real/build.sh's cache: every shared object
of SGLang, its kernel packages, flashinfer and torch read from their files and
resolved with the unit's environment, as on a host without the NVIDIA driver
(this machine) and with the driver stand-in (libcuda.so.1, a test double) on
the unit's LD_LIBRARY_PATH.

What the real wheels hold (their RECORD files, counted here): 0.5.11 has 1
shared object in sglang (srt/grpc/_core), 13 in sglang-kernel 0.4.2 (sgl_kernel,
deep_gemm, mscclpp) and 13 in torch 2.11.0; 0.5.23 has 5 in sglang, 6 in
sglang-kernel 0.4.10, 1 in sgl-deep-gemm, 2 in sgl-flash-mla, 1 in sgl-deep-ep
and 13 in torch. flashinfer ships no shared object (it compiles its kernels
just in time). The only library that does not resolve without a driver is the
driver's own, libcuda.so.1, needed by sgl_kernel's common_ops (both
architectures), flash_ops, ... and torch's libcaffe2_nvrtc.so."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
from real_sglang import RELEASES, python, venv

from ansible_collections.inferops.sglang.plugins.module_utils import _runtime_probe as probe
from ansible_collections.inferops.sglang.plugins.modules import sglang_runtime_probe

# Shared objects per scanned distribution, as their RECORD lists them.
EXPECTED = {
    "0.5.11": {"sglang": 1, "sglang-kernel": 13, "torch": 13},
    "0.5.23": {"sglang": 5, "sglang-kernel": 6, "sgl-deep-gemm": 1, "sgl-flash-mla": 2, "sgl-deep-ep": 1, "torch": 13},
}
# Files that need the driver's libcuda.so.1 (relative to site-packages).
NEEDS_DRIVER = {
    "0.5.11": {"sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so", "sgl_kernel/flash_ops.abi3.so",
               "sgl_kernel/flashmla_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so", "deep_gemm/deep_gemm_cpp.abi3.so",
               "torch/lib/libcaffe2_nvrtc.so", "_mscclpp.cpython-310-x86_64-linux-gnu.so", "lib/mscclpp.so",
               "lib/mscclpp.so.0", "lib/mscclpp.so.0.6.0", "lib/mscclpp_nccl.so", "lib/mscclpp_nccl.so.0",
               "lib/mscclpp_nccl.so.0.6.0"},
    "0.5.23": {"sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so", "sgl_kernel/flash_ops.abi3.so",
               "sgl_kernel/flashmla_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so",
               "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so", "torch/lib/libcaffe2_nvrtc.so",
               "deep_ep/_C.cpython-311-x86_64-linux-gnu.so", "flash_mla/_C_legacy.abi3.so", "flash_mla/cuda.abi3.so"},
}


def site(real, release: str) -> Path:
    [found] = (venv(real, release) / "lib").glob("python3*/site-packages")
    return found


def run(capsys, real, release: str, **overrides) -> dict:
    args = dict(python=python(real, release), cuda_version="13.0", cuda_home="/nonexistent/cuda-13.0",
                checks=["dependencies"], ddtree_manifest="/nonexistent/manifest.json", fail_on_error=False)
    args.update(overrides)
    from sim_helpers import run_module  # noqa: E402 - the unit tests' module runner

    rc, result = run_module(sglang_runtime_probe.main, capsys, args)[:2]
    assert rc == 0, result
    return result


@pytest.fixture(autouse=True)
def _unit_helpers():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    yield
    sys.path.remove(str(Path(__file__).resolve().parents[1] / "unit"))


@pytest.mark.parametrize("release", RELEASES)
def test_without_a_driver_only_the_drivers_library_does_not_resolve(real, release, capsys):
    started = time.monotonic()
    result = run(capsys, real, release)
    elapsed = time.monotonic() - started
    deps = result["dependencies"]
    found = {name: count for name, count in deps["distributions"].items() if count}
    assert found == EXPECTED[release]
    assert deps["scanned"] == sum(EXPECTED[release].values()) and deps["errors"] == []
    assert deps["ld_cache_error"] is None
    root = str(site(real, release)) + "/"
    assert Counter(u["name"] for u in deps["unresolved"]) == {"libcuda.so.1": len(NEEDS_DRIVER[release])}
    assert {u["needed_by"].replace(root, "") for u in deps["unresolved"]} == NEEDS_DRIVER[release]
    [error] = result["errors"]
    assert error.startswith("libcuda.so.1 needed by ") and error.endswith(
        "does not resolve (LD_LIBRARY_PATH=/nonexistent/cuda-13.0/lib64, RUNPATH=none): it is a library of the "
        "NVIDIA driver's user space, which is not installed where the loader looks")
    assert deps["seconds"] < 10 and elapsed < 60  # measured: 0.4-0.7 s of scan, under 1 s in all
    # A host prepared before its driver: reported, not failed.
    assert run(capsys, real, release, require_driver=False)["errors"] == []


@pytest.mark.parametrize("release", RELEASES)
def test_with_the_driver_stand_in_on_the_units_path_everything_resolves(real, release, capsys):
    libcuda = real["INFEROPS_REAL_LIBCUDA_DIR"]
    result = run(capsys, real, release, library_path=[libcuda])
    assert result["dependencies"]["unresolved"] == [] and result["errors"] == []
    assert result["environment"]["LD_LIBRARY_PATH"] == f"/nonexistent/cuda-13.0/lib64:{libcuda}"


def test_the_whole_venv_is_600_shared_objects_and_the_scan_stays_within_the_serving_stack(real):
    """Measured on the 0.5.11 venv: 600 shared objects in all. Outside the scanned distributions some
    need what a CUDA 13 host does not have (torch_memory_saver's builds need libcudart.so.12, torchcodec's
    per-FFmpeg builds need libavcodec.so.58 ... 62): those variants are chosen at run time and never loaded
    together, which is why the probe reads SGLang, its kernel packages, flashinfer and torch, not every file."""
    root = site(real, "0.5.11")
    files = [os.path.join(d, f) for d, _dirs, names in os.walk(root) for f in names if f.endswith(".so") or ".so." in f]
    assert len(files) == 600
    started = time.monotonic()
    resolver = probe.elf.Resolver(real["INFEROPS_REAL_LIBCUDA_DIR"], "/etc/ld.so.cache")
    objects, unresolved = probe.elf.scan([str(root)], resolver)
    assert time.monotonic() - started < 30  # measured: about 1 s
    needs = Counter(u["name"] for u in unresolved)
    assert needs["libcudart.so.12"] == 4 and "libcuda.so.1" not in needs
    cu12 = {os.path.basename(u["needed_by"]) for u in unresolved if u["name"] == "libcudart.so.12"}
    # torch_memory_saver 0.0.10 (SGLang's --enable-memory-saver): its unsuffixed builds need the CUDA 12
    # runtime too, so that option would fail on a CUDA 13 host; the _cu13 builds resolve.
    assert cu12 == {"torch_memory_saver_hook_mode_preload_cu12.abi3.so", "torch_memory_saver_hook_mode_torch_cu12.abi3.so",
                    "torch_memory_saver_hook_mode_preload.abi3.so", "torch_memory_saver_hook_mode_torch.abi3.so"}
