"""gpu_facts: the module run for real against the lab's fake nvidia-smi (a test
double on PATH, reading a copy of ct129's or ct200's hardware file), the lab's
Qwen3.6-27B config, and a driver /proc directory and device directory of the
test's own (device nodes are links to /dev/null, a real character device)."""

from __future__ import annotations

import json
import os

import pytest
from sim_helpers import LAB, MODELS, run_module

from ansible_collections.inferops.sglang.plugins.modules import gpu_facts

QWEN = str(MODELS / "Qwen3.6-27B")
CT129_NODES = ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia2", "nvidia3", "nvidia4", "nvidia5", "nvidia6", "nvidia7")
KERNEL_LINE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Tue Sep 23 09:55:41 UTC 2025\n"


@pytest.fixture
def host(tmp_path, monkeypatch, fake_nvidia_smi):
    """make(name='ct129', **hardware changes) -> a host whose nvidia-smi is the lab's fake."""

    def make(name: str = "ct129", **changes) -> None:
        data = json.loads((LAB / "hosts" / name / "hardware.json").read_text())
        data.update(changes)
        path = tmp_path / "hardware.json"
        path.write_text(json.dumps(data))
        monkeypatch.setenv("SGLANG_SIM_HARDWARE", str(path))
        monkeypatch.setenv("SGLANG_SIM_STATE", str(tmp_path / "gpu"))
        fake_nvidia_smi()

    return make


@pytest.fixture
def driver(tmp_path):
    """make(kernel='580.95.05', nodes=[...]) -> (driver_proc_dir, device_dir) of a passed-through GPU host."""

    def make(kernel: str | None = "580.95.05", nodes=CT129_NODES) -> tuple[str, str]:
        proc = tmp_path / "proc-driver-nvidia"
        proc.mkdir()
        if kernel:
            (proc / "version").write_text(KERNEL_LINE.format(kernel))
        dev = tmp_path / "dev"
        dev.mkdir()
        for name in nodes:
            (dev / name).symlink_to("/dev/null")
        return str(proc), str(dev)

    return make


def run(capsys, **args) -> tuple[int, dict]:
    args.setdefault("container_checks", "never")
    return run_module(gpu_facts.main, capsys, args)[:2]


def test_ct129(host, capsys):
    host()
    rc, result = run(capsys, model_path=QWEN)
    assert rc == 0, result
    assert result["changed"] is False
    facts = result["ansible_facts"]["inferops_gpus"]
    assert facts["usable"] == [0, 2, 3, 4, 5, 6, 7]
    assert facts["cuda_visible_devices"] == "0,2,3,4,5,6,7"
    assert facts["count"] == 8
    assert facts["unusable"] == [{"index": 1, "pci_bus_id": "00000000:21:00.0", "state": "lost",
                                  "problem": "GPU is lost. Reboot the system to recover this GPU"}]
    assert facts["tp"] == {"valid": [1, 2, 4], "chosen": 4, "requested": None, "devices": [0, 2, 3, 4],
                           "cuda_visible_devices": "0,2,3,4"}
    assert facts["driver_version"] == "580.95.05" and facts["cuda_version"] == "13.0"
    assert facts["model"]["num_attention_heads"] == 24 and facts["model"]["num_key_value_heads"] == 4
    assert facts["gpus"][0]["name"] == "NVIDIA RTX A6000" and facts["gpus"][0]["compute_capability"] == "8.6"
    assert facts["container"]["checked"] is False


def test_ct200(host, capsys):
    host("ct200")
    rc, result = run(capsys, model_path=QWEN)
    assert rc == 0, result
    facts = result["ansible_facts"]["inferops_gpus"]
    assert facts["usable"] == [0, 1] and facts["unusable"] == []
    assert facts["tp"]["valid"] == [1, 2] and facts["tp"]["chosen"] == 2
    assert facts["gpus"][1]["name"] == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    assert facts["gpus"][1]["memory_total_mib"] == 97887 and facts["gpus"][1]["compute_capability"] == "12.0"


def test_check_mode_reads_the_same_facts(host, capsys):
    host()
    rc, result = run(capsys, model_path=QWEN, _ansible_check_mode=True)
    assert rc == 0 and result["changed"] is False
    assert result["ansible_facts"]["inferops_gpus"]["tp"]["chosen"] == 4


