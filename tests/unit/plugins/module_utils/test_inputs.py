"""_inputs: the deploy's input checks (hostile and mistaken values in, the
problem named out; the API key never in a message)."""

from __future__ import annotations

import pytest
import yaml
from sim_helpers import REPO

from ansible_collections.inferops.sglang.plugins.module_utils import _inputs

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
CONTROL = ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\u2029"]


def good(**overrides) -> dict:
    values = dict(service_name="sglang-qwen.service", user="sglang", group="sglang", variant="balanced",
                  variants=DEFAULTS["sglang_service_variants"], aliases=DEFAULTS["sglang_service_variant_aliases"],
                  overrides={}, common={}, served_model_name="Qwen3.6-27B", model_path="/srv/models/Qwen3.6-27B",
                  draft_model_path="/srv/models/Qwen3.6-27B-DFlash", bind_host="127.0.0.1",
                  python="/opt/sglang/venv/bin/python", state_dir="/var/lib/inferops-sglang",
                  environment={"HF_HOME": "/srv/hf cache", "NCCL_DEBUG": "WARN"}, read_write_paths=["/srv/cache"],
                  api_key="s3cr3t-key", settings={k: DEFAULTS[k] for k in _inputs.SETTINGS}
                  | {"sglang_service_gate_stall_budgets": {"weights": 1200}})
    values.update(overrides)
    return values


def test_the_role_defaults_pass():
    assert _inputs.check(good()) == []


@pytest.mark.parametrize("char", CONTROL, ids=[f"U+{ord(c):04X}" for c in CONTROL])
@pytest.mark.parametrize("where", ["description", "served_model_name", "model_path", "draft_model_path", "bind_host",
                                   "env_value", "read_write_path", "extra_args", "python", "watchdog_python", "common"])
def test_control_characters_are_refused_wherever_they_reach_the_unit(char, where):
    hostile = f"x{char}ExecStartPre=+/bin/sh -c id"
    values = good()
    if where == "description":
        variants = dict(values["variants"])
        variants["nextn"] = dict(variants["nextn"], description=hostile)
        values["variants"] = variants
    elif where == "env_value":
        values["environment"] = {"A": hostile}
    elif where == "read_write_path":
        values["read_write_paths"] = ["/srv/" + hostile]
    elif where == "extra_args":
        values["overrides"] = {"nextn": {"extra_args": ["--foo", hostile]}}
    elif where == "common":
        values["common"] = {"kv_cache_dtype": hostile}
    else:
        values[where] = "/x" + hostile if where.endswith(("path", "python")) else hostile
    errors = _inputs.check(values)
    assert len(errors) == 1, errors
    assert "must not contain control characters" in errors[0] and f"U+{ord(char):04X}" in errors[0]
    assert char not in errors[0]


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
                                  "openai_api_key", "WANDB_API_KEY"])
def test_a_secret_in_the_units_world_readable_environment_is_refused(name):
    """Issue 29: HF_TOKEN landed in the 0644 unit file."""
    errors = _inputs.check(good(environment={name: "hf_s3cret"}))
    assert len(errors) == 1 and errors[0].startswith(f"environment variable {name} looks like a secret"), errors
    assert "hf_s3cret" not in errors[0]


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "LD_LIBRARY_PATH", "NCCL_P2P_DISABLE", "SGLANG_KEYS_CACHE"])
def test_plain_environment_names_pass(name):
    assert _inputs.check(good(environment={name: "1"})) == []


@pytest.mark.parametrize("value", ["python3", "bin/python3", ""])
def test_the_watchdog_interpreter_root_runs_is_an_absolute_path(value):
    """Issue 29: it reached the watchdog's unit, run as root, unchecked."""
    assert _inputs.check(good(watchdog_python=value)) == [
        f"sglang_service_watchdog_python must be an absolute path, got {value}"]
    assert _inputs.check(good(watchdog_python="/usr/bin/python3")) == []


@pytest.mark.parametrize("name", ["../../tmp/x.service", "sglang/../x.service", "sglang..x.service", "sglang",
                                  "Sglang.service", ".service", "-x.service", "a b.service", "x.service\n",
                                  "x" * 250 + ".service", "", None])
def test_service_names_that_would_leave_their_directories_are_refused(name):
    errors = _inputs.check(good(service_name=name) if name is not None else dict(good(), service_name=7))
    assert len(errors) == 1 and errors[0].startswith("sglang_service_name must be [a-z0-9][a-z0-9._-]*.service"), errors


