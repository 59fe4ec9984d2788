"""sglang_runtime_probe, for real: real virtual environments (python -m venv)
filled by the real pip from a wheelhouse the tests build (the lab's torch
stand-in wheel and SGLang simulator wheel, both test doubles), and real shared
objects compiled with gcc (stand-ins for the toolkit's CUDA runtime) that
ctypes.CDLL really loads. The DDTree build is the lab's, laid by the real
ddtree_build module: its gcc-built ddtree_kernels.so needs libcudart.so.12
(DT_NEEDED), which the probe finds unresolved from the file itself."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ddtree_helpers import ddtree_overlay, overlay_inputs
from sim_helpers import LAB, patch_module_args, run_module

from ansible_collections.inferops.sglang.plugins.modules import ddtree_build, sglang_runtime_probe

sys.path.insert(0, str(LAB / "wheels"))
from build_torch_wheel import build as build_torch  # noqa: E402 - lab tool, not an installed module

CUDART_SOURCE = """
/* Stand-in for the CUDA runtime (a test double): one real entry point. */
int cudaRuntimeGetVersion(int *version) { *version = %d; return 0; }
"""
REAL_TOOLKIT = Path("/usr/local/cuda-13.0")


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    sys.path.insert(0, str(LAB / "simulator"))
    from build_wheel import build as build_sglang  # noqa: E402 - lab tool, not an installed module

    out = tmp_path_factory.mktemp("wheelhouse")
    for version in ("2.11.0+cu130", "2.11.0+cu128"):
        build_torch(version, out)
    build_sglang("0.5.11", out)
    return out


@pytest.fixture(scope="session")
def make_venv(wheelhouse, tmp_path_factory):
    """make_venv(torch=, ddtree=) -> the venv's python; the venv is real, pip installs
    into it from the wheelhouse only (--no-index), as the role's wheelhouse mode does."""
    cache: dict[tuple[str, bool], Path] = {}

    def make(torch: str = "2.11.0+cu130", ddtree: bool = False) -> Path:
        key = (torch, ddtree)
        if key not in cache:
            root = tmp_path_factory.mktemp("venv")
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
            python = root / "bin" / "python"
            subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
                            "--disable-pip-version-check", "--find-links", str(wheelhouse),
                            f"torch=={torch}", "sglang==0.5.11"], check=True)
            if ddtree:
                # The lab's build, laid as the lab lays it: the ddtree_build module, overlay source.
                files = [{"path": item["name"], "src": item["src"], "sha256": item["sha256"]}
                         for item in overlay_inputs(ddtree_overlay())]
                args = dict(venv=str(root), source="overlay", sglang_version="0.5.11+simulator", files=files,
                            manifest=str(root / "ddtree-manifest.json"), built_by="test")
                assert _run_quiet(ddtree_build.main, args) == 0
            cache[key] = python
        return cache[key]

    return make


def _run_quiet(main, args: dict) -> int:
    """A module's main() outside a test's capsys (the session fixture lays the build with it)."""
    with patch_module_args(args), contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main()
        except SystemExit as exc:
            assert exc.code == 0, out.getvalue()
            return exc.code
    return 0


def manifest_of(python: Path) -> str:
    return str(python.parent.parent / "ddtree-manifest.json")


def kernels_of(python: Path) -> str:
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    return os.path.join(os.path.realpath(site), "sglang/srt/speculative/ddtree_kernels.so")


