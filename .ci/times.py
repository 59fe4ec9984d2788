"""Print the suite's parts and their wall times (.ci/timed's lines) as one table.

Each row: the part, when it started (seconds after the first part started),
its wall time, its CPU time where .ci/timed measured it (the part's own
processes, a lab container's not included; a molecule step's is not measured),
and how it ended. Parts that overlap ran side by side (lint and sanity
beside the tests, the molecule lanes). The last row is the wall time
from the first start to the last end.

    python3 .ci/times.py .cache/ci-times.tsv
"""

from __future__ import annotations

import sys


def table(lines: list[str]) -> str:
    rows = []
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if len(fields) not in (4, 5):
            continue
        part, start, end, rc, cpu = (*fields, "")[:5]
        rows.append((part, int(start), int(end), int(rc), f"{int(cpu)}s" if cpu else "-"))
    if not rows:
        return "suite times: no part ran\n"
    rows.sort(key=lambda row: (row[1], row[0]))
    first = rows[0][1]
    last = max(row[2] for row in rows)
    width = max(len("part"), *(len(row[0]) for row in rows))
    out = [f"{'part':<{width}}  {'from':>6}  {'wall':>6}  {'cpu':>6}  result"]
    for part, start, end, rc, cpu in rows:
        result = "ok" if rc == 0 else f"FAILED ({rc})"
        out.append(f"{part:<{width}}  {start - first:>5}s  {end - start:>5}s  {cpu:>6}  {result}")
    out.append(f"{'all':<{width}}  {0:>5}s  {last - first:>5}s")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as handle:
        sys.stdout.write(table(handle.readlines()))
