"""sglang_preflight: the role's four checks in one call, in order, on a stand-in for ct129
(the simulator's installed package, the lab's model directories, the fake nvidia-smi reading
ct129's hardware file: GPU 1 lost). Each step gives what the module that makes that check on
its own gives (sglang_inputs, sglang_host_manifest state=read, sglang_variant,
sglang_model_stage state=verified), and the first refusal ends the call before the next step
looks at the host."""

from __future__ import annotations

import json
import re
import shutil
import sys

import pytest
import yaml
from sim_helpers import MODELS, REPO, run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _model_config
from ansible_collections.inferops.sglang.plugins.module_utils import _model_stage as ms
from ansible_collections.inferops.sglang.plugins.module_utils import _preflight
from ansible_collections.inferops.sglang.plugins.modules import sglang_host_manifest
from ansible_collections.inferops.sglang.plugins.modules import sglang_preflight
from ansible_collections.inferops.sglang.plugins.modules import sglang_variant

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
TABLE = dict(variants=DEFAULTS["sglang_service_variants"], aliases=DEFAULTS["sglang_service_variant_aliases"])


@pytest.fixture(autouse=True)
def checkout_visible(monkeypatch):
    """The lab's model directories are this checkout's, which may lie where the unit's sandbox
    hides (a CI clone under /tmp or /root): that one directory counts as visible here."""
    visible = {hidden: why for hidden, why in _model_config.SANDBOX_HIDDEN.items()
               if not str(MODELS).startswith(hidden + "/")}
    monkeypatch.setattr(_model_config, "SANDBOX_HIDDEN", visible)


@pytest.fixture
def ct129(sim_install, hardware, monkeypatch, fake_nvidia_smi, tmp_path):
    """The stand-in host, and every command the module runs on it (AnsibleModule.run_command)."""
    monkeypatch.setenv("PYTHONPATH", str(sim_install("0.5.11", True)))
    for key, value in hardware("ct129").items():
        if key.startswith("SGLANG_SIM"):
            monkeypatch.setenv(key, value)
    fake_nvidia_smi()
    ran: list[list[str]] = []
    real = sglang_preflight.AnsibleModule.run_command

    def spy(self, args, *a, **kw):
        ran.append([str(x) for x in args] if isinstance(args, list) else [str(args)])
        return real(self, args, *a, **kw)

    monkeypatch.setattr(sglang_preflight.AnsibleModule, "run_command", spy)
    return dict(ran=ran, manifest=str(tmp_path / "host.json"), proc=str(tmp_path / "no-driver"))


def args(ct129: dict, **overrides) -> dict:
    out = dict(name="balanced", baseline="nextn", **TABLE, service_name="sglang-qwen.service", user="sglang",
               group="sglang", state_dir="/var/lib/inferops-sglang", python=sys.executable,
               model_path=str(MODELS / "Qwen3.6-27B"), draft_model_path=str(MODELS / "Qwen3.6-27B-DFlash"),
               served_model_name="Qwen3.6-27B", tp_size="2", gpu_devices="0,2", manifest_path=ct129["manifest"],
               manifest_required=False, driver_proc_dir=ct129["proc"], ddtree_manifest=ct129["manifest"] + ".none",
               settings={"sglang_service_gate_interval": "2"})
    out.update(overrides)
    return out


def run(capsys, **kw) -> tuple[int, dict]:
    return run_module(sglang_preflight.main, capsys, kw, check_mode=True)[:2]


