"""The sglang_service role's unit and --config templates rendered by Ansible's
own templating (as the template module renders them: trim_blocks, no
backslash escaping) with hostile values: each is either refused by the
preflight's input check (_inputs) or rendered so that systemd (the unit,
read back by tests/unit/systemd_syntax.py after systemd.syntax(7), and by
systemd-analyze verify where it is installed) and SGLang (the --config file,
read by yaml.safe_load and by real SGLang 0.5.11's ConfigArgumentMerger from
the published wheel) get exactly the input back."""

from __future__ import annotations

import argparse
import json
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ddtree_helpers import wheel
from sim_helpers import REPO

import systemd_syntax
from ansible_collections.inferops.sglang.plugins.module_utils import _credentials
from ansible_collections.inferops.sglang.plugins.module_utils import _host_manifest
from ansible_collections.inferops.sglang.plugins.module_utils import _inputs
from ansible_collections.inferops.sglang.plugins.module_utils import _variants

ROLE = REPO / "roles" / "sglang_service"
ROLE_VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
# the unit's own Environment= lines, before the host's
UNIT_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NO_PROXY": "127.0.0.1,localhost,::1",
            "no_proxy": "127.0.0.1,localhost,::1", "HOME": "%S/sglang", "XDG_CACHE_HOME": "%C/sglang",
            "PYTHONUNBUFFERED": "1", "SGLANG_LOGGING_CONFIG_PATH": "/etc/sglang/sglang-qwen.logging.json"}


def _trust(value):
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trust(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trust(v) for v in value]
    return value


def render(template: str, **overrides) -> str:
    """templates/<template> as the template module renders it, with the role's vars/main.yml."""
    loader = DataLoader()
    variables = dict(
        ansible_managed="Ansible managed", sglang_service_name="sglang-qwen.service",
        sglang_service_state_dir="/var/lib/inferops-sglang", sglang_service_bind_host="127.0.0.1",
        sglang_service_port=30000, sglang_service_served_model_name="Qwen3.6-27B", sglang_service_user="sglang",
        sglang_service_group="sglang", sglang_service_python="/opt/sglang/venv/bin/python",
        sglang_service_api_key="", sglang_service_admin_api_key="", sglang_service_read_write_paths=[],
        _sglang_service_gpus=[0, 2],
        sglang_service_gpu_devices=[0, 2],
        _sglang_service_environment={"LD_LIBRARY_PATH": "/usr/local/cuda-13.0/lib64"},
        _sglang_service_render={"variant": "nextn", "params": {"description": "Production baseline"},
                                "sglang_version": "0.5.11", "exec_args": "--model-path /srv/models/Qwen3.6-27B",
                                "privileged_port": False},
    )
    variables.update(overrides)
    # the manifest read's device nodes (tasks/preflight.yml, vars/main.yml): with no minors
    # known, a GPU's node is its index, as sglang_host_manifest gives it on such a host
    variables.setdefault("_sglang_service_gpu_nodes", _host_manifest.gpu_nodes(variables["_sglang_service_gpus"], {})[0])
    # the role's vars/main.yml as Ansible resolves them (the ones the templates use)
    variables.setdefault("_sglang_service_slot", None)  # no slots: the service's own unit
    for name in ("_sglang_service_base", "_sglang_service_unit", "_sglang_service_config_file",
                 "_sglang_service_credential", "_sglang_service_logging_file", "_sglang_service_logging",
                 "_sglang_service_config_used"):
        variables[name] = Templar(loader=loader, variables=variables).template(_trust(ROLE_VARS[name]))
    templar = Templar(loader=loader, variables=variables)
    text = trust_as_template((ROLE / "templates" / template).read_text())
    return templar.template(text, escape_backslashes=False,
                            overrides=dict(trim_blocks=True, lstrip_blocks=False, newline_sequence="\n"))


def keys(unit: str) -> list[tuple[str, str]]:
    return [(section, key) for section, key, _value in systemd_syntax.lines(unit)]


