# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU health: the kernel log's Xid events, nvidia-smi's ECC, retired-page and row-remap
state, and what follows from them (docs/gpu-health.md: each signal, its source, what to do).

Read with the tools the host has, through ``read_kernel_log`` and ``read_memory_health`` (with
a module's ``run_command``); everything else is pure functions over the tools' output, tested
as printed:

- the kernel log: ``journalctl -k -b -o short-monotonic``, else ``dmesg`` (both print
  ``[seconds since boot] ...``). The driver logs ``NVRM: Xid (PCI:0000:41:00): 79, pid=...,
  name=..., GPU has fallen off the bus.`` (open-gpu-kernel-modules, kernel_rc.c: the PCI tag is
  domain:bus:device, no function; MIG adds `` GPU-I:nn``; older drivers print no pid/name).
  Newer drivers report a GPU that fell off the bus in three lines without an Xid number ("NVRM:
  The NVIDIA GPU 0000:b3:00.0 ... fallen off the bus"); that is read as Xid 79. In an LXC
  container both tools usually see nothing (no kernel entries in the container's journal,
  ``dmesg`` refused): the events are then unread, and the result says so.
- memory health: ``nvidia-smi -q -x``, the XML form, which conforms to NVIDIA's published
  DTDs (nvsmi_device_v11..v13): ``ecc_mode`` (current, pending), ``ecc_errors`` volatile and
  aggregate (Turing+ ``sram_*``/``dram_*`` counters, Ampere+ parity/SEC-DED splits, pre-Turing
  ``single_bit``/``double_bit`` totals), ``retired_pages`` and ``remapped_rows`` (a leaf
  ``N/A`` where the GPU has no row remapper), and ``gpu_recovery_action`` (575+). ``-d`` does
  not combine with ``-x`` (nvidia-smi(1)), so the whole document is read once.
- NVIDIA's Xid catalog ("Analyzing Xid Errors with the Xid Catalog", the Resolution Bucket
  (Immediate Action) column), folded into five actions: ``ignore``, ``restart_app``,
  ``reset_gpu``, ``reboot``, ``contact_support`` (an unknown Xid, and every bucket that sends
  the operator to a workflow or to NVIDIA).

A GPU is unusable (``sick``) after a reset- or reboot-class Xid since boot, with a row remap or
page retirement pending, after a remapping failure, when NVIDIA's recovery action asks for a
reset or a reboot, or when its uncorrectable ECC counts rose since the baseline the manifest
kept. ECC off on a card that has it is a warning (``ecc_disabled: refuse`` makes it a refusal).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ansible_collections.inferops.sglang.plugins.module_utils import _gpu as gpu_mod

ACTIONS = ("ignore", "restart_app", "reset_gpu", "reboot", "contact_support")
# What the operator does, per action (docs/gpu-health.md tells the rest).
ADVICE = {
    "ignore": "no action needed",
    "restart_app": "restart the application that used the GPU",
    "reset_gpu": "reset the GPU (nvidia-smi -r -i N, with no process on it) or reboot the host",
    "reboot": "reboot the host",
    "contact_support": "check the GPU's history and contact NVIDIA support if it repeats",
}
# The actions that make a GPU unusable until the operator acts: restarting a server cannot help.
UNUSABLE = frozenset({"reset_gpu", "reboot"})
# The actions that fail a variant whose start produced them on its own GPUs.
START_FAULT = frozenset({"restart_app", "reset_gpu", "reboot"})

# NVIDIA's buckets folded into the five actions. The workflows: Xid 48's (a double-bit error:
# reset, then see whether a row remap is pending), NVLink's (reset, then inspect the link).
_BUCKETS = {
    "RESTART_APP": "restart_app", "RESET_GPU": "reset_gpu", "RESTART_BM": "reboot", "RESTART_VM": "reboot",
    "IGNORE": "ignore", "WORKFLOW_XID_48": "reset_gpu", "WORKFLOW_NVLINK_ERR": "reset_gpu",
    "WORKFLOW_NVLINK5_ERR": "reset_gpu", "WORKFLOW_XID_45": "ignore",
}
# Xid -> (what NVIDIA calls it, its Immediate Action bucket), from NVIDIA's Xid catalog for Ampere
# and newer (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html). Xid 45 follows the
# Xid before it (it reports the cleanup); Xid 154 reports a recovery action, read from its text.
CATALOG = {
    8: ("GPU stopped processing", "RESTART_APP"),
    11: ("Invalid or corrupted push buffer stream", "RESTART_APP"),
    13: ("Graphics Engine Exception", "RESTART_APP"),
    25: ("Invalid or illegal push buffer stream", "RESTART_APP"),
    31: ("GPU memory page fault", "RESTART_APP"),
    32: ("Invalid or corrupted push buffer stream", "RESTART_APP"),
    37: ("Driver firmware error", "IGNORE"),
    38: ("Driver firmware error", "IGNORE"),
    39: ("Copy Engine Exception", "RESTART_APP"),
    40: ("Copy Engine Exception", "RESTART_APP"),
    41: ("Copy Engine Exception", "RESTART_APP"),
    43: ("GPU stopped processing", "IGNORE"),
    44: ("Graphics Engine fault during context switch", "IGNORE"),
    45: ("Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45"),
    46: ("GPU stopped processing", "RESET_GPU"),
    48: ("Double Bit ECC Error", "WORKFLOW_XID_48"),
    54: ("Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS"),
    60: ("Video processor exception", "RESTART_APP"),
    62: ("Internal micro-controller halt", "RESET_GPU"),
    63: ("GPU memory remapping event", "IGNORE"),
    64: ("GPU memory remapping failure", "RESET_GPU"),
    66: ("Illegal access by driver", "IGNORE"),
    67: ("Illegal access by driver", "IGNORE"),
    68: ("NVDEC0 Exception", "RESTART_APP"),
    69: ("Graphics Engine class error", "RESTART_APP"),
    74: ("NVLINK Error", "WORKFLOW_NVLINK_ERR"),
    78: ("vGPU Start Error", "UPDATE_SWFW"),
    79: ("GPU has fallen off the bus", "RESTART_BM"),
    80: ("Corrupted data sent to GPU", "RESTART_APP"),
    92: ("High single-bit ECC error rate", "IGNORE"),
    93: ("Non-fatal violation of provisioned InfoROM wear limit", "IGNORE"),
    94: ("Contained memory error", "RESTART_APP"),
    95: ("Uncontained memory error", "RESET_GPU"),
    109: ("Context Switch Timeout Error", "RESET_GPU"),
    110: ("Security Fault Error", "RESET_GPU"),
    119: ("GSP RPC Timeout", "RESET_GPU"),
    120: ("GSP Error", "RESET_GPU"),
    121: ("C2C Error", "IGNORE"),
    136: ("Link Training Failed", "RESET_GPU"),
    137: ("NVLink Privilege Error", "IGNORE"),
    140: ("ECC Unrecovered Error", "RESET_GPU"),
    141: ("CUDA Fast Path Error", "IGNORE"),
    143: ("GPU Initialization Error", "RESET_GPU"),
    **{xid: (f"NVLink error (Xid {xid})", "WORKFLOW_NVLINK5_ERR") for xid in range(144, 151)},
    151: ("Key rotation Error", "RESTART_VM"),
    154: ("GPU Recovery Action Changed", "XID_154"),
    155: ("NVLINK: SW Defined Error", "RESET_GPU"),
    156: ("Resource Retirement Event", "RESET_GPU"),
    157: ("Resource Retirement Failure", "IGNORE"),
    158: ("GPU Fatal Timeout", "RESET_GPU"),
    160: ("Channel Retirement Event", "IGNORE"),
    161: ("Channel Retirement Failure", "IGNORE"),
}
# Copy engines, decoders and JPEG engines the catalog lists one by one, all RESTART_APP.
CATALOG.update({xid: (f"Engine exception (Xid {xid})", "RESTART_APP")
                for xid in (70, 71, 72, 75, 76, 77, 82, 83, 84, 85, 86, 88, 89, 96, 97, 98, 99, 100, 101, 102, 103,
                            104, 105, 126, 127, 128, 129, 130, 131, 132, 133, 134, 135, 139)})

_STAMP = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]\s?(.*)$")
_PCI = r"(?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
_XID = re.compile(r"NVRM: Xid \(" + _PCI + r"[^)]*\): (\d+),\s*(.*)$")
_PID_NAME = re.compile(r"^pid=('?[^,]*?'?), name=(.*?), (.*)$")
_FALLEN_START = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?")
_RECOVERY = (("reboot", "reboot"), ("reset", "reset_gpu"), ("drain", "reset_gpu"))