def test_each_step_gives_what_its_own_module_gives(ct129, capsys):
    """One call: the manifest read's settings (a -e string of GPUs validated into a list), the variant
    and the baseline checked with those settings, the model and the draft the variant runs verified."""
    given = args(ct129)
    rc, result = run(capsys, **given)
    assert rc == 0, result
    assert result["changed"] is False
    assert result["settings"]["gpu_devices"] == [0, 2] and result["settings"]["tp_size"] == 2
    assert result["sources"]["gpu_devices"] == "override"
    variant = result["variant"]
    assert variant["variant"] == "shadow-balanced" and variant["baseline"]["variant"] == "nextn"
    assert variant["baseline"]["errors"] == [] and variant["url"] == "http://127.0.0.1:30000"
    # the variant runs a draft model: both directories were verified
    assert [m["path"] for m in result["models"]] == [given["model_path"], given["draft_model_path"]]
    assert all("passes the quick check" in m["msg"] for m in result["models"])

    # the same checks, module by module, as the role made them before (the variant with the read's settings)
    rc, alone, _out = run_module(sglang_host_manifest.main, capsys, dict(
        state="read", path=given["manifest_path"], required=False, tp_size="2", gpu_devices="0,2", python=sys.executable,
        driver_proc_dir=ct129["proc"], ddtree_manifest=given["ddtree_manifest"], name="balanced", **TABLE),
        check_mode=True)
    assert rc == 0, alone
    assert (result["settings"], result["sources"], result["exists"]) == (alone["settings"], alone["sources"], alone["exists"])
    rc, alone, _out = run_module(sglang_variant.main, capsys, dict(
        name="balanced", baseline="nextn", **TABLE, python=sys.executable, model_path=given["model_path"],
        draft_model_path=given["draft_model_path"], served_model_name="Qwen3.6-27B", tp_size=2, gpu_devices=[0, 2]),
        check_mode=True)
    assert rc == 0, alone
    assert variant == {k: v for k, v in alone.items() if k not in ("changed", "invocation")}


@pytest.mark.parametrize("bind_host, api_key, warned", [
    ("0.0.0.0", None, True), ("::", "", True), ("10.0.0.7", None, True), ("gpu-host.internal", None, True),
    ("0.0.0.0", "k3y-for-the-test", False), ("127.0.0.1", None, False), ("127.0.0.2", None, False),
    ("::1", None, False), ("[::1]", None, False), ("localhost", None, False),
])
def test_a_server_beyond_loopback_without_a_key_is_warned_about(bind_host, api_key, warned):
    said = _preflight.exposure_warning(bind_host, api_key)
    assert (said is not None) is warned
    assert said is None or said.startswith(f"the server listens on {bind_host} without an API key")


def test_the_module_warns_of_an_exposed_server_and_still_passes(ct129, capsys):
    for bind_host, warned in (("0.0.0.0", True), ("127.0.0.1", False)):
        rc, result = run(capsys, **args(ct129, name="nextn", bind_host=bind_host))
        assert rc == 0, result
        assert ("listens on 0.0.0.0 without an API key" in json.dumps(result.get("warnings", []))) is warned


def test_bad_input_is_refused_before_the_host_is_looked_at(ct129, capsys):
    rc, result = run(capsys, **args(ct129, api_key="hostile-secret\nLD_PRELOAD=/tmp/x.so", gpu_devices="0,1",
                                    service_name="../../tmp/x.service"))
    assert rc == 1 and result["step"] == "inputs"
    assert result["msg"].startswith("bad input, nothing was changed: ")
    assert "sglang_service_api_key must be printable ASCII" in result["msg"]
    assert "sglang_service_name must be" in result["msg"]
    assert "hostile-secret" not in json.dumps(result)
    assert ct129["ran"] == []  # not even nvidia-smi (GPU 1 is lost: the variant's step would say so)


@pytest.mark.parametrize("user, group, refused", [
    ("root", "sglang", "sglang_service_user root is root (UID 0)"),
    ("nobody", "sglang", "sglang_service_user nobody is a login account here (UID 65534)"),
    ("sglang-preflight-test", "root", "sglang_service_group root is root's group (GID 0)"),
    ("daemon", "daemon", None),  # a system account: the role may take it over
    ("sglang-preflight-test", "sglang-preflight-test", None),  # made a system account by the role
])
def test_the_services_account_is_not_roots_nor_a_persons(ct129, capsys, user, group, refused):
    rc, result = run(capsys, **args(ct129, name="nextn", user=user, group=group))
    if refused is None:
        assert rc == 0, result
        return
    assert rc == 1 and result["step"] == "account"
    assert result["msg"].startswith(f"the service's account cannot be used, nothing was changed: {refused}"), result["msg"]
    assert ct129["ran"] == []