def baseline_keys(**benign) -> list[tuple[str, str]]:
    """The unit's lines (section, key) with a harmless value where the test puts a hostile one."""
    return keys(render("sglang.service.j2", **benign))


def verify(unit: str, tmp_path) -> None:
    """systemd-analyze verify on the rendered unit, where systemd is installed: no warning about it."""
    if not shutil.which("systemd-analyze"):
        return
    path = tmp_path / "sglang-qwen.service"
    path.write_text(unit.replace("/opt/sglang/venv/bin/python", "/bin/true"))
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, check=False)
    own = [line for line in proc.stderr.splitlines() if path.name in line]
    assert proc.returncode == 0 and not own, proc.stderr


HOSTILE = {
    "newline": "a\nExecStartPre=+/bin/sh -c 'id > /tmp/pwned'",
    "cr": "a\rUser=root",
    "tab": "a\tb",
    "nul": "a\x00b",
    "del": "a\x7fb",
    "nel": "a\x85b",
    "u2028": "a\u2028User=root",
    "u2029": "a\u2029b",
    "double_quote": 'say "hi"',
    "single_quote": "it's",
    "backslash": "C:\\path\\",
    "backslash_quote": '\\"',
    "percent": "100% %h %%n",
    "dollar": "$HOME ${PATH} $$",
    "space": "two words  and more ",
    "equals": "a=b=c",
    "semicolon_hash": "; # not a comment",
    "very_long": "x" * 20000,
    "non_ascii": "été ✓ 模型",
    "empty": "",
}


@pytest.mark.parametrize("case", HOSTILE)
def test_environment_values_are_refused_or_reach_the_server_exactly(case, tmp_path):
    value = HOSTILE[case]
    env = {"LD_LIBRARY_PATH": "/usr/local/cuda-13.0/lib64", "HOSTILE": value}
    errors = _inputs.check_environment(env)
    if _inputs.control_characters(value):
        assert len(errors) == 1 and "environment variable HOSTILE must not contain control characters" in errors[0]
        return
    assert errors == []
    unit = render("sglang.service.j2", _sglang_service_environment=env)
    assert keys(unit) == baseline_keys(_sglang_service_environment=dict(env, HOSTILE="x"))
    assert systemd_syntax.environment(unit) == dict(UNIT_ENV, CUDA_VISIBLE_DEVICES="0,2", **env)
    verify(unit, tmp_path)


@pytest.mark.parametrize("case", HOSTILE)
def test_description_and_served_name_are_refused_or_stay_on_their_lines(case, tmp_path):
    value = HOSTILE[case]
    values = dict(served_model_name=value, variants={"nextn": {"description": value}})
    errors = _inputs.check(values)
    if _inputs.control_characters(value):
        assert len(errors) == 2 and all("must not contain control characters" in e for e in errors), errors
        return
    assert errors == []
    unit = render("sglang.service.j2", sglang_service_served_model_name=value,
                  _sglang_service_render={"variant": "nextn", "params": {"description": value},
                                          "sglang_version": "0.5.11", "exec_args": "--model-path /m",
                                          "privileged_port": False})
    assert keys(unit) == baseline_keys()
    description = [v for s, k, v in systemd_syntax.lines(unit) if k == "Description"]
    assert [systemd_syntax.specifiers(d) for d in description] == [f"SGLang {value} (nextn)".strip()]
    verify(unit, tmp_path)


@pytest.mark.parametrize("case", HOSTILE)
def test_command_line_arguments_are_refused_or_reach_the_server_exactly(case):
    """exec_args (_variants.quote): the served model name and extra_args as SGLang's argv gets them."""
    value = HOSTILE[case]
    errors = _inputs.check(dict(served_model_name=value, common={"extra_args": ["--x", value]}))
    if _inputs.control_characters(value):
        assert len(errors) == 2 and all("must not contain control characters" in e for e in errors), errors
        return
    assert errors == []
    argv = ["--model-path", "/srv/m", "--served-model-name", value, "--x", value]
    unit = render("sglang.service.j2", _sglang_service_render={
        "variant": "nextn", "params": {}, "sglang_version": "0.5.11", "exec_args": _variants.quote(argv),
        "privileged_port": False})
    assert keys(unit) == baseline_keys()
    (line,) = [v for s, k, v in systemd_syntax.lines(unit) if k == "ExecStart"]
    # systemd.service(5) "COMMAND LINES": specifiers over the whole line, then the words, then $$ is $
    words = systemd_syntax.words(systemd_syntax.specifiers(line))
    assert all("$" not in w.replace("$$", "") for w in words)
    assert [w.replace("$$", "$") for w in words] == ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server"] + argv


