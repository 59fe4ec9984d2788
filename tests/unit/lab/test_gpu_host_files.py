"""The archive that makes a lab container a GPU host stand-in (lab/playbooks/files/gpu_host_files.py,
laid by lab/playbooks/tasks/gpu_host.yml with one unarchive)."""

from __future__ import annotations

import importlib.util
import json
import tarfile

from sim_helpers import LAB

SPEC = importlib.util.spec_from_file_location("gpu_host_files", LAB / "playbooks" / "files" / "gpu_host_files.py")
gpu_host_files = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_host_files)


def members(path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {info.name: info for info in tar.getmembers()}


def test_ct129s_archive_stands_in_for_its_usable_gpus_and_driver(tmp_path):
    out = tmp_path / "ct129.tar"
    gpu_host_files.write("ct129", out)
    found = members(out)
    hardware = json.loads((LAB / "hosts" / "ct129" / "hardware.json").read_text())
    usable = {f"nvidia{g['index']}" for g in hardware["gpus"] if g["state"] == "ok"}
    nodes = {name.rsplit("/", 1)[1]: info for name, info in found.items() if name.startswith("etc/inferops-lab/dev/")}
    # GPU 1 is lost on ct129: no device node stands in for it
    assert set(nodes) == usable | {"nvidiactl", "nvidia-uvm"} and "nvidia1" not in nodes
    assert all(info.issym() and info.linkname == "/dev/null" for info in nodes.values())
    with tarfile.open(out) as tar:
        version = tar.extractfile("etc/inferops-lab/proc-driver-nvidia/version").read().decode()
        smi = tar.extractfile("usr/bin/nvidia-smi").read().decode()
        assert tar.extractfile("etc/inferops-lab/hardware.json").read() == (LAB / "hosts/ct129/hardware.json").read_bytes()
    assert f"Kernel Module  {hardware['driver_version']}  " in version
    assert "from sglang_simulator.nvidia_smi import main" in smi and found["usr/bin/nvidia-smi"].mode == 0o755
    assert found["run/inferops-lab/gpu"].isdir() and found["run/inferops-lab/gpu"].mode == 0o1777
    assert "srv/models/Qwen3.6-27B/config.json" in found and "opt/inferops-lab/lib/sglang_simulator/server.py" in found
    assert not [name for name in found if "__pycache__" in name or name.endswith(".pyc")]
    # the host's own directories are not entries: extracting keeps their owners and modes
    assert not {"etc", "usr", "usr/bin", "run", "srv", "opt", "etc/tmpfiles.d"} & set(found)
    assert {(info.uid, info.gid, info.mtime) for info in found.values()} == {(0, 0, gpu_host_files.MTIME)}


def test_the_same_inputs_give_the_same_bytes(tmp_path):
    for name, host in (("a.tar", "ct200"), ("b.tar", "ct200"), ("c.tar", "ct129")):
        gpu_host_files.write(host, tmp_path / name)
    data = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(data) == ["a.tar", "b.tar", "c.tar"]  # no temporary file left
    assert data["a.tar"] == data["b.tar"] and data["a.tar"] != data["c.tar"]
