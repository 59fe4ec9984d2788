"""Time to verdict against real SGLang on CPU: wait_for_sglang's gate against the naive loop.

No lab container: each case starts real SGLang (0.5.11; the ready case on 0.5.23 too) from
lab/real/build.sh's cache (``make real``) with tests/conformance/real_sglang.py's RealServer,
once for the naive loop and once, fresh, for the gate, one server at a time. The gate runs
as wait_for_sglang does in PID mode: a Gate with a PidWatcher on the server's main process
and its log file, at the module's defaults (1 s interval, 3 s settle), the budget as its
timeout. The naive loop is the uri + until/retries/delay loop users write today.

Cases:
  ready              a plain CPU start: load to verdict (0.5.11 and 0.5.23)
  refused            --context-length twice the model's max_position_embeddings: real
                     SGLang raises ValueError at start and exits 1
  killed-scheduler   SIGKILL of the sglang::scheduler child once the log shows the weight
                     load (the host's OOM killer): "Rank 0 scheduler died during initialization"
  stopped-mid-start  SIGSTOP of the server's whole process group at the same point: a real
                     silent hang; the gate gets --stall seconds for every stage after
                     ``starting`` and must say ``stalled``, the naive loop waits out its budget

Times are from the server's start to each way's verdict. The machine is shared and noisy:
the naive/gate ratio within one run is what counts, not one run's seconds against another's.
Figures go to .cache/bench/readiness_real.json, the servers' logs to .cache/bench/readiness_real-logs/.

Usage: python lab/bench/readiness_real.py [--budget 120] [--delay 5] [--stall 20] [--cases a,b] [--from-json F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".cache" / "bench" / "readiness_real.json"
LOGS = OUT.parent / "readiness_real-logs"  # each server's output, of the latest run
# As tests/conformance/conftest.py does: real_sglang from there, the collection through collections/.
sys.path.insert(0, str(REPO / "tests" / "conformance"))
sys.path.insert(0, str(REPO / "collections"))

from real_sglang import ExitClock, RealServer, free_port, model_max, paths, session_pids  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.inferops.sglang.plugins.module_utils import _listener  # noqa: E402
from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as r  # noqa: E402
from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_log as sglog  # noqa: E402
from ansible_collections.inferops.sglang.plugins.module_utils._process_watch import PidWatcher  # noqa: E402

NAIVE_REQUEST_TIMEOUT = 5.0  # bench_case.yml's uri timeout on /v1/models
FIRST_REQUEST_TIMEOUT = 30.0  # and on the first real /generate
FIRST_REQUEST = {"text": "The capital city of France is", "sampling_params": {"max_new_tokens": 8}}
# The actions act once the log shows "Load weight begin." (stage ``weights``), before the
# scheduler's init ends (its "max_total_num_tokens=..." summary enters ``http``).
LATE = frozenset(sglog.STAGES[sglog.STAGES.index("http"):])
ACT_WAIT = 300.0  # bounds a broken start only: a real CPU start is 10-45 s


@dataclass
class Case:
    """One benchmark case: the release, extra server flags, and what is done to the server while it starts."""

    name: str
    release: str = "0.5.11"
    args: Callable[[dict], tuple[str, ...]] = lambda real: ()
    action: Callable[[RealServer], dict] | None = None
    stall: bool = False


# -- the two ways to wait ------------------------------------------------------------

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the local server, never through a proxy


def http_status(url: str, timeout: float, body: dict | None = None) -> int:
    """The HTTP status of one GET (or POST of ``body`` as JSON), -1 where no answer came, as uri reports it."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with _OPENER.open(request, timeout=timeout) as answer:
            answer.read()
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return -1


