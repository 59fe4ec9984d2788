"""_host_manifest: what provisioning proved, written once and read by the deploy.

The GPU facts are gpu_facts' own, run against the lab's fake nvidia-smi (a
test double) on ct129's hardware file (GPU 1 lost, TP 2 on GPUs 0 and 2
requested as the inventory does), so the manifest is built from the real
module output, not from a hand-written dict."""

from __future__ import annotations

import json
import os
import stat

import pytest
from sim_helpers import LAB, MODELS, run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _host_manifest as hm
from ansible_collections.inferops.sglang.plugins.modules import gpu_facts

NOW = "2026-12-01T21:00:00Z"
LATER = "2026-12-02T08:00:00Z"
RUNTIME = {"python": "/opt/sglang/venv/bin/python", "venv": "/opt/sglang/venv",
           "installed": {"torch": "2.11.0+cu130", "sglang": "0.5.11", "sgl-kernel": "0.4.2"}}
ENV = {"PATH": "/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "LANG": "C.UTF-8",
       "PYTHONDONTWRITEBYTECODE": "1", "LD_LIBRARY_PATH": "/usr/local/cuda-13.0/lib64", "CUDA_VISIBLE_DEVICES": "0"}
SITE = "/opt/sglang/venv/lib/python3.11/site-packages"
DDTREE = {"format": 1, "state": "applied", "build_id": "ab" * 32, "source": "overlay", "sglang_version": "0.5.11",
          "site_packages": SITE, "applied_at": "2026-12-01T20:00:00Z",
          "files": [{"path": "sglang/srt/speculative/ddtree_utils.py"}, {"path": "sglang/srt/speculative/ddtree_kernels.so"}]}
PROVENANCE = {"run": "20261201T210000-ct129-1234", "playbook": "provision.yml", "user": "ops"}


@pytest.fixture
def ct129_facts(tmp_path, monkeypatch, fake_nvidia_smi, capsys):
    """gpu_facts on ct129 with TP 2 on GPUs 0 and 2 requested (the inventory's request)."""
    hardware = tmp_path / "hardware.json"
    hardware.write_text((LAB / "hosts" / "ct129" / "hardware.json").read_text())
    monkeypatch.setenv("SGLANG_SIM_HARDWARE", str(hardware))
    monkeypatch.setenv("SGLANG_SIM_STATE", str(tmp_path / "gpu"))
    fake_nvidia_smi()
    args = {"model_path": str(MODELS / "Qwen3.6-27B"), "tp_size": 2, "gpus": [0, 2], "container_checks": "never"}
    rc, result, _skip = run_module(gpu_facts.main, capsys, args)
    assert rc == 0, result
    return result["ansible_facts"]["inferops_gpus"]


def probe(ok=True, errors=None, environment="proved", **more):
    """A probe result; environment "proved" is ENV, None leaves the key out (an older probe)."""
    result = {"changed": False, "ok": ok, "errors": list(errors or []), "installed": RUNTIME["installed"],
              "ld_library_path": "/usr/local/cuda-13.0/lib64", "checks": ["versions", "torch", "libraries", "dependencies"]}
    if environment is not None:
        result["environment"] = dict(ENV if environment == "proved" else environment)
    result.update(more)
    return result


def manifest(facts, probe_result=None, ddtree=None, now=NOW, **kw):
    return hm.build(facts, {"version": "13.0", "home": "/usr/local/cuda-13.0"}, RUNTIME,
                    probe_result if probe_result is not None else probe(), ddtree, PROVENANCE, now, **kw)


