"""The variant table through real SGLang's own argument validation.

Every variant of the role's table, resolved and rendered as the role does
(``_variants.resolve`` and ``argv`` with each production host's inventory
values), goes through ``lab/real/validate_args.py`` in the real 0.5.11 and
0.5.23 venvs with that host's GPU profile (lab/hosts/<host>/hardware.json):
``prepare_server_args`` (0.5.11 runs ``ServerArgs.__post_init__`` there),
``resolve_once`` (0.5.20+) and ``check_server_args``, with only the GPU's
answers stood in for. A refusal fails with SGLang's own message.

Variants whose speculative algorithm the release does not know (DDTREE, the
patched build's) are skipped, and only for that reason: the test first checks
that the real release refuses them for exactly that.

One harness process per (release, host) validates all of its argvs (importing
sglang takes most of the time), with test_real_server_args.py's cases of the same
GPU profile (real_sglang.register_gpu_cases); the four run two at a time.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from real_sglang import REPO, RELEASES, register_gpu_cases

from ansible_collections.inferops.sglang.plugins.module_utils import _gpu, _variants

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
HOSTS = ("ct129", "ct200")
VERSIONS = {release: _variants.parse_version(release) for release in RELEASES}
# Multiprocessors per GPU: flashinfer reads get_device_properties().multi_processor_count at import
# (0.5.11's flashinfer gdn_kernels/gdn_decode_bf16_state.py:2262). hardware.json does not carry it;
# these are NVIDIA's published figures (RTX A6000: 84 SMs; RTX PRO 6000 Blackwell Workstation: 188 SMs).
SM_COUNT = {"NVIDIA RTX A6000": 84, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": 188}
# The negative control: nextn as it was rendered before the fix (radix cache on).
CONTROL = "nextn-with-radix-cache"
# nextn's argv with DDTREE as the algorithm and no DDTree flags: the algorithm alone, refused or not.
DDTREE_ONLY = "nextn-as-ddtree"
# 0.5.11 srt/server_args.py:2452-2456 (raised at :2453)
RADIX_REFUSAL = ("Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix cache "
                 "when using --mamba-scheduler-strategy no_buffer.")


def hostvars() -> dict:
    """The production inventory's variables per host, merged by Ansible itself."""
    out = subprocess.run([str(REPO / ".venv/bin/ansible-inventory"), "-i", str(REPO / "inventories/production"),
                          "--list"], capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout)["_meta"]["hostvars"]


HOSTVARS = hostvars()


def lab_model(path: str) -> str:
    """The lab's copy of a model directory (config.json and the weight index, no weights)."""
    local = REPO / "lab/models" / Path(path).name
    assert (local / "config.json").is_file(), f"no lab copy of {path} under lab/models"
    return str(local)


def table(host: str) -> tuple[dict, dict, dict, dict]:
    hv = HOSTVARS[host]
    return (hv.get("sglang_service_variants", DEFAULTS["sglang_service_variants"]),
            hv.get("sglang_service_variant_aliases", DEFAULTS["sglang_service_variant_aliases"]),
            hv.get("sglang_service_variant_overrides", DEFAULTS["sglang_service_variant_overrides"]),
            hv.get("sglang_service_overrides", DEFAULTS["sglang_service_overrides"]))


def tp_and_devices(host: str) -> tuple[int, list[int]]:
    """The TP size and GPUs provisioning chooses for the host (gpu_facts, written to the host manifest):
    the inventory's gpu_preflight_requested_gpus/_tp_size where it asks, else from the usable GPUs of
    its hardware file and the model's heads (_gpu.valid_tp and choose_tp), the first that many GPUs."""
    hv = HOSTVARS[host]
    hardware = json.loads((REPO / "lab/hosts" / host / "hardware.json").read_text())
    usable = [g["index"] for g in hardware["gpus"] if g["state"] == "ok"]
    selected = [i for i in hv.get("gpu_preflight_requested_gpus") or usable if i in usable]
    tp = hv.get("gpu_preflight_requested_tp_size")
    if tp is None:
        config = json.loads((Path(lab_model(hv["inferops_model_path"])) / "config.json").read_text())
        tp = _gpu.choose_tp(_gpu.valid_tp(_gpu.model_heads(config), len(selected)))
    assert tp and int(tp) <= len(selected), (host, tp, selected)
    return int(tp), selected[:int(tp)]


