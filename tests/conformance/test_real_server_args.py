"""sglang_server_args' harness against real SGLang 0.5.11 and 0.5.23, and the
simulator's ``sglang.srt.server_args`` against real.

On CPU, as the lab host cpu-real runs real SGLang (SGLANG_USE_CPU_ENGINE=1, the
libcuda.so.1 test double on LD_LIBRARY_PATH: real_sglang.environment()): the host's
own variants (inventories/lab/host_vars/cpu-real.yml, rendered as the role renders
them) and a few command lines that real SGLang refuses, each through the module's
harness (plugins/module_utils/_server_args.py: HARNESS_SOURCE with the module's request,
its answer read by the module's ``outcome``). Nothing is stood in there. Per release one
process of the venv imports sglang once and runs each argv's harness in a child forked from
it (tests/conformance/harness_batch.py): a harness process spends nearly all its time in
that import. The module itself runs end to end, one ``python -c HARNESS_SOURCE`` process
per call as on a host, for one accepted and one refused variant.

On a GPU host, for the refusals that depend on it (the radix-cache rule of hybrid
models, DFLASH without a draft), through lab/real/validate_args.py, which runs the
same harness with only the GPU's answers stood in for (ct129's figures,
lab/hosts/ct129/hardware.json), in the process that validates test_real_args.py's
argvs of ct129 (real_sglang.register_gpu_cases).

Then each command line goes through the simulator (a test double of SGLang, installed
from its wheel as the lab installs it) for the same release: same verdict, same
exception type, same message, same stage, except where the real refusal is one of a
CPU host that the simulator (which emulates GPU hosts) does not claim to model; those
are listed with real SGLang's own message, which the test checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from real_sglang import CPU_ARGS, REPO, RELEASES, environment, python, register_gpu_cases

from ansible_collections.inferops.sglang.plugins.module_utils import _server_args, _variants

DEFAULTS = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
HYBRID = str(REPO / "lab/models/Qwen3.6-27B")
HARNESS_BATCH = REPO / "tests/conformance/harness_batch.py"

# The messages real SGLang gives, with the file:line that raises them in the wheel
NGRAM_0_5_11 = ("ValueError", "Ngram speculative decoding only supports CUDA device.",
                "sglang/srt/server_args.py:3559", "prepare_server_args")  # 0.5.11 server_args.py:3557-3561
RADIX_0_5_11 = ("ValueError", "Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix "
                "cache when using --mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, "
                "please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.",
                "sglang/srt/server_args.py:2453", "prepare_server_args")  # 0.5.11 server_args.py:2452-2456
DFLASH_0_5_11 = ("ValueError", "DFLASH speculative decoding requires setting --speculative-draft-model-path.",
                 "sglang/srt/server_args.py:3331", "prepare_server_args")  # 0.5.11 server_args.py:3330-3333
UNKNOWN_FLAG = ("SystemExit", "sglang serve: error: unrecognized arguments: --no-such-flag", "argparse",
                "prepare_server_args")
DDTREE_0_5_11 = ("SystemExit", "sglang serve: error: argument --speculative-algorithm: invalid choice: 'DDTREE' "
                 "(choose from 'DFLASH', 'EAGLE', 'EAGLE3', 'NEXTN', 'STANDALONE', 'NGRAM')", "argparse",
                 "prepare_server_args")  # 0.5.11 server_args.py:5365-5369 (choices)
DDTREE_0_5_23 = ("ValueError", "Unknown speculative algorithm name: DDTREE", "sglang/srt/speculative/spec_info.py:65",
                 "resolve_once")  # 0.5.23 spec_info.py:65 (SpeculativeAlgorithm.from_string)
AMBIGUOUS_0_5_23 = ("SystemExit", "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
                    "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill", "argparse", "prepare_server_args")
# Refusals of a CPU host only: the simulator emulates GPU hosts and does not model them
CPU_RADIX_0_5_23 = ("AssertionError", "extra_buffer requires platform support for Mamba cache state snapshots.",
                    "sglang/srt/arg_groups/mamba_hook.py:120", "resolve_once")  # 0.5.23 arg_groups/mamba_hook.py:119-121
CPU_DFLASH_0_5_23 = ("ValueError", "DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'.",
                     "sglang/srt/arg_groups/speculative_hook.py:298", "resolve_once")  # 0.5.23 speculative_hook.py:297-300


def cpu_real() -> dict:
    """The lab host cpu-real's variables, merged by Ansible itself."""
    out = subprocess.run([str(REPO / ".venv/bin/ansible-inventory"), "-i", str(REPO / "inventories/lab"), "--host",
                          "cpu-real"], capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout)


