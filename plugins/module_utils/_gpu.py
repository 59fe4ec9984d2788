# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU facts from ``nvidia-smi`` output, and what follows from them.

The modules' one reader of ``nvidia-smi``: every module that asks the
tool anything runs it through ``read_inventory``, ``read_versions`` or
``device_memory`` here (with the module's ``run_command``), and everything else
is pure functions over the tool's text, so every format is tested as printed:

- the inventory: ``--query-gpu=QUERY_FIELDS --format=csv,noheader,nounits``
  (units and a header are tolerated), the NVML error line the tool prints in
  place of a GPU it cannot open ("Unable to determine the device handle for
  GPU0000:21:00.0: GPU is lost.  Reboot the system to recover this GPU", exit
  15) and ``-L`` (which places that line at the lost GPU's index);
- versions: ``--version`` (or the default table's header) and the kernel
  module's ``/proc/driver/nvidia/version``;
- the usable set, ``CUDA_VISIBLE_DEVICES`` and the tensor-parallel sizes a
  model can use on it (TP must divide the attention and KV head counts and fit
  the usable GPUs);
- container (LXC) checks: user space against the kernel module, device nodes.
"""

from __future__ import annotations

import csv
import os
import re

from ansible_collections.inferops.sglang.plugins.module_utils import _model_config

QUERY_FIELDS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "memory.used", "compute_cap", "driver_version")
EXIT_GPU_LOST = 15

# Values nvidia-smi prints in brackets. These two only mean "no value here";
# any other bracketed value ("[GPU requires reset]", "[Unknown Error]") is a fault.
_NO_VALUE = ("[N/A]", "[Not Supported]", "N/A")
_BUS_ID = r"(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
_HANDLE_ERROR = re.compile(r"Unable to determine the device handle for (?:GPU|gpu)\s*(" + _BUS_ID + r"):\s*(.*)$")
_LIST_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?$")
_KERNEL_MODULE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
_VERSION_LINE = re.compile(r"^\s*(NVIDIA-SMI|NVML|DRIVER|CUDA) version\s*:\s*(\S+)", re.IGNORECASE)
_TABLE_CUDA = re.compile(r"CUDA Version:\s*(\d+\.\d+)")
_TABLE_SMI = re.compile(r"NVIDIA-SMI\s+(\d+\.\d+(?:\.\d+)?)")

# The tool's own failures: (text it prints, what it means).
_TOOL_FAILURES = (
    ("couldn't communicate with the NVIDIA driver",
     "the NVIDIA kernel driver is not loaded (or not installed) on this host; in a container it is the "
     "hypervisor's module that must be loaded. This collection never installs a kernel driver"),
    ("Driver/library version mismatch",
     "the driver's user-space libraries do not match the loaded kernel module (upgraded without a reboot, "
     "or a container whose libraries differ from the hypervisor's driver)"),
    ("No devices were found", "the driver is loaded but sees no GPU"),
    ("Failed to initialize NVML", "NVML cannot start (in a container: are the /dev/nvidia* nodes passed through?)"),
    ("Insufficient Permissions", "this user may not open the GPU device nodes"),
)


class GpuError(Exception):
    """nvidia-smi or the model config cannot be used; the message says why."""


def normalize_bus_id(text: str) -> str:
    """PCI bus id in nvidia-smi's query form, ``00000000:21:00.0`` (an 8-digit domain, upper case)."""
    text = (text or "").strip()
    match = re.fullmatch(r"(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])", text)
    if not match:
        return text.upper()
    domain = int(match.group(1) or "0", 16)
    return f"{domain:08X}:{match.group(2).upper()}:{match.group(3).upper()}.{match.group(4)}"


def explain_failure(rc: int, output: str) -> str:
    """Operator message for nvidia-smi failing without listing any GPU."""
    text = " ".join((output or "").split())
    for needle, meaning in _TOOL_FAILURES:
        if needle.lower() in text.lower():
            return f"nvidia-smi failed (exit {rc}): {meaning}. It said: {text[:400]}"
    return f"nvidia-smi failed (exit {rc}): {text[:400] or 'no output'}"


def _number(value: str | None) -> int | None:
    if value is None:
        return None
    match = re.match(r"\s*(\d+)", value)
    return int(match.group(1)) if match else None


def _value(raw: str) -> tuple[str | None, str | None]:
    """(value, fault): a bracketed value other than N/A is a fault of the GPU."""
    raw = raw.strip()
    if raw in _NO_VALUE:
        return None, None
    if raw.startswith("[") and raw.endswith("]"):
        return None, raw[1:-1]
    return raw, None


def parse_query(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> tuple[list[dict], list[dict], list[str]]:
    """Rows of a ``--query-gpu`` CSV: (gpus, handle errors, other lines).

    Units ("49140 MiB") and a header line are accepted. A handle error is
    ``{"pci_bus_id", "problem"}`` for a GPU the tool could not open.
    """
    gpus: list[dict] = []
    errors: list[dict] = []
    other: list[str] = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        handle = _HANDLE_ERROR.search(line)
        if handle:
            errors.append({"pci_bus_id": normalize_bus_id(handle.group(1)), "problem": " ".join(handle.group(2).split())})
            continue
        cells = next(csv.reader([line], skipinitialspace=True))
        if len(cells) != len(fields):
            other.append(line)
            continue
        row = dict(zip(fields, cells))
        if row.get("index", "").strip() == "index":
            continue  # the header
        values: dict[str, str | None] = {}
        faults = []
        for name, raw in row.items():
            value, fault = _value(raw)
            values[name] = value
            if fault:
                faults.append(f"{name} reads [{fault}]")
        index = _number(values.get("index"))
        if index is None:
            other.append(line)
            continue
        gpus.append({
            "index": index,
            "name": values.get("name"),
            "uuid": values.get("uuid"),
            "pci_bus_id": normalize_bus_id(values["pci.bus_id"]) if values.get("pci.bus_id") else None,
            "memory_total_mib": _number(values.get("memory.total")),
            "memory_used_mib": _number(values.get("memory.used")),
            "compute_capability": values.get("compute_cap"),
            "driver_version": values.get("driver_version"),
            "state": "error" if faults else "ok",
            "usable": not faults,
            "problem": "; ".join(faults) or None,
        })
    return gpus, errors, other


def parse_list(text: str) -> list[dict]:
    """``nvidia-smi -L`` in order: ``{"index", "name", "uuid"}`` or, for a GPU it cannot
    open, ``{"index": position, "pci_bus_id", "problem"}``. MIG device lines are skipped."""
    entries: list[dict] = []
    for line in (text or "").splitlines():
        if not line.strip() or line[:1].isspace():
            continue
        handle = _HANDLE_ERROR.search(line)
        if handle:
            entries.append({"index": len(entries), "pci_bus_id": normalize_bus_id(handle.group(1)),
                            "problem": " ".join(handle.group(2).split())})
            continue
        match = _LIST_LINE.match(line.strip())
        if match:
            entries.append({"index": int(match.group(1)), "name": match.group(2), "uuid": match.group(3)})
    return entries


def parse_versions(text: str) -> dict:
    """``nvidia-smi --version`` (or the default table): the tool's, NVML's, the driver's and CUDA's versions."""
    found: dict[str, str | None] = {"nvidia_smi_version": None, "nvml_version": None, "driver_version": None,
                                    "cuda_version": None}
    keys = {"nvidia-smi": "nvidia_smi_version", "nvml": "nvml_version", "driver": "driver_version", "cuda": "cuda_version"}
    for line in (text or "").splitlines():
        match = _VERSION_LINE.match(line)
        if match:
            found[keys[match.group(1).lower()]] = match.group(2)
    if not found["cuda_version"]:
        match = _TABLE_CUDA.search(text or "")
        found["cuda_version"] = match.group(1) if match else None
    if not found["nvidia_smi_version"]:
        match = _TABLE_SMI.search(text or "")
        found["nvidia_smi_version"] = match.group(1) if match else None
    return found


def parse_kernel_module_version(text: str) -> str | None:
    """The version in ``/proc/driver/nvidia/version``:
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  ..." (or the open module's wording)."""
    match = _KERNEL_MODULE.search(text or "")
    return match.group(1) if match else None


def parse_device_minor(text: str) -> int | None:
    """"Device Minor:" of ``/proc/driver/nvidia/gpus/<bus id>/information``."""
    match = re.search(r"^Device Minor:\s*(\d+)", text or "", re.MULTILINE)
    return int(match.group(1)) if match else None


def _lost_index(error: dict, listing: list[dict], gpus: list[dict], errors: list[dict], taken: set[int]) -> int:
    """Index of a GPU the tool could not open: its place in ``-L``, else its place in bus order."""
    for entry in listing:
        if entry.get("pci_bus_id") == error["pci_bus_id"] and entry["index"] not in taken:
            return entry["index"]
    buses = sorted({g["pci_bus_id"] for g in gpus if g["pci_bus_id"]} | {e["pci_bus_id"] for e in errors})
    position = buses.index(error["pci_bus_id"])
    # Bus order is the enumeration order when it agrees with the GPUs that were read.
    if all(buses.index(g["pci_bus_id"]) == g["index"] for g in gpus if g["pci_bus_id"]) and position not in taken:
        return position
    index = 0
    while index in taken:
        index += 1
    return index


def inventory(query_text: str, list_text: str = "", fields: tuple[str, ...] = QUERY_FIELDS) -> list[dict]:
    """Every GPU, sorted by index: the ones read from the query and, unusable, the ones it could not open."""
    gpus, errors, _other = parse_query(query_text, fields)
    listing = parse_list(list_text)
    taken = {g["index"] for g in gpus}
    for error in errors:
        index = _lost_index(error, listing, gpus, errors, taken)
        taken.add(index)
        named = next((e for e in listing if e["index"] == index and e.get("uuid")), {})
        gpus.append({
            "index": index, "name": named.get("name"), "uuid": named.get("uuid"), "pci_bus_id": error["pci_bus_id"],
            "memory_total_mib": None, "memory_used_mib": None, "compute_capability": None, "driver_version": None,
            "state": "lost" if "lost" in error["problem"].lower() else "error",
            "usable": False, "problem": error["problem"],
        })
    return sorted(gpus, key=lambda g: g["index"])


def handle_errors(query_text: str) -> bool:
    """Whether the tool printed a GPU it could not open (then ``-L`` tells where it sits)."""
    return bool(parse_query(query_text)[1])


def usable(gpus: list[dict]) -> list[int]:
    return [g["index"] for g in gpus if g["usable"]]


def cuda_visible_devices(indices: list[int]) -> str:
    return ",".join(str(i) for i in indices)


def describe_unusable(gpus: list[dict]) -> str:
    """"GPU 1 lost", "GPUs 1, 3 lost; GPU 5 unusable; GPU 6 sick" ('' when all are usable)."""
    parts = []
    for state, word in (("lost", "lost"), ("error", "unusable"), ("sick", "sick")):
        indices = [str(g["index"]) for g in gpus if not g["usable"] and g["state"] == state]
        if indices:
            parts.append(f"GPU{'s' if len(indices) > 1 else ''} {', '.join(indices)} {word}")
    return "; ".join(parts)


def model_heads(config: dict) -> dict:
    """The head counts tensor parallelism splits, from a model's ``config.json``
    (``_model_config.heads``, the one reader of model configs)."""
    return _model_config.heads(config, error=GpuError)


def tp_problems(tp_size: int, heads: dict | None, available: int, shortfall: str = "usable", why: str = "") -> list[str]:
    """Why ``tp_size`` cannot work: it must fit the ``available`` GPUs and divide every head count."""
    if tp_size < 1:
        return [f"tp_size must be at least 1, got {tp_size}"]
    problems = []
    if tp_size > available:
        problems.append(f"tp_size {tp_size} needs {tp_size} GPUs; {available} {shortfall}" + (f" ({why})" if why else ""))
    for key, count in (heads or {}).items():
        if count % tp_size:
            problems.append(f"tp_size {tp_size} does not divide {key} {count}")
    return problems


def valid_tp(heads: dict | None, available: int) -> list[int]:
    return [tp for tp in range(1, available + 1) if not tp_problems(tp, heads, available)]


def choose_tp(valid: list[int]) -> int | None:
    """The largest power of two among the valid sizes (7 usable GPUs and 24/4 heads: 4)."""
    powers = [tp for tp in valid if tp & (tp - 1) == 0]
    return max(powers) if powers else None


# -- the one reader: every module's nvidia-smi run goes through these --

def query_command(nvidia_smi: str = "nvidia-smi", fields: tuple[str, ...] = QUERY_FIELDS,
                  devices: list[int] | None = None) -> list[str]:
    argv = [nvidia_smi]
    if devices:
        argv += ["-i", ",".join(str(d) for d in devices)]
    return argv + ["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


def read_inventory(run_command, nvidia_smi: str = "nvidia-smi") -> dict:
    """Every GPU of the host with ``run_command`` (AnsibleModule.run_command):
    ``{"gpus": inventory(), "fields", "rc", "query", "error"}``. ``error`` is the
    operator message when the tool lists no GPU at all (None otherwise). Drivers
    too old to query ``compute_cap`` are read without it; when a GPU cannot be
    opened, ``nvidia-smi -L`` places it at its index."""
    fields = QUERY_FIELDS
    rc, out, err = run_command(query_command(nvidia_smi, fields))
    if rc != 0 and "compute_cap" in out + err and "not a valid field" in out + err:
        fields = tuple(f for f in fields if f != "compute_cap")
        rc, out, err = run_command(query_command(nvidia_smi, fields))
    listing = ""
    if handle_errors(out):
        _rc, listing, _err = run_command([nvidia_smi, "-L"])
    gpus = inventory(out, listing, fields)
    error = None
    if not gpus:
        error = explain_failure(rc, out + "\n" + err) if rc != 0 else "nvidia-smi lists no GPU"
    return {"gpus": gpus, "fields": fields, "rc": rc, "query": out, "error": error}


def read_versions(run_command, nvidia_smi: str = "nvidia-smi") -> dict:
    """``parse_versions`` of ``nvidia-smi --version``, else of the default table."""
    rc, out, _err = run_command([nvidia_smi, "--version"])
    found = parse_versions(out if rc == 0 else "")
    if not found["cuda_version"]:
        _rc, out, _err = run_command([nvidia_smi])
        table = parse_versions(out)
        found = {key: found[key] or table[key] for key in found}
    return found


def device_memory(run_command, devices: list[int], nvidia_smi: str = "nvidia-smi") -> tuple[list[int], list[str]]:
    """(memory.total MiB of each GPU, problems): one ``nvidia-smi -i N`` per GPU, so a
    GPU the tool cannot open is named with what the tool said while the others still answer."""
    memory, problems = [], []
    fields = ("index", "name", "memory.total")
    for device in devices:
        rc, out, err = run_command(query_command(nvidia_smi, fields, [device]))
        if rc != 0:
            problems.append(f"GPU {device} is not usable: {' '.join((out + ' ' + err).split()) or f'exit code {rc}'}")
            continue
        gpus, errors, _other = parse_query(out, fields)
        if errors:
            problems.append(f"GPU {device} is not usable: {errors[0]['problem']}")
            continue
        total = gpus[0]["memory_total_mib"] if gpus else None
        if total is None:
            problems.append(f"GPU {device}: cannot read memory.total from nvidia-smi's {out.strip()[:120]!r}")
            continue
        memory.append(total)
    return memory, problems


def device_minor(proc_dir: str, gpu: dict) -> int | None:
    """The GPU's device minor (its /dev/nvidia<minor>) from
    ``<proc_dir>/gpus/<bus id>/information``; None when that is not readable."""
    gpus_dir = os.path.join(proc_dir, "gpus")
    try:
        entries = os.listdir(gpus_dir)
    except OSError:
        return None
    for entry in entries:
        if gpu.get("pci_bus_id") and normalize_bus_id(entry) == gpu["pci_bus_id"]:
            try:
                with open(os.path.join(gpus_dir, entry, "information"), "r", encoding="utf-8") as handle:
                    return parse_device_minor(handle.read())
            except (OSError, UnicodeDecodeError):
                return None
    return None


def container_kind(detect_virt: str | None = None, run_systemd_container: str | None = None,
                   proc1_environ: bytes | None = None) -> tuple[str | None, str | None]:
    """(kind, how it was found): ``systemd-detect-virt --container`` output, then
    ``/run/systemd/container``, then ``container=`` in PID 1's environment."""
    if detect_virt is not None:
        value = detect_virt.strip()
        return (None if value in ("", "none") else value), "systemd-detect-virt"
    if run_systemd_container and run_systemd_container.strip():
        return run_systemd_container.strip(), "/run/systemd/container"
    for item in (proc1_environ or b"").split(b"\0"):
        if item.startswith(b"container=") and item[len(b"container="):]:
            return item[len(b"container="):].decode("utf-8", "replace"), "/proc/1/environ"
    return None, None


def container_problems(user_space_version: str | None, kernel_module_version: str | None,
                       node_faults: dict[str, str], version_file: str = "/proc/driver/nvidia/version") -> list[str]:
    """Problems of a container with passed-through GPUs: the user-space driver against
    the hypervisor's kernel module, and the device nodes (path -> fault, e.g. ``missing``)."""
    problems = []
    if kernel_module_version is None:
        problems.append(f"the NVIDIA kernel module's version is not readable ({version_file}): "
                        "the host's module is not loaded or not visible in this container")
    elif user_space_version and user_space_version != kernel_module_version:
        problems.append(f"user-space driver {user_space_version} does not match the kernel module {kernel_module_version}: "
                        f"install the {kernel_module_version} user-space libraries in the container (never a kernel driver)")
    for fault in sorted(set(node_faults.values())):
        paths = sorted(path for path, what in node_faults.items() if what == fault)
        one = len(paths) == 1
        problems.append(f"device node{'' if one else 's'} {', '.join(paths)} {'is' if one else 'are'} {fault}: "
                        f"pass {'it' if one else 'them'} through to the container")
    return problems