def test_a_privileged_port_gives_the_server_the_capability_to_bind_it_and_no_other(tmp_path):
    """Issue 29: a port below the host's unprivileged range cannot be taken by another local user
    while the server loads or is down; the unit then holds CAP_NET_BIND_SERVICE, bounded to it."""
    def capabilities(unit: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for _section, key, value in systemd_syntax.lines(unit):
            if key in ("CapabilityBoundingSet", "AmbientCapabilities"):
                found.setdefault(key, []).append(value)
        return found

    plain = render("sglang.service.j2")
    assert capabilities(plain) == {"CapabilityBoundingSet": [""], "AmbientCapabilities": [""]}
    unit = render("sglang.service.j2", sglang_service_port=443, _sglang_service_render={
        "variant": "nextn", "params": {}, "sglang_version": "0.5.11", "exec_args": "--model-path /m --port 443",
        "privileged_port": True})
    assert capabilities(unit) == {"CapabilityBoundingSet": ["CAP_NET_BIND_SERVICE"],
                                  "AmbientCapabilities": ["CAP_NET_BIND_SERVICE"]}
    assert [k for k in keys(unit) if k[1] != "#"] == [k for k in keys(plain) if k[1] != "#"]
    verify(unit, tmp_path)


def test_the_green_slot_logs_under_its_own_name_and_says_its_slot(tmp_path):
    """Two slots: the gate and the watchdog read a unit's own lines by its SyslogIdentifier, so the green
    slot's server cannot be mistaken for the blue one's (or the reverse) while both run."""
    def lines(unit: str) -> dict:
        return {(section, key): value for section, key, value in systemd_syntax.lines(unit)}

    blue = lines(render("sglang.service.j2"))
    assert blue[("Service", "SyslogIdentifier")] == "sglang-qwen"
    green_unit = render("sglang.service.j2", _sglang_service_slot={"slot": "green", "unit": "sglang-qwen-green.service"})
    green = lines(green_unit)
    assert green[("Service", "SyslogIdentifier")] == "sglang-qwen-green"
    assert green[("Unit", "Description")].endswith("(nextn, slot green)")
    verify(green_unit, tmp_path)


@pytest.mark.parametrize("path,error", [
    ("/srv/a\nUser=root", "must not contain control characters"),
    ("/srv/a b", "must not contain whitespace"),
    ("relative/x", "must be an absolute path"),
    ("/srv/100%", None),
    ("/srv/été", None),
])
def test_read_write_paths_are_refused_or_written_whole(path, error, tmp_path):
    errors = _inputs.check_paths("sglang_service_read_write_paths", [path])
    if error:
        assert len(errors) == 1 and error in errors[0]
        return
    assert errors == []
    unit = render("sglang.service.j2", sglang_service_read_write_paths=[path])
    found = [systemd_syntax.words(systemd_syntax.specifiers(v)) for s, k, v in systemd_syntax.lines(unit)
             if k == "ReadWritePaths"]
    assert found == [[path]]
    verify(unit, tmp_path)


@pytest.mark.parametrize("given,devices", [("0,2", [0, 2]), ("10", [10]), (10, [10]), ([1, 3], [1, 3]), (" 0, 2 ", [0, 2])])
def test_a_gpu_list_given_as_a_string_renders_the_validated_list(given, devices):
    """-e sglang_service_gpu_devices=0,2 rendered CUDA_VISIBLE_DEVICES=0,,,2 and =10 gave GPUs 1 and 0:
    the unit renders the list the manifest read validated, not the raw variable."""
    settings, _sources, problems, _warnings = _host_manifest.settings(None, None, given)
    assert problems == [] and settings["gpu_devices"] == devices
    unit = render("sglang.service.j2", sglang_service_gpu_devices=given, _sglang_service_gpus=settings["gpu_devices"])
    assert systemd_syntax.environment(unit)["CUDA_VISIBLE_DEVICES"] == ",".join(str(d) for d in devices)
    allowed = [v for s, k, v in systemd_syntax.lines(unit) if k == "DeviceAllow"]
    assert allowed == ["/dev/nvidiactl rw", "/dev/nvidia-uvm rw", "/dev/nvidia-uvm-tools rw"] + [
        f"/dev/nvidia{d} rw" for d in devices]


def test_the_preflight_keeps_the_validated_gpu_list_and_nothing_later_reads_the_raw_one():
    preflight = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    assert ROLE_VARS["_sglang_service_gpus"] == "{{ __sglang_service_host.settings.gpu_devices }}"
    assert ROLE_VARS["_sglang_service_variant"] == "{{ __sglang_service_host.variant }}"
    checked = [t for t in preflight if "inferops.sglang.sglang_preflight" in t]
    # one resolution (the variant and the baseline together, after the manifest read in the same call)
    assert len(checked) == 1 and checked[0]["register"] == "__sglang_service_host"
    # a tune (tasks/tune.yml) has no rollback target
    assert checked[0]["inferops.sglang.sglang_preflight"]["baseline"] == (
        "{{ omit if _sglang_service_tuning | default(false) else sglang_service_baseline_variant }}")
    # the rollback target is never resolved again with other options (a first deploy's baseline
    # was planned with the defaults: issue 28)
    for module in ("sglang_variant", "sglang_preflight"):
        assert sum(path.read_text().count(f"inferops.sglang.{module}:") for path in (ROLE / "tasks").glob("*.yml")) == (
            module == "sglang_preflight")
    for path in list((ROLE / "tasks").glob("*.yml")) + list((ROLE / "templates").glob("*.j2")) + [ROLE / "vars/main.yml"]:
        text = path.read_text().replace("never sglang_service_gpu_devices itself", "")
        if path.name in ("preflight.yml", "plan.yml"):
            # the manifest read is given the raw value to validate; nothing else reads it
            text = text.replace('gpu_devices: "{{ sglang_service_gpu_devices }}"', "", 1)
        assert "sglang_service_gpu_devices" not in text, path


HOSTILE_KEYS = ['ab\\cd\\', 'q"uo\'te', "#hash", "a: b", "{x: 1}", "[1, 2]", "%h%%", "$HOME", "!tag", "&anchor",
                "*alias", "|", ">", "'", '"', "\\", "in ner sp", "null", "~", "true", "123", "0x1F", "1e3", "5-",
                "@`", "?", ",", "=", "key # not a comment", "".join(chr(c) for c in range(0x21, 0x7F))]


def _real_merger():
    """Real SGLang 0.5.11's srt/server_args_config_parser.py (ConfigArgumentMerger), from the published wheel."""
    with zipfile.ZipFile(wheel()) as archive:
        source = archive.read("sglang/srt/server_args_config_parser.py")
    spec = importlib.util.spec_from_loader("sglang_server_args_config_parser", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, "server_args_config_parser.py", "exec"), module.__dict__)  # pylint: disable=exec-used
    return module.ConfigArgumentMerger


