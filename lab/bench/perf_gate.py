"""The performance gate's cost and verdicts: sglang_bench's load at the role's defaults
(a warmup round, then 3 rounds; concurrency min(max_running_requests, 8), twice as many
requests, max_tokens min(context_length / 4, 128)), as the deploy runs it after the
readiness gate, against a known-good server and a variant, one server at a time.

Real SGLang 0.5.11 on CPU (lab/real/build.sh's cache, ``make real``) with the tiny model,
as known-good --max-running-requests 8 and as the variant --max-running-requests 2 (a
smaller envelope: at concurrency 8, six requests queue), both under the same load
(concurrency 8, the known-good's): the variant serves, and should be caught as slower.
The simulator's speeds per host and variant (ct200: balanced 1.24x NEXTN, NEXTN without
CUDA graphs half as fast) are measured the same way by tests/unit/lab/test_simulator_speed.py.

For each: seconds the measurement took (the gate's cost on a switch; a first switch from a
service with no figures in the history measures the known-good one too), the figures, the
comparison and its verdict at the default thresholds. The machine is shared and noisy: the
ratios within one run are what count. Figures go to .cache/bench/perf_gate.json.

Usage: python lab/bench/perf_gate.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".cache" / "bench" / "perf_gate.json"
sys.path.insert(0, str(REPO / "tests" / "conformance"))
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.inferops.sglang.plugins.module_utils import _bench  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.inferops.sglang.plugins.module_utils._http import Client  # noqa: E402  pylint: disable=wrong-import-position


def wait_healthy(url: str, proc, log: Path, timeout: float = 600) -> None:
    client = Client(url, None, True, 5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode}: {log.read_text(errors='replace')[-1500:]}")
        if client.call("GET", "/health").kind == "ok" and client.call("POST", "/generate", {
                "text": "warm", "sampling_params": {"max_new_tokens": 2}}).kind == "ok":
            return
        time.sleep(1)
    raise RuntimeError(f"no healthy server in {timeout:g} s: {log.read_text(errors='replace')[-1500:]}")


def measure(url: str, load: dict) -> dict:
    started = time.monotonic()
    result = _bench.benchmark(Client(url, None, True, load["timeout"]), load["requests"], load["concurrency"],
                              load["max_tokens"], load["rounds"], load["warmup"], load["timeout"])
    result["wall"] = round(time.monotonic() - started, 2)
    return result


def real_server(args: tuple[str, ...], log: Path):
    from real_sglang import RealServer, paths  # pylint: disable=import-outside-toplevel

    server = RealServer(paths(), "0.5.11", log, args=args)
    try:
        wait_healthy(server.url, server.proc, log)
    except BaseException:
        server.stop()  # whatever ended the wait (an error of ours too), no server is left behind
        raise
    return server.url, server.stop


def pair(name: str, known: dict, variant: dict, load: dict, logs: Path) -> dict:
    out = {"pair": name, "load": load}
    for side, spec in (("known_good", known), ("variant", variant)):
        url, stop = spec["start"](logs / f"{name}-{side}.log")
        try:
            out[side] = dict(measure(url, load), label=spec["label"])
        finally:
            stop()
        print(f"{name}: {side} {spec['label']}: {out[side]['msg']} ({out[side]['wall']} s)", flush=True)
    out["comparison"] = _bench.compare(out["variant"]["figures"], out["known_good"]["figures"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    flag = "--max-running-requests"
    pairs = {
        "real": (dict(label="0.5.11 CPU, max_running_requests 8", start=lambda log: real_server((flag, "8"), log)),
                 dict(label="0.5.11 CPU, max_running_requests 2", start=lambda log: real_server((flag, "2"), log)),
                 _bench.plan_load(8, 1024)),
    }
    logs = OUT.parent / "perf_gate-logs"
    logs.mkdir(parents=True, exist_ok=True)
    results = []
    for name, (known, variant, load) in pairs.items():
        try:
            results.append(pair(name, known, variant, load, logs))
        except RuntimeError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 2
    OUT.write_text(json.dumps(results, indent=2))
    print()
    print(f"{'pair':<11} {'load (C/N/T)':<13} {'known-good s':>12} {'variant s':>9}  {'tok/s ratio':>11} {'TTFT p95 ratio':>14}  verdict")
    for res in results:
        checks = {c["figure"]: c for c in res["comparison"]["checks"]}
        load = res["load"]
        print(f"{res['pair']:<11} {load['concurrency']}/{load['requests']}/{load['max_tokens']:<8} "
              f"{res['known_good']['wall']:>12} {res['variant']['wall']:>9}  "
              f"{checks['output_tokens_per_s']['ratio']:>11} {checks['ttft_p95']['ratio']:>14}  "
              f"{'passes' if res['comparison']['passed'] else 'REGRESSION'}")
    print(f"\nfigures: {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