@pytest.mark.parametrize("name", ["sglang-qwen.service", "sglang_qwen.2.service", "0.service"])
def test_plain_service_names_pass(name):
    assert _inputs.check(good(service_name=name)) == []


@pytest.mark.parametrize("key", ["../../var/tmp/x", "a/b", "..", "Upper", "-x", "x y", "a..b", ""])
def test_variant_and_alias_names_used_in_paths_are_refused(key):
    variants = dict(good()["variants"], **{key: {"description": "x"}})
    errors = _inputs.check(good(variants=variants))
    assert errors == [f"sglang_service_variants key must match [a-z0-9][a-z0-9._-]* without '..' (it names a file or "
                      f"directory), got {key!r}"]
    aliases = {key: "nextn"}
    assert len(_inputs.check(good(aliases=aliases))) == 1
    assert _inputs.check(good(aliases={"fast": key})) == [
        f"sglang_service_variant_aliases.fast must match [a-z0-9][a-z0-9._-]* without '..' (it names a file or "
        f"directory), got {key!r}"]


@pytest.mark.parametrize("user", ["root\nUser=root", "../x", "a b", "Root", "x" * 33, "", "1abc"])
def test_bad_user_and_group_names_are_refused(user):
    assert len(_inputs.check(good(user=user))) == 1
    assert len(_inputs.check(good(group=user))) == 1


@pytest.mark.parametrize("name", ["1X", "A-B", "A B", "A=B", "", "A\n"])
def test_environment_names_systemd_would_ignore_are_refused(name):
    errors = _inputs.check(good(environment={name: "v"}))
    assert errors == [f"environment variable name {name!r} must match [A-Za-z_][A-Za-z0-9_]*"]


def test_environment_values_may_hold_anything_printable_and_are_never_quoted_in_errors():
    env = {"A": "a b", "B": "%h$HOME\\\"'=;#", "C": "é✓", "D": "x" * 5000, "E": 7}
    assert _inputs.check(good(environment=env)) == []
    errors = _inputs.check(good(environment={"TOKEN": "hf_secret\nLD_PRELOAD=/tmp/x.so"}))
    assert len(errors) == 1 and "hf_secret" not in errors[0] and "TOKEN" in errors[0]


@pytest.mark.parametrize("paths", [["relative"], ["/a b"], ['/a"b'], ["/a\\b"], "/srv/cache", [7]])
def test_read_write_paths_must_be_plain_absolute_paths(paths):
    assert len(_inputs.check(good(read_write_paths=paths))) == 1


def test_a_read_write_path_may_carry_systemds_minus_prefix():
    # "-/srv/optional": systemd skips it when it does not exist (systemd.exec(5), SANDBOXING)
    assert _inputs.check(good(read_write_paths=["-/srv/optional", "/srv/cache"])) == []
    assert len(_inputs.check(good(read_write_paths=["-relative"]))) == 1


HOSTILE_KEYS = ['ab\\cd\\', 'q"uo\'te', "#hash", "a: b", "{x}", "%h%%", "$HOME", "!tag", "& *a", "in ner",
                "~", "null", "123", "0x1F", "5-", "[1,2]", "'", '"', "|", ">", "@`"]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_printable_ascii_keys_pass(key):
    assert _inputs.check(good(api_key=key)) == []


@pytest.mark.parametrize("key,why", [
    ("secret\nLD_PRELOAD=/tmp/x.so", "printable ASCII"),
    ("secret\r", "printable ASCII"),
    ("sec\tret", "printable ASCII"),
    ("sec\x00ret", "printable ASCII"),
    ("sec\x7fret", "printable ASCII"),
    ("clé-secrète", "printable ASCII"),
    ("ключ", "printable ASCII"),
    ("key\u2028", "printable ASCII"),
    (" secret", "begin or end with a space"),
    ("secret ", "begin or end with a space"),
    ("-secret", "must not begin with '-'"),
])
def test_keys_a_header_or_sglang_cannot_carry_are_refused_without_the_key_in_the_message(key, why):
    errors = _inputs.check(good(api_key=key))
    assert len(errors) == 1 and why in errors[0], errors
    for part in ("secret", "clé", "ключ", "LD_PRELOAD"):
        assert part not in errors[0]