def _parse_like_sglang(merger, config: str) -> argparse.Namespace:
    """prepare_server_args (0.5.11 srt/server_args.py:7276-7288): the merger, then argparse;
    --api-key and --admin-api-key as ServerArgs.add_cli_args declares them (:5019-5033)."""
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    parser.add_argument("--model-path", type=str)
    parser.add_argument("--api-key", type=str, default=None)
    parser.add_argument("--admin-api-key", type=str, default=None)
    argv = merger(parser).merge_config_with_args(["--model-path", "/m", "--config", config])
    return parser.parse_args(argv)


@pytest.fixture(scope="module", name="merger")
def fixture_merger():
    return _real_merger()


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_any_printable_key_reaches_sglang_byte_for_byte_through_the_config_file(key, merger, tmp_path):
    assert _inputs.check_api_key(key) == []
    text = render("sglang.config.yaml.j2", sglang_service_api_key=key)
    assert yaml.safe_load(text) == {"api-key": key}
    path = tmp_path / "sglang-qwen.yaml"
    path.write_text(text)
    assert _parse_like_sglang(merger, str(path)).api_key == key
    # the pre-gate reads the running service's key from the same file
    assert _credentials.api_key_from_config(str(path)) == key


def test_a_key_starting_with_a_dash_would_stop_sglang_so_it_is_refused(merger, tmp_path):
    path = tmp_path / "sglang-qwen.yaml"
    path.write_text(render("sglang.config.yaml.j2", sglang_service_api_key="-secret"))
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parse_like_sglang(merger, str(path))
    assert _inputs.check_api_key("-secret") == [
        "sglang_service_api_key must not begin with '-': SGLang passes it to argparse as --api-key VALUE, which "
        "takes it for an option"]


