"""Fake ``nvidia-smi`` for lab hosts (a test double), driven by the hardware file.

Prints what the real tool prints for the queries the collection uses:
``--query-gpu=FIELDS --format=csv[,noheader][,nounits] [-i IDS]``,
``--query-compute-apps=FIELDS --format=csv...``, ``-L``, ``--version``, ``-q -x``
(the XML document of DTD v12, with each GPU's ECC, retired-page and row-remap
state from its ``health`` in the hardware file) and the default table. Memory used comes from the simulator's GPU ledger, so a running
(or still releasing) simulated server shows up as it would on a real host.

A GPU whose ``state`` is ``lost`` cannot be opened: in its place the tool prints
NVML's message, "Unable to determine the device handle for GPU<bus id>: GPU is
lost.  Reboot the system to recover this GPU", and exits with NVML's code for
it (15) after listing the GPUs it could read.
"""

from __future__ import annotations

import sys

from . import hardware as hw

NVML_ERROR_GPU_IS_LOST = 15
INVALID_ARGUMENT = 2


def _lost_line(gpu: hw.Gpu) -> str:
    return f"Unable to determine the device handle for GPU{gpu.pci_bus_id[4:]}: GPU is lost.  Reboot the system to recover this GPU"


def _fields(gpu: hw.Gpu, hardware: hw.Hardware) -> dict[str, tuple[str, str]]:
    """field -> (value, unit); unit '' when the field has none."""
    used = hw.used_mib(gpu.index)
    busy = used > 0
    return {
        "index": (str(gpu.index), ""),
        "name": (gpu.name, ""),
        "gpu_name": (gpu.name, ""),
        "uuid": (gpu.uuid, ""),
        "gpu_uuid": (gpu.uuid, ""),
        "pci.bus_id": (gpu.pci_bus_id, ""),
        "gpu_bus_id": (gpu.pci_bus_id, ""),
        "memory.total": (str(gpu.memory_total_mib), "MiB"),
        "memory.used": (str(used), "MiB"),
        "memory.free": (str(gpu.memory_total_mib - used), "MiB"),
        "compute_cap": (gpu.compute_cap, ""),
        "driver_version": (hardware.driver_version, ""),
        "count": (str(len(hardware.gpus)), ""),
        "temperature.gpu": ("62" if busy else "34", ""),
        "utilization.gpu": ("87" if busy else "0", "%"),
        "utilization.memory": ("41" if busy else "0", "%"),
        "power.draw": ("211.37" if busy else "22.18", "W"),
        "power.limit": (f"{gpu.power_limit_w:.2f}", "W"),
        "pstate": ("P2" if busy else "P8", ""),
        "persistence_mode": ("Enabled", ""),
        "compute_mode": ("Default", ""),
        "display_mode": ("Disabled", ""),
        "ecc.errors.uncorrected.volatile.total": ("0", ""),
    }


def _format(fmt: set[str], header: list[str], rows: list[list[tuple[str, str]]]) -> list[str]:
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(header))
    for row in rows:
        values = []
        for value, unit in row:
            if unit and "nounits" not in fmt:
                value = f"{value} %" if unit == "%" else f"{value} {unit}"
            values.append(value)
        lines.append(", ".join(values))
    return lines


def _parse(argv: list[str]) -> dict[str, str]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            key, value = arg.split("=", 1)
            opts[key] = value
        elif arg in ("-i", "--id", "--format", "--query-gpu", "--query-compute-apps"):
            opts["-i" if arg == "--id" else arg] = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        else:
            opts[arg] = ""
        i += 1
    return opts