@pytest.mark.parametrize("name,value", [
    ("sglang_service_gate_interval", 0), ("sglang_service_gate_interval", "0"), ("sglang_service_gate_interval", -1),
    ("sglang_service_gate_interval", 61), ("sglang_service_gate_interval", "abc"),
    ("sglang_service_gate_interval", "nan"), ("sglang_service_gate_interval", True),
    ("sglang_service_gate_generations", 0), ("sglang_service_gate_generations", 1.5),
    ("sglang_service_gate_settle", -1), ("sglang_service_gate_progress_interval", -0.5),
    ("sglang_service_plan_tolerance", 1.5), ("sglang_service_plan_tolerance", -0.1),
    ("sglang_service_release_timeout", 0), ("sglang_service_release_threshold_mib", -1),
    ("sglang_service_lock_timeout", -1), ("sglang_service_lock_lease", 0), ("sglang_service_keep_attempts", 0),
    ("sglang_service_args_timeout", 0), ("sglang_service_keep_attempts", None), ("sglang_service_gate_settle", "inf"),
])
def test_settings_the_switch_and_rollback_use_are_checked_first(name, value):
    settings = dict(good()["settings"], **{name: value})
    errors = _inputs.check(good(settings=settings))
    assert len(errors) == 1 and errors[0].startswith(f"{name} ("), errors
    assert repr(value) in errors[0]


@pytest.mark.parametrize("name,value", [
    ("sglang_service_gate_interval", "0.5"), ("sglang_service_gate_interval", 60),
    ("sglang_service_gate_generations", "3"), ("sglang_service_gate_settle", 0),
    ("sglang_service_plan_tolerance", "1"), ("sglang_service_plan_tolerance", 0), ("sglang_service_lock_timeout", "0"),
    ("sglang_service_keep_attempts", 2.0),
])
def test_settings_in_range_pass_as_numbers_or_strings(name, value):
    assert _inputs.check(good(settings=dict(good()["settings"], **{name: value}))) == []


@pytest.mark.parametrize("budgets,error", [
    ({"weights": -1}, "sglang_service_gate_stall_budgets.weights must be a finite number of seconds >= 0"),
    ({"weigths": 10}, "sglang_service_gate_stall_budgets: unknown stage 'weigths'"),
    ({"http": "abc"}, "sglang_service_gate_stall_budgets.http must be a number of seconds"),
    ("weights=10", "sglang_service_gate_stall_budgets must be a dict of stage: seconds"),
])
def test_stall_budgets_are_checked_per_stage(budgets, error):
    errors = _inputs.check(good(settings=dict(good()["settings"], sglang_service_gate_stall_budgets=budgets)))
    assert len(errors) == 1 and errors[0].startswith(error), errors


def test_every_problem_is_reported_together():
    errors = _inputs.check(good(service_name="../x.service", user="root\n", api_key="a\nb",
                                environment={"A": "\n"}, settings=dict(good()["settings"], sglang_service_gate_interval=0)))
    assert len(errors) == 5


def test_a_gate_interval_longer_than_the_variants_gate_timeout_is_refused_first():
    """The gate refuses interval > timeout, and the switch would only find out after stopping the service."""
    settings = dict(good()["settings"], sglang_service_gate_interval=45)
    assert _inputs.check(good(settings=settings)) == []
    errors = _inputs.check(good(settings=settings, overrides={"shadow-balanced": {"gate_timeout": 30}}))
    assert errors == ["sglang_service_gate_interval 45 exceeds the gate_timeout 30 of the variant shadow-balanced"]
    errors = _inputs.check(good(settings=settings, baseline_variant="nextn", common={"gate_timeout": 20}))
    assert errors == ["sglang_service_gate_interval 45 exceeds the gate_timeout 20 of the variant shadow-balanced",
                      "sglang_service_gate_interval 45 exceeds the gate_timeout 20 of the baseline variant nextn"]
    # a variant that does not resolve is sglang_variant's to name
    assert _inputs.check(good(settings=settings, variant="turbo")) == []


@pytest.mark.parametrize("name,value,error", [
    ("sglang_service_perf_gate", "strict", "sglang_service_perf_gate must be one of enforce, report, off, got 'strict'"),
    ("sglang_service_perf_gate", False, "sglang_service_perf_gate must be one of enforce, report, off, got False "
                                        "(quote off in YAML: unquoted it reads as false)"),
    ("sglang_service_perf_load", {"concurency": 4}, "sglang_service_perf_load: unknown setting concurency"),
    ("sglang_service_perf_load", {"rounds": 0}, "sglang_service_perf_load.rounds must be an integer in [1, 4096], got 0"),
    ("sglang_service_perf_thresholds", {"output_tokens_per_s": -1},
     "sglang_service_perf_thresholds.output_tokens_per_s must be a ratio in (0, 100), got -1"),
    ("sglang_service_perf_thresholds", {"itl": 1.1}, "sglang_service_perf_thresholds: unknown figure itl"),
])
def test_the_performance_gates_settings_are_checked_before_anything_changes(name, value, error):
    errors = _inputs.check(good(settings=dict(good()["settings"], **{name: value})))
    assert len(errors) == 1 and errors[0].startswith(error), errors


