"""sglang_variant: the host preflight, run for real against the simulator's
installed package (version, --help), the lab model directories and the fake
nvidia-smi reading ct129's hardware file (GPU 1 lost)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from sim_helpers import MODELS, REPO, run_module, write_executable

from ansible_collections.inferops.sglang.plugins.module_utils import _model_config
from ansible_collections.inferops.sglang.plugins.module_utils import _switch
from ansible_collections.inferops.sglang.plugins.modules import sglang_variant

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
SANDBOX_HIDDEN = dict(_model_config.SANDBOX_HIDDEN)


@pytest.fixture(autouse=True)
def checkout_visible(monkeypatch):
    """The lab's model directories are this checkout's, which may itself lie where the unit's
    sandbox hides (a CI clone under /tmp or /root): here that one directory counts as visible.
    The sandbox's own test puts the real list back."""
    visible = {hidden: why for hidden, why in SANDBOX_HIDDEN.items() if not str(MODELS).startswith(hidden + "/")}
    monkeypatch.setattr(_model_config, "SANDBOX_HIDDEN", visible)


@pytest.fixture
def host(sim_install, hardware, monkeypatch, fake_nvidia_smi):
    """A controller-side stand-in for ct129: SGLang (the simulator) importable by
    sys.executable, nvidia-smi on PATH."""

    def make(version: str = "0.5.11", ddtree: bool = True) -> None:
        monkeypatch.setenv("PYTHONPATH", str(sim_install(version, ddtree)))
        for key, value in hardware("ct129").items():
            if key.startswith("SGLANG_SIM"):
                monkeypatch.setenv(key, value)
        fake_nvidia_smi()

    return make


def run(capsys, **overrides) -> tuple[int, dict]:
    args = dict(name="balanced", variants=DEFAULTS["sglang_service_variants"],
                aliases=DEFAULTS["sglang_service_variant_aliases"], python=sys.executable,
                model_path=str(MODELS / "Qwen3.6-27B"), served_model_name="Qwen3.6-27B",
                draft_model_path=str(MODELS / "Qwen3.6-27B-DFlash"), tp_size=2, gpu_devices=[0, 2])
    args.update(overrides)
    return run_module(sglang_variant.main, capsys, args)[:2]


def test_balanced_resolves_and_passes_on_ct129(host, capsys):
    host()
    rc, result = run(capsys)
    assert rc == 0, result
    assert result["variant"] == "shadow-balanced" and result["sglang_version"] == "0.5.11+simulator"
    assert "--disable-cuda-graph" in result["argv"]
    assert result["exec_args"].startswith("--model-path ")
    assert result["max_position_embeddings"] == 262144
    assert result["changed"] is False


def test_metrics_render_enable_metrics_once_and_pass_the_servers_own_help(host, capsys):
    """metrics: true adds --enable-metrics (accepted by the installed server's --help, which the
    module checks) right after the server's own address; off by default; not a boolean is refused."""
    host()
    rc, result = run(capsys, metrics=True)
    assert rc == 0, result
    assert result["argv"].count("--enable-metrics") == 1
    assert result["argv"].index("--enable-metrics") == result["argv"].index("--tp-size") + 2
    rc, result = run(capsys)
    assert rc == 0 and "--enable-metrics" not in result["argv"]
    rc, result = run(capsys, metrics="maybe")
    assert rc == 1 and "metrics" in result["msg"] and "boolean" in result["msg"]


def test_all_problems_are_reported_together(host, capsys):
    host()
    rc, result = run(capsys, gpu_devices=[0, 1], tp_size=4, common={"context_length": 300000})
    assert rc == 1
    errors = result["errors"]
    assert "tp_size 4 does not match the 2 GPU(s) in gpu_devices [0, 1]" in errors
    assert "context_length 300000 exceeds the model's max_position_embeddings 262144" in errors
    assert any(e.startswith("GPU 1 is not usable: Unable to determine the device handle for GPU0000:21:00.0: GPU is lost.")
               for e in errors)
    assert result["msg"].startswith("variant shadow-balanced cannot run on this host: ")


def test_a_removed_flag_is_found_before_the_unit_changes(host, capsys):
    host(version="0.5.20")
    rc, result = run(capsys, name="nextn", common={"extra_args": ["--cuda-graph-max-bs", "16"]})
    assert rc == 1
    assert result["errors"] == ["flag --cuda-graph-max-bs is not accepted by the installed SGLang"]
    assert result["sglang_version"] == "0.5.20+simulator"


