"""What a switch costs the service's clients, measured: ``make bench-switch``.

The collection's own switch (``_switch.Switch``, the state machine the role runs) drives a
real gateway (smg at ``_gateway.PINNED``, from the test venv ``make units`` builds) in front
of one server, in place: the server is taken out of the gateway, drained, stopped, the
variant started, gated and put in (or, refused, the known-good one restored and put back).
The host seam is ``_switch.SystemHost`` for everything but the unit, which is a local process
here (``ProcessHost``: its unit file holds the server's arguments; the gate watches its PID).

Clients, all through the gateway's port, from before the switch until after it: two loops of
short requests one after another, and a loop of streams of 200 tokens; a failed request is
sent again 50 ms later (so the failed counts measure attempts during the outage, not users).
For each switch: requests and streams, the failed and refused ones, the streams cut short
(answered 200, ended before their tokens), the longest time with no successful answer, and the switch's own record (outcome, the gateway's ``unavailable_s``,
the variant's start time as its gate measured it).

Servers: the SGLang simulator with ct200's hardware file at a time scale (``--server sim``,
the default: seconds), or real SGLang 0.5.11 on CPU with the tiny model (``--server real``,
``make real`` builds it). Blue/green (the candidate beside the live server) is not built
yet: these are the in-place figures it is to beat. Figures go to .cache/bench/switch.json.

Usage: python lab/bench/switch.py [--server sim|real] [--time-scale 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".cache" / "bench" / "switch.json"
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO / "tests" / "conformance"))
sys.path.insert(0, str(REPO / "lab" / "simulator"))
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.inferops.sglang.plugins.module_utils import _http, _process_watch, _readiness, _switch  # noqa: E402  pylint: disable=wrong-import-position
from sim_helpers import MODEL, NEXTN, GatewayProcess, free_port, through_gateway  # noqa: E402  pylint: disable=wrong-import-position

GATEWAY_PYTHON = Path(os.environ.get("INFEROPS_GATEWAY_VENV", REPO / ".cache" / "gateway-venv")) / "bin" / "python"
UNIT = "bench.service"
STREAM_TOKENS = 200


class ProcessHost(_switch.SystemHost):
    """SystemHost with the unit as a local process: ``spawn(args, log)`` starts the server the
    installed unit file names (its JSON ``args``) and returns (proc, stop)."""

    def __init__(self, unit_file: Path, spawn, logs: Path) -> None:
        super().__init__(UNIT, gate_options={"check_listener": False, "interval": 0.5})
        self.unit_file, self.spawn, self.logs = unit_file, spawn, logs
        self.proc, self._stop, self.log, self.starts = None, None, None, 0

    def unit_state(self, unit: str) -> dict:
        return {"active": self.proc is not None and self.proc.poll() is None, "loaded": self.unit_file.exists()}

    def stop(self, unit: str) -> None:
        if self._stop:
            self._stop()
        self.proc = self._stop = None

    def start(self, unit: str) -> None:
        self.stop(unit)
        self.starts += 1
        self.log = self.logs / f"server-{self.starts}.log"
        self.proc, self._stop = self.spawn(json.loads(self.unit_file.read_text())["args"], self.log)

    def gate(self, url: str, api_key_file: str | None, timeout: float, settle: float) -> dict:
        watcher = _process_watch.PidWatcher(self.proc.pid, str(self.log)) if self.proc else _process_watch.NoWatcher()
        gate = _readiness.Gate(_http.Client(url, None, True, 30), watcher, timeout=timeout, interval=0.5,
                               generations=1, settle=settle, check_listener=False)
        return gate.run()


class Clients:
    """Requests through the gateway until ``stop``: each (kind, started, ended, ok, detail)."""

    def __init__(self, port: int) -> None:
        self.port, self.done, self._stop = port, [], threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(kind,), daemon=True)
                         for kind in ("short", "short", "stream")]
        for thread in self._threads:
            thread.start()

    def _loop(self, kind: str) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            if kind == "stream":
                answer = through_gateway(self.port, STREAM_TOKENS, stream=True)
                ok = answer["status"] == 200 and answer.get("tokens") == STREAM_TOKENS
            else:
                answer = through_gateway(self.port, 2)
                ok = answer["status"] == 200
            self.done.append((kind, started, time.monotonic(), ok, answer))
            if not ok:
                time.sleep(0.05)  # a client retrying, not spinning

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=300)


def figures(done: list, since: float, until: float) -> dict:
    inside = [d for d in done if d[1] >= since and d[1] <= until]
    short = [d for d in inside if d[0] == "short"]
    streams = [d for d in inside if d[0] == "stream"]
    ends = sorted([since] + [d[2] for d in done if d[3] and since <= d[2] <= until] + [until])
    # a stream refused (no 200) failed as a request does; one that got its 200 and ended short was cut
    return {"requests": len(short), "failed": sum(1 for d in short if not d[3]), "streams": len(streams),
            "failed_streams": sum(1 for d in streams if d[4].get("status") != 200),
            "cut_streams": sum(1 for d in streams if d[4].get("status") == 200 and not d[3]),
            "longest_gap_s": round(max(b - a for a, b in zip(ends, ends[1:])), 2)}


def variant(name: str, args: list[str], port: int) -> dict:
    argv = [*args, "--host", "127.0.0.1", "--port", str(port)]
    return {"variant": name, "argv": argv, "params": {"gate_timeout": 600}, "sglang_version": "0.5.11"}


def run_switch(root: Path, gateway: GatewayProcess, control_file: Path, host: ProcessHost, target: dict,
               baseline: dict, run_id: str, url: str) -> dict:
    sdir = root / "state"
    staging = sdir / "staging" / run_id
    for directory, v in ((staging, target), (staging / "baseline", baseline)):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / UNIT).write_text(json.dumps({"args": v["argv"]}))
    files = [{"name": UNIT, "src": str(host.unit_file), "mode": "0644"},
             {"name": "current.json", "src": str(sdir / "current.json"), "mode": "0600", "template": None}]
    settings = _switch.Settings(
        service=UNIT, service_dir=str(sdir), files=files, staging=str(staging), baseline_staging=str(staging / "baseline"),
        variant=target, baseline=baseline, url=url, run_id=run_id, check_gpus=False, gate_settle=1,
        gateway={"url": gateway.url, "control_key_file": str(control_file), "workers_file": str(sdir / "workers.json"),
                 "timeout": 60})
    return _switch.Switch(settings, host).run()


def sim_spawn(scale: float, root: Path):
    from build_wheel import build  # pylint: disable=import-outside-toplevel

    site = root / "sim-site"
    if not site.exists():
        wheel = build("0.5.11", root / "sim-wheel")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--disable-pip-version-check", "--target", str(site), str(wheel)], check=True)
    hardware = json.loads((REPO / "lab" / "hosts" / "ct200" / "hardware.json").read_text())
    hardware["time_scale"] = scale
    (root / "hardware.json").write_text(json.dumps(hardware))
    env = dict(os.environ, PYTHONPATH=str(site), SGLANG_SIM_HARDWARE=str(root / "hardware.json"),
               SGLANG_SIM_STATE=str(root / "gpu"), CUDA_VISIBLE_DEVICES="0,1")

    def spawn(args: list[str], log: Path):
        handle = log.open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *args], env=env, stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)

        def stop() -> None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            handle.close()
        return proc, stop
    known = [*MODEL, *NEXTN]
    smaller = [*known]
    smaller[smaller.index("--max-running-requests") + 1] = "8"
    return spawn, known, smaller, [*known, "--dtype", "not-a-dtype"]


def real_spawn(root: Path):
    from real_sglang import CPU_ARGS, environment, paths, python  # pylint: disable=import-outside-toplevel

    real = paths()

    def spawn(args: list[str], log: Path):
        handle = log.open("wb")
        proc = subprocess.Popen([python(real, "0.5.11"), "-m", "sglang.launch_server", *args], env=environment(real),
                                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)

        def stop() -> None:
            try:
                os.killpg(proc.pid, 15)
                proc.wait(60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait()
            handle.close()
        return proc, stop
    known = ["--model-path", real["INFEROPS_REAL_MODEL"], *CPU_ARGS]
    return spawn, known, [*known, "--max-running-requests", "4"], [*known, "--attention-backend", "triton"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=["sim", "real"], default="sim")
    parser.add_argument("--time-scale", type=float, default=0.05, help="the simulator's (ct200's hardware at this scale)")
    options = parser.parse_args()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"switch-{options.server}-", dir=OUT.parent))
    logs = root / "logs"
    logs.mkdir()
    (root / "unit").mkdir()
    if options.server == "sim":
        spawn, known, target, refused = sim_spawn(options.time_scale, root)
        port = free_port()
    else:
        from real_sglang import free_port as real_port  # pylint: disable=import-outside-toplevel

        spawn, known, target, refused = real_spawn(root)
        port = real_port()
    url = f"http://127.0.0.1:{port}"
    control = "bench-control-key"
    (root / "control-key").write_text(control + "\n")
    gateway = GatewayProcess(GATEWAY_PYTHON, root / "gateway", control)
    host = ProcessHost(root / "unit" / UNIT, spawn, logs)
    base = variant("known-good", known, port)
    results = []
    try:
        first = run_switch(root, gateway, root / "control-key", host, base, base, "run0", url)
        if first["outcome"] != "switched":
            raise RuntimeError(f"the known-good service did not start: {first['msg']}")
        for run_id, name, v in (("run1", "in-place switch", variant("variant", target, port)),
                                ("run2", "refused candidate, in place", variant("refused", refused, port))):
            clients = Clients(gateway.port)
            time.sleep(3)
            started = time.monotonic()
            result = run_switch(root, gateway, root / "control-key", host, v, base, run_id, url)
            ended = time.monotonic()
            time.sleep(3)
            clients.stop()
            record = result["record"] or {}
            verdict = record.get("verdict") or {}
            out = dict(figures(clients.done, started, ended + 3), case=name, server=options.server,
                       outcome=result["outcome"], switch_s=round(ended - started, 2),
                       unavailable_s=(record.get("gateway") or {}).get("unavailable_s"),
                       variant_gate_s=verdict.get("elapsed"),
                       rollback_gate_s=(record.get("rollback") or {}).get("elapsed"))
            results.append(out)
            print(f"{name} ({options.server}): {out['outcome']} in {out['switch_s']} s; {out['requests']} requests, "
                  f"{out['failed']} failed; {out['streams']} streams, {out['failed_streams']} refused, {out['cut_streams']} cut; longest gap with no "
                  f"answer {out['longest_gap_s']} s; the record's unavailable_s {out['unavailable_s']}; the variant's "
                  f"gate {out['variant_gate_s']} s, the restored one's {out['rollback_gate_s']} s", flush=True)
    finally:
        host.stop(UNIT)
        gateway.stop()
    previous = json.loads(OUT.read_text()) if OUT.exists() else {}
    previous[options.server] = results
    OUT.write_text(json.dumps(previous, indent=2))
    print(f"figures: {OUT}; logs: {logs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