class HealthError(Exception):
    """A health source's output cannot be used; the message says why."""


def bus_id(tag: str) -> str:
    """The kernel log's PCI tag (``0000:41:00``, no function) in nvidia-smi's form, ``00000000:41:00.0``."""
    tag = (tag or "").strip()
    if tag.count(":") == 2 and "." not in tag:
        tag += ".0"
    return gpu_mod.normalize_bus_id(tag)


def classify(xid: int, detail: str = "") -> tuple[str, str]:
    """(what NVIDIA calls the Xid, its action): an Xid not in the catalog is ``contact_support``."""
    name, bucket = CATALOG.get(xid, (f"Xid {xid}, not in NVIDIA's catalog", "CONTACT_SUPPORT"))
    if bucket == "XID_154":
        # "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
        tail = detail.lower().rsplit(" to ", 1)[-1]
        return name, next((action for word, action in _RECOVERY if word in tail), "contact_support")
    return name, _BUCKETS.get(bucket, "contact_support")


def parse_kernel_log(text: str) -> list[dict]:
    """Xid events of ``journalctl -k -o short-monotonic`` or ``dmesg`` text: ``{"time", "bus_id", "xid",
    "name", "action", "pid", "process", "detail"}`` in log order; ``time`` is seconds since boot."""
    events: list[dict] = []
    fallen: tuple[float, str] | None = None
    for raw in (text or "").splitlines():
        stamp = _STAMP.match(raw.strip())
        time, line = (float(stamp.group(1)), stamp.group(2)) if stamp else (None, raw.strip())
        match = _XID.search(line)
        if match:
            xid, detail = int(match.group(2)), match.group(3).strip()
            pid = process = None
            named = _PID_NAME.match(detail)
            if named:
                pid, process, detail = named.group(1).strip("'"), named.group(2), named.group(3).strip()
            name, action = classify(xid, detail)
            events.append({"time": time, "bus_id": bus_id(match.group(1)), "xid": xid, "name": name,
                           "action": action, "pid": pid, "process": process, "detail": detail[:300]})
            continue
        start = _FALLEN_START.search(line)
        if start:
            fallen = (time, start.group(1))
        if fallen and "fallen off the bus" in line:
            name, action = classify(79)
            events.append({"time": fallen[0], "bus_id": bus_id(fallen[1]), "xid": 79, "name": name, "action": action,
                           "pid": None, "process": None, "detail": "reported without an Xid number (newer drivers)"})
            fallen = None
    return events


