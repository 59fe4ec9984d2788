"""Every file a lab container needs to stand in for one GPU host of the fleet, as
one tar archive laid with a single unarchive (tasks/gpu_host.yml): a module run
per file cost about a second for each of ten tasks on each host of each scenario.

    python3 lab/playbooks/files/gpu_host_files.py --host ct200 --out FILE

The archive holds the host's hardware file (lab/hosts/<host>/hardware.json), the
fake nvidia-smi and dmesg (test doubles over the simulator's library), the stand-ins for
the kernel module's /proc/driver/nvidia/version and the passed-through
/dev/nvidia* nodes (links to /dev/null, a real character device, one per usable
GPU), the simulated GPU memory ledger's directory (now, and at boot through
tmpfiles.d), the simulator library and the model directories (config and index
only). Byte for byte the same for the same inputs (sorted, fixed times, root's),
written to a temporary name and renamed: two scenarios preparing at once write the
same bytes. Only the lab's own directories are entries: the host's /etc, /usr/bin
and /run keep their owners and modes.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

LAB = Path(__file__).resolve().parents[2]
MTIME = 1767225600  # 2026-01-01: same inputs, same archive
MODELS = ("Qwen3.6-27B", "Qwen3.6-27B-DFlash")
NVIDIA_SMI = b'''#!/usr/bin/python3
"""Fake nvidia-smi of the inferops.sglang lab (a test double)."""
import sys
sys.path.insert(0, "/opt/inferops-lab/lib")
from sglang_simulator.nvidia_smi import main
sys.exit(main())
'''
DMESG = b'''#!/usr/bin/python3
"""Fake dmesg of the inferops.sglang lab (a test double): the lab's kernel log."""
import sys
sys.path.insert(0, "/opt/inferops-lab/lib")
from sglang_simulator.dmesg import main
sys.exit(main())
'''
DIRECTORIES = {  # the lab's own directories and their modes
    "etc/inferops-lab": 0o755,
    "etc/inferops-lab/proc-driver-nvidia": 0o755,
    "etc/inferops-lab/dev": 0o755,
    "opt/inferops-lab": 0o755,
    "opt/inferops-lab/lib": 0o755,
    "run/inferops-lab": 0o755,
    "run/inferops-lab/gpu": 0o1777,  # the ledger: every service user's server writes its own file
    "srv/models": 0o755,
}


def entries(host: str) -> list[tuple[str, int, bytes | None, str | None]]:
    """(path, mode, content or None for a directory, link target or None) of one host's files."""
    hardware_file = LAB / "hosts" / host / "hardware.json"
    hardware = json.loads(hardware_file.read_text())
    out: list[tuple[str, int, bytes | None, str | None]] = [(p, m, None, None) for p, m in DIRECTORIES.items()]
    out.append(("etc/inferops-lab/hardware.json", 0o644, hardware_file.read_bytes(), None))
    out.append(("usr/bin/nvidia-smi", 0o755, NVIDIA_SMI, None))
    out.append(("usr/bin/dmesg", 0o755, DMESG, None))  # replaces util-linux's: the container's kernel is the CI machine's
    out.append(("etc/inferops-lab/proc-driver-nvidia/version", 0o644,
                (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {hardware['driver_version']}  "
                 "Tue Sep 23 09:55:41 UTC 2025\n").encode(), None))
    usable = [str(gpu["index"]) for gpu in hardware["gpus"] if gpu["state"] == "ok"]
    for node in ["nvidiactl", "nvidia-uvm", *(f"nvidia{index}" for index in usable)]:
        out.append((f"etc/inferops-lab/dev/{node}", 0o777, None, "/dev/null"))
    out.append(("etc/tmpfiles.d/inferops-lab.conf", 0o644, b"d /run/inferops-lab/gpu 1777 root root -\n", None))
    trees = [(LAB / "simulator" / "sglang_simulator", "opt/inferops-lab/lib/sglang_simulator")]
    trees += [(LAB / "models" / name, f"srv/models/{name}") for name in MODELS]
    for root, prefix in trees:
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root)
            if "__pycache__" in relative.parts or path.suffix == ".pyc":
                continue
            name = f"{prefix}/{relative.as_posix()}"
            out.append((name, 0o755, None, None) if path.is_dir() else (name, 0o644, path.read_bytes(), None))
        out.append((prefix, 0o755, None, None))
    return sorted(set(out), key=lambda entry: entry[0])


def write(host: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    try:
        with os.fdopen(fd, "wb") as handle, tarfile.open(fileobj=handle, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for name, mode, content, link in entries(host):
                info = tarfile.TarInfo(name)
                info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = mode, MTIME, 0, 0, "root", "root"
                if link is not None:
                    info.type, info.linkname = tarfile.SYMTYPE, link
                    tar.addfile(info)
                elif content is None:
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                else:
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--host", required=True, help="a lab host (lab/hosts/<host>/hardware.json)")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    write(args.host, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
