"""Variants as data: resolution, parameter checks, and the command line per
SGLang version, checked against the simulator's real argparse --help."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import yaml
from sim_helpers import LAB, REPO

from ansible_collections.inferops.sglang.plugins.module_utils import _variants as v

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
TABLE = DEFAULTS["sglang_service_variants"]
ALIASES = DEFAULTS["sglang_service_variant_aliases"]
SERVER = {"model_path": "/srv/models/Qwen3.6-27B", "served_model_name": "Qwen3.6-27B", "host": "127.0.0.1",
          "port": 30000, "tp_size": 2, "draft_model_path": "/srv/models/Qwen3.6-27B-DFlash"}


def params_of(*args, **kwargs) -> dict:
    return v.resolve(*args, **kwargs)[1]


def test_alias_and_inheritance():
    name, params = v.resolve("nograph", TABLE, ALIASES)
    assert name == "shadow-nograph"
    # shadow-nograph = shadow-small (= shadow with a small envelope) without CUDA graphs
    assert params["speculative_algorithm"] == "DDTREE" and params["ddtree_shadow_linear"] is True
    assert (params["context_length"], params["max_running_requests"], params["mem_fraction_static"]) == (32768, 4, 0.95)
    assert params["cuda_graph"] is False
    assert "inherits" not in params


def test_overrides_apply_per_variant_then_common():
    overrides = {"shadow-balanced": {"mem_fraction_static": 0.86}, "nextn": {"mem_fraction_static": 0.5}}
    params = params_of("balanced", TABLE, ALIASES, overrides=overrides, common={"max_running_requests": 2})
    assert params["mem_fraction_static"] == 0.86 and params["max_running_requests"] == 2
    assert v.resolve("nextn", TABLE, ALIASES)[1]["mem_fraction_static"] == 0.88  # the table itself is not changed


def test_unknown_variant_lists_the_valid_ones():
    with pytest.raises(v.VariantError) as exc:
        v.resolve("turbo", TABLE, ALIASES)
    assert str(exc.value).startswith("unknown variant 'turbo'; valid variants: nextn, shadow, shadow-balanced, shadow-nograph, shadow-small")
    assert "balanced -> shadow-balanced" in str(exc.value)


def test_inheritance_loops_and_dangling_parents():
    with pytest.raises(v.VariantError, match="inherits in a loop: a -> b -> a"):
        v.resolve("a", {"a": {"inherits": "b"}, "b": {"inherits": "a"}})
    with pytest.raises(v.VariantError, match="'a' inherits from unknown variant 'ghost'"):
        v.resolve("a", {"a": {"inherits": "ghost"}})


@pytest.mark.parametrize("override, error", [
    ({"mem_fraction_static": 1.2}, "mem_fraction_static must be in (0, 1), got 1.2"),
    ({"mem_fraction_static": 0}, "mem_fraction_static must be in (0, 1), got 0"),
    ({"max_running_requests": 0}, "max_running_requests must be in [1, 65536], got 0"),
    ({"context_length": "long"}, "context_length must be int, got 'long'"),
    ({"cuda_graph": "no"}, "cuda_graph must be bool, got 'no'"),
    ({"max_running_requests": True}, "max_running_requests must be int, got True"),
    ({"mem_fration_static": 0.8}, "unknown parameter 'mem_fration_static'"),
    ({"draft_model": False}, "speculative_algorithm DDTREE needs a draft model"),
    ({"extra_args": ["--api-key", "x"]}, "extra_args must not carry a secret flag (--api-key)"),
    ({"extra_args": ["--admin-api-key=x"]}, "extra_args must not carry a secret flag (--admin-api-key)"),
    # argparse takes an unambiguous prefix for the flag (real SGLang keeps allow_abbrev)
    ({"extra_args": ["--admin-api", "x"]}, "extra_args must not carry a secret flag (--admin-api-key)"),
    ({"extra_args": ["--api-k=x"]}, "extra_args must not carry a secret flag (--api-key)"),
])
def test_parameter_checks(override, error):
    params = params_of("shadow-balanced", TABLE, ALIASES, common=override)
    assert any(error in e for e in v.check(params)), v.check(params)


def test_the_default_table_is_clean():
    for name in TABLE:
        assert v.check(v.resolve(name, TABLE, ALIASES)[1]) == [], name


def field_case_args(name: str) -> list[str]:
    cases = yaml.safe_load((LAB / "field_cases.yml").read_text())
    case = next(c for c in cases["lab_cases"] if c["name"] == name)
    text = case["args"].replace("{{ lab_ddtree_args }}", cases["lab_ddtree_args"])
    return shlex.split(cases["lab_common_args"]) + shlex.split(text)


@pytest.mark.parametrize("name", ["nextn", "shadow", "shadow-small", "shadow-nograph", "shadow-balanced"])
def test_the_table_renders_the_field_storys_command_lines(name):
    """The lab's field cases are the command lines the field ran; the variant
    table must render the same flags and values (order aside)."""
    rendered = v.argv(v.resolve(name, TABLE, ALIASES)[1], SERVER, (0, 5, 11))

    def pairs(args):
        out, i = set(), 0
        while i < len(args):
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                out.add((args[i], args[i + 1]))
                i += 2
            else:
                out.add((args[i], None))
                i += 1
        return out

    assert pairs(rendered) == pairs(field_case_args(name))


def test_cuda_graph_flags_follow_the_version():
    nograph = params_of("shadow-nograph", TABLE, ALIASES)
    assert "--disable-cuda-graph" in v.argv(nograph, SERVER, (0, 5, 11))
    new = v.argv(nograph, SERVER, (0, 5, 20))
    assert "--disable-cuda-graph" not in new
    assert new[new.index("--cuda-graph-backend-decode") + 1] == "disabled"
    small = params_of("shadow-small", TABLE, ALIASES, common={"cuda_graph_max_bs": 8})
    assert v.argv(small, SERVER, (0, 5, 19))[-2:] == ["--cuda-graph-max-bs", "8"]
    assert v.argv(small, SERVER, (0, 5, 23))[-2:] == ["--cuda-graph-max-bs-decode", "8"]


@pytest.mark.parametrize("version, flags", [
    # --disable-radix-cache exists in every release (0.5.11 server_args.py; 0.5.23 arg_groups/fields)
    ((0, 5, 9), ["--disable-radix-cache"]),
    ((0, 5, 11), ["--disable-radix-cache"]),
    ((0, 5, 23), ["--disable-radix-cache"]),
])
def test_nextn_renders_radix_cache_off_on_every_release(version, flags):
    """Real 0.5.10-0.5.13 refuse NEXTN on the hybrid Qwen3.6 with radix cache on
    (0.5.11 server_args.py:2452-2456); the baseline turns it off on every release."""
    nextn = params_of("nextn", TABLE, ALIASES)
    assert nextn["disable_radix_cache"] is True and nextn["mamba_radix_cache_strategy"] is None
    rendered = v.argv(nextn, SERVER, version)
    assert [f for f in rendered if "radix" in f or "mamba" in f] == flags


@pytest.mark.parametrize("version, flag", [
    ((0, 5, 10), "--mamba-scheduler-strategy"),
    ((0, 5, 11), "--mamba-scheduler-strategy"),
    ((0, 5, 13), "--mamba-scheduler-strategy"),
    # renamed in 0.5.14 (the old name a deprecated alias until 0.5.19, 0.5.14 server_args.py:6350-6356)
    ((0, 5, 14), "--mamba-radix-cache-strategy"),
    ((0, 5, 19), "--mamba-radix-cache-strategy"),
    ((0, 5, 23), "--mamba-radix-cache-strategy"),
])
def test_mamba_strategy_flag_follows_the_version(version, flag):
    params = params_of("nextn", TABLE, ALIASES, common={"disable_radix_cache": False,
                                                        "mamba_radix_cache_strategy": "extra_buffer"})
    assert v.check(params) == []
    rendered = v.argv(params, SERVER, version)
    assert "--disable-radix-cache" not in rendered
    assert [f for f in rendered if "mamba" in f] == [flag]
    assert rendered[rendered.index(flag) + 1] == "extra_buffer"


def test_no_radix_flags_unless_asked():
    small = params_of("shadow-small", TABLE, ALIASES)
    for version in ((0, 5, 11), (0, 5, 23)):
        assert not [f for f in v.argv(small, SERVER, version) if "radix" in f or "mamba" in f]


@pytest.mark.parametrize("override, error", [
    ({"mamba_radix_cache_strategy": "extra"}, "mamba_radix_cache_strategy must be one of no_buffer, extra_buffer or null"),
    ({"disable_radix_cache": "yes"}, "disable_radix_cache must be bool, got 'yes'"),
    # 0.5.11 server_args.py:2396-2401 refuses extra_buffer with --disable-radix-cache
    ({"mamba_radix_cache_strategy": "extra_buffer"}, "SGLang refuses both together"),
])
def test_radix_parameter_checks(override, error):
    params = params_of("nextn", TABLE, ALIASES, common=override)
    assert any(error in e for e in v.check(params)), v.check(params)


def sim_help(sim_install, version: str, ddtree: bool) -> str:
    env = dict(os.environ, PYTHONPATH=str(sim_install(version, ddtree)))
    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--help"], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout


def test_flags_checked_against_the_installed_servers_help(sim_install):
    small = params_of("shadow-small", TABLE, ALIASES, common={"cuda_graph_max_bs": 8})
    old_render = v.argv(small, SERVER, (0, 5, 11))
    help_020 = sim_help(sim_install, "0.5.20", ddtree=True)
    assert v.unsupported(old_render, help_020) == ["flag --cuda-graph-max-bs is not accepted by the installed SGLang"]
    assert v.unsupported(v.argv(small, SERVER, (0, 5, 20)), help_020) == []


def test_ddtree_needs_the_patched_build(sim_install):
    shadow = params_of("shadow", TABLE, ALIASES)
    problems = v.unsupported(v.argv(shadow, SERVER, (0, 5, 11)), sim_help(sim_install, "0.5.11", ddtree=False))
    assert "flag --speculative-ddtree-shadow-linear is not accepted by the installed SGLang" in problems
    assert any(p.startswith("speculative algorithm DDTREE is not offered") and p.endswith("needs the patched DDTree build")
               for p in problems)
    assert v.unsupported(v.argv(shadow, SERVER, (0, 5, 11)), sim_help(sim_install, "0.5.11", ddtree=True)) == []


def test_systemd_quoting():
    assert v.quote(["--model-path", "/srv/models/My Model", "--served-model-name", "50%", "x$y"]) == \
        '--model-path "/srv/models/My Model" --served-model-name 50%% "x$$y"'


def test_version_parsing():
    assert v.parse_version("0.5.11+simulator") == (0, 5, 11)
    assert v.parse_version("0.5.23.post1") == (0, 5, 23)
    with pytest.raises(v.VariantError):
        v.parse_version("unknown")


def test_flag_switches_come_from_the_release_table():
    """The renderer's switch points are the table's (each range checked against the wheels by
    tests/conformance/test_releases_wheels.py): --cuda-graph-max-bs is an option up to 0.5.19
    (0.5.19 server_args.py) and gone in 0.5.20 (arg_groups/fields); --mamba-radix-cache-strategy
    from 0.5.14 (0.5.14 server_args.py:6350-6356)."""
    from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_releases as rel

    assert v.SPLIT_CUDA_GRAPH_FLAGS == (0, 5, 20) == rel.first("cuda_graph_max_bs_flag", False)
    assert rel.fact("split_cuda_graph_flags", (0, 5, 14)) and not rel.fact("cuda_graph_max_bs_flag", (0, 5, 20))
    assert v.MAMBA_RADIX_CACHE_STRATEGY_FLAG == (0, 5, 14) == rel.first("mamba_radix_cache_strategy_flag")
    assert rel.fact("mamba_scheduler_strategy_flag", (0, 5, 19)) and not rel.fact("mamba_scheduler_strategy_flag", (0, 5, 20))


@pytest.mark.parametrize("arg, flag", [
    ("--api-key", "--api-key"), ("--api-key=s3cret", "--api-key"), ("--admin", "--admin-api-key"),
    ("--attention-backend", None), ("--apikey", None), ("--api-keys", None), ("-a", None), ("--", None), ("x--api", None),
])
def test_a_secret_flag_is_found_whole_or_abbreviated(arg, flag):
    assert v.secret_flag(arg) == flag
