"""The sglang_service README's memory plan example is what the preflight says:
the table's shadow variant on ct129 (the lab's hardware file and the inventory's
GPUs), planned by the preflight's own code with the role's default assumptions,
refused with the message the README shows (``...`` stands for the part it leaves
out)."""

from __future__ import annotations

import json
import re

import yaml
from sim_helpers import LAB, MODELS, REPO

from ansible_collections.inferops.sglang.plugins.module_utils import _memplan
from ansible_collections.inferops.sglang.plugins.module_utils import _variants
from ansible_collections.inferops.sglang.plugins.module_utils import _preflight

README = REPO / "roles" / "sglang_service" / "README.md"
DEFAULTS = REPO / "roles" / "sglang_service" / "defaults" / "main.yml"


def _example() -> str:
    section = README.read_text().split("## Memory plan", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "the Memory plan section has no example"
    return " ".join(block.group(1).split())


def test_the_memory_plan_example_is_the_preflights_refusal():
    defaults = yaml.safe_load(DEFAULTS.read_text())
    hosts = yaml.safe_load((REPO / "inventories" / "production" / "host_vars" / "ct129.yml").read_text())
    hardware = json.loads((LAB / "hosts" / "ct129" / "hardware.json").read_text())
    devices = hosts["gpu_preflight_requested_gpus"]
    memory = [gpu["memory_total_mib"] for gpu in hardware["gpus"] if gpu["index"] in devices]
    name, params = _variants.resolve("shadow", defaults["sglang_service_variants"],
                                     defaults["sglang_service_variant_aliases"], {}, {})
    plan = _memplan.plan_resolved(params, str(MODELS / "Qwen3.6-27B"), str(MODELS / "Qwen3.6-27B-DFlash"), memory,
                                  hosts["gpu_preflight_requested_tp_size"], "0.5.11",
                                  defaults["sglang_service_memory_assumptions"])
    said = _preflight.memory_refusal(name, plan)
    head, tail = _example().split(" ... ")
    assert said.startswith(head) and said.endswith(tail), (said, _example())
