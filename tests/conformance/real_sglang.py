"""Real SGLang for the conformance tests: the venvs, driver stand-in and tiny
model that lab/real/build.sh keeps in the per-user cache, and a launcher that
runs a real server on CPU as real-sglang.md describes.

The conformance tests never skip: without a complete build (``make real``)
they fail, saying so. ``make conformance`` builds it first.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RELEASES = ("0.5.11", "0.5.23")


def paths() -> dict[str, str]:
    """INFEROPS_REAL_* -> path, from lab/real/build.sh --print."""
    proc = subprocess.run([str(REPO / "lab/real/build.sh"), "--print"], capture_output=True, text=True, check=False)
    found = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    if proc.returncode != 0:
        raise RuntimeError("real SGLang is not built: run `make real` (lab/real/build.sh) first; "
                           f"missing parts under {found.get('INFEROPS_REAL_ROOT')}")
    return found


def venv(real: dict[str, str], release: str) -> Path:
    return Path(real["INFEROPS_REAL_VENV_" + release.replace(".", "_")])


def python(real: dict[str, str], release: str) -> str:
    return str(venv(real, release) / "bin" / "python")


def environment(real: dict[str, str], cpu: bool = True, **extra: str) -> dict[str, str]:
    """What real SGLang needs here besides the unit's own environment: the driver
    stand-in for ``import sgl_kernel``, no hub, no proxy, and (``cpu``) the CPU engine;
    without it, what a GPU host's argument validation sees."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CUDA_"))}
    env.update(LD_LIBRARY_PATH=real["INFEROPS_REAL_LIBCUDA_DIR"],
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", PYTHONUNBUFFERED="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if cpu:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    env.update(extra)
    return env


# lab/real/validate_args.py's cases, which the test modules register as they are collected:
# (owner, release, tag, make), make() -> (the GPU profile's arguments, {case id: argv}). The
# session's fixture ``gpu_validated`` (conftest.py) runs one validate_args.py process per
# release and GPU profile for every case registered with it: importing sglang takes most of
# a process's time, and one process serves one profile (SGLang caches the GPU's answers).
GPU_CASES: list[tuple[str, str, str, object]] = []


def register_gpu_cases(owner: str, release: str, tag: str, make) -> None:
    """Cases for validate_args.py, answered under (owner, release, tag) (the tag: a host, say)."""
    GPU_CASES.append((owner, release, tag, make))


def validate_gpu_cases(real: dict[str, str]) -> dict:
    """(owner, release, tag) -> {sglang, speculative_algorithms, results: {case id: answer},
    argv: {case id: argv}, seconds (of the whole process), argvs (in the whole process)}."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    groups: dict[tuple[str, tuple[str, ...]], dict] = {}
    for owner, release, tag, make in GPU_CASES:
        profile, cases = make()
        group = groups.setdefault((release, tuple(profile)), {})
        for name, argv in cases.items():
            assert (owner, tag, name) not in group, (owner, tag, name)
            group[(owner, tag, name)] = argv

    def one(key: tuple[str, tuple[str, ...]]) -> tuple[tuple[str, tuple[str, ...]], dict]:
        release, profile = key
        cases = [{"id": list(case), "argv": argv} for case, argv in groups[key].items()]
        start = time.monotonic()
        proc = subprocess.run([python(real, release), str(REPO / "lab/real/validate_args.py"), *profile, "--cases", "-"],
                              input=json.dumps(cases), capture_output=True, text=True, cwd=REPO, timeout=600, check=False,
                              env=environment(real, cpu=False, CUDA_DEVICE_ORDER="PCI_BUS_ID"))
        seconds = time.monotonic() - start
        assert proc.returncode in (0, 1), f"validate_args.py {release} {' '.join(profile)} exit {proc.returncode}: {proc.stderr[-3000:]}"
        return key, dict(json.loads(proc.stdout), seconds=seconds, argvs=len(cases))

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(pool.map(one, list(groups)))
    out: dict = {}
    for (release, profile), answer in done.items():
        by_id = {tuple(result["id"]): result for result in answer["results"]}
        assert len(by_id) == len(answer["results"]), f"validate_args.py {release} answered a case twice"
        for (owner, tag, name), argv in groups[(release, profile)].items():
            mine = out.setdefault((owner, release, tag), {
                "sglang": answer["sglang"], "speculative_algorithms": answer["speculative_algorithms"],
                "results": {}, "argv": {}, "seconds": answer["seconds"], "argvs": answer["argvs"]})
            mine["results"][name] = by_id[(owner, tag, name)]
            mine["argv"][name] = argv
    return out


# --sleep-on-idle: an idle real scheduler otherwise spins a whole core (18.9 s of CPU in 20 s
# idle, 0.3 s with it, on real 0.5.11 here; it wakes on a request at once: 0.5.11
# srt/managers/scheduler.py:3722-3749, IdleSleeper polls its sockets), and the servers here
# are idle most of their lives
CPU_ARGS = ("--device", "cpu", "--sampling-backend", "pytorch", "--disable-cuda-graph",
            "--max-total-tokens", "4096", "--context-length", "1024", "--sleep-on-idle")


# Real SGLang refuses a --port above 55535: it derives its gRPC port as port + 10000 and
# checks it is at most 65535, even with gRPC off (0.5.11 srt/server_args.py:1042-1050,
# 0.5.23 srt/arg_groups/serving_hook.py:372-386: "ValueError: SGLANG_GRPC_PORT (70613)
# must be between 1 and 65535"). The kernel's ephemeral ports (32768-60999 here) go
# above that, so a free port for a real server is taken from below it.
MAX_SGLANG_PORT = 55535


def free_port(low: int = 20000, high: int = MAX_SGLANG_PORT) -> int:
    """A port free on 127.0.0.1 that real SGLang accepts as --port."""
    for port in random.sample(range(low, high + 1), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


class RealServer:
    """One real ``python -m sglang.launch_server`` on CPU, its output in a file."""

    def __init__(self, real: dict[str, str], release: str, log: Path, port: int | None = None,
                 args: tuple[str, ...] = (), model: str | None = None, env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.release = release
        self.log_path = log
        self.argv = [python(real, release), "-m", "sglang.launch_server",
                     "--model-path", model or real["INFEROPS_REAL_MODEL"], *CPU_ARGS,
                     "--host", "127.0.0.1", "--port", str(self.port), *args]
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=environment(real, **(env or {})), start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_line(self, needle: str, timeout: float = 180) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return True
            if self.proc.poll() is not None:
                return needle in self.text()
            time.sleep(0.5)
        return False

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, then SIGKILL of the whole session (the server's tree)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


def model_max(real: dict[str, str]) -> int:
    """The tiny model's own context length (its config.json's max_position_embeddings)."""
    return json.loads((Path(real["INFEROPS_REAL_MODEL"]) / "config.json").read_text())["max_position_embeddings"]


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            data = handle.read()
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def session_pids(leader: int) -> list[int]:
    """Live processes of a server's session, the leader included (RealServer starts it as one)."""
    found = []
    for name in os.listdir("/proc"):
        fields = _stat(int(name)) if name.isdigit() else None
        if fields and int(fields[3]) == leader and fields[0] not in ("Z", "X"):
            found.append(int(name))
    return found


class ExitClock(threading.Thread):
    """When a server's main process died: the first look at /proc that shows it a zombie
    or gone (its parent, the caller, does not reap it meanwhile). ``halt`` ends the watch."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.at, self.halt = pid, None, threading.Event()
        self.start()

    def run(self) -> None:
        while self.at is None and not self.halt.is_set():
            fields = _stat(self.pid)
            if fields is None or fields[0] in ("Z", "X"):
                self.at = time.monotonic()
            time.sleep(0.01)
