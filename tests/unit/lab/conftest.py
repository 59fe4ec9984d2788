"""Fixtures for the SGLang simulator's own tests: the simulator is installed from
its wheel (as the lab installs it) into a throwaway directory per emulated version,
and run as a real process with a hardware file and GPU ledger of its own."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
LAB = REPO / "lab"
MODELS = LAB / "models"
sys.path.insert(0, str(LAB / "simulator"))


@pytest.fixture(scope="session")
def sim_install(tmp_path_factory):
    """install(version, ddtree=False) -> directory to put on PYTHONPATH."""
    cache: dict[tuple[str, bool], Path] = {}
    sys.path.insert(0, str(LAB / "simulator"))
    from build_wheel import build  # noqa: E402 - lab tool, not an installed module

    def install(version: str = "0.5.11", ddtree: bool = False) -> Path:
        key = (version, ddtree)
        if key not in cache:
            root = tmp_path_factory.mktemp(f"sim-{version}-{int(ddtree)}")
            wheel = build(version, root / "wheel")
            target = root / "site"
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                 "--disable-pip-version-check", "--target", str(target), str(wheel)],
                check=True,
            )
            if ddtree:
                shutil.copy(LAB / "ddtree" / "ddtree_utils.py", target / "sglang/srt/speculative/ddtree_utils.py")
            cache[key] = target
        return cache[key]

    return install


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else None

    def wait_for(self, predicate, timeout: float = 20.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"{what} not reached in {timeout} s; output:\n{self.output()}")

    def status(self, path: str, headers: dict | None = None):
        try:
            return self.request("GET", path, headers=headers)[0]
        except (urllib.error.URLError, ConnectionError):
            return None


@pytest.fixture
def hardware(tmp_path):
    """write(host='ct129', **overrides) -> env for a simulator process."""

    def write(host: str = "ct129", **overrides) -> dict:
        data = json.loads((LAB / "hosts" / host / "hardware.json").read_text())
        data["time_scale"] = 0.01
        data.update(overrides)
        path = tmp_path / f"hardware-{host}.json"
        path.write_text(json.dumps(data))
        env = dict(os.environ)
        env.update(SGLANG_SIM_HARDWARE=str(path), SGLANG_SIM_STATE=str(tmp_path / "gpu"))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        return env

    return write


@pytest.fixture
def launch(sim_install, hardware, tmp_path):
    """launch(args, version=, ddtree=, host=, gpus=, hw=) -> Server (a real process)."""
    servers: list[Server] = []

    def start(args: list[str], version: str = "0.5.11", ddtree: bool = False, host: str = "ct129",
              gpus: str | None = "0,2", hw: dict | None = None, port: int | None = None) -> Server:
        site = sim_install(version, ddtree)
        env = hardware(host, **(hw or {}))
        env["PYTHONPATH"] = str(site)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        port = port or free_port()
        log = tmp_path / f"server-{port}.log"
        cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(port), *args]
        proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        server = Server(proc, port, log)
        servers.append(server)
        return server

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


MODEL = ["--model-path", str(MODELS / "Qwen3.6-27B"), "--tp-size", "2", "--served-model-name", "Qwen3.6-27B"]
DDTREE = ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", str(MODELS / "Qwen3.6-27B-DFlash")]
NEXTN = ["--speculative-algorithm", "NEXTN", "--context-length", "131072", "--max-running-requests", "16",
         "--mem-fraction-static", "0.88"]