def test_a_variants_own_perf_thresholds_are_checked_with_the_variant():
    variants = dict(DEFAULTS["sglang_service_variants"], fast={"inherits": "nextn", "perf_thresholds": {"ttft_p95": 0}})
    from ansible_collections.inferops.sglang.plugins.module_utils import _variants
    errors = _variants.check(_variants.resolve("fast", variants)[1])
    assert errors == ["perf_thresholds.ttft_p95 must be a ratio in (0, 100), got 0"]
    ok = dict(variants, fast={"inherits": "nextn", "perf_thresholds": {"output_tokens_per_s": 1.05}})
    assert _variants.check(_variants.resolve("fast", ok)[1]) == []


# -- the rotation hooks (sglang_service_rotation_out, sglang_service_rotation_in) --------------

OUT = "sglang_service_rotation_out"
URL_HOOK = {"url": "https://lb.example/api/pools/qwen/members/ct129", "method": "PUT",
            "headers": {"Authorization": "Bearer lb-t0ken"}, "body": {"state": "disabled"},
            "status_code": [200, 204], "timeout": 10, "where": "host"}


@pytest.mark.parametrize("hook", [
    None,
    {},
    {"command": ["/usr/local/bin/lb", "disable", "ct129"]},
    {"command": ["/usr/local/bin/lb", "disable", "ct129"], "where": "host"},
    {"url": "http://127.0.0.1:9000/out"},
    URL_HOOK,
    dict(URL_HOOK, status_code="204", timeout="25"),  # -e gives strings
    dict(URL_HOOK, status_code=204, method="DELETE", where="controller"),
], ids=["none", "empty", "command", "command-on-host", "url", "url-full", "url-strings", "url-status-int"])
def test_a_well_formed_hook_passes(hook):
    assert _inputs.check_hook(OUT, hook) == []


@pytest.mark.parametrize("hook, errors", [
    ("lb disable ct129", [f"{OUT} must be a dict (command: [argv...] or url: ...), or {{}} for none, got 'lb disable ct129'"]),
    (["lb", "disable"], [f"{OUT} must be a dict (command: [argv...] or url: ...), or {{}} for none, got ['lb', 'disable']"]),
    ({"comand": ["lb"]}, [f"{OUT} has an unknown key 'comand' (known: body, command, headers, method, status_code, timeout, "
                          "url, where)", f"{OUT} must have exactly one of command (an argv list) and url"]),
    ({"where": "host"}, [f"{OUT} must have exactly one of command (an argv list) and url"]),
    ({"command": ["lb"], "url": "http://lb/out"}, [f"{OUT} must have exactly one of command (an argv list) and url"]),
    ({"command": "lb disable ct129"},
     [f"{OUT}.command must be a list of non-empty strings (an argv, run without a shell), got 'lb disable ct129'"]),
    ({"command": []}, [f"{OUT}.command must be a list of non-empty strings (an argv, run without a shell), got []"]),
    ({"command": ["lb", ""]}, [f"{OUT}.command must be a list of non-empty strings (an argv, run without a shell), got ['lb', '']"]),
    ({"command": ["lb", 7]}, [f"{OUT}.command must be a list of non-empty strings (an argv, run without a shell), got ['lb', 7]"]),
    ({"command": ["lb"], "method": "POST", "timeout": 5}, [f"{OUT}: only a url hook takes method, timeout"]),
    ({"command": ["lb"], "where": "lb-host"}, [f"{OUT}.where must be controller or host, got 'lb-host'"]),
    ({"url": "ftp://lb/out"}, [f"{OUT}.url must be an http:// or https:// URL without spaces or control characters"]),
    ({"url": "http:// lb/out"}, [f"{OUT}.url must be an http:// or https:// URL without spaces or control characters"]),
    ({"url": ["http://lb/out"]}, [f"{OUT}.url must be an http:// or https:// URL without spaces or control characters"]),
    ({"url": "http://lb/out", "method": "get"}, [f"{OUT}.method must be one of GET, POST, PUT, PATCH, DELETE, got 'get'"]),
    ({"url": "http://lb/out", "headers": ["Authorization: x"]}, [f"{OUT}.headers must map header names to strings"]),
    ({"url": "http://lb/out", "headers": {"X-Weight": 0}}, [f"{OUT}.headers must map header names to strings"]),
    ({"url": "http://lb/out", "status_code": 99}, [f"{OUT}.status_code must be an HTTP status or a list of them, got 99"]),
    ({"url": "http://lb/out", "status_code": []}, [f"{OUT}.status_code must be an HTTP status or a list of them, got []"]),
    ({"url": "http://lb/out", "status_code": [200, "ok"]},
     [f"{OUT}.status_code must be an HTTP status or a list of them, got [200, 'ok']"]),
    ({"url": "http://lb/out", "status_code": True}, [f"{OUT}.status_code must be an HTTP status or a list of them, got True"]),
    ({"url": "http://lb/out", "timeout": 0}, [f"{OUT}.timeout must be a whole number of seconds > 0, got 0"]),
    ({"url": "http://lb/out", "timeout": "soon"}, [f"{OUT}.timeout must be a whole number of seconds > 0, got 'soon'"]),
    ({"url": "http://lb/out", "timeout": float("inf")}, [f"{OUT}.timeout must be a whole number of seconds > 0, got inf"]),
    # the uri module's timeout is whole seconds: 0.5 would become 0, a call that never waits
    ({"url": "http://lb/out", "timeout": 0.5}, [f"{OUT}.timeout must be a whole number of seconds > 0, got 0.5"]),
    ({"url": "http://lb/out", "timeout": "2.5"}, [f"{OUT}.timeout must be a whole number of seconds > 0, got '2.5'"]),
])
def test_a_malformed_hook_is_refused_with_each_problem_named(hook, errors):
    assert _inputs.check_hook(OUT, hook) == errors