def server(host: str) -> dict:
    """The role's server values (defaults/main.yml) from the host's inventory, with the lab's model copies."""
    hv = HOSTVARS[host]
    return {"model_path": lab_model(hv["inferops_model_path"]), "served_model_name": hv.get("inferops_model_name", ""),
            "host": hv.get("sglang_service_bind_host", DEFAULTS["sglang_service_bind_host"]),
            "port": int(hv.get("inferops_service_port", 30000)), "tp_size": tp_and_devices(host)[0],
            "draft_model_path": lab_model(hv["inferops_draft_model_path"])}


def gpu_profile(host: str) -> list[str]:
    """validate_args.py's GPU figures: the GPUs the unit is given (CUDA_VISIBLE_DEVICES) from hardware.json."""
    hardware = json.loads((REPO / "lab/hosts" / host / "hardware.json").read_text())
    devices = tp_and_devices(host)[1]
    gpus = [g for g in hardware["gpus"] if g["index"] in devices]
    assert len(gpus) == len(devices) and all(g["state"] == "ok" for g in gpus), (host, devices)
    assert len({(g["name"], g["compute_cap"]) for g in gpus}) == 1, "one GPU model per host"
    name = gpus[0]["name"]
    return ["--gpu-mib", str(min(g["memory_total_mib"] for g in gpus)), "--capability", gpus[0]["compute_cap"],
            "--gpus", str(len(gpus)), "--gpu-name", name, "--sm-count", str(SM_COUNT[name]),
            "--driver-version", hardware["driver_version"]]


def rendered(host: str, release: str) -> dict[str, list[str]]:
    variants, aliases, overrides, common = table(host)
    out = {}
    for name in variants:
        canonical, params = _variants.resolve(name, variants, aliases, overrides, common)
        assert _variants.check(params) == [], (name, _variants.check(params))
        out[canonical] = _variants.argv(params, server(host), VERSIONS[release])
    _canonical, nextn = _variants.resolve("nextn", variants, aliases, overrides, common)
    out[CONTROL] = _variants.argv(dict(nextn, disable_radix_cache=False), server(host), VERSIONS[release])
    out[DDTREE_ONLY] = _variants.argv(dict(nextn, speculative_algorithm="DDTREE"), server(host), VERSIONS[release])
    return out


for _release in RELEASES:
    for _host in HOSTS:
        register_gpu_cases("table", _release, _host,
                           lambda release=_release, host=_host: (gpu_profile(host), rendered(host, release)))


@pytest.fixture(scope="session")
def validated(gpu_validated) -> dict:
    """(release, host) -> {sglang, speculative_algorithms, results: {case id: answer}, argv, seconds, argvs}."""
    return {(release, host): gpu_validated[("table", release, host)] for release in RELEASES for host in HOSTS}


def upstream(answer: dict, params: dict) -> bool:
    algo = params.get("speculative_algorithm")
    return algo is None or str(algo).upper() in answer["speculative_algorithms"]


CASES = [(release, host, name) for release in RELEASES for host in HOSTS for name in table(host)[0]]


@pytest.mark.parametrize("release, host, name", CASES, ids=["-".join(c) for c in CASES])
def test_variant_passes_real_validation(validated, release, host, name):
    answer = validated[(release, host)]
    assert answer["sglang"] == release
    variants, aliases, overrides, common = table(host)
    params = _variants.resolve(name, variants, aliases, overrides, common)[1]
    result = answer["results"][name]
    if not upstream(answer, params):
        # the only reason to skip: the real release does not know the algorithm, and says so
        error = result["error"] or {}
        assert not result["ok"] and "DDTREE" in str(params["speculative_algorithm"]).upper(), result
        assert "DDTREE" in error.get("message", "") or "ddtree" in error.get("message", ""), error
        pytest.skip(f"{params['speculative_algorithm']} is not an upstream algorithm of SGLang {release} "
                    f"(it knows {', '.join(answer['speculative_algorithms'])}): it needs the patched DDTree build; "
                    f"real SGLang says: {error.get('message', '')[-200:]}")
    if not result["ok"]:
        error = result["error"]
        pytest.fail(f"real SGLang {release} refuses variant {name} on {host}'s GPUs: {error['type']}: "
                    f"{error['message']} (at {error['where']})\nargv: {' '.join(answer['argv'][name])}", pytrace=False)
    resolved = result["resolved"]
    # what the variant asks for is what SGLang resolved
    for key in ("context_length", "max_running_requests", "mem_fraction_static", "speculative_num_steps",
                "speculative_eagle_topk", "speculative_num_draft_tokens"):
        if params.get(key) is not None:
            assert resolved[key] == params[key], (key, resolved[key])
    assert resolved["disable_radix_cache"] is bool(params["disable_radix_cache"])
    assert resolved["tp_size"] == tp_and_devices(host)[0] and resolved["device"] == "cuda"
    # SGLang read the model's config.json and no other file of it
    assert result["model_files"] == ["config.json"], result["model_files"]


