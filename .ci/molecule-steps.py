"""Pass a molecule run's output through, and note each step's wall time as a part of the suite.

Molecule logs ``INFO     [deploy > converge] Executing`` when a step starts and
``INFO     [deploy > converge] Executed: Successful`` when it ends. Each step that
started becomes one line "molecule deploy: converge<TAB>START<TAB>END<TAB>EXIT" in
$INFEROPS_CI_TIMES (as .ci/timed writes them; .ci/times.py prints them in the suite's
table): exit 0 when molecule said Successful, 1 otherwise, and 1 for a step that never
said it ended (the run stopped in it). The output itself is unchanged.

    molecule test -s deploy 2>&1 | python3 .ci/molecule-steps.py
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

STEP = re.compile(r"^INFO\s+\[(?P<scenario>[^\]>]+?) > (?P<step>[^\]]+)\] (?P<what>Executing|Executed: (?P<result>\S+))")


class Steps:
    def __init__(self, out: Path, clock=time.time) -> None:
        self.out = out
        self.clock = clock
        self.open: dict[tuple[str, str], int] = {}

    def line(self, text: str) -> None:
        match = STEP.match(text)
        if not match:
            return
        key = (match["scenario"], match["step"])
        if match["what"] == "Executing":
            self.open[key] = int(self.clock())
        elif key in self.open:
            self.note_end(key, match["result"] == "Successful")

    def note_end(self, key: tuple[str, str], ok: bool) -> None:
        scenario, step = key
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with self.out.open("a", encoding="utf-8") as handle:
            handle.write(f"molecule {scenario}: {step}\t{self.open.pop(key)}\t{int(self.clock())}\t{0 if ok else 1}\n")

    def close(self) -> None:
        for key in list(self.open):
            self.note_end(key, False)


def main() -> None:
    default = Path(__file__).resolve().parent.parent / ".cache" / "ci-times.tsv"
    steps = Steps(Path(os.environ.get("INFEROPS_CI_TIMES") or default))
    for text in sys.stdin:
        sys.stdout.write(text)
        sys.stdout.flush()
        steps.line(text)
    steps.close()


if __name__ == "__main__":
    main()