def test_contents_from_gpu_facts(ct129_facts):
    m = manifest(ct129_facts)
    assert m["schema"] == hm.SCHEMA and hm.validate(m) == []
    gpus = m["gpus"]
    assert [g["index"] for g in gpus["usable"]] == [0, 2, 3, 4, 5, 6, 7]
    first = gpus["usable"][0]
    assert first["name"] == "NVIDIA RTX A6000" and first["memory_mib"] == 49140 and first["uuid"]
    assert "device_minor" in first  # null here: the test host has no /proc/driver/nvidia/gpus
    assert gpus["unusable"] == [{"index": 1, "uuid": None, "name": None, "memory_mib": None, "pci_bus_id": "00000000:21:00.0",
                                 "compute_capability": None, "device_minor": None, "state": "lost",
                                 "reason": "GPU is lost. Reboot the system to recover this GPU"}]
    assert gpus["tp"] == {"valid": [1, 2], "chosen": 2, "devices": [0, 2], "cuda_visible_devices": "0,2"}
    assert gpus["cuda_visible_devices"] == "0,2"
    assert m["cuda"] == {"version": "13.0", "home": "/usr/local/cuda-13.0"}
    assert m["venv"] == {"path": "/opt/sglang/venv", "python": "/opt/sglang/venv/bin/python"}
    assert m["installed"]["sglang"] == "0.5.11"
    assert m["environment"] == ENV and m["environment_source"] == "probe"
    assert m["written"] == {"at": NOW, **PROVENANCE}
    assert m["builds"] == {"sglang": {"name": "sglang 0.5.11", "ok": True, "errors": [], "proved_at": NOW,
                                      "checks": ["versions", "torch", "libraries", "dependencies"]}}
    assert m["ddtree"] is None


def test_environment_reconstructed_without_the_probe_key(ct129_facts):
    m = manifest(ct129_facts, probe(environment=None), extra_environment={"SGLANG_X": "1"})
    assert m["environment"] == {"SGLANG_X": "1", "LD_LIBRARY_PATH": "/usr/local/cuda-13.0/lib64"}
    assert m["environment_source"] == "reconstructed"


def test_ddtree_failure_is_the_builds_alone(ct129_facts):
    err = (f"libcudart.so.12 needed by {SITE}/sglang/srt/speculative/ddtree_kernels.so is not found "
           "(LD_LIBRARY_PATH=/usr/local/cuda-13.0/lib64)")
    m = manifest(ct129_facts, probe(ok=False, errors=[err]), DDTREE)
    assert m["ddtree"]["build_id"] == "ab" * 32
    assert m["builds"]["sglang"]["ok"] is True and m["builds"]["sglang"]["errors"] == []
    assert m["builds"]["ddtree"] == {"name": "ddtree abababababab", "build_id": "ab" * 32, "ok": False, "errors": [err],
                                     "checks": ["versions", "torch", "libraries", "dependencies"], "proved_at": NOW}


def test_an_sglang_failure_fails_both_builds(ct129_facts):
    err = "torch 2.11.0+cu128 is built for CUDA 12.8 (torch.version.cuda) but the toolkit is CUDA 13.0"
    m = manifest(ct129_facts, probe(ok=False, errors=[err]), DDTREE)
    assert m["builds"]["sglang"] == dict(m["builds"]["sglang"], ok=False, errors=[err])
    assert m["builds"]["ddtree"]["ok"] is False and m["builds"]["ddtree"]["errors"] == [err]


def test_an_unresolved_library_both_need_fails_both(ct129_facts):
    """The probe's dependency scan names one error per library, with every file that needs it
    (plugins/module_utils/_runtime_probe.py dependency_errors); its unresolved entries say which
    are the build's."""
    kernel = f"{SITE}/sgl_kernel/common_ops.so"
    build = f"{SITE}/sglang/srt/speculative/ddtree_kernels.so"
    both = f"libcuda.so.1 needed by {kernel}, {build} (the DDTree build) does not resolve (LD_LIBRARY_PATH=none)"
    alone = f"libcudart.so.12 needed by {build} (the DDTree build) does not resolve (LD_LIBRARY_PATH=none)"
    deps = {"build_files": [build], "unresolved": [
        {"name": "libcuda.so.1", "needed_by": kernel, "build": None},
        {"name": "libcuda.so.1", "needed_by": build, "build": "ddtree"},
        {"name": "libcudart.so.12", "needed_by": build, "build": "ddtree"}]}
    m = manifest(ct129_facts, probe(ok=False, errors=[both, alone], dependencies=deps), DDTREE)
    assert m["builds"]["sglang"]["ok"] is False and m["builds"]["sglang"]["errors"] == [both]
    assert m["builds"]["ddtree"]["errors"] == [both, alone]
    m = manifest(ct129_facts, probe(ok=False, errors=[alone], dependencies=deps), DDTREE)
    assert m["builds"]["sglang"]["ok"] is True and m["builds"]["ddtree"]["ok"] is False


