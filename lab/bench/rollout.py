"""Rolling deploy across a lab fleet: wall time against N and forks, and what a
failed host does to the rollout.

For each fleet size N (all hosts ct200-like, where the balanced variant
serves): `lab/labctl fleet up N`, the NEXTN baseline on every host at once
(timed apart, not part of the figure), then `deploy.yml -e variant=balanced`
with the default canary and batches, timed, once per forks value (the fleet is
put back on NEXTN between runs). Then two failure runs on 8 hosts, each from a
fleet on NEXTN:

  canary    position 1 is ct129-like (no CUDA 12 runtime: balanced dies on its
            first request): the canary is rolled back to NEXTN, the playbook
            exits 2, and no other host is touched (its history has no balanced
            attempt, its unit file's checksum and its server's MainPID are
            unchanged).
  batch3    canary 1, then batches of 2 (-e rollout_batch=2: [1] [2,3] [4,5] ...),
            position 4 (first host of batch 3) is ct129-like: hosts 1-3 switch,
            host 4 is rolled back to NEXTN and serves, host 5 (same batch)
            switches, hosts 6-8 are untouched, exit code 2.

Outcomes are read from the hosts (history.jsonl, unit checksum, MainPID, a
request to the server), not from the playbook's output. Prints a table and
writes .cache/bench/rollout.json. The lab's time_scale makes one batch take
about a minute or two; the default run takes a while (see --sizes, --skip).

Usage: python lab/bench/rollout.py [--sizes 8 16] [--forks 5,N] [--batch 25%,100%] [--skip timing|failures] [--failures canary,batch3] [--down]
       python lab/bench/rollout.py --from-json .cache/bench/rollout.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".cache" / "bench" / "rollout.json"
INVENTORY = REPO / ".cache" / "fleet" / "inventory"
LABCTL = REPO / "lab" / "labctl"
STATE = "/var/lib/inferops-sglang/sglang-qwen"
UNIT = "/etc/systemd/system/sglang-qwen.service"
SERVICE = "sglang-qwen.service"
BALANCED = "shadow-balanced"
BASELINE = "nextn"

# One shell per host: history, unit checksum, MainPID, unit state, an HTTP answer
PROBE = f"""
echo "@@history"; cat {STATE}/history.jsonl 2>/dev/null
echo "@@unit"; sha256sum {UNIT} 2>/dev/null | cut -d' ' -f1
echo "@@pid"; systemctl show -p MainPID --value {SERVICE}
echo "@@active"; systemctl is-active {SERVICE}
echo "@@http"; python3 -c 'import urllib.request,sys
try: print(urllib.request.urlopen("http://127.0.0.1:30000/v1/models", timeout=5).status)
except Exception as e: print(type(e).__name__)'
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def env() -> dict:
    venv_bin = REPO / ".venv" / "bin"
    e = dict(os.environ, NO_PROXY="127.0.0.1,localhost", ANSIBLE_FORCE_COLOR="0")
    if venv_bin.is_dir():
        e["PATH"] = f"{venv_bin}:{e.get('PATH', '')}"
    return e


def fleet_up(n: int, faulty: list[int] | None = None) -> float:
    cmd = [str(LABCTL), "fleet", "up", str(n)]
    if faulty:
        cmd += ["--faulty", ",".join(map(str, faulty))]
    log(" ".join(cmd[1:]))
    start = time.monotonic()
    run = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, check=False)
    if run.returncode != 0:
        sys.stderr.write(run.stdout[-3000:] + run.stderr[-3000:])
        raise SystemExit(f"fleet up {n} failed ({run.returncode})")
    return time.monotonic() - start


def deploy(variant: str, forks: int, extra: dict | None = None, limit: list[str] | None = None) -> dict:
    """ansible-playbook deploy.yml on the fleet; wall time, exit code, output tail."""
    ev = {"variant": variant, **(extra or {})}
    cmd = ["ansible-playbook", "-i", str(INVENTORY), "deploy.yml", "--forks", str(forks), "-e", json.dumps(ev)]
    if limit:
        cmd += ["--limit", ",".join(limit)]
    log(f"deploy {json.dumps(ev)} forks={forks} limit={','.join(limit or []) or 'all'}")
    start = time.monotonic()
    run = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    log(f"  rc={run.returncode} in {wall:.0f} s")
    return {"extra_vars": ev, "forks": forks, "rc": run.returncode, "wall_s": round(wall, 1),
            "output_tail": (run.stdout + run.stderr)[-6000:]}


def all_at_once(n: int) -> dict:
    """Every host in one batch, no stop on failure: the baseline and the resets."""
    return {"rollout_canary": n, "rollout_batch": "100%", "rollout_max_fail_percentage": 100}