def kernel_lines(text: str) -> int:
    """How many stamped kernel log lines the text holds (0: the source saw no kernel log at all)."""
    return sum(1 for line in (text or "").splitlines() if _STAMP.match(line.strip()))


def _text(node) -> str | None:
    if node is None or node.text is None:
        return None
    value = node.text.strip()
    return None if value in ("", "N/A", "[N/A]", "Not Supported", "[Not Supported]") else value


def _int(node) -> int | None:
    value = _text(node)
    match = re.match(r"(\d+)", value or "")
    return int(match.group(1)) if match else None


def _flag(node) -> bool | None:
    value = _text(node)
    return None if value is None else value.lower() in ("yes", "true", "enabled", "1")


def _ecc_counts(node) -> dict:
    """{"corrected", "uncorrected"} of one ``volatile`` or ``aggregate`` element, None where N/A."""
    if node is None:
        return {"corrected": None, "uncorrected": None}
    totals = {"corrected": None, "uncorrected": None}
    for child in node:
        tag = child.tag
        if tag in ("single_bit", "double_bit"):  # pre-Turing: per location, with a total
            key = "corrected" if tag == "single_bit" else "uncorrected"
            count = _int(child.find("total"))
        elif tag.endswith("_uncorrectable") or "_uncorrectable_" in tag:
            key, count = "uncorrected", _int(child)
        elif tag.endswith("_correctable"):
            key, count = "corrected", _int(child)
        else:
            continue
        if count is not None:
            totals[key] = (totals[key] or 0) + count
    return totals


