# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory planner on a laptop: will the variants fit a GPU, and why not.

Same planner as plan.yml and the deploy preflight (plugins/module_utils/_memplan.py),
without Ansible or a host: give it a model directory (config.json and
model.safetensors.index.json are enough, no weights), the GPU's memory.total, the
tensor-parallel size and the SGLang version.

    python3 tools/inferops_plan.py --model lab/models/Qwen3.6-27B \\
        --draft lab/models/Qwen3.6-27B-DFlash --gpu-mib 49140 --tp 2 --sglang 0.5.11
    python3 tools/inferops_plan.py ... --variant balanced --set mem_fraction_static=0.9 --json

Variants come from roles/sglang_service/defaults/main.yml unless --variants names
another YAML file with sglang_service_variants (an inventory's group_vars, say).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _collection import ROOT, load

memplan = load("_memplan")
variants_mod = load("_variants")


def _value(text: str):
    """A --set/--assume value: JSON when it parses (numbers, true, null, lists), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _pairs(items: list[str], what: str) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{what} takes key=value, got {item!r}")
        out[key] = _value(value)
    return out


def _table(path: Path) -> tuple[dict, dict]:
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        raise SystemExit("reading a variants file needs PyYAML (pip install pyyaml)") from exc
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if "sglang_service_variants" not in data:
        raise SystemExit(f"{path} has no sglang_service_variants")
    return data["sglang_service_variants"], data.get("sglang_service_variant_aliases") or {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plan SGLang variants' GPU memory (inferops.sglang planner).")
    parser.add_argument("--model", required=True, help="model directory (config.json, weight index)")
    parser.add_argument("--draft", help="draft model directory, for variants with draft_model: true")
    parser.add_argument("--gpu-mib", type=int, action="append", required=True,
                        help="memory.total of a GPU in MiB (nvidia-smi); repeat per GPU or give one for all")
    parser.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    parser.add_argument("--tp-candidates", type=int, nargs="*", default=[],
                        help="other tensor-parallel sizes the host allows, tried when a variant does not fit")
    parser.add_argument("--sglang", required=True, help="SGLang version, e.g. 0.5.11")
    parser.add_argument("--variants", type=Path, default=ROOT / "roles/sglang_service/defaults/main.yml",
                        help="YAML file with sglang_service_variants (and _aliases)")
    parser.add_argument("--variant", action="append", default=[], help="plan only this variant (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a variant parameter for every variant, e.g. mem_fraction_static=0.9")
    parser.add_argument("--assume", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a planner estimate ({', '.join(sorted(memplan.ASSUMPTIONS))})")
    parser.add_argument("--host", default="", help="host name for the table")
    parser.add_argument("--json", action="store_true", help="print the plans as JSON")
    args = parser.parse_args(argv)

    variants, aliases = _table(args.variants)
    common = _pairs(args.set, "--set")
    assume = _pairs(args.assume, "--assume")
    unknown = sorted(set(assume) - set(memplan.ASSUMPTIONS))
    if unknown:
        raise SystemExit(f"unknown --assume {unknown} (known: {', '.join(sorted(memplan.ASSUMPTIONS))})")
    gpus = args.gpu_mib * args.tp if len(args.gpu_mib) == 1 else args.gpu_mib
    cache = memplan.ModelCache()
    rows, failed = [], False
    for wanted in args.variant or sorted(variants):
        try:
            name, params = variants_mod.resolve(wanted, variants, aliases, None, common)
            problems = variants_mod.check(params)
            if problems:
                raise memplan.PlanError("; ".join(problems))
            plan = memplan.plan_resolved(params, args.model, args.draft, gpus, args.tp, args.sglang, assume, cache,
                                         tp_candidates=args.tp_candidates)
            rows.append({"host": args.host, "variant": name, "plan": plan})
            failed = failed or not plan["fits"]
        except (variants_mod.VariantError, memplan.PlanError) as exc:
            rows.append({"host": args.host, "variant": wanted, "error": str(exc)})
            failed = True
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    else:
        print("\n".join(memplan.report(rows)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
