"""sglang_inputs (the action plugin): the whole check on the controller. Issue 29: the module's
``settings`` (the rotation hooks' URLs and headers) were logged in the GPU host's journal and
shown at -vvv; now nothing at all is sent to the host."""

from __future__ import annotations

import json
from types import SimpleNamespace

import yaml
from sim_helpers import REPO

from ansible_collections.inferops.sglang.plugins.action import sglang_inputs as action_mod
from ansible_collections.inferops.sglang.plugins.module_utils import _inputs
from ansible_collections.inferops.sglang.plugins.modules import sglang_inputs as module_mod

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
HOOK = {"url": "https://lb.example.internal/api/hosts/ct200", "method": "POST",
        "headers": {"Authorization": "Bearer lb-token-7f3a"}}


def run(args: dict) -> tuple[dict, list]:
    sent: list = []
    task = SimpleNamespace(args=dict(args), check_mode=False, async_val=0, action="inferops.sglang.sglang_inputs")
    action = action_mod.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir=None)), None, None, None)
    action._execute_module = lambda **kw: sent.append(kw) or {}
    return action.run(task_vars={"inventory_hostname": "ct200"}), sent


def good(**overrides) -> dict:
    values = dict(service_name="sglang-qwen.service", user="sglang", group="sglang", variant="balanced",
                  variants=DEFAULTS["sglang_service_variants"], aliases=DEFAULTS["sglang_service_variant_aliases"],
                  model_path="/srv/models/Qwen3.6-27B", bind_host="127.0.0.1",
                  settings={"sglang_service_rotation_out": HOOK, "sglang_service_gate_interval": 2})
    values.update(overrides)
    return values


def test_the_check_runs_on_the_controller_and_nothing_reaches_the_host():
    result, sent = run(good())
    assert sent == [] and result["changed"] is False and not result.get("failed"), result
    bad_hook = dict(HOOK, where="elsewhere")
    result, sent = run(good(settings={"sglang_service_rotation_out": bad_hook, "sglang_service_gate_interval": 0}))
    assert sent == [] and result["failed"] and len(result["errors"]) == 2, result
    assert "lb-token-7f3a" not in json.dumps(result)
    result, sent = run(good(colour="blue"))
    assert sent == [] and result["failed"] and "Unsupported parameters" in result["msg"] and "colour" in result["msg"]


def test_the_plugin_validates_the_modules_own_options():
    """The plugin and the module share one argument spec, the one the module documents, and
    the plugin validates a task's arguments as the module did: a wrong type is refused."""
    documented = yaml.safe_load(module_mod.DOCUMENTATION)["options"]
    assert set(_inputs.ARGUMENT_SPEC) == set(documented)
    result, sent = run(good(variants="not a table"))
    assert sent == [] and result["failed"] and "argument 'variants' is of type str" in result["msg"], result