def parse_smi_xml(text: str) -> dict[str, dict]:
    """``nvidia-smi -q -x`` per GPU, by PCI bus id: ``{"ecc": {"current", "pending"}, "volatile", "aggregate"
    ({"corrected", "uncorrected"}), "retired": {"single_bit", "double_bit", "pending"}, "remap": {"supported",
    "correctable", "uncorrectable", "pending", "failure"}, "recovery_action"}``; None where the GPU says N/A."""
    # a GPU the tool cannot open is named in a line of its own before or after the document
    start, end = (text or "").find("<"), (text or "").rfind(">")
    if start < 0 or end < start:
        raise HealthError("nvidia-smi -q -x printed no XML")
    try:
        root = ET.fromstring(text[start:end + 1])
    except ET.ParseError as exc:
        raise HealthError(f"nvidia-smi -q -x printed XML that does not parse: {exc}") from None
    out: dict[str, dict] = {}
    for gpu in root.iter("gpu"):
        bus = gpu_mod.normalize_bus_id(gpu.get("id") or _text(gpu.find("pci/pci_bus_id")) or "")
        ecc_mode = gpu.find("ecc_mode")
        errors = gpu.find("ecc_errors")
        retired = gpu.find("retired_pages")
        remap = gpu.find("remapped_rows")
        remap_supported = remap is not None and len(remap) > 0
        pending_retirement = None
        if retired is not None:
            flags = [_flag(retired.find(tag)) for tag in ("pending_blacklist", "pending_retirement")]
            pending_retirement = None if all(f is None for f in flags) else any(flags)
        out[bus] = {
            "ecc": {"current": _text(ecc_mode.find("current_ecc")) if ecc_mode is not None else None,
                    "pending": _text(ecc_mode.find("pending_ecc")) if ecc_mode is not None else None},
            "volatile": _ecc_counts(errors.find("volatile") if errors is not None else None),
            "aggregate": _ecc_counts(errors.find("aggregate") if errors is not None else None),
            "retired": {
                "single_bit": _int(retired.find("multiple_single_bit_retirement/retired_count")) if retired is not None else None,
                "double_bit": _int(retired.find("double_bit_retirement/retired_count")) if retired is not None else None,
                "pending": pending_retirement,
            },
            "remap": {
                "supported": remap_supported,
                "correctable": _int(remap.find("remapped_row_corr")) if remap_supported else None,
                "uncorrectable": _int(remap.find("remapped_row_unc")) if remap_supported else None,
                "pending": _flag(remap.find("remapped_row_pending")) if remap_supported else None,
                "failure": _flag(remap.find("remapped_row_failure")) if remap_supported else None,
            },
            "recovery_action": _text(gpu.find("gpu_recovery_action")),
        }
    return out


# -- the decision ---------------------------------------------------------------

def event_text(event: dict) -> str:
    """"Xid 79 (GPU has fallen off the bus) at 1843.3 s since boot: reboot the host"."""
    when = f" at {event['time']:.1f} s since boot" if event.get("time") is not None else ""
    by = f", process {event['process']} (pid {event['pid']})" if event.get("process") not in (None, "<unknown>") else ""
    return f"Xid {event['xid']} ({event['name']}){when}{by}: {ADVICE[event['action']]}"


def counters(memory: dict | None) -> dict:
    """What the manifest keeps of a GPU's memory health, for the next check to tell what is new."""
    memory = memory or {}
    return {
        "ecc_mode": (memory.get("ecc") or {}).get("current"),
        "ecc_mode_pending": (memory.get("ecc") or {}).get("pending"),
        "volatile_uncorrected": (memory.get("volatile") or {}).get("uncorrected"),
        "aggregate_uncorrected": (memory.get("aggregate") or {}).get("uncorrected"),
        "aggregate_corrected": (memory.get("aggregate") or {}).get("corrected"),
        "retired_double_bit": (memory.get("retired") or {}).get("double_bit"),
        "retired_pending": (memory.get("retired") or {}).get("pending"),
        "remapped_uncorrectable": (memory.get("remap") or {}).get("uncorrectable"),
        "remap_pending": (memory.get("remap") or {}).get("pending"),
        "remap_failure": (memory.get("remap") or {}).get("failure"),
        "recovery_action": memory.get("recovery_action"),
    }