def _selected(hardware: hw.Hardware, ids: str | None) -> list[hw.Gpu]:
    if not ids:
        return list(hardware.gpus)
    chosen = []
    for token in ids.split(","):
        token = token.strip()
        for gpu in hardware.gpus:
            if token in (str(gpu.index), gpu.uuid, gpu.pci_bus_id):
                chosen.append(gpu)
                break
        else:
            raise LookupError(f"No devices were found matching the id {token}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        hardware = hw.load()
    except hw.HardwareError:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
        return 9
    opts = _parse(argv)
    out: list[str] = []
    try:
        gpus = _selected(hardware, opts.get("-i"))
    except LookupError as exc:
        print(exc)
        return 6
    lost = [g for g in gpus if g.lost]

    if "--version" in opts:
        major = ".".join(hardware.driver_version.split(".")[:2])
        print(f"NVIDIA-SMI version  : {hardware.driver_version}\nNVML version        : {major}\n"
              f"DRIVER version      : {hardware.driver_version}\nCUDA Version        : {hardware.cuda_version}")
        return 0
    if "-L" in opts or "--list-gpus" in opts:
        for gpu in gpus:
            out.append(_lost_line(gpu) if gpu.lost else f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})")
        print("\n".join(out))
        return NVML_ERROR_GPU_IS_LOST if lost else 0

    if "-q" in opts or "--query" in opts:
        if "-x" not in opts and "--xml-format" not in opts:
            print("the lab's nvidia-smi prints -q only as XML (-q -x)")
            return INVALID_ARGUMENT
        print(_xml(hardware, gpus))
        return NVML_ERROR_GPU_IS_LOST if lost else 0

    fmt = set(opts.get("--format", "").split(","))
    if "--query-gpu" in opts:
        if "csv" not in fmt:
            print('"--format" must be specified when querying.')  # the real tool insists
            return INVALID_ARGUMENT
        names = [f.strip() for f in opts["--query-gpu"].split(",") if f.strip()]
        sample = _fields(hardware.gpus[0], hardware)
        for name in names:
            if name not in sample:
                print(f'Field "{name}" is not a valid field to query.')
                return INVALID_ARGUMENT
        header = [f"{n} [{sample[n][1]}]" if sample[n][1] else n for n in names]
        rows = []
        for gpu in gpus:
            if gpu.lost:
                continue
            fields = _fields(gpu, hardware)
            rows.append([fields[n] for n in names])
        out = _format(fmt, header, rows)
        out += [_lost_line(g) for g in lost]
        print("\n".join(out))
        return NVML_ERROR_GPU_IS_LOST if lost else 0

    if "--query-compute-apps" in opts:
        names = [f.strip() for f in opts["--query-compute-apps"].split(",") if f.strip()]
        allowed = {"pid", "process_name", "name", "used_memory", "used_gpu_memory", "gpu_uuid", "gpu_bus_id", "gpu_name"}
        for name in names:
            if name not in allowed:
                print(f'Field "{name}" is not a valid field to query.')
                return INVALID_ARGUMENT
        header = [f"{n} [MiB]" if n in ("used_memory", "used_gpu_memory") else n for n in names]
        rows = []
        for entry in hw.ledger_entries():
            for index, mib in sorted(entry.get("gpus", {}).items()):
                gpu = hardware.gpu(int(index))
                if gpu not in gpus or gpu.lost:
                    continue
                values = {
                    "pid": (str(entry["pid"]), ""), "process_name": (entry.get("name", "python3"), ""),
                    "name": (entry.get("name", "python3"), ""), "used_memory": (str(mib), "MiB"),
                    "used_gpu_memory": (str(mib), "MiB"), "gpu_uuid": (gpu.uuid, ""),
                    "gpu_bus_id": (gpu.pci_bus_id, ""), "gpu_name": (gpu.name, ""),
                }
                rows.append([values[n] for n in names])
        out = _format(fmt, header, rows) + [_lost_line(g) for g in lost]
        print("\n".join(out))
        return NVML_ERROR_GPU_IS_LOST if lost else 0

    print(_table(hardware, gpus))
    return NVML_ERROR_GPU_IS_LOST if lost else 0