def test_uid_min_is_login_defs_own_or_1000(tmp_path):
    defs = tmp_path / "login.defs"
    defs.write_text("# UID_MIN 7\nUID_MIN\t\t 2000\nUID_MAX 60000\n")
    assert _preflight.uid_min(str(defs)) == 2000
    defs.write_text("UID_MAX 60000\n")
    assert _preflight.uid_min(str(defs)) == 1000
    assert _preflight.uid_min(str(tmp_path / "absent")) == 1000


def test_a_host_without_its_manifest_is_refused_before_the_variant_is_checked(ct129, capsys):
    rc, result = run(capsys, **args(ct129, manifest_required=True))
    assert rc == 1 and result["step"] == "manifest"
    assert result["msg"].startswith("no host manifest: ") and result["exists"] is False
    assert ct129["ran"] == []


def test_a_lost_gpu_is_the_variants_refusal_with_every_problem(ct129, capsys):
    rc, result = run(capsys, **args(ct129, gpu_devices=[0, 1], tp_size=None, common={"context_length": 300000}))
    assert rc == 1 and result["step"] == "variant"
    assert result["msg"].startswith("variant shadow-balanced cannot run on this host: ")
    assert "context_length 300000 exceeds the model's max_position_embeddings 262144" in result["errors"]
    assert any(e.startswith("GPU 1 is not usable: ") for e in result["errors"])
    assert any(cmd[0].endswith("nvidia-smi") for cmd in ct129["ran"])