def test_a_probe_of_another_build_proves_nothing_about_this_one(ct129_facts):
    m = manifest(ct129_facts, probe(ddtree_build={"build_id": "ef" * 32, "state": "applied"}), DDTREE)
    assert m["builds"]["ddtree"]["ok"] is None and "efefefefefef" in m["builds"]["ddtree"]["errors"][0]
    assert m["builds"]["sglang"]["ok"] is True


def test_no_probe_means_no_verdict(ct129_facts):
    m = hm.build(ct129_facts, {}, RUNTIME, {"skipped": True}, DDTREE, {}, NOW)
    assert m["builds"]["sglang"]["ok"] is None and m["builds"]["ddtree"]["ok"] is None
    assert "did not run" in m["builds"]["sglang"]["errors"][0]


def test_a_reverted_build_is_no_build(ct129_facts):
    m = manifest(ct129_facts, ddtree=dict(DDTREE, state="reverted"))
    assert m["ddtree"] is None and "ddtree" not in m["builds"]


def test_write_read_and_idempotence(ct129_facts, tmp_path):
    path = str(tmp_path / "etc" / "host.json")
    first = manifest(ct129_facts)
    hm.write(path, first)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert hm.read(path) == first
    assert os.listdir(tmp_path / "etc") == ["host.json"]  # no temporary file left
    # a later run that finds the same host: only the provenance and times differ
    again = manifest(ct129_facts, now=LATER)
    assert again != first and hm.same(first, again)
    # a changed verdict or GPU is a change
    assert not hm.same(first, manifest(ct129_facts, probe(ok=False, errors=["sglang is not installed"])))
    lost = json.loads(json.dumps(ct129_facts))
    lost["gpus"][2]["usable"], lost["gpus"][2]["state"], lost["gpus"][2]["problem"] = False, "lost", "GPU is lost"
    assert not hm.same(first, manifest(lost))
    assert not hm.same(None, first)


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not valid JSON"),
    ("[]", "is not a JSON object"),
    ('{"schema": 99}', "schema 99 is not 1"),
    ('{"schema": 1, "written": {}, "cuda": {}, "venv": {"python": "relative"}, "installed": {}, "environment": {},'
     ' "builds": {}}', "venv.python is not an absolute path"),
    ('{"schema": 1, "written": {}, "cuda": {}, "venv": {"python": "/p"}, "installed": {}, "environment": {"A": 1},'
     ' "builds": {"sglang": {}}}', "environment values must be strings; builds.sglang must hold ok and errors"),
])
def test_bad_files(tmp_path, text, message):
    path = tmp_path / "host.json"
    path.write_text(text)
    with pytest.raises(hm.ManifestError) as exc:
        hm.read(str(path))
    assert message in str(exc.value) and str(path) in str(exc.value)


def test_devices_must_be_usable(ct129_facts):
    m = manifest(ct129_facts)
    m["gpus"]["tp"]["devices"] = [0, 1]
    assert "gpus.tp.devices [0, 1] are not all usable" in "; ".join(hm.validate(m))


def test_missing_file(tmp_path):
    with pytest.raises(hm.ManifestMissing) as exc:
        hm.read(str(tmp_path / "absent.json"))
    assert "run provision.yml first" in str(exc.value)
    assert hm.read_optional(str(tmp_path / "absent.json")) is None


# -- precedence: a setting given wins over the manifest's --------------------------

def test_settings_from_the_manifest(ct129_facts):
    settings, sources, problems, _w = hm.settings(manifest(ct129_facts))
    assert problems == []
    assert settings["tp_size"] == 2 and settings["gpu_devices"] == [0, 2]
    assert settings["python"] == "/opt/sglang/venv/bin/python"
    # the unit sets CUDA_VISIBLE_DEVICES itself: the probe's is left out
    assert settings["environment"] == {k: v for k, v in ENV.items() if k != "CUDA_VISIBLE_DEVICES"}
    assert sources == {"tp_size": "manifest", "gpu_devices": "manifest", "python": "manifest", "environment": "manifest"}


