"""The simulated host: its GPUs, driver, CUDA libraries and faults.

A lab host carries one hardware file (JSON, default
``/etc/inferops-lab/hardware.json``, overridden by ``SGLANG_SIM_HARDWARE``)::

    {
      "host": "ct129",
      "driver_version": "580.95.05",
      "cuda_version": "13.0",
      "gpus": [
        {"index": 0, "name": "NVIDIA RTX A6000", "uuid": "GPU-...",
         "pci_bus_id": "00000000:01:00.0", "memory_total_mib": 49140,
         "compute_cap": "8.6", "state": "ok"},
        {"index": 1, ..., "state": "lost"}
      ],
      "cuda_libraries": ["libcudart.so.13", "libcublas.so.13"],
      "time_scale": 0.05,
      "performance": {"step_seconds": 0.02, "eager_factor": 2.0, "prefill_seconds": 0.1,
                      "speculative": {"NEXTN": {"accept_length": 2.71, "step_factor": 1.1}}}
    }

``state`` is ``ok`` or ``lost`` (fallen off the bus: nvidia-smi cannot get a
handle, CUDA cannot use it). ``cuda_libraries`` lists the CUDA user-space
libraries a ``ctypes.CDLL`` can open on this host. ``time_scale`` shrinks the
simulated durations (weight loading, graph capture) for tests.

``performance`` (optional) is how fast this host decodes, so that variants that
all serve differ in speed as they do on the real host: one decode step of the
target model takes ``step_seconds`` with CUDA graphs, ``eager_factor`` times
that without (``--disable-cuda-graph``: each step launches its kernels one by
one); a speculative step costs ``step_factor`` target steps (the draft and the
verification) and yields ``accept_length`` tokens on average. A token thus takes
``step_seconds * step_factor * (eager_factor without graphs) / accept_length``.
Its own ``time_scale`` (default the host's) scales generations alone: a
performance gate measures milliseconds, which a shared machine's scheduling
noise would swamp at the start-up's scale.

A GPU's ``health`` (optional) is what the fake ``nvidia-smi -q -x`` reports of its
memory: ``ecc`` and ``ecc_pending`` (``Enabled``/``Disabled``, default
``Enabled``), ``volatile_uncorrected`` and ``aggregate_uncorrected`` (``N/A``
with ECC off), ``remap_pending``, ``remap_failure``, ``remapped_uncorrectable``,
``recovery_action``; and ``start_xid``: a server started on the GPU logs that
Xid (``NVRM: Xid (PCI:0000:41:00): 13, pid=..., name=python3, ...``) to the
lab's kernel log, as a variant whose start faults the GPU does.

The lab's kernel log is ``kernel*.log`` in the ledger directory, each line
stamped as ``dmesg`` stamps it (seconds since boot); the
fake ``dmesg`` prints them in order (``kernel_log``).

Memory used on each GPU is kept in a ledger directory (``SGLANG_SIM_STATE``,
default ``/run/inferops-lab/gpu``): one JSON file per simulator process,
``{"pid": N, "name": "...", "gpus": {"0": MiB, ...}}``. The fake nvidia-smi
and later simulator processes read it, so a server that is still running (or
still releasing memory) is visible, as on a real host. Entries of dead
processes are ignored.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HARDWARE_FILE = "/etc/inferops-lab/hardware.json"
DEFAULT_STATE_DIR = "/run/inferops-lab/gpu"

# Memory the driver and CUDA context hold on a GPU before any tensor exists.
CUDA_CONTEXT_MIB = 500


# A step's cost and its tokens per speculative algorithm when the hardware file says
# nothing: every algorithm costs one target step; the accept lengths are of the
# order real SGLang reports for each (meta_info.spec_accept_length).
ACCEPT_LENGTH = {"NEXTN": 2.71, "EAGLE": 2.71, "EAGLE3": 3.12, "DFLASH": 4.36, "DDTREE": 5.41}


# How the speed of one request moves with the settings a tune searches, as far as the
# simulator models it (every coefficient is the hardware file's ``performance`` section's,
# and 0 or absent leaves the plain model: a step's time fixed per algorithm, whatever the batch):
#
# - accept length against the speculative steps: a draft whose tokens are each accepted with
#   probability a yields (1 - a**(k+1)) / (1 - a) tokens a step for k draft tokens (Leviathan,
#   Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023,
#   eq. 1); a is solved from the table's accept length at the steps it was measured with
#   (``steps``), so the table stays the measured point and other step counts follow the curve;
# - a step's cost against the steps: each draft step is a forward of the draft model,
#   ``draft_cost`` of the target's (an assumption of the lab: an MTP head or a small draft is one
#   layer and an LM head against the target's dozens of layers; no measured figure for these
#   models on these GPUs);
# - a step's cost against the batch: decode is bound by memory reads (the weights once a step,
#   each request's KV cache and verified tokens on top), so each further request in the batch adds
#   ``batch_cost`` of a lone request's step, scaled by the tokens it verifies a step (steps + 1
#   over the table's); an assumption of the lab of the order of a request's KV reads at a few
#   thousand tokens of context against a GPU's share of the weights;
# - CUDA graphs: a batch larger than the captured batch sizes (cuda_graph_max_bs) runs eager,
#   as with graphs off (real SGLang replays a graph only for a batch it captured:
#   srt/model_executor/cuda_graph_runner.py can_run), at ``eager_factor``;
# - the batch: a request waits in the queue (#queue-req) while the running requests are at
#   max_running_requests or their tokens would pass the KV pool's max_total_num_tokens; its speed
#   is the batch's when it is admitted (the simulator does not re-pace a running request).


def accept_for_steps(measured: float, at_steps: int, steps: int) -> float:
    """The accept length at ``steps`` draft steps on the curve through ``measured`` at ``at_steps``."""
    if steps == at_steps or measured <= 1.0:
        return measured
    if measured >= at_steps + 1:  # every draft token accepted: the curve is the step count
        return float(steps + 1)
    low, high = 0.0, 1.0
    for _step in range(60):
        mid = (low + high) / 2
        if sum(mid ** i for i in range(at_steps + 1)) < measured:
            low = mid
        else:
            high = mid
    rate = (low + high) / 2
    return sum(rate ** i for i in range(steps + 1))


@dataclass(frozen=True)
class Performance:
    step_seconds: float = 0.02
    eager_factor: float = 1.0
    prefill_seconds: float = 0.1
    time_scale: float | None = None  # None: the host's time_scale
    # (algorithm, accept length, step factor, steps the accept length was measured at or 0)
    speculative: tuple[tuple[str, float, float, int], ...] = tuple((a, n, 1.0, 0) for a, n in ACCEPT_LENGTH.items())
    batch_cost: float = 0.0
    draft_cost: float = 0.0

    def _entry(self, algorithm: str | None) -> tuple[float, float, int]:
        return next(((n, f, k) for a, n, f, k in self.speculative if a == algorithm), (1.0, 1.0, 0)) if algorithm \
            else (1.0, 1.0, 0)

    def accept_length(self, algorithm: str | None, steps: int | None = None) -> float:
        """Tokens per decode step (1.0 without speculative decoding)."""
        measured, _factor, at_steps = self._entry(algorithm)
        if not algorithm or not steps or not at_steps:
            return measured
        return accept_for_steps(measured, at_steps, int(steps))

    def token_seconds(self, algorithm: str | None, cuda_graph: bool, batch: int = 1, steps: int | None = None,
                      graph_max_bs: int | None = None) -> float:
        """Simulated seconds per output token of one request in a decode batch of ``batch``."""
        _measured, factor, at_steps = self._entry(algorithm)
        graphed = cuda_graph and (not graph_max_bs or batch <= graph_max_bs)
        step = self.step_seconds * factor * (1.0 if graphed else self.eager_factor)
        width = 1.0
        if algorithm and steps and at_steps:
            step *= (1 + self.draft_cost * steps) / (1 + self.draft_cost * at_steps)
            width = (steps + 1) / (at_steps + 1)
        step *= 1 + self.batch_cost * max(0, batch - 1) * width
        return step / self.accept_length(algorithm, steps)


def _performance(data: dict | None) -> Performance:
    data = data or {}
    table = {a: (n, 1.0, 0) for a, n in ACCEPT_LENGTH.items()}
    for algorithm, spec in (data.get("speculative") or {}).items():
        table[str(algorithm)] = (float(spec["accept_length"]), float(spec.get("step_factor", 1.0)), int(spec.get("steps", 0)))
    return Performance(step_seconds=float(data.get("step_seconds", 0.02)), eager_factor=float(data.get("eager_factor", 1.0)),
                       prefill_seconds=float(data.get("prefill_seconds", 0.1)),
                       time_scale=float(data["time_scale"]) if data.get("time_scale") is not None else None,
                       speculative=tuple((a, n, f, k) for a, (n, f, k) in table.items()),
                       batch_cost=float(data.get("batch_cost", 0.0)), draft_cost=float(data.get("draft_cost", 0.0)))


class HardwareError(Exception):
    """The hardware file is missing or malformed."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: int
    compute_cap: str
    state: str = "ok"
    power_limit_w: int = 300
    health: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def lost(self) -> bool:
        return self.state == "lost"