def test_a_damaged_model_is_refused_last_and_a_variant_without_a_draft_checks_only_the_model(
        ct129, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(_model_config, "SANDBOX_HIDDEN", {})  # the copy is under the test's /tmp
    model = tmp_path / "srv" / "Qwen3.6-27B"
    shutil.copytree(MODELS / "Qwen3.6-27B", model)
    rc, result = run(capsys, **args(ct129, name="nextn", model_path=str(model)))
    assert rc == 0, result
    assert [m["path"] for m in result["models"]] == [str(model)]  # nextn runs no draft model
    # the safetensors index changed since the model was staged (its manifest's size)
    index = json.loads((model / ms.INDEX).read_text())
    (model / ms.INDEX).write_text(json.dumps(dict(index, weight_map={"a": "model-00001-of-00001.safetensors"})))
    rc, result = run(capsys, **args(ct129, name="nextn", model_path=str(model)))
    assert rc == 1 and result["step"] == "model", result["msg"]
    assert result["msg"].startswith(f"model {model} fails the quick check: ") and f"{ms.INDEX} has " in result["msg"]
    rc, result = run(capsys, **args(ct129, name="nextn", model_path=str(model), model_check="off"))
    assert rc == 0 and result["models"] == []


def test_behind_the_gateway_the_server_moves_to_loopback_and_the_gateway_takes_the_service_address(ct129, capsys, monkeypatch):
    probes = []
    monkeypatch.setattr(_preflight._credentials, "problem", lambda run_command: probes.append(1))
    rc, result = run(capsys, **args(ct129, bind_host="0.0.0.0", port=30000, api_key="k3y-for-the-test",
                                    gateway={"server_port": 30010, "metrics_port": 29000}))
    assert rc == 0, result
    variant = result["variant"]
    assert variant["url"] == "http://127.0.0.1:30010" and probes == [1]  # the gateway's keys are credentials
    argv = variant["argv"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "30010"
    assert variant["gateway"] == {"url": "http://127.0.0.1:30000", "bind_host": "0.0.0.0", "port": 30000,
                                  "metrics_port": 29000, "metrics_url": "http://127.0.0.1:29000/metrics",
                                  "server_port": 30010, "privileged_port": False}
    rc, result = run(capsys, **args(ct129))
    assert result["variant"]["gateway"] is None and result["variant"]["url"] == "http://127.0.0.1:30000"


@pytest.mark.parametrize("gateway, error", [
    ({"server_port": 30000, "metrics_port": 29000}, "must differ"),
    ({"server_port": 30010, "metrics_port": 30010}, "must differ"),
    ({"server_port": 70000, "metrics_port": 29000}, r"gateway.server_port must be in \[1, 65535\]"),
])
def test_gateway_ports_that_clash_are_refused_before_anything_changes(ct129, capsys, monkeypatch, gateway, error):
    monkeypatch.setattr(_preflight._credentials, "problem", lambda run_command: None)
    rc, result = run(capsys, **args(ct129, port=30000, gateway=gateway))
    assert rc == 1 and result["step"] == "variant" and re.search(error, result["msg"]), result["msg"]


@pytest.mark.parametrize("server_port, api_key, warned", [(30010, "k3y", True), (30010, None, False), (900, "k3y", False)])
def test_a_keyed_server_behind_the_gateway_on_a_port_anyone_may_bind_is_warned_about(server_port, api_key, warned):
    said = _preflight.gateway_key_warning({"gateway": {"server_port": server_port, "metrics_port": 29000},
                                           "api_key": api_key})
    assert (said is not None) is warned
    if warned:
        assert "127.0.0.1:30010" in said and "send it the API key" in said and "k3y" not in said


@pytest.mark.parametrize("extra, error", [
    ({"gateway_url": "http://10.0.0.1:31000", "gateway_control_key": "fleet-key-hostile-secret"},
     "cannot reach a server that listens on 127.0.0.1"),
    ({"gateway_url": "http://10.0.0.1:31000", "bind_host": "0.0.0.0"}, "needs its control key"),
    ({"gateway_url": "10.0.0.1:31000", "bind_host": "0.0.0.0", "gateway_control_key": "fleet-key-hostile-secret"},
     "gateway_url must be an http"),
    ({"gateway_url": "http://10.0.0.1:31000", "bind_host": "0.0.0.0", "gateway_control_key": "fleet-key-hostile-secret",
      "gateway": {"server_port": 30010, "metrics_port": 29000}}, "exclude each other"),
])
def test_a_fleet_gateway_that_cannot_work_is_refused_before_anything_changes(ct129, capsys, monkeypatch, extra, error):
    monkeypatch.setattr(_preflight._credentials, "problem", lambda run_command: None)
    rc, result = run(capsys, **args(ct129, **extra))
    assert rc == 1 and error in result["msg"], result["msg"]
    assert "fleet-key-hostile-secret" not in json.dumps(result)


def test_a_fleet_gateway_that_can_work_passes(ct129, capsys):
    rc, result = run(capsys, **args(ct129, bind_host="0.0.0.0", gateway_url="http://10.0.0.1:31000",
                                    gateway_control_key="fleet-key-hostile-secret"))
    assert rc == 0, result
    assert result["variant"]["url"] == "http://127.0.0.1:30000" and result["variant"]["gateway"] is None


def live_slot(tmp_path, monkeypatch, active: bool, **current) -> str:
    """A service directory whose current.json names the live slot, and a systemctl that says whether its unit runs."""
    state = tmp_path / "state"
    (state / "sglang-qwen").mkdir(parents=True)
    doc = {"variant": "nextn", "params": {"x": 1}, "argv": ["--host", "127.0.0.1", "--port", "30010"],
           "gpu_devices": [0, 2], **current}
    (state / "sglang-qwen" / "current.json").write_text(json.dumps(doc))
    bin_dir = tmp_path / "systemctl-bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho ActiveState={'active' if active else 'inactive'}\n")
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return str(state)


def test_two_slots_put_a_candidate_beside_the_live_one_on_free_gpus_and_its_own_port(ct129, capsys, monkeypatch,
                                                                                     tmp_path):
    monkeypatch.setattr(_preflight._credentials, "problem", lambda run_command: None)
    state = live_slot(tmp_path, monkeypatch, True)
    gateway = {"server_port": 30010, "metrics_port": 29000}
    rc, result = run(capsys, **args(ct129, name="nextn", state_dir=state, gpu_devices="3,4", gateway=gateway,
                                    slots={"green_port": 30011}))
    assert rc == 0, result
    slot = result["variant"]["slot"]
    assert (slot["mode"], slot["slot"], slot["unit"], slot["port"], slot["gpus"]) == (
        "blue_green", "green", "sglang-qwen-green.service", 30011, [3, 4])
    assert slot["live"]["unit"] == "sglang-qwen.service" and slot["live"]["url"] == "http://127.0.0.1:30010"
    assert result["variant"]["url"] == "http://127.0.0.1:30011" and "30011" in result["variant"]["argv"]
    assert result["settings"]["gpu_devices"] == [3, 4]
    # the live slot's GPUs asked for: in place, in the live slot, on its port
    rc, result = run(capsys, **args(ct129, name="nextn", state_dir=state, gpu_devices="0,2", gateway=gateway,
                                    slots={"green_port": 30011}))
    assert rc == 0 and result["variant"]["slot"]["mode"] == "in_place", result
    assert result["variant"]["url"] == "http://127.0.0.1:30010" and "which the live slot blue uses" in \
        result["variant"]["slot"]["why"]


def test_two_slots_need_the_gateway_and_a_port_of_their_own_and_a_green_live_slot_needs_slots(ct129, capsys,
                                                                                              monkeypatch, tmp_path):
    rc, result = run(capsys, **args(ct129, name="nextn", slots={"green_port": 30011}))
    assert rc == 1 and "need the host's own gateway" in result["msg"]
    rc, result = run(capsys, **args(ct129, name="nextn", gateway={"server_port": 30010, "metrics_port": 29000},
                                    slots={"green_port": 29000}))
    assert rc == 1 and "the green slot's port 29000 is also gateway.metrics_port" in result["msg"]
    state = live_slot(tmp_path, monkeypatch, True, slot="green", unit="sglang-qwen-green.service")
    rc, result = run(capsys, **args(ct129, name="nextn", state_dir=state))
    assert rc == 1 and "keep sglang_service_slots: true" in result["msg"]


# -- a tune's trial servers ---------------------------------------------------------------------------------------

def test_a_tune_puts_the_reference_and_the_candidate_beside_the_live_slot_on_free_gpus(ct129, capsys, monkeypatch,
                                                                                       tmp_path):
    """ct129's stand-in: GPU 1 lost, the live slot on 0 and 2: the reference on 3 and 4, the candidates on 5 and 6,
    each rendered on its own port."""
    monkeypatch.setattr(_preflight._credentials, "problem", lambda run_command: None)
    state = live_slot(tmp_path, monkeypatch, True)
    rc, result = run(capsys, **args(ct129, name="nextn", baseline=None, state_dir=state, trials={"ports": [30020, 30021]}))
    assert rc == 0, result
    reference, candidate = result["trials"]
    assert (reference["role"], reference["unit"], reference["port"], reference["gpus"]) == (
        "reference", "sglang-qwen-tune-reference.service", 30020, [3, 4])
    assert (candidate["role"], candidate["unit"], candidate["port"], candidate["gpus"]) == (
        "candidate", "sglang-qwen-tune-candidate.service", 30021, [5, 6])
    assert reference["render"]["url"] == "http://127.0.0.1:30020" and "30020" in reference["render"]["exec_args"]
    assert candidate["render"]["url"] == "http://127.0.0.1:30021" and "--port 30021" in candidate["render"]["exec_args"]
    assert result["variant"] == reference["render"]
    # the memory plan is each trial's own, on its GPUs
    assert reference["render"]["memory_plan"]["fits"] and candidate["render"]["memory_plan"]["fits"]


def test_a_tune_is_refused_without_a_deployed_service_or_room_or_ports_of_its_own(ct129, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(_preflight._credentials, "problem", lambda run_command: None)
    rc, result = run(capsys, **args(ct129, name="nextn", baseline=None, state_dir=str(tmp_path / "none"),
                                    trials={"ports": [30020, 30021]}))
    assert rc == 1 and "was never deployed on this host" in result["msg"]
    state = live_slot(tmp_path, monkeypatch, True)
    rc, result = run(capsys, **args(ct129, name="nextn", baseline=None, state_dir=state, trials={"ports": [30020, 30000]}))
    assert rc == 1 and "the trial port 30000 is also port" in result["msg"]
    rc, result = run(capsys, **args(ct129, name="nextn", baseline=None, state_dir=state, trials={"ports": [30020]}))
    assert rc == 1 and "trials.ports must be two ports" in result["msg"]
    # TP 4 on ct129 with the live slot on 0, 2, 3, 4: three usable GPUs left, no group of four
    state = live_slot(tmp_path / "tp4", monkeypatch, True, gpu_devices=[0, 2, 3, 4])
    rc, result = run(capsys, **args(ct129, name="nextn", baseline=None, state_dir=state, tp_size="4",
                                    gpu_devices="0,2,3,4", trials={"ports": [30020, 30021]}))
    assert rc == 1 and "no room for a tune beside nextn" in result["msg"] and "TP 4 needs 4 free GPUs" in result["msg"]
    assert "free: [5, 6, 7]" in result["msg"] and "a tune in place (tune_in_place)" in result["msg"], result["msg"]


def test_one_free_group_makes_the_trials_take_turns_and_none_tunes_in_place_only_where_allowed(
        ct129, capsys, monkeypatch, tmp_path):
    """TP 4, the live slot on 0 and 2: GPUs 3-6 are one free group, where the reference and each candidate take
    turns. The live slot on 0, 2, 3, 4: no group is free; in place (allowed) both take the live slot's GPUs, and
    the downtime is stated before anything stops."""
    monkeypatch.setattr(_preflight._credentials, "problem", lambda run_command: None)
    state = live_slot(tmp_path, monkeypatch, True)
    rc, result = run(capsys, **args(ct129, name="nextn", baseline=None, state_dir=state, tp_size="4",
                                    gpu_devices="0,2,3,4", trials={"ports": [30020, 30021]}))
    assert rc == 0, result
    reference, candidate = result["trials"]
    assert reference["mode"] == candidate["mode"] == "one" and reference["gpus"] == candidate["gpus"] == [3, 4, 5, 6]
    assert "take turns on GPUs [3, 4, 5, 6]" in reference["why"] and reference["port"] != candidate["port"]
    busy = live_slot(tmp_path / "busy", monkeypatch, True, gpu_devices=[0, 2, 3, 4])
    rc, result = run(capsys, **args(ct129, name="nextn", baseline=None, state_dir=busy, tp_size="4", gpu_devices="0,2,3,4",
                                    trials={"ports": [30020, 30021], "in_place": True, "minutes": 30}))
    assert rc == 0, result
    reference, candidate = result["trials"]
    assert reference["mode"] == candidate["mode"] == "in_place" and reference["gpus"] == candidate["gpus"] == [0, 2, 3, 4]
    assert reference["live"]["unit"] == "sglang-qwen.service" and reference["live"]["url"] == "http://127.0.0.1:30010"
    # the downtime, stated first: the budget, three starts within the gate's timeout, the timer's deadline
    limit = (60 * 30 + 3 * 900 + 600 + 60) / 60
    assert ("sglang-qwen.service is stopped for the whole tune: about the budget's 30 min" in reference["why"]
            and f"at most {limit:.0f} min: a systemd timer starts sglang-qwen.service again" in reference["why"]), reference["why"]


def test_a_gpu_that_logged_a_fatal_xid_refuses_the_variant_before_anything_changes(ct129, capsys, tmp_path):
    """An Xid 48 (double-bit ECC error, NVIDIA's Xid 48 workflow: reset) on GPU 2 since boot, no manifest
    to start from: a variant on GPUs 0,2 is refused naming the GPU and the event; on GPUs 0,3 it passes;
    an application-class Xid 13 on GPU 3 refuses nothing."""
    state = tmp_path / "gpu"
    state.mkdir(exist_ok=True)
    (state / "kernel-test.log").write_text(
        "[  512.000000] NVRM: Xid (PCI:0000:41:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit "
        "error (DBE) has been detected on GPU in the framebuffer at physAddr 0x12bac1c3e0 partition 2, subpartition 1.\n"
        "[  513.000000] NVRM: Xid (PCI:0000:61:00): 13, pid=4242, name=python3, Graphics SM Warp Exception\n")
    rc, result = run(capsys, **args(ct129))
    assert rc == 1 and result["step"] == "variant"
    assert ("GPU 2 (00000000:41:00.0) is not healthy since boot: Xid 48 (Double Bit ECC Error) at 512.0 s since boot: "
            "reset the GPU (nvidia-smi -r -i N, with no process on it) or reboot the host") in result["errors"]
    rc, result = run(capsys, **args(ct129, gpu_devices="0,3"))
    assert rc == 0, result["msg"] if rc else ""
    rc, result = run(capsys, **args(ct129, check_health=False))   # the operator's choice: not judged
    assert rc == 0, result["msg"] if rc else ""
