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
