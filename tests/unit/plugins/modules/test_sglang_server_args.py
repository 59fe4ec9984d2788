"""sglang_server_args, run for real: the module's harness in a real interpreter
against the simulator's installed package (a test double of SGLang, installed from
its wheel as the lab hosts install it), the lab model directories, and stand-in
interpreters (shell scripts) that hang or crash."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sim_helpers import MODEL, MODELS, NEXTN, run_module, write_executable

from ansible_collections.inferops.sglang.plugins.modules import sglang_server_args

# 0.5.11 srt/server_args.py:2452-2456, as the simulator raises it for that release
RADIX = ("Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix cache when using "
         "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use "
         "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.")
WITH_RADIX = [a for a in MODEL + NEXTN if a != "--disable-radix-cache"]
CPU = ["--model-path", str(MODELS / "Qwen3.6-27B"), "--device", "cpu", "--context-length", "1024", "--disable-radix-cache"]


@pytest.fixture
def sim(sim_install):
    """sim(version, ddtree=False) -> the module's environment option that makes the simulator SGLang."""

    def make(version: str = "0.5.11", ddtree: bool = False) -> dict:
        return {"PYTHONPATH": str(sim_install(version, ddtree))}

    return make


def run(capsys, check_mode: bool = False, **args) -> tuple[int, dict]:
    args.setdefault("python", sys.executable)
    rc, result = run_module(sglang_server_args.main, capsys, args, check_mode=check_mode)[:2]
    return rc, result


def test_accepted_with_the_resolved_fields(sim, capsys):
    rc, result = run(capsys, argv=MODEL + NEXTN, environment=sim("0.5.11"), label="variant nextn")
    assert rc == 0, result
    assert result["ok"] is True and result["error"] is None and result["changed"] is False
    assert result["sglang_version"] == "0.5.11+simulator"
    resolved = result["resolved"]
    assert resolved["speculative_algorithm"] == "NEXTN" and resolved["disable_radix_cache"] is True
    assert resolved["device"] == "cuda" and resolved["mem_fraction_static"] == 0.88
    assert resolved["max_running_requests"] == 16 and resolved["mamba_scheduler_strategy"] == "auto"
    assert 0 < result["elapsed"] < 60
    assert set(result) == {"changed", "ok", "sglang_version", "error", "resolved", "elapsed", "invocation"}


def test_radix_cache_refusal_of_0_5_11_with_sglangs_message(sim, capsys):
    rc, result = run(capsys, argv=WITH_RADIX, environment=sim("0.5.11"), label="rollback target nextn")
    assert rc == 1
    assert result["msg"] == f"SGLang 0.5.11+simulator refuses rollback target nextn: {RADIX}"
    assert result["error"]["type"] == "ValueError" and result["error"]["stage"] == "prepare_server_args"
    assert result["ok"] is False and result["resolved"] == {}


def test_0_5_23_keeps_radix_cache_with_extra_buffer(sim, capsys):
    rc, result = run(capsys, argv=WITH_RADIX, environment=sim("0.5.23"))
    assert rc == 0, result
    assert result["resolved"]["mamba_radix_cache_strategy"] == "extra_buffer"
    assert result["resolved"]["disable_radix_cache"] is False
    assert "mamba_scheduler_strategy" not in result["resolved"]


@pytest.mark.parametrize("version, stage", [("0.5.18", "prepare_server_args"), ("0.5.19", "resolve_once"),
                                            ("0.5.23", "resolve_once")])
def test_where_the_release_refuses_an_unknown_algorithm(sim, capsys, version, stage):
    """Up to 0.5.18 ServerArgs.__post_init__ validates inside prepare_server_args; from 0.5.19
    resolve_once does (real 0.5.19 server_args.py:3663-3673)."""
    argv = MODEL + ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", str(MODELS / "Qwen3.6-27B-DFlash")]
    rc, result = run(capsys, argv=argv, environment=sim(version), label="variant shadow")
    assert rc == 1
    assert result["msg"] == f"SGLang {version}+simulator refuses variant shadow: Unknown speculative algorithm name: DDTREE"
    assert result["error"]["stage"] == stage