@pytest.fixture(scope="session")
def cudart(tmp_path_factory):
    """cudart(soname, version=13000, garbage=False) -> a directory holding a real
    shared object with that soname, compiled with gcc."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to compile the CUDA runtime stand-in")
    cache: dict[tuple, Path] = {}

    def make(soname: str = "libcudart.so.13", version: int = 13000, garbage: bool = False) -> Path:
        key = (soname, version, garbage)
        if key not in cache:
            lib = tmp_path_factory.mktemp("lib")
            if garbage:
                (lib / soname).write_bytes(b"not a shared object\n")
            else:
                src = lib / "cudart.c"
                src.write_text(CUDART_SOURCE % version)
                subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(lib / soname), str(src)],
                               check=True)
            cache[key] = lib
        return cache[key]

    return make


def run(capsys, python: Path, check_mode: bool = False, **overrides) -> tuple[int, dict]:
    args = dict(python=str(python), cuda_version="13.0", torch_version="2.11.0+cu130", sglang_version="0.5.11",
                cuda_home="/nonexistent/cuda-13.0", ddtree_manifest=manifest_of(python))
    args.update(overrides)
    return run_module(sglang_runtime_probe.main, capsys, args, check_mode)[:2]


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_a_good_runtime_passes_in_the_venvs_own_interpreter(make_venv, cudart, capsys):
    python = make_venv()
    lib = cudart()
    rc, result = run(capsys, python, library_path=[str(lib)])
    assert rc == 0, result
    assert result["ok"] is True and result["errors"] == [] and result["changed"] is False
    # The checks ran in the venv's interpreter, not in the module's.
    assert result["python"]["prefix"] == str(python.parent.parent)
    assert result["python"]["prefix"] != sys.prefix
    assert result["installed"] == {"torch": "2.11.0+cu130", "sglang": "0.5.11+simulator", "sgl-kernel": None,
                                   "sglang-kernel": None}
    assert result["needs_install"] == []
    assert result["torch"] == {"version": "2.11.0+cu130", "cuda": "13.0", "error": None}
    assert result["ddtree_build"] is None and result["dependencies"]["build_files"] == []
    assert result["dependencies"]["distributions"] == {"sglang": 0, "torch": 0}  # the stand-ins ship no .so
    assert result["dependencies"]["unresolved"] == []
    # Every variable the probe ran with, and no other: what the unit must be given.
    assert result["environment"] == {
        "PATH": f"{python.parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1", "LD_LIBRARY_PATH": f"/nonexistent/cuda-13.0/lib64:{lib}"}
    [libcudart] = result["libraries"]
    assert libcudart["name"] == "libcudart.so.13" and libcudart["loaded"] is True
    assert libcudart["path"] == str(lib / "libcudart.so.13")  # the stand-in, found through the unit's path
    assert libcudart["runtime_version"] == 13000
    assert result["ld_library_path"] == f"/nonexistent/cuda-13.0/lib64:{lib}"


def test_torch_built_for_cu128_fails_naming_both(make_venv, cudart, capsys):
    rc, result = run(capsys, make_venv(torch="2.11.0+cu128"), library_path=[str(cudart())])
    assert rc == 1
    assert ("torch 2.11.0+cu128 is built for CUDA 12.8 (torch.version.cuda) but the toolkit is CUDA 13.0: "
            "install the cu130 build") in result["errors"]
    assert f"torch 2.11.0+cu128 is installed in {make_venv(torch='2.11.0+cu128').parent.parent}, the pin is 2.11.0+cu130" \
        in result["errors"]
    assert result["needs_install"] == ["torch==2.11.0+cu130"]
    assert result["msg"].startswith("the SGLang runtime in ")


def test_pins_that_disagree_fail_before_anything_runs(tmp_path, capsys):
    # The venv does not even exist: the pins alone are wrong.
    rc, result = run(capsys, tmp_path / "nothing/bin/python", torch_version="2.11.0+cu128", fail_on_error=False)
    assert rc == 1
    assert result["errors"] == ["the torch pin 2.11.0+cu128 is built for CUDA 12.8 but the toolkit is CUDA 13.0: "
                                "pin 2.11.0+cu130 (or change the toolkit)"]


def test_the_ddtree_builds_missing_library_fails_naming_the_file_that_needs_it(make_venv, cudart, capsys, monkeypatch):
    python = make_venv(ddtree=True)
    # The module's own environment may find a libcudart.so.12; the unit's (and the probe's) does not.
    monkeypatch.setenv("LD_LIBRARY_PATH", str(cudart("libcudart.so.12", 12080)))
    rc, result = run(capsys, python, library_path=[str(cudart())])
    assert rc == 1
    kernels = kernels_of(python)
    assert result["dependencies"]["build_files"] == [kernels]
    assert result["ddtree_build"]["state"] == "applied"
    assert result["dependencies"]["unresolved"] == [
        {"name": "libcudart.so.12", "needed_by": kernels, "runpath": None, "rpath": None, "build": "ddtree"}]
    assert result["errors"] == [
        f"libcudart.so.12 needed by {kernels} (the DDTree build) does not resolve "
        f"(LD_LIBRARY_PATH=/nonexistent/cuda-13.0/lib64:{cudart()}, RUNPATH=none)"]
    # Nothing is declared any more: the only library loaded by name is the kernel package's preload.
    assert [(lib["name"], lib["loaded"]) for lib in result["libraries"]] == [("libcudart.so.13", True)]


def test_the_ddtree_build_passes_where_its_library_is_on_the_units_path(make_venv, cudart, capsys):
    # The same check passes when a CUDA 12 runtime is really there (ct200's story):
    # it is the loader's search that decides, not the name.
    cuda12 = cudart("libcudart.so.12", 12080)
    rc, result = run(capsys, make_venv(ddtree=True), library_path=[str(cudart()), str(cuda12)])
    assert rc == 0, result
    assert result["dependencies"]["unresolved"] == []
    assert result["environment"]["LD_LIBRARY_PATH"].endswith(f":{cuda12}")


def test_a_library_needed_by_the_build_is_not_searched_in_the_toolkit_unless_the_unit_has_it(make_venv, cudart, capsys):
    # The module's environment is not the unit's: a CUDA 12 runtime in the unit's extra environment resolves.
    cuda12 = cudart("libcudart.so.12", 12080)
    rc, result = run(capsys, make_venv(ddtree=True), library_path=[str(cudart())],
                     environment={"LD_LIBRARY_PATH": str(cuda12), "CUDA_HOME": "/nonexistent/cuda-13.0"})
    assert rc == 0, result
    assert result["environment"]["CUDA_HOME"] == "/nonexistent/cuda-13.0"
    assert result["environment"]["LD_LIBRARY_PATH"] == f"/nonexistent/cuda-13.0/lib64:{cudart()}:{cuda12}"


def test_a_library_that_exists_but_is_not_loadable_gives_the_loaders_reason(make_venv, cudart, capsys):
    lib = cudart("libcublas.so.13", garbage=True)
    rc, result = run(capsys, make_venv(), library_path=[str(cudart()), str(lib)], libraries=["libcudart.so.13", "libcublas.so.13"])
    assert rc == 1
    [error] = result["errors"]
    assert error.startswith("libcublas.so.13 (opened by SGLang's kernel package with ctypes) does not load with ctypes.CDLL: ")
    assert "invalid ELF header" in error or "file too short" in error


def test_a_cuda_runtime_of_the_wrong_major_fails(make_venv, cudart, capsys):
    lib = cudart("libcudart.so.13", 12080)
    rc, result = run(capsys, make_venv(), library_path=[str(lib)])
    assert rc == 1
    assert result["errors"] == [f"libcudart.so.13 loaded from {lib}/libcudart.so.13 is CUDA runtime 12.8 but its name promises CUDA 13"]


def test_an_sglang_version_other_than_the_pin_fails(make_venv, cudart, capsys):
    python = make_venv()
    rc, result = run(capsys, python, library_path=[str(cudart())], sglang_version="0.5.12")
    assert rc == 1
    assert result["errors"] == [f"sglang 0.5.11+simulator is installed in {python.parent.parent}, the pin is 0.5.12"]
    assert result["needs_install"] == ["sglang==0.5.12"]


def test_report_only_says_what_to_install_and_never_fails(make_venv, tmp_path, capsys):
    rc, result = run(capsys, tmp_path / "absent/bin/python", checks=["versions"], fail_on_error=False)
    assert rc == 0
    assert result["venv_exists"] is False and result["ok"] is False
    assert result["needs_install"] == ["torch==2.11.0+cu130", "sglang==0.5.11"]
    rc, result = run(capsys, make_venv(torch="2.11.0+cu128"), checks=["versions"], fail_on_error=False)
    assert rc == 0 and result["needs_install"] == ["torch==2.11.0+cu130"]
    assert "torch" not in result and "libraries" not in result  # nothing imported, nothing loaded


def test_check_mode_reports_the_same_and_changes_nothing(make_venv, cudart, capsys):
    python = make_venv(ddtree=True)
    before = tree_digest(python.parent.parent)
    rc, result = run(capsys, python, check_mode=True, library_path=[str(cudart())])
    assert rc == 1 and result["changed"] is False
    assert result["errors"] == [f"libcudart.so.12 needed by {kernels_of(python)} (the DDTree build) does not resolve "
                                f"(LD_LIBRARY_PATH=/nonexistent/cuda-13.0/lib64:{cudart()}, RUNPATH=none)"]
    rc, result = run(capsys, make_venv(), check_mode=True, library_path=[str(cudart())])
    assert rc == 0 and result["ok"] is True and result["changed"] is False
    assert tree_digest(python.parent.parent) == before


def test_a_missing_venv_fails_clearly(tmp_path, capsys):
    rc, result = run(capsys, tmp_path / "venv/bin/python")
    assert rc == 1
    assert result["msg"] == f"{tmp_path}/venv/bin/python does not exist: the SGLang virtual environment is not installed"


def test_a_broken_torch_import_is_reported(make_venv, cudart, capsys):
    python = make_venv()
    site = Path(subprocess.run([str(python), "-B", "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    original = (site / "version.py").read_text()
    try:
        (site / "version.py").write_text("raise ImportError('libtorch_cuda.so: cannot open shared object file')\n")
        rc, result = run(capsys, python, library_path=[str(cudart())])
    finally:
        (site / "version.py").write_text(original)
    assert rc == 1
    assert result["torch"]["error"] == "ImportError: libtorch_cuda.so: cannot open shared object file"
    assert f"import torch fails in {python.parent.parent}: ImportError: libtorch_cuda.so: cannot open shared object file" \
        in result["errors"]


@pytest.mark.skipif(not (REAL_TOOLKIT / "lib64" / "libcudart.so.13").exists(), reason="no CUDA 13.0 toolkit on this machine")
def test_the_real_cuda_13_runtime_loads_from_the_toolkit(make_venv, capsys):
    rc, result = run(capsys, make_venv(), cuda_home=str(REAL_TOOLKIT))
    assert rc == 0, result
    [libcudart] = result["libraries"]
    assert libcudart["path"] == str(REAL_TOOLKIT / "lib64" / "libcudart.so.13")
    assert libcudart["runtime_version"] // 1000 == 13
    assert os.path.realpath(libcudart["path"]).startswith(os.path.realpath(REAL_TOOLKIT))