def baseline(n: int) -> dict:
    """NEXTN on every host that does not serve it now, all at once."""
    state = probe(n)
    todo = [h for h, s in state.items()
            if not (s["history"] and s["history"][-1]["running"] == BASELINE and s["active"] == "active" and s["http"] == "200")]
    if not todo:
        log(f"all {n} hosts serve {BASELINE} already")
        return {"rc": 0, "wall_s": 0.0, "hosts": 0}
    result = deploy(BASELINE, n, all_at_once(n), limit=todo)
    result["hosts"] = len(todo)
    if result["rc"] != 0:
        sys.stderr.write(result["output_tail"])
        raise SystemExit(f"NEXTN baseline on {n} hosts failed ({result['rc']})")
    return result


def probe_host(container: str) -> dict:
    run = subprocess.run(["podman", "exec", container, "bash", "-c", PROBE], capture_output=True, text=True, check=False)
    parts: dict[str, list[str]] = {}
    key = None
    for line in run.stdout.splitlines():
        if line.startswith("@@"):
            key = line[2:]
            parts[key] = []
        elif key:
            parts[key].append(line)
    history = [json.loads(line) for line in parts.get("history", []) if line.strip()]
    return {
        "history": history,
        "unit_sha256": "".join(parts.get("unit", [])).strip() or None,
        "main_pid": "".join(parts.get("pid", [])).strip(),
        "active": "".join(parts.get("active", [])).strip(),
        "http": "".join(parts.get("http", [])).strip(),
    }


