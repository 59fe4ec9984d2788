"""The fake nvidia-smi prints the real tool's formats and its lost-GPU error."""

from __future__ import annotations

import pytest
from sglang_simulator import hardware as hw
from sglang_simulator import nvidia_smi


@pytest.fixture
def ct129(hardware, monkeypatch):
    for key, value in hardware("ct129").items():
        if key.startswith("SGLANG_SIM"):
            monkeypatch.setenv(key, value)


def run(capsys, *args):
    rc = nvidia_smi.main(list(args))
    return rc, capsys.readouterr().out.splitlines()


def test_csv_with_header_and_units(ct129, capsys):
    rc, lines = run(capsys, "--query-gpu=index,name,memory.total,memory.used", "--format=csv")
    assert lines[0] == "index, name, memory.total [MiB], memory.used [MiB]"
    assert lines[1] == "0, NVIDIA RTX A6000, 49140 MiB, 0 MiB"
    assert rc == nvidia_smi.NVML_ERROR_GPU_IS_LOST
    assert lines[-1] == ("Unable to determine the device handle for GPU0000:21:00.0: GPU is lost.  "
                         "Reboot the system to recover this GPU")
    assert len(lines) == 1 + 7 + 1


def test_selecting_healthy_gpus_succeeds(ct129, capsys):
    rc, lines = run(capsys, "-i", "0,2", "--query-gpu=index,compute_cap,driver_version", "--format=csv,noheader,nounits")
    assert rc == 0 and lines == ["0, 8.6, 580.95.05", "2, 8.6, 580.95.05"]


def test_invalid_field(ct129, capsys):
    rc, lines = run(capsys, "--query-gpu=index,bogus", "--format=csv")
    assert rc == 2 and lines == ['Field "bogus" is not a valid field to query.']


def test_list_and_version(ct129, capsys):
    rc, lines = run(capsys, "-L")
    assert rc == 15 and lines[0].startswith("GPU 0: NVIDIA RTX A6000 (UUID: GPU-")
    rc, lines = run(capsys, "--version")
    assert rc == 0 and "CUDA Version        : 13.0" in lines


def test_memory_used_comes_from_live_ledger_entries(ct129, capsys):
    ledger = hw.Ledger("test")
    ledger.hold(2, 1234)
    try:
        lines = run(capsys, "-i", "2", "--query-gpu=memory.used,memory.free", "--format=csv,noheader,nounits")[1]
        assert lines == [f"1234, {49140 - 1234}"]
    finally:
        ledger.release()
    lines = run(capsys, "-i", "2", "--query-gpu=memory.used", "--format=csv,noheader,nounits")[1]
    assert lines == ["0"]


def test_q_x_is_the_xml_the_collection_reads_and_names_a_lost_gpu_after_it(ct129, capsys, monkeypatch, tmp_path):
    """The fake's -q -x read by the collection's own reader: each GPU's health as its hardware file says."""
    import json
    from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
    data = json.loads(open(hw.hardware_path()).read())
    data["gpus"][2]["health"] = {"remap_pending": True, "remapped_uncorrectable": 2, "aggregate_uncorrected": 2}
    data["gpus"][3]["health"] = {"ecc": "Disabled", "ecc_pending": "Enabled"}
    path = tmp_path / "sick.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("SGLANG_SIM_HARDWARE", str(path))
    rc, lines = run(capsys, "-q", "-x")
    assert rc == nvidia_smi.NVML_ERROR_GPU_IS_LOST and lines[-1].startswith("Unable to determine the device handle")
    read = _gpu_health.parse_smi_xml("\n".join(lines))
    assert len(read) == 7 and "00000000:21:00.0" not in read
    assert read["00000000:41:00.0"]["remap"] == {"supported": True, "correctable": 0, "uncorrectable": 2,
                                                 "pending": True, "failure": False}
    assert read["00000000:41:00.0"]["aggregate"]["uncorrected"] == 2
    assert read["00000000:61:00.0"]["ecc"] == {"current": "Disabled", "pending": "Enabled"}
    assert read["00000000:61:00.0"]["volatile"] == {"corrected": None, "uncorrected": None}
    assert run(capsys, "-q")[0] == 2   # the text form is not faked: the collection reads the XML


def test_dmesg_prints_the_labs_kernel_log_in_order(ct129, capsys):
    from sglang_simulator import dmesg
    gpu = hw.load().gpu(2)
    hw.log_kernel(hw.xid_line(gpu, 13, hw.XID_DETAIL[13], 4242, "python3"), name="kernel-b.log")
    hw.log_kernel(hw.xid_line(gpu, 79, "GPU has fallen off the bus."), name="kernel-a.log")
    assert dmesg.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[    0.000000] Linux version ")
    assert [line.split("): ", 1)[1][:2] for line in lines[1:]] == ["13", "79"]   # by time, not by file
    assert lines[1].endswith("NVRM: Xid (PCI:0000:41:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on "
                             "(GPC 8, TPC 5, SM 0): Out Of Range Address")
    assert dmesg.main(["-T"]) == 1