def test_overrides_win(ct129_facts):
    m = manifest(ct129_facts)
    extra = {"LD_LIBRARY_PATH": "/opt/lib", "EXTRA": "1"}
    settings, sources, problems, _w = hm.settings(m, tp_size="1", gpu_devices=[2], python="/srv/venv/bin/python",
                                                  environment=extra)
    assert problems == []
    assert settings["tp_size"] == 1 and settings["gpu_devices"] == [2] and settings["python"] == "/srv/venv/bin/python"
    assert settings["environment"]["LD_LIBRARY_PATH"] == "/opt/lib" and settings["environment"]["EXTRA"] == "1"
    assert settings["environment"]["PATH"] == ENV["PATH"]
    assert sources["tp_size"] == sources["gpu_devices"] == sources["python"] == "override"


def test_tp_alone_takes_the_first_usable_gpus(ct129_facts):
    settings, sources, problems, _w = hm.settings(manifest(ct129_facts), tp_size=1)
    assert (settings["tp_size"], settings["gpu_devices"], sources["gpu_devices"], problems) == (1, [0], "manifest", [])
    settings, _skip, problems, _w = hm.settings(manifest(ct129_facts), tp_size=4)
    assert problems == ["sglang_service_tp_size 4 needs 4 GPUs; the host manifest has 2 usable ([0, 2])"]


def test_devices_alone_set_the_tp_size(ct129_facts):
    settings, sources, problems, _w = hm.settings(manifest(ct129_facts), gpu_devices=[0])
    assert (settings["tp_size"], sources["tp_size"], problems) == (1, "gpu_devices", [])
    # as -e gives them on the command line
    settings, _skip, problems, _w = hm.settings(manifest(ct129_facts), gpu_devices="2, 3")
    assert (settings["gpu_devices"], settings["tp_size"], problems) == ([2, 3], 2, [])
    _skip, _skip2, problems, _w = hm.settings(manifest(ct129_facts), gpu_devices="two")
    assert problems == ["sglang_service_gpu_devices must be a list of GPU indexes, got ['two']"]


def test_an_override_on_a_lost_gpu_wins_with_a_warning(ct129_facts):
    settings, _skip, problems, warnings = hm.settings(manifest(ct129_facts), gpu_devices=[0, 1])
    assert problems == [] and settings["gpu_devices"] == [0, 1]
    assert warnings == ["GPU 1 was unusable when the host was provisioned: GPU is lost. Reboot the system to recover this GPU"]
    _skip, _skip2, _skip3, warnings = hm.settings(manifest(ct129_facts), tp_size=3, gpu_devices=[0, 2, 3])
    assert warnings == ["tp_size 3 is not among the TP sizes provisioning found valid on this host (1, 2)"]
    assert hm.settings(manifest(ct129_facts))[3] == []


def test_no_manifest_needs_every_setting():
    _skip, _skip2, problems, _w = hm.settings(None)
    assert "the host manifest has none (run provision.yml)" in problems[0]
    settings, sources, problems, _w = hm.settings(None, tp_size=1, gpu_devices=[0], environment={"A": "b"})
    assert problems == [] and settings == {"tp_size": 1, "gpu_devices": [0], "python": hm.FALLBACK_PYTHON,
                                           "environment": {"A": "b"}}
    assert sources["python"] == "default" and sources["environment"] == "none"


def test_use_environment_false_gives_only_the_extra(ct129_facts):
    settings, _skip, _skip2, _w = hm.settings(manifest(ct129_facts), environment={"A": "b"}, use_environment=False)
    assert settings["environment"] == {"A": "b"}


# -- the variant's build ----------------------------------------------------------

NEXTN = {"speculative_algorithm": "NEXTN"}
SHADOW = {"speculative_algorithm": "DDTREE", "draft_model": True, "ddtree_shadow_linear": True}


def test_build_needed():
    assert hm.build_needed(NEXTN) == "sglang" and hm.build_needed({}) == "sglang"
    assert hm.build_needed(SHADOW) == "ddtree" and hm.build_needed({"speculative_algorithm": "ddtree"}) == "ddtree"
    assert hm.build_needed({"ddtree_budget": 64}) == "ddtree"


def test_a_variant_whose_build_failed_is_refused(ct129_facts):
    err = f"libcudart.so.12 needed by {SITE}/sglang/srt/speculative/ddtree_kernels.so is not found"
    m = manifest(ct129_facts, probe(ok=False, errors=[err]), DDTREE)
    assert hm.refusal("nextn", NEXTN, m, hm.ddtree_installed(DDTREE)) is None
    message = hm.refusal("shadow-balanced", SHADOW, m, hm.ddtree_installed(DDTREE))
    assert message.startswith("variant shadow-balanced needs ddtree abababababab, which failed the runtime probe "
                              f"when the host was provisioned ({NOW}): {err}")


