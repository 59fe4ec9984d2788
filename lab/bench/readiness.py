"""Time to verdict: wait_for_sglang against the naive readiness loop.

Runs lab/playbooks/bench_readiness.yml on a lab host (the SGLang simulator
under systemd replaying the field story) and prints, per case, how long each
way took to give its verdict and what the verdict was. Both ways get the same
budget; the naive loop polls /v1/models every --delay seconds, the gate polls
at its default 1 s interval with its default stall budgets, but for a case that
hangs the simulator in a start-up stage (graph-hang: cuda_graph), whose stage
gets --stall seconds: the gate says ``stalled`` there, naming the stage, the
naive loop waits out its budget. Times on a shared machine are noisy: compare
the two columns of one run, not runs with each other.

The same comparison against real SGLang on CPU, no lab needed: lab/bench/readiness_real.py.

Usage: python lab/bench/readiness.py [--host ct129] [--budget 60] [--delay 5] [--stall 20] [--cases a,b]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".cache" / "bench" / "readiness.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="ct129")
    parser.add_argument("--budget", type=int, default=60, help="seconds both ways may wait (default 60)")
    parser.add_argument("--delay", type=int, default=5, help="the naive loop's delay between tries (default 5)")
    parser.add_argument("--stall", type=int, default=20, help="the gate's stall budget for a hang case's stage (default 20)")
    parser.add_argument("--cases", help="comma-separated lab cases (default: every case of lab/field_cases.yml)")
    parser.add_argument("--from-json", type=Path, help="print the table of an earlier run instead of running")
    args = parser.parse_args()

    if not args.from_json:
        extra = {"bench_host": args.host, "bench_budget": args.budget, "bench_delay": args.delay, "bench_stall": args.stall,
                 "bench_out": str(OUT)}
        if args.cases:
            extra["bench_cases"] = args.cases.split(",")
        OUT.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["ansible-playbook", "-i", "inventories/lab", "lab/playbooks/bench_readiness.yml", "-e", json.dumps(extra)]
        env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.minimal", ANSIBLE_DISPLAY_OK_HOSTS="false")
        run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if run.returncode != 0:
            sys.stderr.write(run.stdout[-4000:] + run.stderr[-4000:])
            return run.returncode
    data = json.loads((args.from_json or OUT).read_text())
    print_table(data)
    return 0


def naive_verdict(n: dict) -> str:
    if not n["healthy"]:
        return "gave up (budget spent)"
    if n["first_request"] == 200:
        return "healthy"
    return f"healthy, then the first request failed ({n['first_request']})"


def gate_verdict(g: dict) -> str:
    if g["ready"]:
        return "ready"
    if g["failure"] == "stalled":
        return f"stalled / stage {g.get('stage') or '-'}"
    return f"{g['failure']} / {g['cause'] or '-'}"


def print_table(data: dict) -> None:
    print(f"host {data['host']} (lab stand-in), budget {data['budget']} s, naive delay {data['delay']} s, gate interval 1 s, "
          f"stall budget {data.get('stall', '-')} s for a hang case's stage")
    print("naive = ansible.builtin.uri on /v1/models with until/retries; "
          "gate = inferops.sglang.wait_for_sglang with its defaults (stall_budgets: the hang stage only)")
    head = f"{'case':<16} {'naive s':>8}  {'naive verdict':<44} {'gate s':>7}  {'gate verdict':<34} {'exit->verdict s':>15} {'naive/gate':>10}"
    print(head)
    print("-" * len(head))
    for case in data.get("order") or list(data["cases"]):
        n, g = data["cases"][case]["naive"], data["cases"][case]["gate"]
        delay = f"{g['detection_delay']:.2f}" if g.get("detection_delay") is not None else "-"
        ratio = n["seconds"] / g["seconds"] if g["seconds"] > 0 else float("inf")
        print(f"{case:<16} {n['seconds']:>8.1f}  {naive_verdict(n):<44} {g['seconds']:>7.1f}  {gate_verdict(g):<34} {delay:>15} {ratio:>9.1f}x")


if __name__ == "__main__":
    sys.exit(main())
