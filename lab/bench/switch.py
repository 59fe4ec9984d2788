"""What a switch costs the service's clients, measured: ``make bench-switch``.

The collection's own switch (``_switch.Switch``, the state machine the role runs) drives a
real gateway (smg at ``_gateway.PINNED``, from the test venv ``make units`` builds) in front
of the service's two slots, as ``_slots.decide`` puts the candidate: blue/green (the candidate
started in the free slot beside the live one, gated, routed, then given the traffic; the old
slot drained, soaked, stopped; refused, the candidate is stopped and the live slot is never
touched) and in place (the server taken out, drained, stopped, the variant started, gated and
put in; refused, the known-good one restored and put back). The host seam is
``_switch.SystemHost`` for everything but the units, which are local processes here
(``ProcessHost``: a unit file holds the server's arguments and GPUs; the gate watches its PID).

Clients, all through the gateway's port, from before the switch until after it: two loops of
short requests one after another, and a loop of streams of 200 tokens; a failed request is
sent again 50 ms later (so the failed counts measure attempts during the outage, not users).
For each switch: requests and streams, the failed and refused ones, the streams cut short
(answered 200, ended before their tokens), the longest time with no successful answer, and the switch's own record (outcome, the gateway's ``unavailable_s``,
the variant's start time as its gate measured it).

Servers: the SGLang simulator with ct129's hardware file at a time scale (``--server sim``,
the default: seconds; the live slot on GPUs 0,2, the candidate on 3,4; in place the candidate
takes the live slot's GPUs), or real SGLang 0.5.11 on CPU with the tiny model (``--server real``,
``make real`` builds it: two real servers at once for blue/green). Figures go to
.cache/bench/switch.json.

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

from ansible_collections.inferops.sglang.plugins.module_utils import _http, _process_watch, _readiness, _slots, _switch  # noqa: E402  pylint: disable=wrong-import-position
from sim_helpers import MODEL, NEXTN, GatewayProcess, free_port, through_gateway  # noqa: E402  pylint: disable=wrong-import-position

GATEWAY_PYTHON = Path(os.environ.get("INFEROPS_GATEWAY_VENV", REPO / ".cache" / "gateway-venv")) / "bin" / "python"
UNIT = "bench.service"
STREAM_TOKENS = 200
PORTS = {}  # slot -> server port, set in main()
GPUS = {"blue": [0, 2], "green": [3, 4]}
SOAK = 10.0


class ProcessHost(_switch.SystemHost):
    """SystemHost with each unit a local process: ``spawn(args, gpus, log)`` starts the server the
    installed unit file names (its JSON ``args`` and ``gpus``) and returns (proc, stop)."""

    def __init__(self, unit_dir: Path, spawn, logs: Path) -> None:
        super().__init__(UNIT, gate_options={"check_listener": False, "interval": 0.5})
        self.unit_dir, self.spawn, self.logs = unit_dir, spawn, logs
        self.units: dict[str, tuple] = {}   # unit -> (proc, stop, log)
        self.starts = 0

    def unit_state(self, unit: str) -> dict:
        proc = self.units.get(unit, (None,))[0]
        return {"active": proc is not None and proc.poll() is None, "loaded": (self.unit_dir / unit).exists()}

    def stop(self, unit: str) -> None:
        found = self.units.pop(unit, None)
        if found:
            found[1]()

    def stop_all(self) -> None:
        for unit in list(self.units):
            self.stop(unit)

    def start(self, unit: str) -> None:
        self.stop(unit)
        self.starts += 1
        log = self.logs / f"server-{self.starts}-{unit}.log"
        doc = json.loads((self.unit_dir / unit).read_text())
        proc, stop = self.spawn(doc["args"], doc["gpus"], log)
        self.units[unit] = (proc, stop, log)

    def disable(self, unit: str) -> None:
        pass

    def gate(self, url: str, api_key_file: str | None, timeout: float, settle: float, unit: str | None = None) -> dict:
        proc, _stop, log = self.units.get(unit or UNIT, (None, None, None))
        watcher = _process_watch.PidWatcher(proc.pid, str(log)) if proc else _process_watch.NoWatcher()
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


def variant(name: str, args: list[str]) -> dict:
    return {"variant": name, "args": args, "params": {"gate_timeout": 600, "name": name}, "sglang_version": "0.5.11"}


def run_switch(root: Path, gateway: GatewayProcess, control_file: Path, host: ProcessHost, target: dict,
               baseline: dict, run_id: str, beside: bool) -> dict:
    """One deploy: the slots decided as the preflight decides them (``beside``: whether the GPUs leave
    room), the files staged as the role stages them, the switch run."""
    sdir = root / "state"
    current = json.loads((sdir / "current.json").read_text()) if (sdir / "current.json").exists() else None
    live = _slots.live_of(current, UNIT, bool(current) and host.unit_state(current["unit"])["active"])
    # room beside the live slot, or only the live slot's own GPUs (the first deploy: blue's)
    pool = [0, 2, 3, 4] if beside else (live["gpus"] if live else GPUS["blue"])
    decision = _slots.decide(live, target["params"], 2, pool, None, {}, 1024, True, UNIT, PORTS)
    slot, unit = decision["slot"], decision["unit"]
    gpus = decision["gpus"] or GPUS[slot]
    staging = sdir / "staging" / run_id

    def argv(v: dict) -> list[str]:
        return [*v["args"], "--host", "127.0.0.1", "--port", str(PORTS[slot])]

    for directory, v in ((staging, target), (staging / "baseline", baseline)):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / unit).write_text(json.dumps({"args": argv(v), "gpus": gpus}))
    files = [{"name": unit, "src": str(host.unit_dir / unit), "mode": "0644"},
             {"name": "current.json", "src": str(sdir / "current.json"), "mode": "0600", "template": None}]
    url = f"http://127.0.0.1:{PORTS[slot]}"
    settings = _switch.Settings(
        service=unit, service_dir=str(sdir), files=files, staging=str(staging), baseline_staging=str(staging / "baseline"),
        variant=dict(target, argv=argv(target)), baseline=dict(baseline, argv=argv(baseline)), url=url, run_id=run_id,
        gpus=gpus, check_gpus=False, gate_settle=1,
        gateway={"url": gateway.url, "control_key_file": str(control_file), "workers_file": str(sdir / "workers.json"),
                 "metrics_url": f"http://127.0.0.1:{gateway.metrics}/metrics", "timeout": 60},
        slot=dict(decision, soak=SOAK))
    return _switch.Switch(settings, host).run()


def sim_spawn(scale: float, root: Path):
    from build_wheel import build  # pylint: disable=import-outside-toplevel

    site = root / "sim-site"
    if not site.exists():
        wheel = build("0.5.11", root / "sim-wheel")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--disable-pip-version-check", "--target", str(site), str(wheel)], check=True)
    hardware = json.loads((REPO / "lab" / "hosts" / "ct129" / "hardware.json").read_text())
    hardware["time_scale"] = scale
    (root / "hardware.json").write_text(json.dumps(hardware))
    env = dict(os.environ, PYTHONPATH=str(site), SGLANG_SIM_HARDWARE=str(root / "hardware.json"),
               SGLANG_SIM_STATE=str(root / "gpu"))

    def spawn(args: list[str], gpus: list[int], log: Path):
        handle = log.open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *args],
                                env=dict(env, CUDA_VISIBLE_DEVICES=",".join(str(g) for g in gpus)), stdout=handle,
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

    def spawn(args: list[str], _gpus: list[int], log: Path):
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
        ports = (free_port(), free_port())
    else:
        from real_sglang import free_port as real_port  # pylint: disable=import-outside-toplevel

        spawn, known, target, refused = real_spawn(root)
        ports = (real_port(), real_port())
    PORTS.update(blue=ports[0], green=ports[1])
    control = "bench-control-key"
    (root / "control-key").write_text(control + "\n")
    gateway = GatewayProcess(GATEWAY_PYTHON, root / "gateway", control)
    host = ProcessHost(root / "unit", spawn, logs)
    base = variant("known-good", known)
    results = []
    try:
        first = run_switch(root, gateway, root / "control-key", host, base, base, "run0", False)
        if first["outcome"] != "switched":
            raise RuntimeError(f"the known-good service did not start: {first['msg']}")
        # blue/green while the GPUs leave room beside the live slot, then in place on the live slot's GPUs
        for run_id, name, v, beside in (
                ("run1", "blue/green switch", variant("variant", target), True),
                ("run2", "refused candidate, blue/green", variant("refused", refused), True),
                ("run3", "in-place switch", variant("known-good", known), False),
                ("run4", "refused candidate, in place", variant("refused", refused), False)):
            clients = Clients(gateway.port)
            time.sleep(3)
            started = time.monotonic()
            result = run_switch(root, gateway, root / "control-key", host, v, base, run_id, beside)
            ended = time.monotonic()
            time.sleep(3)
            clients.stop()
            record = result["record"] or {}
            verdict = record.get("verdict") or {}
            out = dict(figures(clients.done, started, ended + 3), case=name, server=options.server,
                       outcome=result["outcome"], switch_s=round(ended - started, 2),
                       slot=(record.get("slot") or {}).get("slot"), mode=(record.get("slot") or {}).get("mode"),
                       unavailable_s=(record.get("gateway") or {}).get("unavailable_s"),
                       record_requests=(record.get("gateway") or {}).get("requests"),
                       variant_gate_s=verdict.get("elapsed"),
                       rollback_gate_s=(record.get("rollback") or {}).get("elapsed"))
            results.append(out)
            print(f"{name} ({options.server}, slot {out['slot']}): {out['outcome']} in {out['switch_s']} s; {out['requests']} requests, "
                  f"{out['failed']} failed; {out['streams']} streams, {out['failed_streams']} refused, {out['cut_streams']} cut; longest gap with no "
                  f"answer {out['longest_gap_s']} s; the record's unavailable_s {out['unavailable_s']}, requests "
                  f"{out['record_requests']}; the variant's "
                  f"gate {out['variant_gate_s']} s, the restored one's {out['rollback_gate_s']} s", flush=True)
    finally:
        host.stop_all()
        gateway.stop()
    previous = json.loads(OUT.read_text()) if OUT.exists() else {}
    previous[options.server] = results
    OUT.write_text(json.dumps(previous, indent=2))
    print(f"figures: {OUT}; logs: {logs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