def _rose(now: dict, before: dict | None, key: str) -> int | None:
    """How much ``key`` rose since ``before`` (None: no baseline or no count)."""
    if not before or now.get(key) is None or before.get(key) is None:
        return None
    return now[key] - before[key] if now[key] > before[key] else None


def assess(bus: str, memory: dict | None, events: list[dict], baseline: dict | None = None,
           ecc_disabled: str = "warn") -> dict:
    """One GPU's verdict: ``{"sick": [reasons], "warnings": [...], "counters", "events"}``.

    ``memory``: ``parse_smi_xml``'s entry for the GPU (None: unread); ``events``: its Xid events
    to judge (since boot at provisioning, since the baseline before a switch); ``baseline``: the
    manifest's ``counters`` of the GPU when it was last checked (None: the first check)."""
    sick: list[str] = []
    warnings: list[str] = []
    now = counters(memory)
    for event in events:
        if event["action"] in UNUSABLE:
            sick.append(event_text(event))
        elif event["action"] == "contact_support":
            warnings.append(event_text(event))
    if memory is not None:
        if now["remap_pending"]:
            sick.append("a row remap is pending (nvidia-smi -q: Remapped Rows, Pending: Yes): "
                        "reset the GPU for the remap to take effect")
        if now["remap_failure"]:
            sick.append("a row remapping failed (Remapping Failure Occurred: Yes): the GPU has no spare rows left "
                        "where it failed; NVIDIA asks for the GPU to be serviced")
        if now["retired_pending"]:
            sick.append("a page retirement is pending (Pending Page Blacklist: Yes): reset the GPU or reboot")
        recovery = (now["recovery_action"] or "").lower()
        if recovery and recovery != "none":
            action = next((a for word, a in _RECOVERY if word in recovery), "contact_support")
            (sick if action in UNUSABLE else warnings).append(
                f"NVIDIA's recovery action for the GPU is {now['recovery_action']}: {ADVICE[action]}")
        rose = _rose(now, baseline, "aggregate_uncorrected")
        if rose:
            sick.append(f"{rose} new uncorrectable ECC error(s) since the last check "
                        f"(aggregate {baseline['aggregate_uncorrected']} -> {now['aggregate_uncorrected']})")
        elif baseline is None and now["volatile_uncorrected"]:
            sick.append(f"{now['volatile_uncorrected']} uncorrectable ECC error(s) since the driver loaded "
                        "(volatile count): reset the GPU or reboot")
        if now["ecc_mode"] == "Disabled":
            fix = ("ECC is enabled at the next reboot (pending: Enabled)" if now["ecc_mode_pending"] == "Enabled"
                   else f"enable it with nvidia-smi -i {bus} -e 1, then reboot")
            text = f"ECC is disabled on a GPU that supports it, which silences every memory error signal: {fix}"
            (sick if ecc_disabled == "refuse" else warnings).append(text)
    return {"sick": sick, "warnings": warnings, "counters": now, "events": events}


def events_of(events: list[dict], bus: str, after: float | None = None) -> list[dict]:
    """The events of the GPU at ``bus`` logged after ``after`` seconds since boot (all when None)."""
    bus = gpu_mod.normalize_bus_id(bus)
    return [e for e in events if e["bus_id"] == bus and (after is None or e["time"] is None or e["time"] > after)]


def unseen(events: list[dict], cursor: dict | None, boot_id: str | None) -> list[dict]:
    """The events a kernel-log ``cursor`` ({"boot_id", "time"}: the manifest's, the watchdog's, the mark a
    switch takes before a start) has not seen: after its time in the same boot, every one of this boot
    after a reboot or without a cursor."""
    same_boot = cursor and cursor.get("boot_id") and cursor.get("boot_id") == boot_id
    after = cursor.get("time") if same_boot else None
    return [e for e in events if after is None or e["time"] is None or e["time"] > after]


def new_events(events: list[dict], bus: str, cursor: dict | None, boot_id: str | None) -> list[dict]:
    """The GPU's events the manifest's kernel-log ``cursor`` has not seen (``unseen``)."""
    return events_of(unseen(events, cursor, boot_id), bus)


