"""sglang_host_manifest: the module run as Ansible runs it. present writes once
(a second run changes nothing, check mode writes nothing); read gives the
deploy its settings and refuses a variant whose build has no passing verdict."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common import warnings as ansible_warnings
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from sim_helpers import run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _host_manifest as hm
from ansible_collections.inferops.sglang.plugins.modules import sglang_host_manifest as module

SITE = "/opt/sglang/venv/lib/python3.11/site-packages"
GPUS = {
    "driver_version": "580.95.05", "cuda_version": "13.0",
    "gpus": [
        {"index": 0, "name": "NVIDIA RTX A6000", "uuid": "GPU-0", "pci_bus_id": "00000000:01:00.0", "memory_total_mib": 49140,
         "compute_capability": "8.6", "usable": True, "state": "ok", "problem": None, "device_minor": 0},
        {"index": 1, "name": None, "uuid": None, "pci_bus_id": "00000000:21:00.0", "memory_total_mib": None,
         "compute_capability": None, "usable": False, "state": "lost", "problem": "GPU is lost", "device_minor": None},
        {"index": 2, "name": "NVIDIA RTX A6000", "uuid": "GPU-2", "pci_bus_id": "00000000:41:00.0", "memory_total_mib": 49140,
         "compute_capability": "8.6", "usable": True, "state": "ok", "problem": None, "device_minor": 2},
    ],
    "selected": [0, 2], "cuda_visible_devices": "0,2",
    "tp": {"valid": [1, 2], "chosen": 2, "devices": [0, 2], "cuda_visible_devices": "0,2"},
}
RUNTIME = {"python": "/opt/sglang/venv/bin/python", "venv": "/opt/sglang/venv", "installed": {"sglang": "0.5.11"}}
ENV = {"LD_LIBRARY_PATH": "/usr/local/cuda-13.0/lib64", "PATH": "/opt/sglang/venv/bin:/usr/bin", "LANG": "C.UTF-8"}
VARIANTS = {"nextn": {"speculative_algorithm": "NEXTN"},
            "shadow": {"speculative_algorithm": "DDTREE", "draft_model": True, "ddtree_shadow_linear": True}}
ALIASES = {"balanced": "shadow"}
BUILD_FILE = "sglang/srt/speculative/ddtree_kernels.so"


@pytest.fixture(autouse=True)
def _no_leftover_warnings():
    """module.warn() collects in a process-wide list that a real module run (its own
    process) never carries over: leave none behind for the next module test."""
    yield
    ansible_warnings._global_warnings.clear()


@pytest.fixture
def paths(tmp_path, monkeypatch):
    # the module chowns a file not root's: the test is not root everywhere
    monkeypatch.setattr(os, "chown", lambda *a: None)
    ddtree = tmp_path / "ddtree" / "manifest.json"
    ddtree.parent.mkdir()
    ddtree.write_text(json.dumps({"format": 1, "state": "applied", "build_id": "ab" * 32, "site_packages": SITE,
                                  "files": [{"path": BUILD_FILE}]}))
    return {"path": str(tmp_path / "etc" / "inferops-sglang" / "host.json"), "ddtree_manifest": str(ddtree),
            "driver_proc_dir": str(tmp_path / "no-driver")}


def write(capsys, paths, probe, check_mode=False, **more):
    args = dict(state="present", gpus=GPUS, cuda={"version": "13.0", "home": "/usr/local/cuda-13.0"}, runtime=RUNTIME,
                probe=probe, provenance={"run": more.pop("run", "run-1")}, **paths, **more)
    rc, result, _skip = run_module(module.main, capsys, args, check_mode=check_mode)
    return rc, result


def read(capsys, paths, **args):
    args = dict(state="read", variants=VARIANTS, aliases=ALIASES, **paths, **args)
    rc, result, _skip = run_module(module.main, capsys, args, check_mode=True)
    return rc, result


def ok_probe():
    return {"ok": True, "errors": [], "environment": ENV, "installed": RUNTIME["installed"]}


def test_present_writes_once(capsys, paths):
    rc, first = write(capsys, paths, ok_probe())
    assert rc == 0 and first["changed"] is True and first["exists"] is False
    on_disk = json.loads(open(paths["path"]).read())
    assert on_disk == first["manifest"] and on_disk["written"]["run"] == "run-1"
    assert oct(os.stat(paths["path"]).st_mode & 0o777) == "0o644"
    before = os.stat(paths["path"]).st_mtime_ns
    rc, second = write(capsys, paths, ok_probe(), run="run-2")
    assert rc == 0 and second["changed"] is False
    assert os.stat(paths["path"]).st_mtime_ns == before
    assert json.loads(open(paths["path"]).read())["written"]["run"] == "run-1"  # the file is as it was


def test_check_mode_writes_nothing(capsys, paths):
    rc, result = write(capsys, paths, ok_probe(), check_mode=True)
    assert rc == 0 and result["changed"] is True and not os.path.exists(paths["path"])


def test_a_changed_verdict_is_written(capsys, paths):
    write(capsys, paths, ok_probe())
    failed = {"ok": False, "errors": [f"libcudart.so.12 needed by {SITE}/{BUILD_FILE} is not found"], "environment": ENV}
    rc, result = write(capsys, paths, failed, run="run-2")
    assert rc == 0 and result["changed"] is True
    data = hm.read(paths["path"])
    assert data["builds"]["sglang"]["ok"] is True and data["builds"]["ddtree"]["ok"] is False
    assert data["written"]["run"] == "run-2"


def test_read_gives_the_manifests_settings(capsys, paths):
    write(capsys, paths, ok_probe())
    rc, result = read(capsys, paths, name="nextn", environment={"EXTRA": "1"})
    assert rc == 0, result
    assert result["settings"] == {"tp_size": 2, "gpu_devices": [0, 2], "python": "/opt/sglang/venv/bin/python",
                                  "environment": dict(ENV, EXTRA="1"), "gpu_nodes": ["/dev/nvidia0", "/dev/nvidia2"]}
    assert result["sources"]["gpu_nodes"] == ["manifest", "manifest"]
    assert result["variant"] == "nextn" and result["build"]["needed"] == "sglang"


def test_read_refuses_what_the_manifest_gives_as_the_input_check_refuses_it(capsys, paths):
    """Issue 29: the manifest's python and environment reach the unit file and root's probes; an edited
    manifest's newline would start a line of its own there. The inventory's values were checked, these were not."""
    write(capsys, paths, ok_probe())
    data = json.loads(Path(paths["path"]).read_text())
    data["venv"]["python"] = "/opt/sglang/venv/bin/python\nExecStartPre=/bin/sh"
    data["environment"]["LD_PRELOAD"] = "/tmp/x.so\nUser=root"
    Path(paths["path"]).write_text(json.dumps(data))
    rc, result = read(capsys, paths, name="nextn")
    assert rc == 1 and len(result["errors"]) == 2, result
    assert result["errors"][0] == ("the host manifest's python must not contain control characters (a newline would "
                                   "start a line of its own in the unit file), found U+000A")
    assert result["errors"][1].startswith("the host manifest's environment variable LD_PRELOAD must not contain control")
    # the inventory's own python is checked where it is given (the input check), not again here
    rc, result = read(capsys, paths, name="nextn", python="/opt/other/bin/python", use_environment=False)
    assert rc == 0, result


def test_read_keeps_an_override(capsys, paths):
    write(capsys, paths, ok_probe())
    rc, result = read(capsys, paths, tp_size="1", gpu_devices=[2])
    assert rc == 0 and result["settings"]["gpu_devices"] == [2] and result["sources"]["tp_size"] == "override"


def test_read_refuses_a_variant_whose_build_failed(capsys, paths):
    failed = {"ok": False, "errors": [f"libcudart.so.12 needed by {SITE}/{BUILD_FILE} is not found"], "environment": ENV}
    write(capsys, paths, failed)
    rc, result = read(capsys, paths, name="balanced")
    assert rc == 1 and result["variant"] == "shadow"
    assert "variant shadow needs ddtree abababababab, which failed the runtime probe" in result["msg"]
    assert BUILD_FILE in result["msg"]
    rc, result = read(capsys, paths, name="nextn")
    assert rc == 0, result


def test_read_without_a_manifest(capsys, paths):
    rc, result = read(capsys, paths, name="nextn")
    assert rc == 1 and "run provision.yml first" in result["msg"]
    assert "sglang_service_host_manifest_required: false" in result["msg"]
    rc, result = read(capsys, paths, name="nextn", required=False, tp_size=1, gpu_devices=[0])
    assert rc == 0 and result["exists"] is False and result["settings"]["python"] == hm.FALLBACK_PYTHON
    assert "not checked against a probe verdict" in json.dumps(result["warnings"])


def test_read_an_unusable_manifest(capsys, paths):
    os.makedirs(os.path.dirname(paths["path"]))
    with open(paths["path"], "w") as handle:
        handle.write('{"schema": 0}')
    rc, result = read(capsys, paths)
    assert rc == 1 and "schema 0 is not 1" in result["msg"]


def test_read_leaves_an_unknown_variant_to_sglang_variant(capsys, paths):
    write(capsys, paths, ok_probe())
    rc, result = read(capsys, paths, name="turbo")
    assert rc == 0 and "variant" not in result and "build" not in result


def test_a_rejected_and_rolled_back_build_is_recorded_and_refused(capsys, paths):
    os.unlink(paths["ddtree_manifest"])  # the rollback left no build
    error = f"libcudart.so.12 needed by {SITE}/{BUILD_FILE} (the DDTree build) does not resolve"
    rejected = {"build_id": "cd" * 32, "verdict": "rejected", "errors": [error], "restored": None, "environment": ENV}
    rc, result = write(capsys, paths, ok_probe(), ddtree_rejected=rejected)
    assert rc == 0 and result["changed"] is True, result
    data = hm.read(paths["path"])
    assert data["ddtree"] is None and data["builds"]["sglang"]["ok"] is True
    assert data["builds"]["ddtree"]["ok"] is False and data["builds"]["ddtree"]["build_id"] == "cd" * 32
    assert data["builds"]["ddtree"]["errors"] == [error] and data["ddtree_rejected"]["build_id"] == "cd" * 32
    rc, again = write(capsys, paths, ok_probe(), ddtree_rejected=rejected, run="run-2")
    assert rc == 0 and again["changed"] is False
    rc, result = read(capsys, paths, name="balanced")
    assert rc == 1 and "variant shadow needs ddtree cdcdcdcdcdcd, which failed the runtime probe" in result["msg"]
    assert error in result["msg"]
    rc, result = read(capsys, paths, name="nextn")
    assert rc == 0, result


# -- the unit's DeviceAllow= by device minor -------------------------------------

UNIT_TEMPLATE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "sglang_service", "templates",
                             "sglang.service.j2")
ROLE_VARS = os.path.join(os.path.dirname(UNIT_TEMPLATE), "..", "vars", "main.yml")


def render_unit(host_result: dict) -> list[str]:
    """The role's unit template rendered as the role renders it, with the preflight's host manifest
    read (``__sglang_service_host``) and the role's own vars/main.yml expression for the nodes."""
    with open(ROLE_VARS, "r", encoding="utf-8") as handle:
        role_vars = yaml.safe_load(handle)
    settings = host_result["settings"]
    variables = dict(
        ansible_managed="managed", __sglang_service_host=host_result,
        _sglang_service_gpu_nodes=trust_as_template(role_vars["_sglang_service_gpu_nodes"]),
        _sglang_service_render={"variant": "nextn", "params": {}, "sglang_version": "0.5.11", "exec_args": "--port 30000",
                                "privileged_port": False},
        _sglang_service_config_file="/etc/sglang/sglang-qwen.yaml", _sglang_service_logging_file="/etc/sglang/l.json",
        _sglang_service_credential="sglang-qwen.yaml", _sglang_service_base="sglang-qwen", _sglang_service_slot=None,
        _sglang_service_unit="sglang-qwen.service",
        sglang_service_served_model_name="qwen", sglang_service_user="sglang", sglang_service_group="sglang",
        sglang_service_gpu_devices=settings["gpu_devices"], _sglang_service_environment={}, sglang_service_api_key="",
        _sglang_service_config_used=False,
        # the preflight's fact: the GPU list the manifest read validated (tasks/preflight.yml)
        _sglang_service_gpus=settings["gpu_devices"],
        sglang_service_python=settings["python"], sglang_service_read_write_paths=[])
    with open(UNIT_TEMPLATE, "r", encoding="utf-8") as handle:
        text = handle.read()
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(text)).splitlines()


