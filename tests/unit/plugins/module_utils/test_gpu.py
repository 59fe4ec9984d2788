"""GPU facts: the parser run on what the lab's fake nvidia-smi (a test double
printing the real formats) prints for ct129 (GPU 1 lost), ct200 and altered
copies of their hardware files, and on verbatim samples of the real tool."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sim_helpers import LAB, MODELS

from ansible_collections.inferops.sglang.plugins.module_utils import _gpu as g

QUERY = ["--query-gpu=" + ",".join(g.QUERY_FIELDS), "--format=csv,noheader,nounits"]
CT129_USABLE = [0, 2, 3, 4, 5, 6, 7]

# Verbatim formats of the real tool (an 8x A6000 host with GPU 1 lost).
REAL_CSV_WITH_UNITS = """\
index, name, uuid, pci.bus_id, memory.total [MiB], memory.used [MiB], compute_cap, driver_version
0, NVIDIA RTX A6000, GPU-92b9b8f4-d5e3-55b1-b2cd-cc847f9758b2, 00000000:01:00.0, 49140 MiB, 46873 MiB, 8.6, 580.95.05
2, NVIDIA RTX A6000, GPU-b0cba620-a084-55b9-bc20-14fde76318bc, 00000000:41:00.0, 49140 MiB, 4 MiB, 8.6, 580.95.05
Unable to determine the device handle for GPU0000:21:00.0: GPU is lost.  Reboot the system to recover this GPU
"""
REAL_LIST_WITH_LOST = """\
GPU 0: NVIDIA RTX A6000 (UUID: GPU-92b9b8f4-d5e3-55b1-b2cd-cc847f9758b2)
Unable to determine the device handle for gpu 0000:21:00.0: GPU is lost.  Reboot the system to recover this GPU
GPU 2: NVIDIA RTX A6000 (UUID: GPU-b0cba620-a084-55b9-bc20-14fde76318bc)
"""
REAL_TABLE_HEADER = """\
Sat Nov 29 10:12:01 2025
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |
|-----------------------------------------+------------------------+----------------------+
"""
REAL_PROC_VERSION = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:55:41 UTC 2025\n"
                     "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n")
REAL_PROC_VERSION_OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
                          "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:45:47 UTC 2025\n")


def smi(tmp_path, host: str = "ct129", args: list[str] | None = None, **changes) -> tuple[int, str]:
    """Run the lab's fake nvidia-smi on (a copy of) a lab host's hardware file."""
    data = json.loads((LAB / "hosts" / host / "hardware.json").read_text())
    for index, state in changes.pop("states", {}).items():
        data["gpus"][index]["state"] = state
    data.update(changes)
    path = tmp_path / f"hardware-{host}.json"
    path.write_text(json.dumps(data))
    env = dict(os.environ, SGLANG_SIM_HARDWARE=str(path), SGLANG_SIM_STATE=str(tmp_path / "gpu"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from sglang_simulator import nvidia_smi; "
            "sys.exit(nvidia_smi.main(sys.argv[2:]))")
    proc = subprocess.run([sys.executable, "-c", code, str(LAB / "simulator"), *(QUERY if args is None else args)],
                          env=env, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def qwen_heads() -> dict:
    return g.model_heads(json.loads((MODELS / "Qwen3.6-27B" / "config.json").read_text()))


def test_ct129_lost_gpu_is_unusable_not_a_crash(tmp_path):
    rc, query = smi(tmp_path)
    assert rc == g.EXIT_GPU_LOST
    _rc, listing = smi(tmp_path, args=["-L"])
    gpus = g.inventory(query, listing)
    assert [x["index"] for x in gpus] == list(range(8))
    lost = gpus[1]
    assert lost["usable"] is False and lost["state"] == "lost"
    assert lost["pci_bus_id"] == "00000000:21:00.0"
    assert lost["problem"] == "GPU is lost. Reboot the system to recover this GPU"
    first = gpus[0]
    assert first == {
        "index": 0, "name": "NVIDIA RTX A6000", "uuid": "GPU-92b9b8f4-d5e3-55b1-b2cd-cc847f9758b2",
        "pci_bus_id": "00000000:01:00.0", "memory_total_mib": 49140, "memory_used_mib": 0,
        "compute_capability": "8.6", "driver_version": "580.95.05", "state": "ok", "usable": True, "problem": None,
    }
    assert g.usable(gpus) == CT129_USABLE
    assert g.cuda_visible_devices(g.usable(gpus)) == "0,2,3,4,5,6,7"
    assert g.describe_unusable(gpus) == "GPU 1 lost"


def test_lost_index_from_bus_order_without_the_listing(tmp_path):
    _rc, query = smi(tmp_path, states={1: "lost", 5: "lost"})
    gpus = g.inventory(query)
    assert [x["index"] for x in gpus if not x["usable"]] == [1, 5]
    assert g.describe_unusable(gpus) == "GPUs 1, 5 lost"


def test_ct200(tmp_path):
    rc, query = smi(tmp_path, host="ct200")
    assert rc == 0
    gpus = g.inventory(query)
    assert g.usable(gpus) == [0, 1]
    assert {x["compute_capability"] for x in gpus} == {"12.0"}
    assert {x["memory_total_mib"] for x in gpus} == {97887}
    heads = qwen_heads()
    assert g.valid_tp(heads, 2) == [1, 2] and g.choose_tp(g.valid_tp(heads, 2)) == 2


def test_versions_from_the_tool(tmp_path):
    _rc, text = smi(tmp_path, args=["--version"])
    assert g.parse_versions(text) == {"nvidia_smi_version": "580.95.05", "nvml_version": "580.95",
                                      "driver_version": "580.95.05", "cuda_version": "13.0"}
    _rc, table = smi(tmp_path, args=[])
    assert g.parse_versions(table)["cuda_version"] == "13.0"


def test_real_csv_with_units_and_header():
    gpus, errors, other = g.parse_query(REAL_CSV_WITH_UNITS)
    assert [(x["index"], x["memory_total_mib"], x["memory_used_mib"]) for x in gpus] == [(0, 49140, 46873), (2, 49140, 4)]
    assert errors == [{"pci_bus_id": "00000000:21:00.0", "problem": "GPU is lost. Reboot the system to recover this GPU"}]
    assert other == []
    gpus = g.inventory(REAL_CSV_WITH_UNITS, REAL_LIST_WITH_LOST)
    assert [(x["index"], x["usable"]) for x in gpus] == [(0, True), (1, False), (2, True)]


def test_real_table_header_and_kernel_module_lines():
    assert g.parse_versions(REAL_TABLE_HEADER)["cuda_version"] == "13.0"
    assert g.parse_versions(REAL_TABLE_HEADER)["nvidia_smi_version"] == "580.95.05"
    assert g.parse_kernel_module_version(REAL_PROC_VERSION) == "580.95.05"
    assert g.parse_kernel_module_version(REAL_PROC_VERSION_OPEN) == "580.95.05"
    assert g.parse_kernel_module_version("") is None
    assert g.parse_device_minor("Model: \t\t NVIDIA RTX A6000\nIRQ:   \t\t 180\nDevice Minor: \t 3\n") == 3


def test_error_values_make_a_gpu_unusable():
    text = ("0, NVIDIA RTX A6000, GPU-a, 00000000:01:00.0, 49140, [N/A], 8.6, 580.95.05\n"
            "1, NVIDIA RTX A6000, GPU-b, 00000000:21:00.0, [GPU requires reset], [GPU requires reset], 8.6, 580.95.05\n")
    gpus = g.inventory(text)
    assert gpus[0]["usable"] and gpus[0]["memory_used_mib"] is None
    assert not gpus[1]["usable"] and gpus[1]["state"] == "error"
    assert gpus[1]["problem"] == "memory.total reads [GPU requires reset]; memory.used reads [GPU requires reset]"
    assert g.describe_unusable(gpus) == "GPU 1 unusable"


def test_bus_ids_are_normalised():
    assert g.normalize_bus_id("0000:21:00.0") == "00000000:21:00.0"
    assert g.normalize_bus_id("00000000:a1:00.0") == "00000000:A1:00.0"
    assert g.normalize_bus_id("21:00.0") == "00000000:21:00.0"


def test_qwen36_heads_come_from_text_config():
    heads = qwen_heads()
    assert heads == {"num_attention_heads": 24, "num_key_value_heads": 4,
                     "linear_num_key_heads": 16, "linear_num_value_heads": 48}


def test_ct129_tp_is_4_never_7_or_8():
    heads = qwen_heads()
    valid = g.valid_tp(heads, len(CT129_USABLE))
    assert valid == [1, 2, 4]
    assert g.choose_tp(valid) == 4


@pytest.mark.parametrize("tp, reasons", [
    (8, ["tp_size 8 needs 8 GPUs; 7 usable (GPU 1 lost)", "tp_size 8 does not divide num_key_value_heads 4"]),
    (7, ["tp_size 7 does not divide num_attention_heads 24", "tp_size 7 does not divide num_key_value_heads 4",
         "tp_size 7 does not divide linear_num_key_heads 16", "tp_size 7 does not divide linear_num_value_heads 48"]),
    (3, ["tp_size 3 does not divide num_key_value_heads 4", "tp_size 3 does not divide linear_num_key_heads 16"]),
    (0, ["tp_size must be at least 1, got 0"]),
])
def test_requested_tp_that_cannot_work_names_the_reason(tp, reasons):
    assert g.tp_problems(tp, qwen_heads(), 7, "usable", "GPU 1 lost") == reasons


def test_without_a_model_every_fitting_size_is_valid():
    assert g.valid_tp(None, 7) == [1, 2, 3, 4, 5, 6, 7]
    assert g.choose_tp(g.valid_tp(None, 7)) == 4
    assert g.valid_tp(None, 0) == [] and g.choose_tp([]) is None


def test_kv_heads_default_to_attention_heads_and_missing_heads_fail():
    assert g.model_heads({"num_attention_heads": 32}) == {"num_attention_heads": 32, "num_key_value_heads": 32}
    with pytest.raises(g.GpuError, match="num_attention_heads"):
        g.model_heads({"text_config": {"hidden_size": 5120}})


def test_driver_failures_are_explained(tmp_path):
    rc, text = smi(tmp_path, host="ct129", args=QUERY)
    assert rc == g.EXIT_GPU_LOST
    env = dict(os.environ, SGLANG_SIM_HARDWARE=str(tmp_path / "absent.json"))
    code = "import sys; sys.path.insert(0, sys.argv[1]); from sglang_simulator import nvidia_smi; sys.exit(nvidia_smi.main(sys.argv[2:]))"
    proc = subprocess.run([sys.executable, "-c", code, str(LAB / "simulator"), *QUERY], env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 9
    message = g.explain_failure(proc.returncode, proc.stdout)
    assert message.startswith("nvidia-smi failed (exit 9): the NVIDIA kernel driver is not loaded")
    assert "never installs a kernel driver" in message
    mismatch = g.explain_failure(18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95\n")
    assert "do not match the loaded kernel module" in mismatch and "NVML library version: 580.95" in mismatch


def test_container_kind_sources():
    assert g.container_kind("lxc\n") == ("lxc", "systemd-detect-virt")
    assert g.container_kind("none\n", "lxc") == (None, "systemd-detect-virt")
    assert g.container_kind(None, "lxc\n") == ("lxc", "/run/systemd/container")
    assert g.container_kind(None, None, b"PATH=/usr/bin\0container=lxc\0TERM=linux\0") == ("lxc", "/proc/1/environ")
    assert g.container_kind(None, None, b"PATH=/usr/bin\0") == (None, None)


def test_container_problems():
    assert g.container_problems("580.95.05", "580.95.05", {}) == []
    problems = g.container_problems("580.82.07", "580.95.05", {"/dev/nvidia-uvm": "missing"})
    assert problems == [
        "user-space driver 580.82.07 does not match the kernel module 580.95.05: install the 580.95.05 "
        "user-space libraries in the container (never a kernel driver)",
        "device node /dev/nvidia-uvm is missing: pass it through to the container",
    ]
    assert g.container_problems("580.95.05", None, {}, "/x/version")[0].startswith(
        "the NVIDIA kernel module's version is not readable (/x/version)")
    nodes = {"/dev/nvidia-uvm": "missing", "/dev/nvidia3": "missing", "/dev/nvidia0": "not a character device"}
    assert g.container_problems("580.95.05", "580.95.05", nodes) == [
        "device nodes /dev/nvidia-uvm, /dev/nvidia3 are missing: pass them through to the container",
        "device node /dev/nvidia0 is not a character device: pass it through to the container",
    ]


def runner(tmp_path, host: str = "ct129", **changes):
    """A run_command (AnsibleModule's signature) that runs the lab's fake nvidia-smi, and the argvs it ran."""
    calls: list[list[str]] = []

    def run_command(argv):
        calls.append(list(argv))
        assert argv[0] == "nvidia-smi"
        code, out = smi(tmp_path, host, list(argv[1:]), **changes)
        return code, out, ""

    return run_command, calls


def test_read_inventory_places_the_lost_gpu_with_the_listing(tmp_path):
    run_command, calls = runner(tmp_path)
    read = g.read_inventory(run_command)
    assert read["error"] is None and read["fields"] == g.QUERY_FIELDS
    assert [x["index"] for x in read["gpus"]] == list(range(8)) and g.usable(read["gpus"]) == [0, 2, 3, 4, 5, 6, 7]
    assert read["gpus"][1]["state"] == "lost"
    assert calls[-1] == ["nvidia-smi", "-L"]  # asked only because a GPU could not be opened


def test_read_inventory_without_a_gpu_explains(tmp_path):
    def run_command(argv):
        return 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", ""

    read = g.read_inventory(run_command)
    assert read["gpus"] == [] and "the NVIDIA kernel driver is not loaded" in read["error"]


def test_read_inventory_without_compute_cap(tmp_path):
    seen = []

    def run_command(argv):
        seen.append(argv)
        if "compute_cap" in argv[1]:
            return 2, 'Field "compute_cap" is not a valid field to query.', ""
        return 0, "0, NVIDIA RTX A6000, GPU-0, 00000000:01:00.0, 49140, 1, 535.54.03\n", ""

    read = g.read_inventory(run_command)
    assert read["fields"] == tuple(f for f in g.QUERY_FIELDS if f != "compute_cap")
    assert read["gpus"][0]["memory_total_mib"] == 49140 and len(seen) == 2


def test_device_memory_names_the_lost_gpu(tmp_path):
    run_command, calls = runner(tmp_path)
    memory, problems = g.device_memory(run_command, [0, 1, 2])
    assert memory == [49140, 49140]
    assert len(problems) == 1 and problems[0].startswith("GPU 1 is not usable: ")
    assert problems[0] == ("GPU 1 is not usable: Unable to determine the device handle for GPU0000:21:00.0: "
                           "GPU is lost. Reboot the system to recover this GPU")
    assert calls[0][:3] == ["nvidia-smi", "-i", "0"]


def test_device_minor(tmp_path):
    gpu = {"index": 0, "pci_bus_id": "00000000:21:00.0"}
    assert g.device_minor(str(tmp_path), gpu) is None
    info = tmp_path / "gpus" / "0000:21:00.0"
    info.mkdir(parents=True)
    (info / "information").write_text("Model: \t\t NVIDIA RTX A6000\nDevice Minor: \t 3\n")
    assert g.device_minor(str(tmp_path), gpu) == 3
