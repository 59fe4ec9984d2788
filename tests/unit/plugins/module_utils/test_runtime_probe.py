"""The runtime probe's logic: pins against the toolkit, PEP 440 exact pins with
local labels, the default libraries per SGLang release, the unit's library path
and environment (exactly what the probe runs with), the DDTree build's shared
objects from its manifest, and the verdict on a probe report, unresolved ELF
dependencies included (the report itself comes from a real venv in
tests/unit/plugins/modules/test_sglang_runtime_probe.py; the ELF reader and the
resolver are tested in test_elf.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _runtime_probe as probe

CUDA13 = (13, 0)


@pytest.mark.parametrize("text, expected", [("13.0", (13, 0)), ("13.0.2", (13, 0)), ("CUDA 12.8", (12, 8)), (13.0, (13, 0))])
def test_cuda_major_minor(text, expected):
    assert probe.cuda_major_minor(text) == expected


def test_cuda_major_minor_rejects_a_bare_major():
    with pytest.raises(probe.ProbeError, match=r"cannot read a CUDA major.minor version from '13' \(expected e.g. 13.0\)"):
        probe.cuda_major_minor("13")


@pytest.mark.parametrize("installed, pin, ok", [
    ("2.11.0+cu130", "2.11.0+cu130", True),
    ("2.11.0+cu128", "2.11.0+cu130", False),
    ("2.11.0", "2.11.0+cu130", False),
    ("2.11.0+cu130", "2.11.0", True),          # a pin without a label accepts any build, as pip does
    ("0.5.11+simulator", "0.5.11", True),
    ("0.5.11+simulator", "0.5.11+simulator", True),
    ("0.5.10", "0.5.11", False),
    ("0.5.11", "0.5.11.0", True),              # PEP 440: trailing zeros are equal
    ("0.5.11rc1", "0.5.11", False),
    ("2.11.0+CU130", "2.11.0+cu130", True),
    (None, "0.5.11", False),
])
def test_version_matches_exact_pins(installed, pin, ok):
    assert probe.version_matches(installed, pin) is ok


def test_the_torch_pin_must_be_the_toolkits_cuda_build():
    assert probe.pin_errors("2.11.0+cu130", CUDA13) == []
    assert probe.pin_errors(None, CUDA13) == []
    assert probe.pin_errors("2.11.0+cu128", CUDA13) == [
        "the torch pin 2.11.0+cu128 is built for CUDA 12.8 but the toolkit is CUDA 13.0: pin 2.11.0+cu130 (or change the toolkit)"]
    assert probe.pin_errors("2.11.0+cpu", CUDA13) == [
        "the torch pin 2.11.0+cpu is not a CUDA build (cpu); the toolkit is CUDA 13.0: pin 2.11.0+cu130"]
    assert probe.pin_errors("2.11.0", CUDA13) == [
        "the torch pin 2.11.0 names no CUDA build; the toolkit is CUDA 13.0: pin 2.11.0+cu130"]
    assert probe.pin_errors("2.8.0+cu128", (12, 8)) == []


def test_default_libraries_follow_the_sglang_release_line_and_the_cuda_major():
    assert probe.default_libraries("0.5.11", CUDA13) == ["libcudart.so.13"]
    assert probe.default_libraries("0.5.11", (12, 8)) == ["libcudart.so.12"]
    assert probe.default_libraries(None, CUDA13) == ["libcudart.so.13"]
    assert probe.default_libraries("0.7.0", CUDA13) == ["libcudart.so.13"]  # newer than the table: the newest line


def test_the_library_path_is_the_toolkit_then_the_units():
    assert probe.library_path("/usr/local/cuda-13.0", ["/opt/extra"], {"LD_LIBRARY_PATH": "/opt/more:/opt/extra"}) == \
        "/usr/local/cuda-13.0/lib64:/opt/extra:/opt/more"


def test_the_probe_runs_with_only_the_units_environment():
    env = probe.environment("/opt/sglang/venv/bin/python", "/usr/local/cuda-13.0/lib64", {"CUDA_HOME": "/usr/local/cuda-13.0"})
    assert env == {"PATH": "/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "LANG": "C.UTF-8",
                   "PYTHONDONTWRITEBYTECODE": "1", "CUDA_HOME": "/usr/local/cuda-13.0",
                   "LD_LIBRARY_PATH": "/usr/local/cuda-13.0/lib64"}
    argv = probe.command("/opt/sglang/venv/bin/python", env, 60)
    assert argv[:5] == ["timeout", "--kill-after=10", "60", "env", "-i"]
    # Exactly the reported environment, no other variable.
    assert argv[5:argv.index("/opt/sglang/venv/bin/python")] == [f"{k}={v}" for k, v in sorted(env.items())]
    assert argv[-2:] == ["-c", probe.PROBE_SOURCE]


def test_the_probe_program_runs_on_a_plain_interpreter():
    # No venv, no torch: the program still reports, and says why torch is missing.
    data = probe.request(["versions", "torch", "libraries", "dependencies"], ["no-such-dist"],
                         ["libc.so.6", "libnothere.so.1"], scan_distributions=["no-such-dist"])
    out = subprocess.run([sys.executable, "-c", probe.PROBE_SOURCE], input=data, capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""}).stdout
    report = probe.parse_report(out)
    assert report["installed"] == {"no-such-dist": None}
    libc, missing = report["libraries"]
    assert libc["loaded"] is True and libc["path"] and "libc.so.6" in libc["path"]
    assert missing == {"name": "libnothere.so.1", "source": "configured", "loaded": False, "path": None,
                       "error": "libnothere.so.1: cannot open shared object file: No such file or directory",
                       "runtime_version": None}
    deps = report["dependencies"]
    assert deps["distributions"] == {} and deps["scanned"] == 0 and deps["unresolved"] == []


def test_the_probe_reads_the_build_files_of_a_held_or_applied_manifest(tmp_path):
    site = tmp_path / "site"
    manifest = tmp_path / "manifest.json"
    files = [{"path": "sglang/srt/speculative/ddtree_kernels.so", "original_sha256": None, "result_sha256": "a" * 64},
             {"path": "sglang/srt/speculative/ddtree_utils.py", "original_sha256": None, "result_sha256": "b" * 64},
             {"path": "sglang/old.so.1", "original_sha256": "c" * 64, "result_sha256": None}]  # removed by the build
    for state, expected in (("applied", True), ("pending", True), ("applying", True), ("reverted", False)):
        manifest.write_text(json.dumps({"format": 1, "state": state, "site_packages": str(site), "files": files,
                                        "build_id": "x"}))
        found, record = probe.build_files(str(manifest))
        assert found == ([str(site / "sglang/srt/speculative/ddtree_kernels.so")] if expected else [])
        assert record["state"] == state
    assert probe.build_files(str(tmp_path / "absent.json")) == ([], None)


def test_parse_report_takes_the_marked_line_after_any_noise():
    out = "a warning printed by an import\n" + probe.MARKER + '{"installed": {}}\n'
    assert probe.parse_report(out) == {"installed": {}}
    assert probe.parse_report("Traceback ...\n") is None


def test_needs_install_lists_the_unmet_pins():
    pins = {"torch": "2.11.0+cu130", "sglang": "0.5.11"}
    assert probe.needs_install({"torch": "2.11.0+cu130", "sglang": "0.5.11+simulator"}, pins) == []
    assert probe.needs_install({"torch": "2.11.0+cu128", "sglang": None}, pins) == ["torch==2.11.0+cu130", "sglang==0.5.11"]
    assert probe.needs_install({}, {"torch": None, "sglang": "0.5.11"}) == ["sglang==0.5.11"]


def test_evaluate_a_cpu_build():
    report = {"installed": {"torch": "2.11.0+cpu", "sglang": "0.5.11"},
              "torch": {"version": "2.11.0+cpu", "cuda": None, "error": None}, "libraries": []}
    errors = probe.evaluate(report, {"torch": "2.11.0+cu130", "sglang": "0.5.11"}, CUDA13, "/usr/local/cuda-13.0/lib64", "/v")
    assert errors == [
        "torch 2.11.0+cpu is installed in /v, the pin is 2.11.0+cu130",
        "torch 2.11.0+cpu is a CPU-only build (torch.version.cuda is None) but the toolkit is CUDA 13.0: install the cu130 build",
    ]


def unresolved(name, path, runpath=None, rpath=None, build=None):
    return {"name": name, "needed_by": path, "runpath": runpath, "rpath": rpath, "build": build}


def test_evaluate_names_each_unresolved_library_with_the_files_that_need_it():
    kernels = "/v/site/sglang/srt/speculative/ddtree_kernels.so"
    deps = {"unresolved": [unresolved("libcudart.so.12", kernels, build="ddtree"),
                           unresolved("libfoo.so.1", "/v/site/a.so", runpath=["$ORIGIN/lib", "/opt/x"]),
                           unresolved("libfoo.so.1", "/v/site/b.so", rpath=["/opt/y"])],
            "errors": [{"path": "/v/site/broken.so", "error": "ElfError: truncated"}], "ld_cache_error": None}
    errors = probe.dependency_errors(deps, "/usr/local/cuda-13.0/lib64")
    assert errors == [
        "cannot read the ELF dynamic section of /v/site/broken.so: ElfError: truncated",
        f"libcudart.so.12 needed by {kernels} (the DDTree build) does not resolve "
        "(LD_LIBRARY_PATH=/usr/local/cuda-13.0/lib64, RUNPATH=none)",
        "libfoo.so.1 needed by /v/site/a.so, /v/site/b.so does not resolve "
        "(LD_LIBRARY_PATH=/usr/local/cuda-13.0/lib64, RUNPATH=$ORIGIN/lib:/opt/x)",
    ]
    many = {"unresolved": [unresolved("libx.so", f"/v/{i}.so", rpath=["/r"]) for i in range(7)]}
    [error] = probe.dependency_errors(many, "")
    assert error == ("libx.so needed by /v/0.so, /v/1.so, /v/2.so, /v/3.so, /v/4.so and 2 more does not resolve "
                     "(LD_LIBRARY_PATH=none, RUNPATH=none, RPATH=/r)")


def test_driver_libraries_fail_naming_the_driver_unless_it_is_not_required():
    deps = {"unresolved": [unresolved("libcuda.so.1", "/v/site/sgl_kernel/sm90/common_ops.abi3.so")]}
    [error] = probe.evaluate({"dependencies": deps}, {}, CUDA13, "", "/v")
    assert error == ("libcuda.so.1 needed by /v/site/sgl_kernel/sm90/common_ops.abi3.so does not resolve "
                     "(LD_LIBRARY_PATH=none, RUNPATH=none): it is a library of the NVIDIA driver's user space, "
                     "which is not installed where the loader looks")
    assert probe.evaluate({"dependencies": deps}, {}, CUDA13, "", "/v", require_driver=False) == []
    # Only the driver's own libraries are excused.
    deps["unresolved"].append(unresolved("libcudart.so.12", "/v/k.so"))
    assert len(probe.evaluate({"dependencies": deps}, {}, CUDA13, "", "/v", require_driver=False)) == 1