def test_without_the_help_check_the_flags_are_left_to_sglangs_own_argument_checks(host, capsys, monkeypatch):
    host(version="0.5.20")
    ran: list[list[str]] = []
    real_run = sglang_variant.AnsibleModule.run_command
    monkeypatch.setattr(sglang_variant.AnsibleModule, "run_command",
                        lambda module, args, **kw: ran.append(list(args)) or real_run(module, args, **kw))
    rc, result = run(capsys, name="nextn", common={"extra_args": ["--cuda-graph-max-bs", "16"]}, check_help=False)
    # nothing imports the server for --help; the command line is rendered as it is, for
    # sglang_server_args (the role runs it when it turns this check off) to argue with
    assert rc == 0, result
    assert not any("--help" in argv for argv in ran) and any("importlib.metadata" in " ".join(argv) for argv in ran)
    assert result["argv"][-2:] == ["--cuda-graph-max-bs", "16"]
    rc, result = run(capsys, name="nextn", common={"extra_args": ["--cuda-graph-max-bs", "16"]})
    assert rc == 1 and any("--help" in argv for argv in ran)


def test_ddtree_without_the_patched_build(host, capsys):
    host(ddtree=False)
    rc, result = run(capsys, name="shadow")
    assert rc == 1
    assert any("needs the patched DDTree build" in e for e in result["errors"])


def test_missing_model_and_draft(host, capsys, tmp_path):
    host()
    rc, result = run(capsys, model_path=str(tmp_path / "absent"), draft_model_path=str(tmp_path))
    assert rc == 1
    assert f"model_path {tmp_path / 'absent'} does not exist on the host" in result["errors"]
    assert any(e.startswith(f"draft_model_path {tmp_path} has no readable config.json") for e in result["errors"])


def test_unknown_variant(host, capsys):
    host()
    rc, result = run(capsys, name="turbo")
    assert rc == 1 and result["msg"].startswith("unknown variant 'turbo'; valid variants: nextn, shadow")


def test_sglang_not_installed(capsys, tmp_path):
    rc, result = run(capsys, python=str(tmp_path / "venv/bin/python"), check_gpus=False)
    assert rc == 1
    assert f"python {tmp_path / 'venv/bin/python'} does not exist: is SGLang installed (provision.yml)?" in result["errors"]


def test_memory_plan_refuses_what_cannot_fit(host, capsys):
    """ct129 (2 x 48 GB at tp 2, SGLang 0.5.11): shadow's speculative states
    overflow the static pool, shadow-small's draft overflows the rest; both are
    refused with the planner's reason before anything changes."""
    host()
    rc, result = run(capsys, name="shadow")
    assert rc == 1
    [refusal] = result["errors"]
    assert refusal.startswith("variant shadow does not fit in GPU memory (static pool, SGLang 0.5.11, tp_size 2")
    assert "Not enough memory. Please try to increase --mem-fraction-static" in refusal
    assert "-e memory_override=true" in refusal
    assert result["memory_plan"]["binding"] == "static_pool" and result["memory_plan"]["max_total_tokens"] == 0

    rc, result = run(capsys, name="small")
    assert rc == 1
    assert result["errors"][0].startswith("variant shadow-small does not fit in GPU memory (dynamic,")
    assert "draft weights 1.61" in result["errors"][0]
    # the planner's own interval, offered as the fix, does fit when applied
    low, high = result["memory_plan"]["mem_fraction_static_range"]
    rc, result = run(capsys, name="small", common={"mem_fraction_static": high})
    assert rc == 0 and result["memory_plan"]["fits"], result
    rc, result = run(capsys, name="small", common={"mem_fraction_static": round(high + 0.001, 3)})
    assert rc == 1
    assert low < high


def test_memory_override_lets_it_pass_with_a_warning(host, capsys):
    host()
    rc, result = run(capsys, name="small", memory_override=True)
    assert rc == 0
    assert result["memory_plan"]["fits"] is False
    assert result["memory_warnings"][0].startswith("variant shadow-small does not fit this host's GPU memory and runs "
                                                   "because memory_override is set")