@pytest.mark.parametrize("tp, reason", [
    (8, "tp_size 8 needs 8 GPUs; 7 usable (GPU 1 lost); tp_size 8 does not divide num_key_value_heads 4"),
    (7, "tp_size 7 does not divide num_attention_heads 24"),
    (3, "tp_size 3 does not divide num_key_value_heads 4"),
])
def test_requested_tp_that_cannot_work_fails_with_the_reason(host, capsys, tp, reason):
    host()
    rc, result = run(capsys, model_path=QWEN, tp_size=tp)
    assert rc == 1
    assert reason in result["msg"]
    assert result["errors"][0].endswith("(valid tp_size here: 1, 2, 4)")
    assert result["inferops_gpus"]["tp"]["requested"] == tp


def test_requested_tp_and_gpus(host, capsys):
    host()
    rc, result = run(capsys, model_path=QWEN, tp_size=2, gpus=[0, 2])
    assert rc == 0, result
    facts = result["ansible_facts"]["inferops_gpus"]
    assert facts["selected"] == [0, 2] and facts["cuda_visible_devices"] == "0,2"
    assert facts["tp"]["chosen"] == 2 and facts["tp"]["devices"] == [0, 2]


def test_tp_larger_than_the_requested_gpus(host, capsys):
    host()
    rc, result = run(capsys, model_path=QWEN, tp_size=4, gpus=[0, 2])
    assert rc == 1
    assert result["errors"] == ["tp_size 4 needs 4 GPUs; 2 selected (gpus [0, 2]) (valid tp_size here: 1, 2)"]


def test_requested_gpus_name_the_lost_one(host, capsys):
    host()
    rc, result = run(capsys, gpus=[0, 1, 9])
    assert rc == 1
    assert "GPU 1 is lost: GPU is lost. Reboot the system to recover this GPU" in result["errors"]
    assert "GPU 9 is not present (this host has GPUs 0, 1, 2, 3, 4, 5, 6, 7)" in result["errors"]


def test_driver_not_loaded(host, capsys, tmp_path, monkeypatch):
    host()
    monkeypatch.setenv("SGLANG_SIM_HARDWARE", str(tmp_path / "no-driver.json"))
    rc, result = run(capsys)
    assert rc == 1
    assert result["rc"] == 9
    assert result["msg"].startswith("nvidia-smi failed (exit 9): the NVIDIA kernel driver is not loaded")
    assert "couldn't communicate with the NVIDIA driver" in result["msg"]


def test_nvidia_smi_missing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, result = run(capsys)
    assert rc == 1
    assert result["msg"].startswith("nvidia-smi not found (nvidia-smi): the NVIDIA driver's user space is not installed")
    rc, result = run(capsys, nvidia_smi=str(tmp_path / "bin" / "nvidia-smi"))
    assert rc == 1 and f"nvidia-smi not found ({tmp_path}/bin/nvidia-smi)" in result["msg"]


def test_no_usable_gpu(host, capsys):
    data = json.loads((LAB / "hosts" / "ct200" / "hardware.json").read_text())
    host("ct200", gpus=[dict(gpu, state="lost") for gpu in data["gpus"]])
    rc, result = run(capsys, model_path=QWEN)
    assert rc == 1
    assert "no usable GPU on this host (GPUs 0, 1 lost)" in result["errors"]


def test_container_checks_pass(host, driver, capsys):
    host()
    proc, dev = driver()
    rc, result = run(capsys, container_checks="always", driver_proc_dir=proc, device_dir=dev)
    assert rc == 0, result
    container = result["ansible_facts"]["inferops_gpus"]["container"]
    assert container["checked"] is True and container["problems"] == []
    assert container["kernel_module_version"] == container["user_space_version"] == "580.95.05"
    assert f"{dev}/nvidia7" in container["device_nodes"] and f"{dev}/nvidia1" not in container["device_nodes"]


def test_container_version_mismatch(host, driver, capsys):
    host(driver_version="580.82.07")
    proc, dev = driver(kernel="580.95.05")
    rc, result = run(capsys, container_checks="always", driver_proc_dir=proc, device_dir=dev)
    assert rc == 1
    assert result["errors"] == ["container check: user-space driver 580.82.07 does not match the kernel module "
                                "580.95.05: install the 580.95.05 user-space libraries in the container (never a kernel driver)"]


