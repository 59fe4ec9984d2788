"""Shared fixtures: the SGLang simulator (a test double) installed from its wheel
(as the lab installs it) into a throwaway directory per emulated version, and run
as a real process with a hardware file and GPU ledger of its own. The
collection itself is importable as ``ansible_collections.inferops.sglang``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_helpers import ddtree_overlay, lab_ddtree
from sim_helpers import LAB, REPO, Server, free_port, write_executable
sys.path.insert(0, str(LAB / "simulator"))
sys.path.insert(0, str(REPO / "collections"))


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
                # The lab's DDTree overlay as the lab lays it: its sources and the gcc-built
                # ddtree_kernels.so (DT_NEEDED libcudart.so.12), from lab/ddtree/build.py.
                overlay = ddtree_overlay()
                for line in (overlay / "SHA256SUMS").read_text().splitlines():
                    name = line[66:]
                    shutil.copy(overlay / name, target / name)
            cache[key] = target
        return cache[key]

    return install


@pytest.fixture(scope="session")
def host_libraries(tmp_path_factory):
    """host_libraries(host) -> a directory of soname-only stand-ins (test doubles) of the
    CUDA runtime libraries the host's hardware file lists that the DDTree kernels need
    (libcudart.so.12 on ct200): the simulated host's user space, for LD_LIBRARY_PATH."""
    cache: dict[str, Path] = {}

    def make(host: str) -> Path:
        if host not in cache:
            listed = json.loads((LAB / "hosts" / host / "hardware.json").read_text()).get("cuda_libraries", [])
            directory = tmp_path_factory.mktemp(f"host-libs-{host}")
            for name in listed:
                if name.startswith("libcudart.so."):
                    lab_ddtree().soname_stub(directory, name)
            cache[host] = directory
        return cache[host]

    return make


@pytest.fixture
def hardware(tmp_path):
    """write(host='ct129', **overrides) -> env for a simulator process."""

    def write(host: str = "ct129", **overrides) -> dict:
        data = json.loads((LAB / "hosts" / host / "hardware.json").read_text())
        data["time_scale"] = 0.01
        # generations at the test's scale too, unless a test asks for the host's own (test_simulator_speed)
        (data.get("performance") or {}).pop("time_scale", None)
        data.update(overrides)
        path = tmp_path / f"hardware-{host}.json"
        path.write_text(json.dumps(data))
        env = dict(os.environ)
        env.update(SGLANG_SIM_HARDWARE=str(path), SGLANG_SIM_STATE=str(tmp_path / "gpu"))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        return env

    return write


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """install(): the lab's fake nvidia-smi and dmesg (test doubles) first on PATH; they
    read the hardware file named by SGLANG_SIM_HARDWARE and the lab's kernel log in SGLANG_SIM_STATE."""

    def install() -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        for name, module in (("nvidia-smi", "nvidia_smi"), ("dmesg", "dmesg")):
            write_executable(bin_dir / name,
                             f"#!/bin/sh\nexec {sys.executable} -c 'import sys; sys.path.insert(0, \"{LAB / 'simulator'}\"); "
                             f"from sglang_simulator import {module}; sys.exit({module}.main(sys.argv[1:]))' \"$@\"\n")
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        # the GPU health check reads the lab's kernel log (the fake dmesg), not this machine's
        from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
        monkeypatch.setattr(_gpu_health, "KERNEL_LOG_COMMANDS", (("dmesg", ["dmesg"]),))

    return install


@pytest.fixture
def launch(sim_install, hardware, host_libraries, tmp_path):
    """launch(args, version=, ddtree=, host=, gpus=, hw=, env_extra=) -> Server (a real process)."""
    servers: list[Server] = []

    def start(args: list[str], version: str = "0.5.11", ddtree: bool = False, host: str = "ct129",
              gpus: str | None = "0,2", hw: dict | None = None, port: int | None = None,
              env_extra: dict | None = None) -> Server:
        site = sim_install(version, ddtree)
        env = hardware(host, **(hw or {}))
        env.update(env_extra or {})
        env["PYTHONPATH"] = str(site)
        if ddtree:
            env["LD_LIBRARY_PATH"] = str(host_libraries(host))
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        port = port or free_port()
        log = tmp_path / f"server-{port}-{len(servers)}.log"
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