def _xml(hardware: hw.Hardware, gpus: list[hw.Gpu]) -> str:
    """``nvidia-smi -q -x``: the elements of DTD v12 the collection reads (a real document has many more);
    an Ampere-or-newer card's layout (SRAM/DRAM counters, a row remapper, page retirement N/A). A lost GPU
    is named in NVML's line after the document, as the real tool names it."""
    lines = ['<?xml version="1.0" ?>', '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">', "<nvidia_smi_log>",
             f"\t<driver_version>{hardware.driver_version}</driver_version>",
             f"\t<cuda_version>{hardware.cuda_version}</cuda_version>",
             f"\t<attached_gpus>{len(hardware.gpus)}</attached_gpus>"]
    for gpu in gpus:
        if gpu.lost:
            continue
        health = gpu.health
        ecc = health.get("ecc", "Enabled")
        on = ecc == "Enabled"

        def count(key: str) -> str:
            return str(int(health.get(key, 0))) if on else "N/A"

        def yes(key: str) -> str:
            return "Yes" if health.get(key) else "No"

        def counters(kind: str) -> list[str]:
            zero = "0" if on else "N/A"
            return [f"\t\t\t<{kind}>", f"\t\t\t\t<sram_correctable>{zero}</sram_correctable>",
                    f"\t\t\t\t<sram_uncorrectable_parity>{zero}</sram_uncorrectable_parity>",
                    f"\t\t\t\t<sram_uncorrectable_secded>{zero}</sram_uncorrectable_secded>",
                    f"\t\t\t\t<dram_correctable>{zero}</dram_correctable>",
                    f"\t\t\t\t<dram_uncorrectable>{count(kind + '_uncorrected')}</dram_uncorrectable>", f"\t\t\t</{kind}>"]

        lines += [f'\t<gpu id="{gpu.pci_bus_id}">', f"\t\t<product_name>{gpu.name}</product_name>",
                  f"\t\t<uuid>{gpu.uuid}</uuid>",
                  "\t\t<ecc_mode>", f"\t\t\t<current_ecc>{ecc}</current_ecc>",
                  f"\t\t\t<pending_ecc>{health.get('ecc_pending', ecc)}</pending_ecc>", "\t\t</ecc_mode>",
                  "\t\t<ecc_errors>", *counters("volatile"), *counters("aggregate"), "\t\t</ecc_errors>",
                  "\t\t<retired_pages>",
                  "\t\t\t<multiple_single_bit_retirement><retired_count>N/A</retired_count>"
                  "<retired_pagelist>N/A</retired_pagelist></multiple_single_bit_retirement>",
                  "\t\t\t<double_bit_retirement><retired_count>N/A</retired_count>"
                  "<retired_pagelist>N/A</retired_pagelist></double_bit_retirement>",
                  "\t\t\t<pending_blacklist>N/A</pending_blacklist>",
                  "\t\t\t<pending_retirement>N/A</pending_retirement>", "\t\t</retired_pages>",
                  "\t\t<remapped_rows>", "\t\t\t<remapped_row_corr>0</remapped_row_corr>",
                  f"\t\t\t<remapped_row_unc>{int(health.get('remapped_uncorrectable', 0))}</remapped_row_unc>",
                  f"\t\t\t<remapped_row_pending>{yes('remap_pending')}</remapped_row_pending>",
                  f"\t\t\t<remapped_row_failure>{yes('remap_failure')}</remapped_row_failure>", "\t\t</remapped_rows>",
                  f"\t\t<gpu_recovery_action>{health.get('recovery_action', 'None')}</gpu_recovery_action>",
                  "\t</gpu>"]
    lines.append("</nvidia_smi_log>")
    return "\n".join(lines + [_lost_line(g) for g in gpus if g.lost])


def _table(hardware: hw.Hardware, gpus: list[hw.Gpu]) -> str:
    rule = "+-----------------------------------------------------------------------------------------+"
    lines = [
        rule,
        f"| NVIDIA-SMI {hardware.driver_version:<23} Driver Version: {hardware.driver_version:<14} CUDA Version: {hardware.cuda_version:<9}|",
        "|-----------------------------------------+------------------------+----------------------+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|=========================================+========================+======================|",
    ]
    for gpu in gpus:
        if gpu.lost:
            lines.append(f"| {gpu.index:>3}  {_lost_line(gpu)[:80]:<80}   |")
            continue
        f = _fields(gpu, hardware)
        mem = f"{f['memory.used'][0]}MiB / {gpu.memory_total_mib}MiB"
        lines.append(f"| {gpu.index:>3}  {gpu.name[:20]:<20}           On  | {gpu.pci_bus_id[4:]:>16} Off | {'0':>20} |")
        power = f"{float(f['power.draw'][0]):>13.0f}W / {gpu.power_limit_w:>4}W"
        lines.append(
            f"| 30%   {f['temperature.gpu'][0]}C    {f['pstate'][0]}  {power} | {mem:>22} | {f['utilization.gpu'][0]:>7}%      Default |"
        )
        lines.append("+-----------------------------------------+------------------------+----------------------+")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