def test_no_key_renders_an_empty_config():
    assert yaml.safe_load(render("sglang.config.yaml.j2")) == {}


# -- the watchdog's units and settings ----------------------------------------------------

WATCHDOG = dict(sglang_service_watchdog_action="restart", sglang_service_watchdog_interval=30,
                sglang_service_watchdog_failures=3, sglang_service_watchdog_timeout=30,
                sglang_service_watchdog_start_grace=900, sglang_service_watchdog_backoff=300,
                sglang_service_watchdog_backoff_max=3600, sglang_service_watchdog_python="/usr/bin/python3",
                sglang_service_metrics_textfile_dir="/var/lib/prometheus/node-exporter",
                sglang_service_gateway=False, sglang_service_gateway_timeout=60)


def render_watchdog(template: str, **overrides) -> str:
    loader = DataLoader()
    variables = dict(sglang_service_name="sglang-qwen.service", sglang_service_state_dir="/var/lib/inferops-sglang",
                     sglang_service_bind_host="0.0.0.0", sglang_service_port=30000, sglang_service_api_key="",
                     _sglang_service_variant={"url": "http://127.0.0.1:30000"}, **WATCHDOG)
    variables.update(overrides)
    variables.setdefault("_sglang_service_gateway", {"url": "http://0.0.0.0:30000"})
    for name in ("_sglang_service_base", "_sglang_service_config_file", "_sglang_service_dir", "_sglang_service_url",
                 "_sglang_service_watchdog_unit", "_sglang_service_watchdog_settings", "_sglang_service_watchdog_root",
                 "_sglang_service_gateway_control_key"):
        variables[name] = Templar(loader=loader, variables=variables).template(_trust(ROLE_VARS[name]))
    return render(template, **variables)


def test_the_watchdog_settings_are_what_the_watchdog_loads_and_hold_no_key():
    from ansible_collections.inferops.sglang.plugins.module_utils import _watchdog

    plain = _watchdog.load_settings(json.loads(render_watchdog("sglang-watchdog.json.j2")))
    assert plain["unit"] == "sglang-qwen.service" and plain["url"] == "http://127.0.0.1:30000"
    assert plain["service_dir"] == "/var/lib/inferops-sglang/sglang-qwen" and plain["api_key_file"] is None
    assert (plain["interval"], plain["failures"], plain["timeout"], plain["lease"]) == (30, 3, 30, 330)
    # each action rewrites the deploy state for node_exporter; '' turns it off
    assert plain["textfile_dir"] == "/var/lib/prometheus/node-exporter"
    assert _watchdog.load_settings(json.loads(render_watchdog(
        "sglang-watchdog.json.j2", sglang_service_metrics_textfile_dir="")))["textfile_dir"] is None
    text = render_watchdog("sglang-watchdog.json.j2", sglang_service_api_key="k3y-in-the-vars",
                           sglang_service_watchdog_action="report")
    keyed = _watchdog.load_settings(json.loads(text))
    assert "k3y-in-the-vars" not in text
    assert keyed["api_key_file"] == "/etc/sglang/sglang-qwen.yaml" and keyed["action"] == "report"
    # behind the host's gateway: the watchdog puts a serving server it does not list back, with the control key file
    assert plain["gateway"] is None
    gated = _watchdog.load_settings(json.loads(render_watchdog("sglang-watchdog.json.j2", sglang_service_gateway=True)))
    assert gated["gateway"] == {"url": "http://0.0.0.0:30000", "control_key_file": "/etc/sglang/sglang-qwen.gateway-key",
                                "timeout": 60}