def test_the_ddtree_build_takes_its_algorithm(sim, capsys):
    argv = MODEL + ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", str(MODELS / "Qwen3.6-27B-DFlash")]
    rc, result = run(capsys, argv=argv, environment=sim("0.5.11", ddtree=True))
    assert rc == 0, result


@pytest.mark.parametrize("version, refused", [
    ("0.5.11", "Ngram speculative decoding only supports CUDA device."),
    ("0.5.15", "Ngram speculative decoding only supports CUDA device."),
    ("0.5.16", None),
    ("0.5.23", None),
])
def test_ngram_on_cpu(sim, capsys, version, refused):
    rc, result = run(capsys, argv=CPU + ["--speculative-algorithm", "NGRAM"], environment=sim(version), label="variant cpu-ngram")
    if refused:
        assert rc == 1 and result["msg"] == f"SGLang {version}+simulator refuses variant cpu-ngram: {refused}"
    else:
        assert rc == 0, result
        assert result["resolved"]["device"] == "cpu"


def test_the_radix_rule_comes_before_the_algorithms_own(sim, capsys):
    """0.5.10-0.5.13 run _handle_model_specific_adjustments before _handle_speculative_decoding
    (0.5.11 server_args.py:845, :882): radix cache on, the hybrid model's refusal comes first."""
    argv = [a for a in CPU if a != "--disable-radix-cache"] + ["--speculative-algorithm", "NGRAM"]
    rc, result = run(capsys, argv=argv, environment=sim("0.5.11"))
    assert rc == 1 and result["error"]["message"] == RADIX
    rc, result = run(capsys, argv=MODEL + ["--speculative-algorithm", "DFLASH"], environment=sim("0.5.11"))
    assert rc == 1 and result["error"]["message"] == RADIX
    rc, result = run(capsys, argv=MODEL + ["--speculative-algorithm", "DFLASH", "--disable-radix-cache"], environment=sim("0.5.11"))
    assert rc == 1
    assert result["error"]["message"] == "DFLASH speculative decoding requires setting --speculative-draft-model-path."


def test_ngram_on_an_unknown_device_in_0_5_16(sim, capsys):
    rc, result = run(capsys, argv=CPU[:2] + ["--device", "npu", "--speculative-algorithm", "NGRAM"], environment=sim("0.5.16"))
    assert rc == 1
    assert result["error"]["message"] == "Ngram speculative decoding only supports CUDA or CPU devices."


def test_an_unknown_flag_is_argparses_refusal(sim, capsys):
    rc, result = run(capsys, argv=MODEL + ["--no-such-flag"], environment=sim("0.5.11"), label="variant x")
    assert rc == 1
    assert result["msg"] == "SGLang 0.5.11+simulator refuses variant x: sglang serve: error: unrecognized arguments: --no-such-flag"
    assert result["error"]["type"] == "SystemExit" and result["error"]["code"] == 2


def test_the_removed_cuda_graph_flag_is_ambiguous_from_0_5_20(sim, capsys):
    rc, result = run(capsys, argv=MODEL + ["--cuda-graph-max-bs", "16"], environment=sim("0.5.20"))
    assert rc == 1
    assert result["error"]["message"] == ("sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
                                          "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill")
    rc, result = run(capsys, argv=MODEL + ["--cuda-graph-max-bs", "16"], environment=sim("0.5.19"))
    assert rc == 0 and result["resolved"]["cuda_graph_max_bs"] == 16


def test_the_config_file_is_not_read(sim, capsys):
    """The unit's --config file exists only inside the unit: dropped, not refused as missing."""
    argv = MODEL + NEXTN + ["--config", "/run/credentials/sglang.service/sglang.yaml"]
    rc, result = run(capsys, argv=argv, environment=sim("0.5.11"))
    assert rc == 0, result
    # the control: the simulator itself refuses it, as real SGLang does
    env = dict(sim("0.5.11"), HOME="/tmp")
    proc = subprocess.run([sys.executable, "-c", "import sys; from sglang.srt.server_args import prepare_server_args; "
                           "prepare_server_args(sys.argv[1:])", *argv], env=env, capture_output=True, text=True, check=False)
    assert "ValueError: Config file not found: /run/credentials/sglang.service/sglang.yaml" in proc.stderr


