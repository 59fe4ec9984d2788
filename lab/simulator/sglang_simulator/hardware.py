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


@dataclass(frozen=True)
class Performance:
    step_seconds: float = 0.02
    eager_factor: float = 1.0
    prefill_seconds: float = 0.1
    time_scale: float | None = None  # None: the host's time_scale
    speculative: tuple[tuple[str, float, float], ...] = tuple((a, n, 1.0) for a, n in ACCEPT_LENGTH.items())

    def accept_length(self, algorithm: str | None) -> float:
        """Tokens per decode step (1.0 without speculative decoding)."""
        return next((n for a, n, _f in self.speculative if a == algorithm), 1.0) if algorithm else 1.0

    def token_seconds(self, algorithm: str | None, cuda_graph: bool) -> float:
        """Simulated seconds per output token of one request."""
        factor = next((f for a, _n, f in self.speculative if a == algorithm), 1.0) if algorithm else 1.0
        eager = 1.0 if cuda_graph else self.eager_factor
        return self.step_seconds * factor * eager / self.accept_length(algorithm)


def _performance(data: dict | None) -> Performance:
    data = data or {}
    table = {a: (n, 1.0) for a, n in ACCEPT_LENGTH.items()}
    for algorithm, spec in (data.get("speculative") or {}).items():
        table[str(algorithm)] = (float(spec["accept_length"]), float(spec.get("step_factor", 1.0)))
    return Performance(step_seconds=float(data.get("step_seconds", 0.02)), eager_factor=float(data.get("eager_factor", 1.0)),
                       prefill_seconds=float(data.get("prefill_seconds", 0.1)),
                       time_scale=float(data["time_scale"]) if data.get("time_scale") is not None else None,
                       speculative=tuple((a, n, f) for a, (n, f) in table.items()))


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