def rendered(hostvars: dict, model: str, name: str, release: str) -> list[str]:
    """cpu-real's variant as the role renders it (sglang_variant's argv), with the real tiny model's path."""
    variants = hostvars["sglang_service_variants"]
    canonical, params = _variants.resolve(name, variants, hostvars.get("sglang_service_variant_aliases", {}),
                                          hostvars.get("sglang_service_variant_overrides", {}),
                                          hostvars.get("sglang_service_overrides", {}))
    assert canonical == name and _variants.check(params) == [], (name, _variants.check(params))
    server = {"model_path": model, "served_model_name": hostvars["inferops_model_name"],
              "host": hostvars.get("sglang_service_bind_host", DEFAULTS["sglang_service_bind_host"]),
              "port": hostvars["inferops_service_port"], "tp_size": hostvars["sglang_service_tp_size"], "draft_model_path": None}
    return _variants.argv(params, server, _variants.parse_version(release))


# (id, how its argv is made, expected answer per release: None = accepted, or (type, message, where, stage))
VARIANTS = {
    "cpu": {"0.5.11": None, "0.5.23": None},
    "cpu-small": {"0.5.11": None, "0.5.23": None},
    # 0.5.16+ let NGRAM run on CPU (0.5.23 arg_groups/speculative_hook.py:1286-1290)
    "cpu-ngram": {"0.5.11": NGRAM_0_5_11, "0.5.23": None},
    # accepted by both; its server then dies while it starts (triton finds no GPU driver): the gate's to find
    "cpu-triton": {"0.5.11": None, "0.5.23": None},
}
EXTRA = {  # id: (argv after the CPU flags, {release: expected})
    "unknown-flag": (["--no-such-flag"], {"0.5.11": UNKNOWN_FLAG, "0.5.23": UNKNOWN_FLAG}),
    "ddtree": (["--speculative-algorithm", "DDTREE"], {"0.5.11": DDTREE_0_5_11, "0.5.23": DDTREE_0_5_23}),
    "cuda-graph-max-bs": (["--cuda-graph-max-bs", "8"], {"0.5.11": None, "0.5.23": AMBIGUOUS_0_5_23}),
    "dflash-without-draft": (["--speculative-algorithm", "DFLASH"], {"0.5.11": DFLASH_0_5_11, "0.5.23": CPU_DFLASH_0_5_23}),
    "hybrid-nextn-radix": (["--speculative-algorithm", "NEXTN"], {"0.5.11": RADIX_0_5_11, "0.5.23": CPU_RADIX_0_5_23}),
    "hybrid-nextn": (["--speculative-algorithm", "NEXTN", "--disable-radix-cache"], {"0.5.11": None, "0.5.23": None}),
}
CPU_ONLY = {CPU_RADIX_0_5_23, CPU_DFLASH_0_5_23}
DFLASH_0_5_23 = ("ValueError", "DFLASH speculative decoding requires setting --speculative-draft-model-path.",
                 "sglang/srt/arg_groups/speculative_hook.py:325", "resolve_once")  # 0.5.23 speculative_hook.py:324-326