def test_memory_plan_off_and_without_gpu_checks(host, capsys):
    host()
    rc, result = run(capsys, name="shadow", memory_plan=False)
    assert rc == 0 and result["memory_plan"] is None
    rc, result = run(capsys, name="shadow", check_gpus=False)
    assert rc == 0 and result["memory_plan"] is None
    assert result["memory_warnings"] == ["the memory plan is skipped: it needs the GPUs' memory, and check_gpus is false"]


@pytest.fixture
def model_in_tmp():
    """A copy of the lab's model directories under /tmp, as an operator might stage them."""
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        for name in ("Qwen3.6-27B", "Qwen3.6-27B-DFlash"):
            shutil.copytree(MODELS / name, os.path.join(top, name))
        yield top


def test_a_model_the_sandbox_hides_is_refused(host, capsys, model_in_tmp, monkeypatch):
    """PrivateTmp=yes: the service sees a /tmp of its own, so a model under the host's /tmp is not
    there for it (main passed this preflight and the server failed at start)."""
    monkeypatch.setattr(_model_config, "SANDBOX_HIDDEN", SANDBOX_HIDDEN)
    host()
    model, draft = os.path.join(model_in_tmp, "Qwen3.6-27B"), os.path.join(model_in_tmp, "Qwen3.6-27B-DFlash")
    rc, result = run(capsys, model_path=model, draft_model_path=draft)
    assert rc == 1
    assert any(e.startswith(f"model_path {model} is under /tmp, which the sandboxed service cannot see: PrivateTmp=yes")
               for e in result["errors"]), result["errors"]
    assert any(e.startswith(f"draft_model_path {draft} is under /tmp") for e in result["errors"])
    rc, result = run(capsys, model_path="/root/models/Qwen3.6-27B")
    assert rc == 1
    assert any(e.startswith("model_path /root/models/Qwen3.6-27B is under /root, which the sandboxed service cannot see: "
                            "ProtectHome=yes") for e in result["errors"]), result["errors"]


def test_read_write_paths_must_exist(host, capsys, tmp_path):
    """ReadWritePaths= on a missing path fails the unit at every start: refused before anything changes."""
    host()
    missing = str(tmp_path / "absent")
    rc, result = run(capsys, read_write_paths=[missing, "relative/dir", "/srv/../etc", str(tmp_path)])
    assert rc == 1
    assert [e for e in result["errors"] if e.startswith("sglang_service_read_write_paths")] == [
        f"sglang_service_read_write_paths: {missing} does not exist on the host, and a ReadWritePaths= path that does "
        "not exist fails the service at every start (226/NAMESPACE, systemd.exec(5)): create it first, or prefix it "
        "with '-' for systemd to skip it",
        "sglang_service_read_write_paths: 'relative/dir' is not an absolute path without '..' (systemd.exec(5), PATHS)",
        "sglang_service_read_write_paths: '/srv/../etc' is not an absolute path without '..' (systemd.exec(5), PATHS)",
    ]
    rc, result = run(capsys, read_write_paths=["-" + missing, str(tmp_path)])
    assert rc == 0, result


@pytest.fixture(name="systemd_run")
def fixture_systemd_run(tmp_path, monkeypatch):
    """A systemd-run on PATH that answers as systemd 252 did in the lab's privileged container:
    with the root mount shared the transient service reads its credential; with it private the
    service's $CREDENTIALS_DIRECTORY is empty and root-only. It records each command line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "systemd-run.log"
    script = bin_dir / "systemd-run"
    write_executable(script, f"""#!/bin/sh