def test_the_watchdog_units_run_the_copied_gate_every_interval(tmp_path):
    service = render_watchdog("sglang-watchdog.service.j2", ansible_managed="Ansible managed")
    timer = render_watchdog("sglang-watchdog.timer.j2", ansible_managed="Ansible managed",
                            sglang_service_watchdog_interval=10)
    lines = {(section, key): value for section, key, value in systemd_syntax.lines(service)}
    assert lines[("Service", "Type")] == "oneshot"
    assert lines[("Service", "ExecStart")] == (
        "/usr/bin/python3 -s -m ansible_collections.inferops.sglang.plugins.module_utils._watchdog "
        "/etc/sglang/sglang-qwen.watchdog.json")
    assert lines[("Service", "TimeoutStartSec")] == "330"
    assert lines[("Service", "SyslogIdentifier")] == "sglang-qwen-watchdog"
    timer_lines = {(section, key): value for section, key, value in systemd_syntax.lines(timer)}
    assert timer_lines[("Timer", "OnUnitActiveSec")] == "10" and timer_lines[("Timer", "OnActiveSec")] == "10"
    assert timer_lines[("Install", "WantedBy")] == "timers.target"
    if shutil.which("systemd-analyze"):
        (tmp_path / "sglang-qwen-watchdog.service").write_text(service.replace("/usr/bin/python3", "/bin/true"))
        (tmp_path / "sglang-qwen-watchdog.timer").write_text(timer)
        proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "sglang-qwen-watchdog.timer")],
                              capture_output=True, text=True, check=False)
        assert not [line for line in proc.stderr.splitlines() if "sglang-qwen-watchdog" in line], proc.stderr


def test_the_watchdog_runs_as_root_in_a_sandbox_that_lets_it_write_its_state_and_the_textfile_only():
    service = render_watchdog("sglang-watchdog.service.j2", ansible_managed="Ansible managed",
                              sglang_service_watchdog_timeout="20")  # -e gives a string
    found: dict[str, list[str]] = {}
    for section, key, value in systemd_syntax.lines(service):
        if section == "Service":
            found.setdefault(key, []).append(value)
    assert found["TimeoutStartSec"] == ["320"]
    assert found["ProtectSystem"] == ["strict"] and found["ProtectHome"] == ["yes"] and found["PrivateTmp"] == ["yes"]
    assert found["NoNewPrivileges"] == ["yes"]
    assert found["ReadWritePaths"] == ["/var/lib/inferops-sglang/sglang-qwen", "-/var/lib/prometheus/node-exporter"]
    assert "CAP_SYS_ADMIN" not in found["CapabilityBoundingSet"][0]
    without = render_watchdog("sglang-watchdog.service.j2", ansible_managed="Ansible managed",
                              sglang_service_metrics_textfile_dir="")
    assert [v for s, k, v in systemd_syntax.lines(without) if k == "ReadWritePaths"] == ["/var/lib/inferops-sglang/sglang-qwen"]