def test_the_modules_own_environment_and_the_option_on_top(sim, capsys, monkeypatch, tmp_path):
    site = sim("0.5.11")["PYTHONPATH"]
    monkeypatch.setenv("PYTHONPATH", site)
    rc, result = run(capsys, argv=MODEL + NEXTN)
    assert rc == 0, result
    # the option wins over the module's environment
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nothing-here"))
    rc, result = run(capsys, argv=MODEL + NEXTN, environment={"PYTHONPATH": site})
    assert rc == 0, result
    rc, result = run(capsys, argv=MODEL + NEXTN)
    assert rc == 1
    assert result["msg"].startswith(f"SGLang cannot be imported by {sys.executable} to check the server arguments: "
                                    "ModuleNotFoundError: No module named 'sglang'")
    assert result["error"]["stage"] == "import"


def test_check_mode_runs_the_same_check(sim, capsys):
    rc, result = run(capsys, check_mode=True, argv=WITH_RADIX, environment=sim("0.5.11"))
    assert rc == 1 and result["msg"].endswith(RADIX)
    rc, result = run(capsys, check_mode=True, argv=MODEL + NEXTN, environment=sim("0.5.11"))
    assert rc == 0 and result["changed"] is False


def stand_in_python(tmp_path, body: str) -> str:
    """An interpreter stand-in (a test double): a shell script that reads its request first, as
    the harness does before it imports SGLang."""
    return str(write_executable(tmp_path / "python", "#!/bin/sh\ncat > /dev/null\n" + body + "\n"))


def test_a_hanging_check_is_killed_at_the_timeout(capsys, tmp_path):
    python = stand_in_python(tmp_path, "echo 'importing sglang' >&2\nexec sleep 120")
    rc, result = run(capsys, python=python, argv=MODEL, timeout=2, label="variant nextn")
    assert rc == 1
    assert result["msg"] == (f"SGLang's argument check of variant nextn did not finish within 2 s in {python} (killed); "
                             "its last output: importing sglang"), result
    assert result["rc"] == 124 and 2 <= result["elapsed"] < 15


def test_a_crashed_harness_says_so_with_its_stderr(capsys, tmp_path):
    python = stand_in_python(tmp_path, "echo 'Fatal Python error: Segmentation fault' >&2\nexit 139")
    rc, result = run(capsys, python=python, argv=MODEL, label="rollback target cpu")
    assert rc == 1
    assert result["msg"] == (f"SGLang's argument check of rollback target cpu crashed in {python} (exit 139) without an "
                             "answer: Fatal Python error: Segmentation fault"), result
    assert result["stderr"] == "Fatal Python error: Segmentation fault"


def test_an_interpreter_gone_before_it_read_its_request_is_named(capsys, tmp_path, monkeypatch):
    """The module writes the request to the interpreter's stdin: one that died at once makes that
    write fail (EPIPE), which must not end the module with run_command's bare "Error executing command"."""
    python = stand_in_python(tmp_path, "exit 0")

    def gone(_module, *_args, **_kwargs):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(sglang_server_args.AnsibleModule, "run_command", gone)
    rc, result = run(capsys, python=python, argv=MODEL, label="variant nextn")
    assert rc == 1
    assert result["msg"] == (f"SGLang's argument check of variant nextn could not run in {python}: it ended before it "
                             "read its request ([Errno 32] Broken pipe)"), result


def test_a_missing_venv(capsys, tmp_path):
    rc, result = run(capsys, python=str(tmp_path / "venv/bin/python"), argv=MODEL, label="variant cpu")
    assert rc == 1
    assert result["msg"] == (f"cannot check variant cpu: {tmp_path}/venv/bin/python does not exist or is not executable: "
                             "the SGLang virtual environment is not installed")


def test_timeout_must_be_positive(capsys):
    rc, result = run(capsys, argv=MODEL, timeout=0)
    assert rc == 1 and result["msg"] == "timeout must be at least 1 second, got 0"