def cursor(kernel: dict) -> dict:
    """Where the next check starts reading: the boot and the time of the last Xid event seen (0.0:
    none). Stable while nothing new is logged, so a provision run that finds nothing new changes nothing."""
    times = [e["time"] for e in kernel.get("events") or [] if e.get("time") is not None]
    return {"boot_id": kernel.get("boot_id"), "time": max(times) if times else 0.0, "source": kernel.get("source")}


def judge(gpus: list[dict], kernel: dict, memory: dict[str, dict], baseline: dict | None = None,
          new_only: bool = False, ecc_disabled: str = "warn") -> dict[int, dict]:
    """Each GPU's verdict (``assess``) by index. ``baseline``: a manifest's ``gpus`` section (each GPU's
    ``health`` counters, the ``kernel_log`` cursor): the counters are judged against its. Events: every
    one of this boot (provisioning), or with ``new_only`` those after the baseline's cursor (a deploy:
    what provisioning has not seen)."""
    before = {g.get("pci_bus_id"): (g.get("health") or {}).get("counters")
              for g in (baseline or {}).get("usable", []) + (baseline or {}).get("unusable", [])}
    mark = (baseline or {}).get("kernel_log")
    out = {}
    for gpu in gpus:
        bus = gpu.get("pci_bus_id")
        if not bus:
            continue
        events = (new_events(kernel["events"], bus, mark, kernel.get("boot_id")) if new_only
                  else events_of(kernel["events"], bus))
        out[gpu["index"]] = assess(bus, memory.get(gpu_mod.normalize_bus_id(bus)), events, before.get(bus), ecc_disabled)
    return out


def summary(verdict: dict) -> dict:
    """What facts and the manifest keep of a verdict: the counters, the Xid events (short), sick, warnings."""
    return {"counters": verdict["counters"], "sick": verdict["sick"], "warnings": verdict["warnings"],
            "xids": [{k: e[k] for k in ("xid", "time", "action", "name")} for e in verdict["events"]]}


# -- reading (with a module's run_command) --------------------------------------

# The kernel log's readers, in order: this boot's kernel entries of the journal, else the ring buffer.
KERNEL_LOG_COMMANDS = (("journal", ["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager", "-q"]),
                       ("dmesg", ["dmesg"]))


def read_kernel_log(run_command, boot_id_path: str = "/proc/sys/kernel/random/boot_id") -> dict:
    """The kernel log of this boot: ``{"source": "journal"|"dmesg"|None, "events", "boot_id", "problem"}``;
    ``source`` None when neither tool could read it (``problem`` says what each said)."""
    boot_id = None
    try:
        with open(boot_id_path, encoding="ascii") as handle:
            boot_id = handle.read().strip()
    except OSError:
        pass
    said = []
    for source, argv in KERNEL_LOG_COMMANDS:
        try:
            rc, out, err = run_command(argv)
        except OSError as exc:
            said.append(f"{argv[0]}: {exc}")
            continue
        if rc == 0 and kernel_lines(out):
            return {"source": source, "events": parse_kernel_log(out), "boot_id": boot_id, "problem": None}
        said.append(f"{argv[0]}: " + (" ".join((err or out).split())[:200] or f"exit {rc}, no kernel log lines"))
    return {"source": None, "events": [], "boot_id": boot_id,
            "problem": "the kernel log cannot be read here, so Xid events are not checked (" + "; ".join(said) + ")"}


def read_memory_health(run_command, nvidia_smi: str = "nvidia-smi") -> tuple[dict[str, dict], str | None]:
    """(``parse_smi_xml`` of ``nvidia-smi -q -x``, problem): {} and the problem when it cannot be read."""
    rc, out, err = run_command([nvidia_smi, "-q", "-x"])
    try:
        return parse_smi_xml(out), None
    except HealthError as exc:
        return {}, f"{exc} (exit {rc}{': ' + ' '.join(err.split())[:200] if err else ''})"