# On a GPU host (validate_args.py, ct129's GPUs), the hybrid model at tp 2 as ct129 runs it. With radix cache
# on, 0.5.11 refuses any speculative algorithm before it looks at the algorithm's own needs
# (_handle_model_specific_adjustments, server_args.py:845, runs before _handle_speculative_decoding, :882).
NO_RADIX = ["--disable-radix-cache"]
GPU_CASES = {
    "nextn-radix": (["--speculative-algorithm", "NEXTN"], {"0.5.11": RADIX_0_5_11, "0.5.23": None}),
    "nextn": (["--speculative-algorithm", "NEXTN", *NO_RADIX], {"0.5.11": None, "0.5.23": None}),
    "dflash-without-draft-radix": (["--speculative-algorithm", "DFLASH"], {"0.5.11": RADIX_0_5_11, "0.5.23": DFLASH_0_5_23}),
    "dflash-without-draft": (["--speculative-algorithm", "DFLASH", *NO_RADIX],
                             {"0.5.11": DFLASH_0_5_11, "0.5.23": DFLASH_0_5_23}),
    "ngram-radix": (["--speculative-algorithm", "NGRAM"], {"0.5.11": RADIX_0_5_11, "0.5.23": None}),
    "ngram": (["--speculative-algorithm", "NGRAM", *NO_RADIX], {"0.5.11": None, "0.5.23": None}),
    "ngram-on-cpu": (["--speculative-algorithm", "NGRAM", "--device", "cpu", *NO_RADIX], {"0.5.11": NGRAM_0_5_11, "0.5.23": None}),
}


def cases(real: dict, hostvars: dict) -> dict[str, tuple[list[str], dict]]:
    model = real["INFEROPS_REAL_MODEL"]
    out = {}
    for name, expected in VARIANTS.items():
        argvs = {release: rendered(hostvars, model, name, release) for release in RELEASES}
        out[name] = (argvs, expected)
    for name, (extra, expected) in EXTRA.items():
        path = HYBRID if name.startswith("hybrid") else model
        argv = ["--model-path", path, *CPU_ARGS, "--host", "127.0.0.1", "--port", "30000", *extra]
        out[name] = ({release: argv for release in RELEASES}, expected)
    return out


def run_harness(python_bin: str, argv: list[str], env: dict) -> dict:
    """The module's harness, as the module runs it (command, request, answer)."""
    start = time.monotonic()
    proc = subprocess.run(_server_args.command(python_bin, 300), input=_server_args.request(argv), capture_output=True,
                          text=True, env=env, timeout=360, check=False)
    seconds = time.monotonic() - start
    answer = _server_args.outcome(proc.returncode, proc.stdout, proc.stderr, python_bin, "case", 300)
    return dict(answer, seconds=seconds, argv=argv)


@pytest.fixture(scope="session")
def simulator(tmp_path_factory) -> dict[str, dict]:
    """release -> the environment that makes the simulator's wheel (that release) the sglang package."""
    from build_wheel import build  # lab/simulator (on sys.path: conftest.py)

    out = {}
    for release in RELEASES:
        root = tmp_path_factory.mktemp(f"simulator-{release}")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                        "--target", str(root / "site"), str(build(release, root / "wheel"))], check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CUDA_"))}
        out[release] = dict(env, PYTHONPATH=str(root / "site"))
    return out