printf '%s\\n' "$*" >> {log}
if [ "$(cat {tmp_path}/mount)" = shared ]; then printf delivered; exit 0; fi
echo "cat: /run/credentials/run-u7.service/inferops-credential-probe: Permission denied" >&2
exit 1
""")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def make(mount: str) -> Path:
        (tmp_path / "mount").write_text(mount)
        return log

    return make


def test_a_host_whose_systemd_loses_the_credentials_is_refused(host, capsys, systemd_run):
    """With an API key the unit hands SGLang its --config by LoadCredential=: a host where that
    arrives empty (a privileged container, root mount private) is refused before anything changes,
    and so is not probed at all without a key."""
    host()
    log = systemd_run("private")
    rc, result = run(capsys, credentials=True)
    assert rc == 1
    (problem,) = [e for e in result["errors"] if "credentials" in e]
    assert problem.startswith("systemd on this host does not hand a service its credentials: ")
    assert "Permission denied" in problem and "mount --make-rshared /" in problem
    assert "SetCredential=inferops-credential-probe:delivered" in log.read_text()
    systemd_run("shared")
    rc, result = run(capsys, credentials=True)
    assert rc == 0, result
    log.unlink()
    systemd_run("private")
    rc, result = run(capsys)
    assert rc == 0, result
    assert not log.exists()


def test_the_baseline_is_resolved_with_the_same_options_as_the_variant(host, capsys):
    """The rollback target of a host's first deploy is planned and checked with the operator's
    settings, not the defaults: with memory_override the baseline that does not fit passes with
    the same warning the variant would get, with memory_assumptions its plan is the variant's own
    plan under them, and its problems are returned without failing the variant."""
    host()
    assumptions = {"context_mib": 4096}
    rc, result = run(capsys, name="balanced", baseline="small", memory_override=True, memory_assumptions=assumptions)
    assert rc == 0, result
    baseline = result["baseline"]
    assert baseline["variant"] == "shadow-small" and baseline["errors"] == []
    assert baseline["memory_plan"]["fits"] is False
    assert baseline["memory_warnings"][0].startswith("variant shadow-small does not fit this host's GPU memory")
    # the same plan as resolving the baseline itself with those options, and every key the role
    # renders a unit from (the templates take the variant or the baseline alike)
    rc, alone = run(capsys, name="small", memory_override=True, memory_assumptions=assumptions)
    assert rc == 0 and baseline["memory_plan"] == alone["memory_plan"] and baseline["argv"] == alone["argv"]
    # the role's templates, and current.json, which the switch writes from the variant or the baseline
    rendered = {key for path in (REPO / "roles/sglang_service").rglob("*") if path.suffix in (".yml", ".j2")
                for key in re.findall(r"\b_sglang_service_render\.(\w+)", path.read_text())} | set(_switch.CURRENT_KEYS)
    assert {"variant", "params", "argv", "exec_args", "sglang_version"} <= rendered
    for key in rendered | {"max_position_embeddings", "memory_plan"}:
        assert baseline[key] == alone[key], key
    assert baseline["memory_plan"] != run(capsys, name="small", memory_override=True)[1]["memory_plan"]
    # without the override the baseline's refusal is returned; the variant still passes
    rc, result = run(capsys, name="balanced", baseline="small")
    assert rc == 0, result
    assert result["baseline"]["errors"][0].startswith("variant shadow-small does not fit in GPU memory")
    # an unknown baseline is a problem of the baseline, not a crash
    rc, result = run(capsys, name="balanced", baseline="turbo")
    assert rc == 0 and "unknown variant 'turbo'" in result["baseline"]["errors"][0]
    assert run(capsys, name="balanced")[1]["baseline"] is None


URLS = [("127.0.0.1", "http://127.0.0.1:30001"), ("0.0.0.0", "http://127.0.0.1:30001"), ("::", "http://[::1]:30001"),
        ("::1", "http://[::1]:30001"), ("fd00::5", "http://[fd00::5]:30001")]


@pytest.mark.parametrize("start, port, privileged", [("1024", 30000, False), ("1024", 443, True), ("40000", 30000, True),
                                                     (None, 1023, True), (None, 1024, False)])
def test_a_port_below_the_hosts_unprivileged_range_is_privileged(host, capsys, monkeypatch, tmp_path, start, port, privileged):
    """The sysctl the kernel checks a bind against (1024 where it cannot be read): the role's unit
    gives the server CAP_NET_BIND_SERVICE for such a port, which no other local user can take."""
    sysctl = tmp_path / "ip_unprivileged_port_start"
    if start is not None:
        sysctl.write_text(start + "\n")
    monkeypatch.setattr(sglang_variant._preflight, "UNPRIVILEGED_PORT_START", str(sysctl))
    host()
    rc, result = run(capsys, port=port, baseline="nextn")
    assert rc == 0, result
    assert result["privileged_port"] is privileged and result["baseline"]["privileged_port"] is privileged


@pytest.mark.parametrize("bind_host, url", URLS)
def test_the_service_url_brackets_ipv6(host, capsys, bind_host, url):
    host()
    rc, result = run(capsys, bind_host=bind_host, port=30001)
    assert rc == 0, result
    assert result["url"] == url