@pytest.mark.parametrize("char", CONTROL, ids=[f"U+{ord(c):04X}" for c in CONTROL])
def test_control_characters_in_a_hook_are_refused_and_never_quoted(char):
    """A hook's argv, URL and headers reach a process or a request line: a newline would
    split a header (and an Authorization header carries a secret the message must not show)."""
    secret = f"Bearer lb-t0ken{char}X-Evil: 1"
    errors = _inputs.check_hook(OUT, dict(URL_HOOK, headers={"Authorization": secret}))
    assert errors == [f"{OUT}.headers.Authorization must not contain control characters (a newline would start a line of "
                      f"its own in the unit file), found U+{ord(char):04X}"]
    assert "lb-t0ken" not in errors[0]
    errors = _inputs.check_hook(OUT, {"command": ["/usr/local/bin/lb", f"ct129{char}reboot"]})
    assert len(errors) == 1 and errors[0].startswith(f"{OUT}.command[1] must not contain control characters")
    errors = _inputs.check_hook(OUT, dict(URL_HOOK, url=f"https://lb.example/out{char}x"))
    assert errors == [f"{OUT}.url must be an http:// or https:// URL without spaces or control characters"]


def test_the_deploys_check_reads_both_hooks_by_their_role_variables():
    """check() (module sglang_inputs, the preflight's first check) checks each hook under its own name,
    with every other problem of the input reported beside them."""
    settings = dict(good()["settings"], sglang_service_rotation_out={"command": ["/usr/local/bin/lb", "disable"]},
                    sglang_service_rotation_in=dict(URL_HOOK, method="PUSH"))
    assert _inputs.check(good(settings=settings)) == [
        "sglang_service_rotation_in.method must be one of GET, POST, PUT, PATCH, DELETE, got 'PUSH'"]
    settings["sglang_service_rotation_out"] = "lb disable"
    settings["sglang_service_gate_interval"] = 0
    errors = _inputs.check(good(settings=settings))
    assert errors[0] == ("sglang_service_gate_interval (seconds between the gate's probes (the pre-gate waits 60 s)) "
                         "must be > 0 and <= 60, got 0")
    assert errors[1:] == [
        "sglang_service_rotation_out must be a dict (command: [argv...] or url: ...), or {} for none, got 'lb disable'",
        "sglang_service_rotation_in.method must be one of GET, POST, PUT, PATCH, DELETE, got 'PUSH'"]
    # the role's defaults: no hooks
    defaults = {name: DEFAULTS[name] for name in _inputs.ROTATION_HOOKS}
    assert defaults == {name: {} for name in _inputs.ROTATION_HOOKS}
    assert _inputs.check(good(settings=dict(good()["settings"], **defaults))) == []