def probe(n: int) -> dict[str, dict]:
    names = [f"fleet-{i:02d}" for i in range(1, n + 1)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        states = pool.map(lambda h: probe_host("inferops-" + h), names)
    return dict(zip(names, states))


def host_summary(before: dict, after: dict) -> dict:
    """What the last deploy did to one host, from its own state."""
    new = after["history"][len(before["history"]):]
    last = new[-1] if new else None
    touched = bool(new) or after["unit_sha256"] != before["unit_sha256"] or after["main_pid"] != before["main_pid"]
    return {
        "touched": touched,
        "new_records": len(new),
        "attempted": last["variant"] if last else None,
        "outcome": last["outcome"] if last else None,
        "running": last["running"] if last else (before["history"][-1]["running"] if before["history"] else None),
        "cause": (last["verdict"].get("cause") or last["verdict"].get("failure")) if last and last["outcome"] != "switched" else None,
        "unit_changed": after["unit_sha256"] != before["unit_sha256"],
        "pid_changed": after["main_pid"] != before["main_pid"],
        "active": after["active"],
        "http": after["http"],
    }


def timing(sizes: list[int], forks_spec: list[str], batches: list[str]) -> list[dict]:
    rows = []
    for n in sizes:
        up_s = fleet_up(n)
        base = baseline(n)
        forks_values = sorted({n if f == "N" else int(f) for f in forks_spec})
        runs = [(batch, forks) for batch in batches for forks in forks_values]
        for i, (batch, forks) in enumerate(runs):
            if i:  # back to NEXTN for the next run (not timed in the figure)
                baseline(n)
            before = probe(n)
            result = deploy("balanced", forks, {"rollout_batch": batch})
            after = probe(n)
            hosts = {h: host_summary(before[h], after[h]) for h in before}
            switched = sum(1 for s in hosts.values() if s["outcome"] == "switched" and s["attempted"] == BALANCED)
            rows.append({"n": n, "batch": batch, "forks": forks, "wall_s": result["wall_s"], "rc": result["rc"], "switched": switched,
                         "fleet_up_s": round(up_s, 1), "baseline_s": base["wall_s"], "hosts": hosts,
                         "output_tail": result["output_tail"]})
            log(f"  N={n} batch={batch} forks={forks}: {result['wall_s']} s, {switched}/{n} switched")
    return rows


def failure_run(name: str, n: int, faulty: int, extra: dict, expect: dict[str, str]) -> dict:
    """expect: host -> 'switched' | 'rolled_back' | 'untouched'."""
    fleet_up(n, [faulty])
    baseline(n)
    before = probe(n)
    result = deploy("balanced", n, extra)
    after = probe(n)
    hosts = {h: host_summary(before[h], after[h]) for h in before}
    checks = []
    for h, want in expect.items():
        s = hosts[h]
        if want == "untouched":
            ok = not s["touched"] and s["new_records"] == 0 and not s["unit_changed"] and not s["pid_changed"]
        elif want == "switched":
            ok = s["attempted"] == BALANCED and s["outcome"] == "switched" and s["running"] == BALANCED
        else:  # rolled back to NEXTN and serving again
            ok = (s["attempted"] == BALANCED and s["outcome"] == "rolled_back" and s["running"] == BASELINE
                  and s["active"] == "active" and s["http"] == "200")
        checks.append({"host": h, "expect": want, "ok": ok})
    checks.append({"host": "playbook", "expect": "exit code 2", "ok": result["rc"] == 2})
    return {"name": name, "n": n, "faulty": faulty, "extra_vars": result["extra_vars"], "rc": result["rc"],
            "wall_s": result["wall_s"], "hosts": hosts, "checks": checks, "ok": all(c["ok"] for c in checks),
            "output_tail": result["output_tail"]}


def failures(which: list[str]) -> list[dict]:
    n = 8
    hosts = [f"fleet-{i:02d}" for i in range(1, n + 1)]
    runs = []
    if "canary" in which:
        runs.append(failure_run("canary fails", n, 1, {},
                                {h: ("rolled_back" if i == 0 else "untouched") for i, h in enumerate(hosts)}))
    if "batch3" in which:
        # canary [1], then batches of 2: [2,3] [4,5] [6,7] [8]; position 4 leads batch 3
        runs.append(failure_run("batch 3 fails", n, 4, {"rollout_canary": 1, "rollout_batch": 2},
                                {h: ("switched" if i in (0, 1, 2, 4) else "rolled_back" if i == 3 else "untouched")
                                 for i, h in enumerate(hosts)}))
    return runs


def print_table(data: dict) -> None:
    if data.get("timing"):
        print("Rolling deploy of balanced (shadow-balanced) over N lab hosts from NEXTN: canary 1, then batches")
        head = f"{'N':>3} {'batch':>5} {'forks':>5} {'wall s':>7} {'s/host':>7} {'switched':>9} {'rc':>3} {'baseline s':>11} {'fleet up s':>11}"
        print(head)
        print("-" * len(head))
        for r in data["timing"]:
            print(f"{r['n']:>3} {r.get('batch', '25%'):>5} {r['forks']:>5} {r['wall_s']:>7.1f} {r['wall_s'] / r['n']:>7.1f} "
                  f"{str(r['switched']) + '/' + str(r['n']):>9} {r['rc']:>3} {r['baseline_s']:>11.1f} {r['fleet_up_s']:>11.1f}")
        print()
    for run in data.get("failures", []):
        print(f"{run['name']}: N={run['n']}, faulty position {run['faulty']}, extra vars {json.dumps(run['extra_vars'])}, "
              f"exit {run['rc']}, {run['wall_s']:.0f} s: {'OK' if run['ok'] else 'NOT AS EXPECTED'}")
        print(f"  {'host':<9} {'expect':<12} {'attempted':<16} {'outcome':<12} {'running':<16} {'touched':<8} {'unit/pid':<9} {'http':<5} ok")
        expect = {c["host"]: c for c in run["checks"]}
        for h, s in run["hosts"].items():
            c = expect.get(h, {"expect": "-", "ok": True})
            unitpid = ("changed" if s["unit_changed"] or s["pid_changed"] else "same")
            print(f"  {h:<9} {c['expect']:<12} {s['attempted'] or '-':<16} {s['outcome'] or '-':<12} {s['running'] or '-':<16} "
                  f"{'yes' if s['touched'] else 'no':<8} {unitpid:<9} {s['http']:<5} {'ok' if c['ok'] else 'FAIL'}")
        pb = expect["playbook"]
        print(f"  playbook  {pb['expect']:<12} rc={run['rc']}  {'ok' if pb['ok'] else 'FAIL'}")
        print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16], help="fleet sizes to time (default 8 16)")
    parser.add_argument("--forks", default="5,N", help="forks values, N = the fleet size (default 5,N)")
    parser.add_argument("--batch", default="25%,100%", help="rollout_batch values after the canary (default 25%%,100%%)")
    parser.add_argument("--skip", choices=["timing", "failures"], action="append", default=[])
    parser.add_argument("--failures", default="canary,batch3", help="failure runs (default canary,batch3)")
    parser.add_argument("--down", action="store_true", help="remove the fleet at the end")
    parser.add_argument("--from-json", type=Path, help="print the table of an earlier run instead of running")
    args = parser.parse_args()

    if args.from_json:
        print_table(json.loads(args.from_json.read_text()))
        return 0
    data: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": {"cpus": os.cpu_count()}}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    try:
        if "timing" not in args.skip:
            data["timing"] = timing(args.sizes, args.forks.split(","), args.batch.split(","))
            OUT.write_text(json.dumps(data, indent=2))
        if "failures" not in args.skip:
            data["failures"] = failures(args.failures.split(","))
    finally:
        OUT.write_text(json.dumps(data, indent=2))
        if args.down:
            subprocess.run([str(LABCTL), "fleet", "down"], cwd=REPO, env=env(), check=False)
    print_table(data)
    return 0 if all(r["ok"] for r in data.get("failures", [])) and all(r["rc"] == 0 for r in data.get("timing", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