def buses(run_command, devices: list[int], nvidia_smi: str = "nvidia-smi") -> dict[str, int]:
    """{PCI bus id: index} of the GPUs ``devices`` (nvidia-smi's inventory; a lost GPU by the bus id its
    error names): what joins the kernel log's and nvidia-smi's per-GPU figures to the GPU indexes."""
    read = gpu_mod.read_inventory(run_command, nvidia_smi)
    return {gpu_mod.normalize_bus_id(g["pci_bus_id"]): g["index"] for g in read["gpus"]
            if g["index"] in devices and g.get("pci_bus_id")}


def deploy_problems(run_command, devices: list[int], baseline: dict | None, nvidia_smi: str = "nvidia-smi") -> list[str]:
    """Why the GPUs a variant will use cannot take it, judged against the manifest's ``gpus`` section
    (``baseline``): a reset- or reboot-class Xid logged since provisioning read the kernel log, a row
    remap or page retirement pending, a remapping failure, uncorrectable ECC errors new since then.
    [] when they are healthy, or when nothing could be read (provisioning warned of that). A lost GPU is
    the preflight's refusal already (device_memory): it does not get here."""
    gpus = [{"index": index, "pci_bus_id": bus} for bus, index in buses(run_command, devices, nvidia_smi).items()]
    if not gpus:
        return []
    kernel = read_kernel_log(run_command)
    memory, _problem = read_memory_health(run_command, nvidia_smi)
    verdicts = judge(gpus, kernel, memory, baseline, new_only=True)
    since = "since provisioning" if (baseline or {}).get("kernel_log") else "since boot"
    return [f"GPU {g['index']} ({g['pci_bus_id']}) is not healthy {since}: " + "; ".join(verdicts[g["index"]]["sick"])
            for g in gpus if verdicts.get(g["index"], {}).get("sick")]


# -- DCGM's level-1 diagnostic (where DCGM is installed) -------------------------------

_DCGM_ROW = re.compile(r"^\|\s(.{25})\s\|\s(.*?)\s*\|$")
_DCGM_RESULTS = ("Pass", "Skip", "Warn", "Fail", "Not Run")


def parse_dcgm_diag(text: str) -> list[dict]:
    """``dcgmi diag -r 1``'s table: ``{"test", "result", "detail"}`` per test (DCGM 3.x names, "Persistence
    Mode"; 4.x plugin names with per-GPU rows, "GPU0: Fail", read as tests of their own: "software GPU0"). An
    ``Error`` row's text (hard-wrapped in its cell) is the detail of the test above it."""
    rows: list[dict] = []
    last_test = None
    for line in (text or "").splitlines():
        match = _DCGM_ROW.match(line.rstrip())
        if not match:
            continue
        name, value = match.group(1).strip(), match.group(2).strip()
        per_gpu = re.match(r"^(GPU\d+):\s*(\S+)", value)
        result = next((r for r in _DCGM_RESULTS if value == r or value.startswith(r + " ")), None)
        if name == "Error" and rows:
            rows[-1]["detail"] = value
        elif not name and per_gpu and last_test:
            rows.append({"test": f"{last_test} {per_gpu.group(1)}", "result": per_gpu.group(2), "detail": ""})
        elif not name and rows and rows[-1]["detail"]:
            rows[-1]["detail"] += value   # the rest of an error text wrapped in its cell
        elif name and result:
            last_test = name
            rows.append({"test": name, "result": result, "detail": ""})
    return rows


def read_dcgm(run_command, dcgmi: str) -> tuple[list[str], str | None]:
    """(the failed or warned tests of ``dcgmi diag -r 1``, problem): exit 0 all passed (or warned), 226
    (DCGM_ST_NVVS_ERROR, -30) a test failed, 205 (-51) one that asks for isolation; another exit: it did
    not run (its host engine down, for one), which is the problem."""
    rc, out, err = run_command([dcgmi, "diag", "-r", "1"])
    rows = parse_dcgm_diag(out)
    said = [f"DCGM diagnostic level 1: {r['test']} {r['result']}" + (f": {r['detail']}" if r["detail"] else "")
            for r in rows if r["result"] in ("Fail", "Warn")]
    if rc in (0, 205, 226) and rows:
        return said, None
    return said, f"dcgmi diag -r 1 did not run (exit {rc}): {' '.join((err or out).split())[:300] or 'no output'}"
