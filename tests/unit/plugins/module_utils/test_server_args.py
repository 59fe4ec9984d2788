"""_server_args: the harness program, run for real by this interpreter against a
fake ``sglang`` package written by the tests (a test double whose
prepare_server_args / resolve_once / check_server_args refuse on request), and the
parsing of its answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _server_args as sa

# The fake SGLang (a test double): argparse as real prepare_server_args builds it
# (prog "sglang serve"), output on both stdout levels as real SGLang's libraries
# print, and a refusal at the stage --fail-at names.
FAKE_SERVER_ARGS = '''
"""Fake sglang.srt.server_args (a test double of the unit tests)."""
import argparse
import os
import sys


class ServerArgs:
    def __init__(self, ns):
        self.__dict__.update(vars(ns))

    def check_server_args(self):
        sys.stderr.write("fake: check_server_args\\n")
        if self.fail_at == "check":
            assert self.tp_size % 3 == 0, "tp_size must be divisible by number of nodes"  # CHECK


class ResolvingServerArgs(ServerArgs):
    def resolve_once(self):
        sys.stderr.write("fake: resolve_once\\n")
        if self.fail_at == "resolve":
            raise ValueError("Unknown speculative algorithm name: DDTREE")  # RESOLVE
        self.max_running_requests = 48


def prepare_server_args(argv):
    parser = argparse.ArgumentParser(prog="sglang serve")
    parser.add_argument("--model-path")
    parser.add_argument("--fail-at")
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--max-running-requests", type=int)
    parser.add_argument("--config")
    print("fake: python-level output on stdout")
    os.write(1, b"fake: fd 1 output\\n")
    ns = parser.parse_args(argv)
    sys.stderr.write("fake: argv %r\\n" % (argv,))
    if ns.config:
        raise ValueError("Config file not found: %s" % ns.config)
    if ns.fail_at == "prepare":
        raise ValueError("Ngram speculative decoding only supports CUDA device.")  # PREPARE
    if ns.fail_at == "exit":
        sys.exit(3)
    cls = ResolvingServerArgs if os.environ.get("FAKE_RESOLVE_ONCE") == "1" else ServerArgs
    return cls(ns)
'''


@pytest.fixture
def fake_sglang(tmp_path) -> Path:
    """A directory holding the fake sglang package (no dist-info: the version comes from __version__)."""
    root = tmp_path / "fake-site"
    (root / "sglang" / "srt").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text('__version__ = "0.5.99"\n')
    (root / "sglang" / "srt" / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "server_args.py").write_text(FAKE_SERVER_ARGS)
    return root


def harness(site: Path, argv: list[str], **env: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAKE_RESOLVE_ONCE")}
    environ.update(PYTHONPATH=str(site), **env)
    proc = subprocess.run(sa.command(sys.executable, 60), input=sa.request(argv), capture_output=True, text=True,
                          env=environ, timeout=90, check=False)
    return proc, sa.parse_answer(proc.stdout)


def line_of(marker: str) -> int:
    return next(i for i, line in enumerate(FAKE_SERVER_ARGS.splitlines(), 1) if line.rstrip().endswith("# " + marker))


def test_accepted_with_the_fields_and_only_the_answer_on_stdout(fake_sglang):
    proc, answer = harness(fake_sglang, ["--model-path", "/m", "--tp-size", "2"])
    assert proc.returncode == 0, proc.stderr
    assert answer["ok"] is True and answer["error"] is None
    assert answer["sglang_version"] == "0.5.99"
    # fields the release has, as it resolved them; those it lacks are left out
    assert answer["resolved"] == {"tp_size": 2, "max_running_requests": None}
    # everything SGLang prints goes to stderr, python-level and fd-level alike
    assert proc.stdout.strip().splitlines() == [proc.stdout.strip()] and proc.stdout.strip().startswith(sa.MARKER)
    assert "fake: python-level output on stdout" in proc.stderr and "fake: fd 1 output" in proc.stderr
    assert "fake: check_server_args" in answer["log"]


def test_resolve_once_runs_only_where_it_exists(fake_sglang):
    _proc, without = harness(fake_sglang, ["--model-path", "/m"])
    _proc, with_it = harness(fake_sglang, ["--model-path", "/m"], FAKE_RESOLVE_ONCE="1")
    assert "fake: resolve_once" not in without["log"]
    assert with_it["log"].index("fake: resolve_once") < with_it["log"].index("fake: check_server_args")
    assert with_it["resolved"]["max_running_requests"] == 48


@pytest.mark.parametrize("stage, marker, kind, message", [
    ("prepare_server_args", "PREPARE", "ValueError", "Ngram speculative decoding only supports CUDA device."),
    ("resolve_once", "RESOLVE", "ValueError", "Unknown speculative algorithm name: DDTREE"),
    ("check_server_args", "CHECK", "AssertionError", "tp_size must be divisible by number of nodes"),
])
def test_each_stage_refuses_with_the_exception_as_raised(fake_sglang, stage, marker, kind, message):
    flag = {"prepare_server_args": "prepare", "resolve_once": "resolve", "check_server_args": "check"}[stage]
    proc, answer = harness(fake_sglang, ["--model-path", "/m", "--fail-at", flag, "--tp-size", "2"], FAKE_RESOLVE_ONCE="1")
    assert proc.returncode == 0, proc.stderr
    assert answer["ok"] is False
    assert answer["error"] == {"type": kind, "message": message, "stage": stage,
                               "where": f"sglang/srt/server_args.py:{line_of(marker)}"}
    assert sa.refusal(answer, "variant x", sys.executable) == f"SGLang 0.5.99 refuses variant x: {message}"


def test_argparse_exit_is_caught_with_its_message(fake_sglang):
    proc, answer = harness(fake_sglang, ["--model-path", "/m", "--no-such-flag"])
    assert proc.returncode == 0
    assert answer["error"] == {"type": "SystemExit", "code": 2, "where": "argparse", "stage": "prepare_server_args",
                               "message": "sglang serve: error: unrecognized arguments: --no-such-flag"}
    assert answer["resolved"] == {}
    # argparse's usage and message still reach stderr
    assert "usage: sglang serve" in proc.stderr


def test_a_sys_exit_without_a_message(fake_sglang):
    _proc, answer = harness(fake_sglang, ["--model-path", "/m", "--fail-at", "exit"])
    assert answer["error"]["type"] == "SystemExit" and answer["error"]["code"] == 3
    assert answer["error"]["message"] == "exit 3"


@pytest.mark.parametrize("config", [["--config", "/run/credentials/sglang.service/sglang.yaml"],
                                    ["--config=/run/credentials/sglang.service/sglang.yaml"]])
def test_config_pairs_are_dropped(fake_sglang, config):
    proc, answer = harness(fake_sglang, ["--model-path", "/m", *config, "--tp-size", "2"])
    assert answer["ok"] is True, answer
    assert answer["config_dropped"] == 1
    assert "fake: argv ['--model-path', '/m', '--tp-size', '2']" in proc.stderr
    # the control: the fake itself refuses a --config file it cannot read
    raw = subprocess.run([sys.executable, "-c", "import sys; from sglang.srt.server_args import prepare_server_args as p; "
                          "p(sys.argv[1:])", "--config", "/run/x.yaml"], env=dict(os.environ, PYTHONPATH=str(fake_sglang)),
                         capture_output=True, text=True, check=False)
    assert "Config file not found: /run/x.yaml" in raw.stderr


def test_import_failure_is_an_answer_at_the_import_stage(tmp_path):
    site = tmp_path / "broken-site"
    (site / "sglang").mkdir(parents=True)
    # a fresh 0.5.11 install with kernels 0.17 dies like this at import (real-sglang.md)
    (site / "sglang" / "__init__.py").write_text('raise ValueError("Either a revision or a version must be specified.")\n')
    proc, answer = harness(site, ["--model-path", "/m"])
    assert proc.returncode == 0, proc.stderr
    assert answer["error"]["stage"] == "import" and answer["error"]["type"] == "ValueError"
    message = sa.refusal(answer, "variant cpu", "/opt/sglang/venv/bin/python")
    assert message.startswith("SGLang cannot be imported by /opt/sglang/venv/bin/python to check variant cpu: ValueError: "
                              "Either a revision or a version must be specified.")


def test_the_harness_is_a_module_whose_main_runs_only_as_main():
    module = types.ModuleType("harness_under_test")
    exec(compile(sa.HARNESS_SOURCE, "HARNESS_SOURCE", "exec"), module.__dict__)  # noqa: S102 - what validate_args.py does
    assert module.RESOLVED_FIELDS == sa.RESOLVED_FIELDS and module.MARKER == sa.MARKER
    assert module.drop_config(["--a", "1", "--config", "x.yaml", "--b", "--config=y.yml"]) == (["--a", "1", "--b"], 2)
    assert module.drop_config(["--model-path", "m", "--config"]) == (["--model-path", "m"], 1)
    assert module.plain({"a": (1, 2.5, None), 3: object}) == {"a": [1, 2.5, None], "3": str(object)}


# -- parsing the answer ------------------------------------------------------------------------

def test_parse_answer_takes_the_last_marker_line():
    first = json.dumps({"ok": False})
    last = json.dumps({"ok": True, "sglang_version": "0.5.11"})
    out = f"noise\n{sa.MARKER}{first}\nmore noise\n{sa.MARKER}{last}\n"
    assert sa.parse_answer(out) == {"ok": True, "sglang_version": "0.5.11"}
    assert sa.parse_answer("no marker at all") is None
    assert sa.parse_answer(f"{sa.MARKER}{{not json") is None
    assert sa.parse_answer(f"{sa.MARKER}[1, 2]") is None
    assert sa.parse_answer("") is None and sa.parse_answer(None) is None


@pytest.mark.parametrize("rc", [124, 137])
def test_outcome_timeout(rc):
    with pytest.raises(sa.HarnessError) as exc:
        sa.outcome(rc, "", "Traceback ...\nimporting torch", "/v/bin/python", "variant nextn", 30)
    assert str(exc.value) == ("SGLang's argument check of variant nextn did not finish within 30 s in /v/bin/python "
                              "(killed); its last output: Traceback ...\nimporting torch")


def test_outcome_crash_keeps_the_stderr_tail():
    stderr = "x" * 5000 + "\nFatal Python error: Segmentation fault"
    with pytest.raises(sa.HarnessError) as exc:
        sa.outcome(-11, "", stderr, "/v/bin/python", "variant nextn", 30)
    text = str(exc.value)
    assert text.startswith("SGLang's argument check of variant nextn crashed in /v/bin/python (exit -11) without an answer: ...")
    assert text.endswith("Fatal Python error: Segmentation fault") and len(text) < 1700


def test_outcome_with_an_answer_whatever_the_exit():
    assert sa.outcome(1, f"{sa.MARKER}{json.dumps({'ok': True})}\n", "", "p", "l", 5) == {"ok": True}


def test_refusal_messages():
    assert sa.refusal({"ok": True}, "x", "p") is None
    assert sa.refusal({"ok": False, "sglang_version": "0.5.23", "error": {"type": "AssertionError", "message": "",
                                                                          "stage": "check_server_args"}},
                      "rollback target cpu", "p") == "SGLang 0.5.23 refuses rollback target cpu: AssertionError"


def test_environment_values_are_strings():
    assert sa.environment({"SGLANG_USE_CPU_ENGINE": 1, "EMPTY": None, "X": "y"}) == \
        {"SGLANG_USE_CPU_ENGINE": "1", "EMPTY": "", "X": "y"}


def test_command_runs_the_harness_under_timeout():
    argv = sa.command("/opt/sglang/venv/bin/python", 180, "/usr/bin/timeout")
    assert argv[:5] == ["/usr/bin/timeout", "--kill-after=10", "180", "/opt/sglang/venv/bin/python", "-c"]
    assert argv[5] == sa.HARNESS_SOURCE
    assert "__MARKER__" not in sa.HARNESS_SOURCE and "__FIELDS__" not in sa.HARNESS_SOURCE
    assert textwrap.dedent(sa.HARNESS_SOURCE) == sa.HARNESS_SOURCE