def test_only_the_patched_builds_algorithm_is_skipped(validated):
    """DDTREE is the one algorithm of the table no release knows; every other variant is validated."""
    skipped = set()
    for (release, host), answer in validated.items():
        variants, aliases, overrides, common = table(host)
        for name in variants:
            params = _variants.resolve(name, variants, aliases, overrides, common)[1]
            if not upstream(answer, params):
                skipped.add(params["speculative_algorithm"])
        assert "NEXTN" in answer["speculative_algorithms"] and "DFLASH" in answer["speculative_algorithms"], release
    assert skipped == {"DDTREE"}
    # and each release refuses the algorithm itself, not only the patched build's flags
    messages = {release: validated[(release, "ct129")]["results"][DDTREE_ONLY]["error"]["message"] for release in RELEASES}
    # 0.5.11: argparse choices (server_args.py add_cli_args); 0.5.23: spec_info.py:65 from_string
    assert "invalid choice: 'DDTREE'" in messages["0.5.11"], messages
    assert "Unknown speculative algorithm name: DDTREE" in messages["0.5.23"], messages
    validated_variants = {n for host in HOSTS for n in table(host)[0]
                          if _variants.resolve(n, *table(host))[1]["speculative_algorithm"] != "DDTREE"}
    assert "nextn" in validated_variants


@pytest.mark.parametrize("host", HOSTS)
def test_negative_control_radix_cache_with_speculation_is_refused_by_0_5_11(validated, host):
    """The harness can fail: nextn with radix cache on (as rendered before disable_radix_cache) is
    refused by real 0.5.11 with its own ValueError, and accepted by 0.5.23, which keeps radix cache
    with the extra_buffer strategy by itself."""
    old = validated[("0.5.11", host)]["results"][CONTROL]
    assert not old["ok"]
    assert old["error"]["type"] == "ValueError"
    assert old["error"]["message"].startswith(RADIX_REFUSAL), old["error"]
    assert old["error"]["where"] == "sglang/srt/server_args.py:2453"
    assert "--disable-radix-cache" not in validated[("0.5.11", host)]["argv"][CONTROL]
    new = validated[("0.5.23", host)]["results"][CONTROL]
    assert new["ok"], new["error"]
    assert new["resolved"]["mamba_radix_cache_strategy"] == "extra_buffer"
    assert new["resolved"]["disable_radix_cache"] is False


@pytest.mark.parametrize("release", RELEASES)
def test_the_hosts_gpu_figures_reach_sglangs_own_defaults(validated, release):
    """The answers are used, not ignored: SGLang picks its per-GPU-size defaults from them. ct129's
    48 GB A6000 and ct200's 96 GB card fall in different tiers of chunked_prefill_size (0.5.11
    server_args.py _handle_gpu_memory_settings, 0.5.23 arg_groups/memory_hook.py:101-117)."""
    ct129 = validated[(release, "ct129")]["results"]["nextn"]["resolved"]
    ct200 = validated[(release, "ct200")]["results"]["nextn"]["resolved"]
    assert (ct129["chunked_prefill_size"], ct200["chunked_prefill_size"]) == (4096, 8192)


def test_time(validated):
    """Each (release, host) harness process, for the report: import once, then one fork per argv."""
    for (release, host), answer in sorted(validated.items()):
        print(f"validate_args.py {release} {host}: {len(answer['results'])} argvs of the table "
              f"({answer['argvs']} in the process) in {answer['seconds']:.1f} s")
        assert answer["seconds"] < 300
