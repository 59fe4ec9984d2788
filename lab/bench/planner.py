"""Plans per second: is the memory planner fast enough to plan every host and
variant of a fleet on every deploy?

Measures, on this machine, in one run:
- one plan without the mem_fraction_static search (the verdict alone);
- one plan with the search (what plan.yml and the deploy preflight compute):
  a variant that fits (the interval) and one that does not (interval and
  envelope suggestions, each a search of its own);
- a fleet: --hosts hosts x every variant of the table, model directories read
  once (ModelCache), as the sglang_memory_plan module does per host;
- the whole module path once: reading config.json and the weight index from disk.
Figures are medians of --repeat runs; the machine is shared, so compare the
rows of one run with each other. --baseline REV also times the fleet with the
planner of git revision REV, alternating with this tree's, in the same run.

Usage: python lab/bench/planner.py [--hosts 200] [--repeat 5] [--baseline REV]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins" / "module_utils"))
import _memplan  # noqa: E402 - pure Python, loaded from the tree
import _variants  # noqa: E402

QWEN, DFLASH = str(REPO / "lab/models/Qwen3.6-27B"), str(REPO / "lab/models/Qwen3.6-27B-DFlash")
HOSTS = (("ct129", 49140), ("ct200", 97887))


def rate(func, seconds: float = 0.5) -> float:
    """Calls per second of func over about `seconds`."""
    count, start = 0, time.perf_counter()
    while True:
        func()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return count / elapsed


def baseline_planner(rev: str):
    """_memplan (and the release table it reads, where the revision has one) as of git revision rev."""
    folder = Path(tempfile.mkdtemp(prefix="planner-baseline-"))
    for name in ("_sglang_releases", "_memplan"):
        shown = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:plugins/module_utils/{name}.py"],
                               capture_output=True, text=True, check=False)
        if shown.returncode == 0:
            (folder / f"{name}_baseline.py").write_text(
                shown.stdout.replace("import _sglang_releases as releases", "import _sglang_releases_baseline as releases"))
        elif name == "_memplan":
            raise SystemExit(f"git show {rev}: {shown.stderr.strip()}")
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("_memplan_baseline", folder / "_memplan_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=200, help="fleet size for the fleet row (default 200)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", help="git revision whose planner to time against this tree's, in the same run")
    args = parser.parse_args()
    table = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
    variants = table["sglang_service_variants"]
    resolved = {name: _variants.resolve(name, variants)[1] for name in variants}
    cache = _memplan.ModelCache()
    target, draft = cache.get(QWEN), cache.get(DFLASH)

    def one(name: str, search: bool, mib: int = 49140):
        params = resolved[name]
        return _memplan.plan(target, draft if params.get("draft_model") else None, [mib, mib], 2, "0.5.11", params,
                             search=search, tp_candidates=[1, 2, 4])

    def fleet(planner=_memplan) -> None:
        models = planner.ModelCache()
        fleet_target, fleet_draft = models.get(QWEN), models.get(DFLASH)
        for index in range(args.hosts):
            mib = HOSTS[index % 2][1]
            for name in variants:
                params = resolved[name]
                planner.plan(fleet_target, fleet_draft if params.get("draft_model") else None, [mib, mib], 2, "0.5.11",
                             params, search=True, tp_candidates=[1, 2, 4])

    def from_disk() -> None:
        fresh = _memplan.ModelCache()
        for name in variants:
            _memplan.plan_resolved(resolved[name], QWEN, DFLASH, [49140, 49140], 2, "0.5.11", cache=fresh)

    rows = [
        ("verdict only (nextn, no search)", lambda: one("nextn", False)),
        ("with interval (shadow-balanced, fits)", lambda: one("shadow-balanced", True)),
        ("with suggestions (shadow-small, does not fit)", lambda: one("shadow-small", True)),
        ("with suggestions and TP 4 (shadow, does not fit)", lambda: one("shadow", True)),
        (f"all {len(variants)} variants read from disk", from_disk),
    ]
    print(f"{'case':52} {'plans/s':>10} {'ms/plan':>9}")
    for label, func in rows:
        per = len(variants) if label.startswith("all") else 1
        calls = statistics.median(rate(func) for _run in range(args.repeat))
        print(f"{label:52} {calls * per:10.0f} {1000 / (calls * per):9.3f}")
    start = time.perf_counter()
    fleet()
    elapsed = time.perf_counter() - start
    plans = args.hosts * len(variants)
    print(f"\nfleet: {args.hosts} hosts x {len(variants)} variants = {plans} plans with search in {elapsed:.2f} s "
          f"({plans / elapsed:.0f} plans/s)")
    if args.baseline:
        old = baseline_planner(args.baseline)
        rates: dict = {"baseline": [], "this tree": []}
        for _run in range(args.repeat):
            for label, planner in (("baseline", old), ("this tree", _memplan)):
                start = time.perf_counter()
                fleet(planner)
                rates[label].append(plans / (time.perf_counter() - start))
        print(f"fleet, median of {args.repeat} alternating runs: {args.baseline} "
              f"{statistics.median(rates['baseline']):.0f} plans/s, this tree {statistics.median(rates['this tree']):.0f} plans/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
