"""What a tune finds and what it costs, against an exhaustive grid measured in the same run:
``make bench-tune``.

The collection's own search (``_tune.Tune``, the one tune.yml runs) on ct129's stand-in: the
SGLang simulator with ct129's hardware file (8x RTX A6000, GPU 1 lost) and the speed model a tune
searches over (``TUNE_PERFORMANCE``: hardware.py's coefficients; the accept length of NEXTN
measured at 3 steps). The live service (NEXTN on GPUs 0,2) serves a constant client load the
whole time (two loops of short requests, a stream loop); the base runs in one trial slot (GPUs
3,4) and each candidate in another (5,6); the memory planner (_memplan, the preflight's) screens
every point first.

Then the exhaustive grid: every point the planner lets through, launched and measured once the
same way (the first rung's pairs against the base), and every point it drops launched too, to
see that it dies. Figures: the grid's size, dropped, launched, died and their time to verdict, the
tune's wall time; the winner's ratio against the grid's best (goal: within 5 %, with at most a
third of the grid's launches, no unfit candidate launched); the live service's failed requests and
main PID. Written to .cache/bench/tune.json.

With ``--server real``: real SGLang 0.5.11 on CPU with the lab's tiny model (``make real`` builds
it), two real servers at once beside a third, the live one, over the settings that matter on CPU
(``REAL_SPACE``: the running-request limit and the prefill chunk, around a base that runs one
request at a time); no memory plan (no GPU), so nothing is dropped.

Usage: python lab/bench/tune.py [--server sim|real] [--time-scale 0.05] [--trials 12] [--no-grid]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".cache" / "bench" / "tune.json"
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO / "lab" / "simulator"))
sys.path.insert(0, str(REPO / "lab" / "bench"))
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.inferops.sglang.plugins.module_utils import _bench, _http, _memplan, _process_watch, _readiness, _sglang_log, _tune, _variants  # noqa: E402  pylint: disable=wrong-import-position
from sim_helpers import MODELS, free_port  # noqa: E402  pylint: disable=wrong-import-position

# The speed model's coefficients on this stand-in (hardware.py names their sources): a step of
# 20 ms at time scale 1, eager decode half as fast, NEXTN's 2.71 tokens a step measured at 3 steps.
TUNE_PERFORMANCE = {"step_seconds": 0.02, "eager_factor": 2.0, "prefill_seconds": 0.1, "batch_cost": 0.06,
                    "draft_cost": 0.12, "speculative": {"NEXTN": {"accept_length": 2.71, "step_factor": 1.1, "steps": 3}}}
MODEL = str(MODELS / "Qwen3.6-27B")
SERVER = {"model_path": MODEL, "served_model_name": "Qwen3.6-27B", "tp_size": 2}
BASE = {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4, "context_length": 32768, "max_running_requests": 4,
        "mem_fraction_static": 0.85, "disable_radix_cache": True, "cuda_graph": False}
GOAL = {"concurrency": 8, "max_tokens": 64}
SPACE = {"mem_fraction_static": [0.82, 0.88, 0.94], "cuda_graph": [True, False], "cuda_graph_max_bs": [4, 8],
         "max_running_requests": [4, 8, 16], "speculative_num_steps": [1, 2, 3, 4, 5]}
GPUS = {"live": [0, 2], "reference": [3, 4], "candidate": [5, 6]}
# Real SGLang on CPU: the tiny model, the conformance suite's CPU flags (their context length and
# KV tokens), around a base that runs one request at a time
REAL_BASE = {"max_running_requests": 1, "cuda_graph": False}
REAL_GOAL = {"concurrency": 4, "max_tokens": 32}
REAL_SPACE = {"max_running_requests": [1, 2, 4], "chunked_prefill_size": [128, 512]}


class SimTrials:
    """_tune.Trials on local simulator processes: a trial slot per role, each gated as the deploy
    gates (the readiness gate on the process, its verdict when it dies)."""

    def __init__(self, spawn, logs: Path, argv=None, ports=None, together: bool = True) -> None:
        self.spawn, self.logs = spawn, logs
        self.together = together  # False: one trial slot, each server measured alone (_tune's one-slot mode)
        self.argv = argv or (lambda params, port: _variants.argv(params, dict(SERVER, port=port), (0, 5, 11)))
        self.procs: dict[str, tuple] = {}
        self.ports = ports or {role: free_port() for role in ("reference", "candidate")}
        self.starts = 0
        self.events: list[dict] = []

    def start(self, role: str, params: dict) -> dict:
        self.stop(role)
        self.starts += 1
        log = self.logs / f"{self.starts:03d}-{role}.log"
        proc, stop = self.spawn(self.argv(params, self.ports[role]), GPUS[role], log)
        self.procs[role] = (proc, stop)
        gate = _readiness.Gate(_http.Client(f"http://127.0.0.1:{self.ports[role]}", None, True, 30),
                               _process_watch.PidWatcher(proc.pid, str(log)), timeout=600, interval=0.2,
                               generations=1, settle=0.5, check_listener=False)
        verdict = gate.run()
        if verdict.get("ready"):
            return {"ready": True, "seconds": verdict.get("elapsed"), "signals": {"server": verdict.get("server")}}
        return {"ready": False, "seconds": verdict.get("elapsed"), "verdict": verdict.get("failure"),
                "cause": f"{verdict.get('cause')}: {verdict.get('cause_summary') or verdict.get('msg')}"}

    def stop(self, role: str) -> None:
        found = self.procs.pop(role, None)
        if found:
            found[1]()

    def compare(self, load: dict) -> dict:
        client = {role: _http.Client(f"http://127.0.0.1:{port}", None, True, 60) for role, port in self.ports.items()}
        return _bench.interleaved(client["reference"], client["candidate"], load)

    def measure(self, role: str, load: dict) -> dict:
        """One server alone (one trial slot), as SystemHost.bench measures it."""
        client = _http.Client(f"http://127.0.0.1:{self.ports[role]}", None, True, 60)
        return _bench.benchmark(client, load["requests"], load["concurrency"], load["max_tokens"], load["rounds"],
                                load.get("warmup", True), load["timeout"])

    def signals(self, role: str) -> dict:
        """SGLang's tuning signals in the trial's own log file since its start."""
        logs = sorted(self.logs.glob(f"*-{role}.log"))
        return _sglang_log.signals(logs[-1].read_text(errors="replace").splitlines()) if logs else {}

    def time(self) -> float:
        return time.monotonic()

    def progress(self, event: dict) -> None:
        self.events.append(event)
        print("  tune:", json.dumps(event, default=str), flush=True)


class LiveLoad:
    """Constant client load on the live server until ``stop``: each (ok, seconds)."""

    def __init__(self, port: int) -> None:
        self.client = _http.Client(f"http://127.0.0.1:{port}", None, True, 60)
        self.done: list[bool] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(tokens,), daemon=True) for tokens in (4, 4, 64)]
        for thread in self._threads:
            thread.start()

    def _loop(self, tokens: int) -> None:
        index = 0
        while not self._stop.is_set():
            index += 1
            try:
                answer = _bench.sample(self.client, _bench.PROMPTS[index % len(_bench.PROMPTS)], tokens, 60)
                self.done.append(bool(answer.get("ok")))
            except Exception:  # noqa: BLE001 - a failed request is the figure
                self.done.append(False)
                time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)


def planner():
    cache = _memplan.ModelCache()

    def plan(params: dict) -> dict:
        return _memplan.plan_resolved(params, MODEL, None, [49140, 49140], 2, "0.5.11", cache=cache, search=False)
    return plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--server", choices=("sim", "real"), default="sim")
    parser.add_argument("--time-scale", type=float, default=0.05, help="the simulator's start-up time scale")
    parser.add_argument("--generation-scale", type=float, default=0.25, help="the generations' time scale")
    parser.add_argument("--trials", type=int, default=12, help="the tune's launches")
    parser.add_argument("--no-grid", action="store_true", help="the tune alone, without the exhaustive grid")
    parser.add_argument("--slots", type=int, choices=(1, 2), default=2,
                        help="trial slots: 2, the base and a candidate at once; 1, taking turns (a host with one free GPU group)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as tmp:
        root = Path(tmp)
        (root / "logs").mkdir()
        setup = real_setup(root) if opts.server == "real" else sim_setup(root, opts)
        spawn, argv, base, goal, space, plan = setup
        ports = None
        if opts.server == "real":
            from real_sglang import free_port as real_port  # pylint: disable=import-outside-toplevel
            ports = {role: real_port() for role in ("reference", "candidate")}
            live_port = real_port()
        else:
            live_port = free_port()
        live_proc, live_stop = spawn(argv(base, live_port), GPUS["live"], root / "logs" / "live.log")
        gate = _readiness.Gate(_http.Client(f"http://127.0.0.1:{live_port}", None, True, 30),
                               _process_watch.PidWatcher(live_proc.pid, str(root / "logs" / "live.log")), timeout=600,
                               interval=0.2, generations=1, settle=0.5, check_listener=False)
        assert gate.run()["ready"], "the live server did not start"
        load = LiveLoad(live_port)
        trials = SimTrials(spawn, root / "logs", argv, ports, together=opts.slots == 2)
        try:
            began = time.monotonic()
            store: dict = {}
            result = _tune.Tune("base", base, goal, space, {"trials": opts.trials, "minutes": 60}, plan, trials,
                                store=store).run()
            tune_seconds = time.monotonic() - began
            tune_launches = trials.starts
            grid = None
            if not opts.no_grid:
                grid = exhaustive(trials, plan, base, goal, space)
        finally:
            trials.stop("reference")
            trials.stop("candidate")
            load.stop()
            live_alive = live_proc.poll() is None
            live_stop()
        figures = {
            "server": opts.server, "slots": opts.slots,
            "grid": result["grid"], "dropped_by_planner": len(result["dropped"]), "fit": result["fit"],
            "tune": {"launches": result["launches"], "server_starts": tune_launches, "deaths": len(result["deaths"]),
                     "death_verdict_s": [d.get("seconds") for d in result["deaths"]], "seconds": round(tune_seconds, 1),
                     "verdict": result["verdict"], "msg": result["msg"],
                     "winner": (result.get("winner") or {}).get("changes")},
            "live": {"requests": len(load.done), "failed": load.done.count(False), "pid_unchanged": live_alive},
        }
        if grid:
            figures["grid_measured"] = grid
            best = max((g for g in grid["points"] if g["ratio"]), key=lambda g: g["ratio"])
            winner_key = (result.get("best") or {}).get("key")
            mine = next((g for g in grid["points"] if g["key"] == winner_key), None)
            figures["winner_vs_grid_best"] = round(mine["ratio"] / best["ratio"], 3) if mine and mine["ratio"] else None
            figures["grid_best"] = best["changes"]
            figures["launch_share"] = round(result["launches"] / max(1, grid["launched_fit"]), 3)
        out = OUT.with_name(f"tune-{opts.server}{'-1slot' if opts.slots == 1 else ''}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(figures, indent=2, default=str))
        report = out.with_name(out.stem + "-report.md")
        report.write_text(_tune.markdown(result, "bench", f"{opts.server} stand-in"))
        out.with_name(out.stem + "-plot.svg").write_text(_tune.svg(result))
        print(json.dumps({k: v for k, v in figures.items() if k != "grid_measured"}, indent=2, default=str))
        print(f"figures: {out}; report: {report}")
    return 0


def sim_setup(root: Path, opts):
    """ct129's stand-in: the simulator with the tune's speed model, the planner on its GPUs."""
    from switch import sim_spawn  # pylint: disable=import-outside-toplevel
    spawn = sim_spawn(opts.time_scale, root)[0]
    hardware = json.loads((root / "hardware.json").read_text())
    hardware["performance"] = dict(TUNE_PERFORMANCE, time_scale=opts.generation_scale)
    (root / "hardware.json").write_text(json.dumps(hardware))

    def argv(params: dict, port: int) -> list[str]:
        return _variants.argv(params, dict(SERVER, port=port), (0, 5, 11))
    return spawn, argv, BASE, GOAL, SPACE, planner()


def real_setup(root: Path):
    """Real SGLang 0.5.11 on CPU with the tiny model; no GPU, so no memory plan."""
    sys.path.insert(0, str(REPO / "tests" / "conformance"))
    from switch import real_spawn  # pylint: disable=import-outside-toplevel
    from real_sglang import CPU_ARGS, paths  # pylint: disable=import-outside-toplevel
    spawn = real_spawn(root)[0]
    model = paths()["INFEROPS_REAL_MODEL"]

    def argv(params: dict, port: int) -> list[str]:
        flags = _variants.argv(params, {"model_path": model, "port": port, "tp_size": 1}, (0, 5, 11))
        # the CPU flags carry --disable-cuda-graph and the context length: drop the variant's copies
        return [f for f in flags if f != "--disable-cuda-graph"] + list(CPU_ARGS)

    def unplanned(_params: dict) -> dict:
        return {"fits": True, "binding": None, "reason": "not planned: no GPU"}
    return spawn, argv, REAL_BASE, REAL_GOAL, REAL_SPACE, unplanned


def exhaustive(trials: SimTrials, plan, base: dict, goal: dict, space: dict) -> dict:
    """Every fitting point measured once as the first rung measures it; every dropped one launched."""
    base = _tune.normalise(base)
    points = _tune.grid(base, space)
    kept, dropped = _tune.screen(points, plan, _tune.objective(goal))
    out = {"points": [], "dropped_died": 0, "dropped_served": 0, "launched_fit": 0, "seconds": 0.0}
    began = time.monotonic()
    reference = trials.start("reference", base)
    assert reference["ready"], reference
    load = {"requests": 2 * goal["concurrency"], "concurrency": goal["concurrency"], "max_tokens": goal["max_tokens"],
            "timeout": 120, "warmup": True, "rounds": _tune.RUNG_PAIRS[0]}
    for entry in kept:
        if entry["key"] == _tune.key_of(base):
            continue
        out["launched_fit"] += 1
        started = trials.start("candidate", entry["params"])
        ratio = None
        if started["ready"]:
            measured = trials.compare(load)
            ratio = _tune.ratio_of(measured).get("ratio") if measured.get("ok") else None
        trials.stop("candidate")
        out["points"].append({"key": entry["key"], "changes": _tune.changes(base, entry["params"]), "ratio": ratio,
                              "died": not started["ready"]})
        print("  grid:", out["launched_fit"], _tune.changes(base, entry["params"]), ratio, flush=True)
    for entry in dropped:
        started = trials.start("candidate", entry["params"])
        out["dropped_died" if not started["ready"] else "dropped_served"] += 1
        trials.stop("candidate")
    trials.stop("reference")
    out["seconds"] = round(time.monotonic() - began, 1)
    return out


if __name__ == "__main__":
    sys.exit(main())
