"""sglang_inputs: the preflight's input check as a module (every problem at
once, nothing changed, the API key in no output)."""

from __future__ import annotations

import pytest
import yaml
from sim_helpers import REPO, run_module

from ansible_collections.inferops.sglang.plugins.modules import sglang_inputs

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
PREFIXES = ("sglang_service_gate_", "sglang_service_release_", "sglang_service_lock_", "sglang_service_plan_tol",
            "sglang_service_keep_", "sglang_service_args_timeout")
SETTINGS = {k: v for k, v in DEFAULTS.items() if k.startswith(PREFIXES)}
SETTINGS.pop("sglang_service_lock_take_over")


def args(**overrides) -> dict:
    values = dict(service_name="sglang-qwen.service", user="sglang", group="sglang", variant="balanced",
                  variants=DEFAULTS["sglang_service_variants"], aliases=DEFAULTS["sglang_service_variant_aliases"],
                  served_model_name="Qwen3.6-27B", model_path="/srv/models/Qwen3.6-27B", bind_host="127.0.0.1",
                  state_dir="/var/lib/inferops-sglang", environment={}, read_write_paths=[], settings=SETTINGS)
    values.update(overrides)
    return values


def test_the_role_defaults_pass(capsys):
    rc, result, _warnings = run_module(sglang_inputs.main, capsys, args(api_key="s3cr3t"))
    assert rc == 0 and result["changed"] is False, result


@pytest.mark.parametrize("key", ["s3cr3t\nLD_PRELOAD=/tmp/x.so", "s3cr3t-ключ", " s3cr3t", "-s3cr3t"])
def test_a_bad_key_is_refused_and_never_printed(capsys, key):
    rc, result, raw = run_module(sglang_inputs.main, capsys, args(api_key=key))
    assert rc == 1 and len(result["errors"]) == 1 and result["errors"][0].startswith("sglang_service_api_key must")
    assert "s3cr3t" not in raw and "LD_PRELOAD" not in raw and "ключ" not in raw


def test_every_problem_is_reported_at_once(capsys):
    rc, result, _warnings = run_module(sglang_inputs.main, capsys, args(
        service_name="../../tmp/x.service", variants=dict(DEFAULTS["sglang_service_variants"], **{"../x": {}}),
        environment={"A": "1\nB=2"}, read_write_paths=["/srv/a\nUser=root"],
        settings=dict(SETTINGS, sglang_service_gate_interval="0")))
    assert rc == 1
    assert result["msg"].startswith("bad input, nothing was changed: sglang_service_name must be")
    assert [e.split(" ")[0] for e in result["errors"]] == [
        "sglang_service_name", "sglang_service_variants", "environment", "sglang_service_read_write_paths[0]",
        "sglang_service_gate_interval"]