def test_a_ddtree_variant_without_a_build_is_refused(ct129_facts):
    message = hm.refusal("shadow", SHADOW, manifest(ct129_facts), None)
    assert "needs the DDTree build, and the host manifest records none" in message


def test_a_build_changed_since_the_probe_is_refused(ct129_facts):
    m = manifest(ct129_facts, ddtree=DDTREE)
    assert hm.refusal("shadow", SHADOW, m, hm.ddtree_installed(DDTREE)) is None
    other = hm.ddtree_installed(dict(DDTREE, build_id="cd" * 32))
    assert "the one in place now (cdcdcdcdcdcd) is not the one provisioning probed (abababababab)" in \
        hm.refusal("shadow", SHADOW, m, other)


def test_an_unprobed_runtime_is_refused(ct129_facts):
    m = hm.build(ct129_facts, {}, RUNTIME, None, None, {}, NOW)
    assert "needs sglang 0.5.11, which was not probed" in hm.refusal("nextn", NEXTN, m)


# A build the ddtree_build role rejected and rolled back: its facts (roles/ddtree_build/tasks/build.yml)
REJECTED = {"build_id": "cd" * 32, "verdict": "rejected", "restored": None, "environment": ENV,
            "errors": [f"libcudart.so.12 needed by {SITE}/sglang/srt/speculative/ddtree_kernels.so (the DDTree build) "
                       "does not resolve (LD_LIBRARY_PATH=/usr/local/cuda-13.0/lib64, RUNPATH=none)"]}


def test_a_rejected_build_rolled_back_to_none_is_the_ddtree_verdict(ct129_facts):
    m = manifest(ct129_facts, rejected=dict(REJECTED, checks=["libraries", "dependencies"]))
    assert m["ddtree"] is None and m["builds"]["sglang"]["ok"] is True
    assert m["builds"]["ddtree"] == {"name": "ddtree cdcdcdcdcdcd", "build_id": "cd" * 32, "ok": False,
                                     "errors": REJECTED["errors"], "checks": ["libraries", "dependencies"], "proved_at": NOW}
    assert m["ddtree_rejected"] == {"build_id": "cd" * 32, "errors": REJECTED["errors"],
                                    "checks": ["libraries", "dependencies"], "restored": None}
    later = manifest(ct129_facts, rejected=dict(REJECTED, checks=["libraries", "dependencies"]), now=LATER)
    assert hm.validate(m) == [] and hm.same(m, later)
    message = hm.refusal("shadow-balanced", SHADOW, m, None)
    assert message.startswith("variant shadow-balanced needs ddtree cdcdcdcdcdcd, which failed the runtime probe "
                              f"when the host was provisioned ({NOW}): {REJECTED['errors'][0]}")
    assert hm.refusal("nextn", NEXTN, m, None) is None
    # a build laid since, outside provisioning, is not the one the manifest speaks of
    assert "is not the one provisioning probed (none: cdcdcdcdcdcd was rejected and rolled back)" in \
        hm.refusal("shadow", SHADOW, m, hm.ddtree_installed(DDTREE))


def test_a_rejected_build_with_the_previous_one_restored_leaves_that_ones_verdict(ct129_facts):
    m = manifest(ct129_facts, ddtree=DDTREE, rejected=dict(REJECTED, restored="ab" * 32))
    assert m["ddtree"]["build_id"] == "ab" * 32 and m["builds"]["ddtree"]["build_id"] == "ab" * 32
    assert m["builds"]["ddtree"]["ok"] is True
    assert m["ddtree_rejected"]["build_id"] == "cd" * 32 and m["ddtree_rejected"]["restored"] == "ab" * 32
    assert hm.refusal("shadow", SHADOW, m, hm.ddtree_installed(DDTREE)) is None


def test_only_a_rejected_verdict_is_recorded(ct129_facts):
    for facts in (None, {}, dict(REJECTED, verdict="passed"), dict(REJECTED, build_id=None)):
        m = manifest(ct129_facts, rejected=facts)
        assert "ddtree_rejected" not in m and "ddtree" not in m["builds"], facts