def test_the_watchdog_files_rendered_by_lookup_are_what_the_template_module_writes(tmp_path):
    """tasks/watchdog.yml hands the module its settings and units rendered by the template lookup;
    a host the template module wrote them on must see the same bytes (an upgrade's re-deploy
    changes nothing). One ansible-playbook run: a role made of this role's templates, vars and
    defaults writes each file both ways, the lookup with the expression the task file uses."""
    tasks = yaml.safe_load((ROLE / "tasks" / "watchdog.yml").read_text())
    (install,) = [t["inferops.sglang.sglang_watchdog"] for t in tasks
                  if "settings" in t.get("inferops.sglang.sglang_watchdog", {})]
    role = tmp_path / "roles" / "watchdog_render"
    (role / "tasks").mkdir(parents=True)
    for part in ("templates", "vars", "defaults"):
        (role / part).symlink_to(ROLE / part)
    out = tmp_path / "out"
    out.mkdir()
    files = {"settings": "sglang-watchdog.json.j2", "service": "sglang-watchdog.service.j2",
             "timer": "sglang-watchdog.timer.j2"}
    steps = []
    for option, template in files.items():
        steps.append({"ansible.builtin.template": {"src": template, "dest": str(out / f"{option}.template"),
                                                   "mode": "0644"}})
        steps.append({"ansible.builtin.copy": {"content": install[option], "dest": str(out / f"{option}.lookup"),
                                               "mode": "0644"}})
    (role / "tasks" / "main.yml").write_text(yaml.safe_dump(steps))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False, "roles": ["watchdog_render"],
        "vars": {"sglang_service_name": "sglang-qwen.service", "sglang_service_api_key": "k3y",
                 "__sglang_service_host": {"variant": {"url": "http://127.0.0.1:30000"}}}}]))
    (tmp_path / "ansible.cfg").write_text(f"[defaults]\nretry_files_enabled = False\nroles_path = {tmp_path / 'roles'}\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c",
                           "local", "-e", f"ansible_python_interpreter={sys.executable}", "play.yml"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for option in files:
        written = (out / f"{option}.template").read_bytes()
        assert (out / f"{option}.lookup").read_bytes() == written, option
        assert written.endswith(b"\n") and not written.endswith(b"\n\n"), option
    settings = json.loads((out / "settings.template").read_text())
    assert settings["unit"] == "sglang-qwen.service" and settings["api_key_file"] == "/etc/sglang/sglang-qwen.yaml"
    assert "k3y" not in (out / "settings.template").read_text()
    assert "[Service]" in (out / "service.template").read_text()
    assert "[Timer]" in (out / "timer.template").read_text()


def test_the_admin_key_goes_to_the_config_file_with_the_api_key_and_never_to_the_unit(merger, tmp_path):
    """Issue 29: --admin-api-key in extra_args was refused (the unit, the records and ps would show it);
    the admin key now has the API key's path: the root-only --config file, read by SGLang as its flag."""
    for api_key, admin in (("", "admin-s3cret"), ("s3cret", "admin-s3cret")):
        unit = render("sglang.service.j2", sglang_service_api_key=api_key, sglang_service_admin_api_key=admin)
        assert "admin-s3cret" not in unit and "LoadCredential=sglang-qwen.yaml:/etc/sglang/sglang-qwen.yaml" in unit
        assert "--config %d/sglang-qwen.yaml" in unit
        config = render("sglang.config.yaml.j2", sglang_service_api_key=api_key, sglang_service_admin_api_key=admin)
        path = tmp_path / "sglang-qwen.yaml"
        path.write_text(config)
        assert yaml.safe_load(config) == ({"admin-api-key": admin} | ({"api-key": api_key} if api_key else {}))
        # real 0.5.11's merger turns each key into its flag (srt/server_args_config_parser.py:172-184)
        parsed = _parse_like_sglang(merger, str(path))
        assert (parsed.admin_api_key, parsed.api_key) == (admin, api_key or None)
        assert _credentials.api_key_from_config(str(path)) == (api_key or None)  # the gate's key, never the admin's
    assert _inputs.check_api_key("-admin", "sglang_service_admin_api_key") == [
        "sglang_service_admin_api_key must not begin with '-': SGLang passes it to argparse as --api-key VALUE, which "
        "takes it for an option"]
    plain = [(k, v) for _s, k, v in systemd_syntax.lines(render("sglang.service.j2"))]
    assert not [k for k, _v in plain if k == "LoadCredential"] and not [v for k, v in plain if "--config" in v]
    assert yaml.safe_load(render("sglang.config.yaml.j2")) == {}