def test_container_missing_device_node(host, driver, capsys):
    host()
    proc, dev = driver(nodes=("nvidiactl", "nvidia0", "nvidia2", "nvidia3", "nvidia4", "nvidia5", "nvidia6"))
    (open(os.path.join(dev, "nvidia7"), "w", encoding="utf-8")).close()
    rc, result = run(capsys, container_checks="always", driver_proc_dir=proc, device_dir=dev)
    assert rc == 1
    assert result["errors"] == [
        f"container check: device node {dev}/nvidia-uvm is missing: pass it through to the container",
        f"container check: device node {dev}/nvidia7 is not a character device: pass it through to the container",
    ]


def test_container_kernel_module_not_visible(host, driver, capsys):
    host()
    proc, dev = driver(kernel=None)
    rc, result = run(capsys, container_checks="always", driver_proc_dir=proc, device_dir=dev)
    assert rc == 1
    assert "the NVIDIA kernel module's version is not readable" in result["msg"]


def test_device_minor_from_proc(host, driver, capsys):
    """A GPU's node is nvidia<Device Minor> when the driver's /proc says so."""
    host("ct200")
    proc, dev = driver(nodes=("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia5"))
    info = os.path.join(proc, "gpus", "0000:21:00.0")
    os.makedirs(info)
    with open(os.path.join(info, "information"), "w", encoding="utf-8") as handle:
        handle.write("Model: \t\t NVIDIA RTX PRO 6000 Blackwell Workstation Edition\nDevice Minor: \t 5\n")
    rc, result = run(capsys, container_checks="always", driver_proc_dir=proc, device_dir=dev)
    assert rc == 0, result
    assert result["ansible_facts"]["inferops_gpus"]["container"]["device_nodes"][-1] == f"{dev}/nvidia5"
    gpus = result["ansible_facts"]["inferops_gpus"]["gpus"]
    # the minor is recorded per GPU (the host manifest keeps it); null where /proc does not say
    assert [g["device_minor"] for g in gpus] == [None, 5]


def _sick_ct129(host, tmp_path, **gpu_health):
    """ct129 with each GPU's health given (index -> health) and the lab's kernel log lines written."""
    data = json.loads((LAB / "hosts" / "ct129" / "hardware.json").read_text())
    for gpu in data["gpus"]:
        gpu["health"] = gpu_health.get(f"gpu{gpu['index']}", {})
    host(gpus=data["gpus"])


def _kernel_log(tmp_path, *lines):
    state = tmp_path / "gpu"
    state.mkdir(exist_ok=True)
    (state / "kernel-test.log").write_text("".join(f"[{100.0 + i:12.6f}] {line}\n" for i, line in enumerate(lines)))