def test_device_allow_names_each_gpus_device_minor_not_its_index(capsys, paths, monkeypatch):
    """GPU 2 (bus 41:00.0) is /dev/nvidia3 on this host: the unit allows /dev/nvidia3, and
    CUDA_VISIBLE_DEVICES keeps the index order (on main the unit allowed /dev/nvidia2, another GPU)."""
    gpus = json.loads(json.dumps(GPUS))
    gpus["gpus"][2]["device_minor"] = 3
    monkeypatch.setitem(globals(), "GPUS", gpus)
    write(capsys, paths, ok_probe())
    rc, result = read(capsys, paths, name="nextn")
    assert rc == 0, result
    assert result["settings"]["gpu_nodes"] == ["/dev/nvidia0", "/dev/nvidia3"]
    unit = render_unit(result)
    assert [line for line in unit if re.match(r"DeviceAllow=/dev/nvidia[0-9]", line)] == [
        "DeviceAllow=/dev/nvidia0 rw", "DeviceAllow=/dev/nvidia3 rw"]
    assert "Environment=CUDA_VISIBLE_DEVICES=0,2" in unit
    # an override of the GPUs takes the minors of those GPUs from the manifest too
    rc, result = read(capsys, paths, gpu_devices=[2])
    assert rc == 0 and result["settings"]["gpu_nodes"] == ["/dev/nvidia3"]