@dataclass(frozen=True)
class Hardware:
    host: str
    driver_version: str
    cuda_version: str
    gpus: tuple[Gpu, ...]
    cuda_libraries: frozenset[str] = field(default_factory=frozenset)
    time_scale: float = 1.0
    performance: Performance = field(default_factory=Performance)

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(index)


def hardware_path() -> Path:
    return Path(os.environ.get("SGLANG_SIM_HARDWARE", DEFAULT_HARDWARE_FILE))


def state_dir() -> Path:
    return Path(os.environ.get("SGLANG_SIM_STATE", DEFAULT_STATE_DIR))


def load(path: Path | None = None) -> Hardware:
    path = path or hardware_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise HardwareError(f"hardware file {path} not found") from exc
    except json.JSONDecodeError as exc:
        raise HardwareError(f"hardware file {path} is not valid JSON: {exc}") from exc
    try:
        gpus = tuple(
            Gpu(
                index=int(g["index"]),
                name=str(g["name"]),
                uuid=str(g["uuid"]),
                pci_bus_id=str(g["pci_bus_id"]),
                memory_total_mib=int(g["memory_total_mib"]),
                compute_cap=str(g["compute_cap"]),
                state=str(g.get("state", "ok")),
                power_limit_w=int(g.get("power_limit_w", 300)),
                health=dict(g.get("health") or {}),
            )
            for g in data["gpus"]
        )
        return Hardware(
            host=str(data.get("host", "")),
            driver_version=str(data["driver_version"]),
            cuda_version=str(data["cuda_version"]),
            gpus=gpus,
            cuda_libraries=frozenset(data.get("cuda_libraries", [])),
            time_scale=float(data.get("time_scale", 1.0)),
            performance=_performance(data.get("performance")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise HardwareError(f"hardware file {path} is malformed: {exc!r}") from exc


def log_kernel(text: str, name: str | None = None) -> None:
    """Append one line to the lab's kernel log, stamped as dmesg stamps it (CLOCK_MONOTONIC, the
    kernel's clock for its log, in microseconds); each writer its own file (``kernel-<pid>.log``:
    the ledger directory is sticky, shared by every service user)."""
    path = state_dir() / (name or f"kernel-{os.getpid()}.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(f"[{time.monotonic():12.6f}] {text}\n")


def kernel_log() -> list[str]:
    """The lab's kernel log lines, in time order."""
    lines = []
    for path in sorted(state_dir().glob("kernel*.log")):
        try:
            lines += path.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
    return sorted(lines, key=lambda line: float(line[1:line.index("]")]) if line.startswith("[") and "]" in line else 0.0)


# What the driver prints after the Xid number, for the Xids the lab logs (a GPU's start_xid, the fault matrix's) (real lines'
# text: an Xid 13 of driver 550.90.07, an Xid 31 of a data-centre GPU).
XID_DETAIL = {
    13: "Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0): Out Of Range Address",
    31: "Ch 0000000a, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_T1_7 faulted @ 0x2b57_b3000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x12bac1c3e0 "
        "partition 2, subpartition 1.",
}


def xid_line(gpu: Gpu, xid: int, detail: str, pid: int | None = None, name: str | None = None) -> str:
    """The driver's Xid line (open-gpu-kernel-modules kernel_rc.c: the PCI tag is domain:bus:device)."""
    tag = gpu.pci_bus_id[4:-2].lower()
    who = f"pid={pid}, name={name}" if pid else "pid='<unknown>', name=<unknown>"
    return f"NVRM: Xid (PCI:{tag}): {xid}, {who}, {detail}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ledger_entries() -> list[dict]:
    """Ledger entries of live processes (stale files of dead ones are skipped)."""
    entries = []
    directory = state_dir()
    if not directory.is_dir():
        return entries
    for path in sorted(directory.glob("*.json")):
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            pid = int(entry["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid):
            entries.append(entry)
    return entries


def used_mib(index: int, exclude_pid: int | None = None) -> int:
    """MiB of GPU ``index`` held by live simulator processes."""
    total = 0
    for entry in ledger_entries():
        if exclude_pid is not None and int(entry["pid"]) == exclude_pid:
            continue
        total += int(entry.get("gpus", {}).get(str(index), 0))
    return total


class Ledger:
    """This process's line in the GPU memory ledger."""

    def __init__(self, name: str, pid: int | None = None) -> None:
        self.pid = pid or os.getpid()
        self.name = name
        self.usage: dict[str, int] = {}
        self.path = state_dir() / f"{self.pid}.json"

    def hold(self, index: int, mib: float) -> None:
        self.usage[str(index)] = self.usage.get(str(index), 0) + int(mib)
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"pid": self.pid, "name": self.name, "gpus": self.usage}),
            encoding="utf-8",
        )
        os.replace(tmp, self.path)

    def release(self) -> None:
        self.usage = {}
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