def test_a_sick_gpu_is_kept_out_like_a_lost_one(host, capsys, tmp_path):
    """GPU 3 has a row remap pending, GPU 4 fell off the bus (Xid 79 in the kernel log), GPU 5 logged an
    application-class Xid 13: 3 and 4 are unusable with the reason, the TP size is chosen from the rest."""
    _sick_ct129(host, tmp_path, gpu3={"remap_pending": True, "remapped_uncorrectable": 1})
    _kernel_log(tmp_path, "NVRM: Xid (PCI:0000:81:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                "NVRM: Xid (PCI:0000:a1:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0)")
    rc, result = run(capsys, model_path=QWEN, health_baseline=str(tmp_path / "none.json"))
    assert rc == 0, result
    facts = result["ansible_facts"]["inferops_gpus"]
    assert facts["usable"] == [0, 2, 5, 6, 7]
    sick = {g["index"]: g for g in facts["unusable"] if g["state"] == "sick"}
    assert sorted(sick) == [3, 4]
    assert sick[3]["problem"].startswith("a row remap is pending")
    assert sick[4]["problem"] == "Xid 79 (GPU has fallen off the bus) at 100.0 s since boot: reboot the host"
    assert facts["tp"]["devices"] == [0, 2, 5, 6]
    gpu5 = facts["gpus"][5]["health"]
    assert gpu5["sick"] == []
    assert gpu5["xids"] == [{"xid": 13, "time": 101.0, "action": "restart_app", "name": "Graphics Engine Exception"}]
    assert facts["kernel_log"]["source"] == "dmesg" and facts["kernel_log"]["time"] == 101.0
    assert facts["gpus"][0]["health"]["counters"]["ecc_mode"] == "Enabled"


def test_ecc_off_is_a_warning_with_the_fix_or_a_refusal(host, capsys, tmp_path):
    _sick_ct129(host, tmp_path, gpu0={"ecc": "Disabled"})
    rc, result = run(capsys, model_path=QWEN, health_baseline=str(tmp_path / "none.json"))
    assert rc == 0 and result["ansible_facts"]["inferops_gpus"]["usable"] == [0, 2, 3, 4, 5, 6, 7]
    warned = result["ansible_facts"]["inferops_gpus"]["health_warnings"]
    assert any("GPU 0 (00000000:01:00.0): ECC is disabled" in w and "-e 1, then reboot" in w for w in warned), warned
    assert "ECC is disabled" in str(result["warnings"])
    rc, result = run(capsys, model_path=QWEN, health_baseline=str(tmp_path / "none.json"), ecc_disabled="refuse")
    assert rc == 0 and result["ansible_facts"]["inferops_gpus"]["usable"] == [2, 3, 4, 5, 6, 7]


def test_new_uncorrectable_errors_since_the_last_manifest_make_a_gpu_sick(host, capsys, tmp_path):
    _sick_ct129(host, tmp_path, gpu2={"aggregate_uncorrected": 3})
    baseline = tmp_path / "host.json"
    rc, result = run(capsys, model_path=QWEN, health_baseline=str(baseline))
    assert rc == 0 and 2 in result["ansible_facts"]["inferops_gpus"]["usable"]   # old errors, no baseline yet
    gpus = [dict(index=g["index"], pci_bus_id=g["pci_bus_id"], health=g.get("health"))
            for g in result["ansible_facts"]["inferops_gpus"]["gpus"]]
    manifest = {"schema": 1, "written": {}, "cuda": {}, "venv": {"python": "/usr/bin/python3"}, "installed": {},
                "environment": {}, "builds": {}, "gpus": {"usable": gpus, "unusable": [], "tp": {"devices": []}}}
    baseline.write_text(json.dumps(manifest))
    _sick_ct129(host, tmp_path, gpu2={"aggregate_uncorrected": 5})
    rc, result = run(capsys, model_path=QWEN, health_baseline=str(baseline))
    facts = result["ansible_facts"]["inferops_gpus"]
    assert 2 not in facts["usable"]
    assert facts["gpus"][2]["problem"] == "2 new uncorrectable ECC error(s) since the last check (aggregate 3 -> 5)"


def test_an_unreadable_kernel_log_is_a_warning(host, capsys, tmp_path, monkeypatch):
    from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
    host()
    monkeypatch.setattr(_gpu_health, "KERNEL_LOG_COMMANDS", (("dmesg", ["dmesg", "--restricted"]),))
    rc, result = run(capsys, model_path=QWEN, health_baseline=str(tmp_path / "none.json"))
    assert rc == 0 and result["ansible_facts"]["inferops_gpus"]["kernel_log"]["source"] is None
    assert any("Xid events are not checked" in w for w in result["ansible_facts"]["inferops_gpus"]["health_warnings"])


def test_dcgm_level_1_runs_where_dcgmi_is_installed_and_its_failures_are_warnings(host, capsys, tmp_path):
    """A stand-in dcgmi on PATH printing DCGM 3.1.8's table with a failed test (exit 226, DCGM_ST_NVVS_ERROR)."""
    import stat
    host()
    table = ("| Persistence Mode          | Fail                                           |\n"
             "| Error                     | Persistence mode for GPU 0 is currently disab  |\n"
             "|                           | led.                                           |\n"
             "| Page Retirement/Row Remap | Pass                                           |\n")
    dcgmi = tmp_path / "bin" / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{table}EOF\nexit 226\n")
    dcgmi.chmod(dcgmi.stat().st_mode | stat.S_IXUSR)
    rc, result = run(capsys, model_path=QWEN, health_baseline=str(tmp_path / "none.json"))
    facts = result["ansible_facts"]["inferops_gpus"]
    assert rc == 0 and facts["usable"] == [0, 2, 3, 4, 5, 6, 7]
    assert facts["dcgm"] == {"findings": ["DCGM diagnostic level 1: Persistence Mode Fail: Persistence mode for GPU 0 "
                                          "is currently disabled."], "problem": None}
    assert facts["dcgm"]["findings"][0] in facts["health_warnings"]
    rc, result = run(capsys, model_path=QWEN, health_baseline=str(tmp_path / "none.json"), dcgm="never")
    assert result["ansible_facts"]["inferops_gpus"]["dcgm"] is None