def test_without_a_manifest_the_minor_is_read_from_the_drivers_procfs(capsys, paths, tmp_path, monkeypatch, fake_nvidia_smi):
    """No manifest: nvidia-smi (the lab's fake, ct200: GPU 1 on bus 21:00.0) gives the bus id and the
    driver's /proc/driver/nvidia/gpus/<bus>/information the minor: GPU index 1 is /dev/nvidia3."""
    monkeypatch.setenv("SGLANG_SIM_HARDWARE", os.path.join(os.path.dirname(UNIT_TEMPLATE), "..", "..", "..", "lab",
                                                           "hosts", "ct200", "hardware.json"))
    monkeypatch.setenv("SGLANG_SIM_STATE", str(tmp_path / "gpu"))
    fake_nvidia_smi()
    info = tmp_path / "proc-driver-nvidia" / "gpus" / "0000:21:00.0"
    info.mkdir(parents=True)
    (info / "information").write_text("Model: \t\t NVIDIA RTX PRO 6000 Blackwell Workstation Edition\nDevice Minor: \t 3\n")
    rc, result = read(capsys, dict(paths, driver_proc_dir=str(tmp_path / "proc-driver-nvidia")), name="nextn",
                      required=False, tp_size=1, gpu_devices=[1])
    assert rc == 0, result
    assert result["settings"]["gpu_nodes"] == ["/dev/nvidia3"] and result["sources"]["gpu_nodes"] == ["procfs"]
    unit = render_unit(result)
    assert "DeviceAllow=/dev/nvidia3 rw" in unit and "DeviceAllow=/dev/nvidia1 rw" not in unit
    assert "Environment=CUDA_VISIBLE_DEVICES=1" in unit
    # a GPU the driver's procfs does not list (a lab host) keeps its index
    rc, result = read(capsys, paths, name="nextn", required=False, tp_size=1, gpu_devices=[0])
    assert rc == 0 and result["settings"]["gpu_nodes"] == ["/dev/nvidia0"] and result["sources"]["gpu_nodes"] == ["index"]
