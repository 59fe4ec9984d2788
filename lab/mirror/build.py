# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's model mirror: two revisions of the real tiny model (lab/real/build.sh's),
r1 as it is and r2 with another generation config, each with its manifest
(tools/inferops_model_manifest.py), under OUT/tiny-qwen2/<revision>/.

    build.py --model ~/.cache/inferops-sglang/real/tiny-model --out .cache/model-mirror
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out) / "tiny-qwen2"
    shutil.rmtree(out, ignore_errors=True)
    for revision in ("r1", "r2"):
        target = out / revision
        shutil.copytree(args.model, target, ignore=shutil.ignore_patterns(".inferops-stamp"))
        if revision == "r2":
            config = json.loads((target / "generation_config.json").read_text())
            config["inferops_revision"] = revision
            (target / "generation_config.json").write_text(json.dumps(config))
        subprocess.run([sys.executable, str(ROOT / "tools" / "inferops_model_manifest.py"), str(target),
                        "--revision", revision], check=True)


if __name__ == "__main__":
    main()