def run_harness_batch(python_bin: str, argvs: dict, env: dict) -> tuple[dict, float]:
    """The module's harness for each argv (id -> argv) in one process of ``python_bin``, one
    child per argv forked after sglang's import (harness_batch.py); each answer read as the
    module reads its harness process's (``outcome``). Returns the answers and the import's seconds."""
    todo = [{"id": key, "request": _server_args.request(argv)} for key, argv in argvs.items()]
    proc = subprocess.run([python_bin, str(HARNESS_BATCH), "--timeout", "300"], input=json.dumps(todo),
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    batch = json.loads(proc.stdout)
    out = {}
    for got in batch["results"]:
        argv = argvs[got["id"]]
        answer = _server_args.outcome(got["rc"], got["stdout"], got["stderr"], python_bin, "case", 300)
        out[got["id"]] = dict(answer, seconds=got["seconds"], argv=argv)
    assert list(out) == list(argvs)
    return out, batch["import_seconds"]


IMPORT_SECONDS: dict[str, float] = {}


@pytest.fixture(scope="session")
def answers(real) -> dict:
    """(case, release) -> the real answer on CPU (the two releases' processes side by side)."""
    todo = cases(real, cpu_real())

    def one(release):
        argvs = {name: argvs[release] for name, (argvs, _expected) in todo.items()}
        found, IMPORT_SECONDS[release] = run_harness_batch(python(real, release), argvs, environment(real))
        return {(name, release): answer for name, answer in found.items()}

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {key: answer for found in pool.map(one, RELEASES) for key, answer in found.items()}


def expected_of(name: str) -> dict:
    return VARIANTS.get(name) or EXTRA[name][1]


def verdict(answer: dict) -> tuple | None:
    error = answer["error"]
    return None if answer["ok"] else (error["type"], error["message"], error["where"], error["stage"])


CASE_IDS = [(name, release) for name in [*VARIANTS, *EXTRA] for release in RELEASES]


@pytest.mark.parametrize("name, release", CASE_IDS, ids=["-".join(c) for c in CASE_IDS])
def test_real_sglang_on_cpu(answers, name, release):
    answer = answers[(name, release)]
    assert answer["sglang_version"] == release
    assert verdict(answer) == expected_of(name)[release], (answer["error"], answer["log"][-10:])
    if answer["ok"]:
        assert answer["resolved"]["device"] == "cpu"
        assert answer["resolved"]["disable_radix_cache"] is ("--disable-radix-cache" in answer["argv"])
    assert answer["config_dropped"] == 0


@pytest.mark.parametrize("name, release", CASE_IDS, ids=["-".join(c) for c in CASE_IDS])
def test_the_simulator_gives_real_sglangs_answer(answers, simulator, name, release):
    real_answer = answers[(name, release)]
    sim = run_harness(sys.executable, real_answer["argv"], simulator[release])
    assert sim["sglang_version"] == f"{release}+simulator"
    if verdict(real_answer) in CPU_ONLY:
        # a refusal of a CPU host only: the simulator emulates GPU hosts (its answer for this argv
        # is compared with a GPU host's in test_on_a_gpu_host_the_simulator_gives_real_sglangs_answer)
        pytest.skip(f"real SGLang {release} refuses {name} on CPU only: {real_answer['error']['message']} "
                    f"(the simulator, which emulates GPU hosts, says: {(sim['error'] or {}).get('message', 'accepted')})")
    assert sim["ok"] == real_answer["ok"], (sim["error"], real_answer["error"])
    if not real_answer["ok"]:
        for key in ("type", "message", "stage"):
            assert sim["error"][key] == real_answer["error"][key], (key, sim["error"], real_answer["error"])
    else:
        for key in ("device", "disable_radix_cache"):
            assert sim["resolved"][key] == real_answer["resolved"][key], key


# -- a GPU host: validate_args.py, the same harness with the GPU's answers stood in for ------------------------

def ct129_profile() -> list[str]:
    hardware = json.loads((REPO / "lab/hosts/ct129/hardware.json").read_text())
    gpus = [g for g in hardware["gpus"] if g["index"] in (0, 2)]
    # RTX A6000: 84 multiprocessors (NVIDIA's figure; flashinfer reads it at import)
    return ["--gpu-mib", str(gpus[0]["memory_total_mib"]), "--capability", gpus[0]["compute_cap"], "--gpus", "2",
            "--gpu-name", gpus[0]["name"], "--sm-count", "84", "--driver-version", hardware["driver_version"]]


def gpu_cases() -> tuple[list[str], dict[str, list[str]]]:
    """ct129's GPU profile and GPU_CASES' argvs (the hybrid model at tp 2)."""
    return ct129_profile(), {name: ["--model-path", HYBRID, "--tp-size", "2", *extra] for name, (extra, _expected) in GPU_CASES.items()}


for _release in RELEASES:
    register_gpu_cases("gpu-cases", _release, "ct129", gpu_cases)


@pytest.fixture(scope="session")
def gpu_answers(gpu_validated) -> dict:
    """release -> {case: answer} from validate_args.py (one process per release and GPU profile, shared with
    test_real_args.py's cases of ct129, whose profile this is)."""
    out = {}
    for release in RELEASES:
        answer = gpu_validated[("gpu-cases", release, "ct129")]
        assert answer["sglang"] == release
        out[release] = {name: dict(result, argv=answer["argv"][name]) for name, result in answer["results"].items()}
    return out


GPU_IDS = [(name, release) for name in GPU_CASES for release in RELEASES]


@pytest.mark.parametrize("name, release", GPU_IDS, ids=["-".join(c) for c in GPU_IDS])
def test_on_a_gpu_host_the_simulator_gives_real_sglangs_answer(gpu_answers, simulator, name, release):
    real_answer = gpu_answers[release][name]
    assert verdict(real_answer) == GPU_CASES[name][1][release], real_answer["error"]
    if real_answer["ok"]:
        assert real_answer["resolved"]["device"] == ("cpu" if "--device" in real_answer["argv"] else "cuda")
    sim = run_harness(sys.executable, real_answer["argv"], simulator[release])
    assert sim["ok"] == real_answer["ok"], (sim["error"], real_answer["error"])
    if not real_answer["ok"]:
        for key in ("type", "message", "stage"):
            assert sim["error"][key] == real_answer["error"][key], (key, sim["error"], real_answer["error"])
    else:
        for key in ("device", "disable_radix_cache", "mamba_radix_cache_strategy"):
            if key in real_answer["resolved"]:
                assert sim["resolved"].get(key) == real_answer["resolved"][key], key


# -- the module, end to end ------------------------------------------------------------------------------------

@pytest.mark.parametrize("release, name, refused", [("0.5.11", "cpu-ngram", NGRAM_0_5_11), ("0.5.23", "cpu-ngram", None),
                                                    ("0.5.11", "cpu", None)])
def test_the_module_on_real_sglang(real, capsys, monkeypatch, release, name, refused):
    """The module as the role calls it: the variant's argv, the unit's extra environment
    (cpu-real's, with this machine's path of the libcuda.so.1 test double)."""
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.inferops.sglang.plugins.modules import sglang_server_args

    hostvars = cpu_real()
    for key in list(os.environ):
        if key.startswith(("SGLANG_", "CUDA_")):
            monkeypatch.delenv(key)
    unit_env = dict(hostvars["sglang_service_environment"], LD_LIBRARY_PATH=real["INFEROPS_REAL_LIBCUDA_DIR"])
    assert unit_env["SGLANG_USE_CPU_ENGINE"] == "1"
    args = {"python": python(real, release), "argv": rendered(hostvars, real["INFEROPS_REAL_MODEL"], name, release),
            "environment": unit_env, "label": f"variant {name}"}
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        sglang_server_args.main()
    result = json.loads(capsys.readouterr().out)
    print(f"sglang_server_args {release} {name}: {result['elapsed']} s")
    # one whole harness process on real (the import of sglang included) within the module's default timeout
    assert result["elapsed"] < 180, result["elapsed"]
    if refused:
        assert exc.value.code == 1
        assert result["msg"] == f"SGLang {release} refuses variant {name}: {refused[1]}"
        assert (result["error"]["type"], result["error"]["where"]) == (refused[0], refused[2])
    else:
        assert exc.value.code == 0, result.get("msg")
        assert result["ok"] is True and result["resolved"]["device"] == "cpu"
        params = _variants.resolve(name, hostvars["sglang_service_variants"])[1]
        assert result["resolved"]["max_running_requests"] == params["max_running_requests"]
        assert result["resolved"]["context_length"] == params["context_length"]


def test_time(answers, simulator):
    """For the report: real's import of sglang (once per release) and each argv's harness after it
    (a whole harness process on real, import included, is test_the_module_on_real_sglang's), and
    one whole harness process on the simulator."""
    for release in RELEASES:
        real_seconds = sorted(a["seconds"] for (_name, r), a in answers.items() if r == release)
        argv = answers[("cpu", release)]["argv"]
        sim_seconds = sorted(run_harness(sys.executable, argv, simulator[release])["seconds"] for _attempt in range(3))
        print(f"harness on real {release}: import {IMPORT_SECONDS[release]:.1f} s, then per argv min {real_seconds[0]:.1f} s, "
              f"median {real_seconds[len(real_seconds) // 2]:.1f} s, max {real_seconds[-1]:.1f} s over {len(real_seconds)} "
              f"argvs (the two releases side by side); simulator {release}: {sim_seconds[1]:.2f} s")
        assert IMPORT_SECONDS[release] + real_seconds[-1] < 180 and sim_seconds[-1] < 10