def naive(url: str, budget: float, delay: float) -> dict:
    """The naive readiness loop: it mirrors the uri loop of lab/playbooks/tasks/bench_case.yml
    (ansible.builtin.uri on /v1/models, timeout 5, ``until: status == 200``,
    ``retries: budget // delay``, ``delay``): one GET, then up to ``retries`` more, ``delay``
    seconds apart, until a 200; ansible-core makes retries + 1 attempts and sleeps only between
    them. Then, if it got its 200, the one real POST /generate a first client sends. It leaves
    out what each uri task costs Ansible itself (a module run per attempt), so it is, if
    anything, quicker than the playbook's loop. ``done`` is its verdict, before that request."""
    attempts = int(budget // delay) + 1
    status = -1
    for attempt in range(1, attempts + 1):
        status = http_status(f"{url}/v1/models", NAIVE_REQUEST_TIMEOUT)
        if status == 200 or attempt == attempts:
            break
        time.sleep(delay)
    done = time.monotonic()
    first = http_status(f"{url}/generate", FIRST_REQUEST_TIMEOUT, FIRST_REQUEST) if status == 200 else None
    return {"healthy": status == 200, "attempts": attempt, "last_status": status, "first_request": first, "done": done}


def gate(server: RealServer, budget: float, stall: float | None) -> dict:
    """wait_for_sglang's gate in PID mode, at the module's defaults but the timeout (and the stall budgets)."""
    budgets = {stage: stall for stage in r.STALL_BUDGETS if stage != "starting"} if stall else None
    client = r.Client(server.url, None, True, 30)
    result = r.Gate(client, PidWatcher(server.proc.pid, str(server.log_path)), timeout=budget, budgets=budgets).run()
    result["done"] = time.monotonic()
    return result


# -- watching and acting on the server ----------------------------------------------------

def stages_seen(server: RealServer) -> list[str]:
    """The start-up stages the server's log has entered so far, in order (``starting`` is implicit)."""
    return [stage for stage in map(sglog.stage_of, server.text().splitlines()) if stage]


def wait_to_act(server: RealServer) -> tuple[str | None, bool]:
    """Block until the log shows the weight load (or, missed, a later stage): (the stage then,
    whether the scheduler was still in its init); (None, False) if the server died first."""
    deadline = time.monotonic() + ACT_WAIT
    while time.monotonic() < deadline and server.proc.poll() is None:
        seen = stages_seen(server)
        if "weights" in seen or LATE.intersection(seen):
            return seen[-1], not LATE.intersection(seen)
        time.sleep(0.02)
    return None, False


def scheduler_pid(server: RealServer) -> int | None:
    """The server's ``sglang::scheduler`` child (real SGLang names its children with setproctitle)."""
    for pid in _listener.descendants(server.proc.pid):
        if (_listener.cmdline(pid) or "").startswith("sglang::scheduler"):
            return pid
    return None


def kill_scheduler(server: RealServer) -> dict:
    """SIGKILL of the scheduler while it loads, as the host's OOM killer would."""
    stage, valid = wait_to_act(server)
    pid = scheduler_pid(server) if stage else None
    if pid is None:
        return {"done": "nothing: no loading scheduler seen", "stage": stage, "valid": False}
    os.kill(pid, signal.SIGKILL)
    return {"done": f"SIGKILL of sglang::scheduler pid {pid}", "stage": stage, "valid": valid}


def stop_group(server: RealServer) -> dict:
    """SIGSTOP of the whole tree mid-start: alive, silent, never serving (a real hang's look)."""
    stage, valid = wait_to_act(server)
    if stage is None:
        return {"done": "nothing: the server died before its weight load", "stage": None, "valid": False}
    os.killpg(server.proc.pid, signal.SIGSTOP)
    return {"done": "SIGSTOP of the process group", "stage": stage, "valid": valid}


def end_server(server: RealServer) -> None:
    """SIGKILL of the server's whole process group (a stopped one too), then of any process of its session left."""
    try:
        os.killpg(server.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.stop(timeout=10)
    for pid in session_pids(server.proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- one measurement ---------------------------------------------------------------------

def measure(real: dict, case: Case, way: str, opts: argparse.Namespace, logs: Path) -> dict:
    """One way on a fresh server of the case: seconds from its start to the verdict, and the verdict."""
    log = logs / f"{case.name.replace(' ', '-')}-{way}.log"
    server = RealServer(real, case.release, log, port=free_port(), args=case.args(real))
    started = time.monotonic()
    clock = ExitClock(server.proc.pid)
    box: dict = {}
    if way == "naive":
        work = threading.Thread(target=lambda: box.update(naive(server.url, opts.budget, opts.delay)), daemon=True)
    else:
        work = threading.Thread(target=lambda: box.update(gate(server, opts.budget, opts.stall if case.stall else None)), daemon=True)
    work.start()
    try:
        acted = case.action(server) if case.action else None
        work.join(opts.budget + 120)
    finally:
        clock.halt.set()
        end_server(server)
    if "done" not in box:
        raise RuntimeError(f"{case.name} ({way}): no verdict within {opts.budget + 120:.0f} s; log {log}")
    row = {k: v for k, v in box.items() if k != "done"} if way == "naive" else gate_row(box)
    row["seconds"] = round(box["done"] - started, 2)
    row["exit_to_verdict"] = round(box["done"] - clock.at, 2) if clock.at is not None and clock.at <= box["done"] else None
    row["action"], row["log"] = acted, str(log)
    return row


def gate_row(result: dict) -> dict:
    """The gate's result, less what is long (timeline, evidence) or noisy."""
    keep = ("ready", "failure", "cause", "cause_line", "phase", "stage", "stages", "elapsed", "since_start",
            "detection_delay", "server", "detail", "msg")
    return {k: result.get(k) for k in keep}


CASES = {
    "ready-0.5.11": Case("ready 0.5.11"),
    "ready-0.5.23": Case("ready 0.5.23", release="0.5.23"),
    "refused": Case("refused", args=lambda real: ("--context-length", str(2 * model_max(real)))),
    "killed-scheduler": Case("killed scheduler", action=kill_scheduler),
    "stopped-mid-start": Case("stopped mid-start", action=stop_group, stall=True),
}


# -- the table -----------------------------------------------------------------------------

def naive_verdict(n: dict) -> str:
    if not n["healthy"]:
        return f"gave up (budget spent, {n['attempts']} tries)"
    if n["first_request"] == 200:
        return "healthy, first request 200"
    return f"healthy, then the first request failed ({n['first_request']})"


def gate_verdict(g: dict) -> str:
    if g["ready"]:
        return "ready"
    if g["failure"] == "stalled":
        return f"stalled / stage {g['stage']}"
    return f"{g['failure']} / {g['cause'] or '-'}"


def seconds(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def print_table(data: dict) -> None:
    print(f"real SGLang on CPU, PID mode; budget {data['budget']:g} s for both ways, naive delay {data['delay']:g} s, "
          f"gate interval 1 s, stall budget {data['stall']:g} s per stage after starting (stopped case only)")
    print("naive = GET /v1/models every delay s until 200 (the uri loop of bench_case.yml), then one POST /generate; "
          "gate = _readiness.Gate + PidWatcher (wait_for_sglang, pid + log_file)")
    print("seconds from the server's start; exit->verdict: the main process's death to each way's verdict. "
          "The machine is noisy: compare the columns of one run.")
    head = (f"{'case':<18} {'naive s':>8}  {'naive verdict':<40} {'gate s':>7}  {'gate verdict':<34} "
            f"{'exit->verdict s naive / gate':>28} {'naive/gate':>10}")
    print(head)
    print("-" * len(head))
    for name in data["order"]:
        n, g = data["cases"][name]["naive"], data["cases"][name]["gate"]
        ratio = n["seconds"] / g["seconds"] if g["seconds"] > 0 else float("inf")
        print(f"{name:<18} {n['seconds']:>8.1f}  {naive_verdict(n):<40} {g['seconds']:>7.1f}  {gate_verdict(g):<34} "
              f"{seconds(n['exit_to_verdict']) + ' / ' + seconds(g['exit_to_verdict']):>28} {ratio:>9.1f}x")
    for name in data["order"]:
        for way in ("naive", "gate"):
            acted = data["cases"][name][way].get("action")
            if acted:
                print(f"  {name} ({way}): {acted['done']} at stage {acted['stage']}"
                      + ("" if acted.get("valid", True) else " (not the intended case: missed the scheduler's init)"))


# -- main ---------------------------------------------------------------------------------

def run(opts: argparse.Namespace) -> dict:
    real = paths()
    names = opts.cases.split(",") if opts.cases else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}")
    data = {"budget": opts.budget, "delay": opts.delay, "stall": opts.stall, "interval": 1.0,
            "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "order": [], "cases": {}}
    shutil.rmtree(LOGS, ignore_errors=True)
    LOGS.mkdir(parents=True)
    for key in names:
        case = CASES[key]
        rows = {}
        for way in ("naive", "gate"):
            print(f"{case.name}: {way} ...", file=sys.stderr, flush=True)
            rows[way] = measure(real, case, way, opts, LOGS)
        data["order"].append(case.name)
        data["cases"][case.name] = rows
        OUT.write_text(json.dumps(data, indent=2))
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=120, help="seconds both ways may wait (default 120)")
    parser.add_argument("--delay", type=float, default=5, help="the naive loop's delay between tries (default 5)")
    parser.add_argument("--stall", type=float, default=20, help="the gate's budget per stage after starting, stopped case (default 20)")
    parser.add_argument("--cases", help=f"comma-separated, of {', '.join(CASES)} (default: all)")
    parser.add_argument("--from-json", type=Path, help="print the table of an earlier run instead of running")
    opts = parser.parse_args()
    if opts.from_json:
        data = json.loads(opts.from_json.read_text())
    else:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = run(opts)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 2
    print_table(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
