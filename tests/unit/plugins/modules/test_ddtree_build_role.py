"""The ddtree_build role through real ansible-playbook runs on localhost, on a
virtual environment with the real SGLang 0.5.11 installed: the lab's build
(its ddtree_kernels.so needs libcudart.so.12) is proven before it is committed;
the probe rejects it where the unit's environment has no CUDA 12 runtime (ct129),
the build is rolled back to the previous build or to none, and the role fails
naming the library and the file that needs it.

The cases run side by side, each a local host of its own (its venv, state
directory and variables as host vars), in three ansible-playbook runs: a
case's runs follow one another, the cases do not share a run's start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ddtree_helpers import FIXTURES, SGLANG_VERSION, copy_venv, ddtree_overlay, site_packages, tree
from sim_helpers import REPO

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: The role under test
      block:
        - name: DDTree build
          ansible.builtin.include_role:
            name: inferops.sglang.ddtree_build
      always:
        - name: Keep the verdict
          ansible.builtin.copy:
            content: "{{ ddtree_build_facts | default({}) | to_json }}"
            dest: "{{ out }}"
            mode: "0600"
"""
KEEP = "Keep the verdict"


class Run:
    """One host's part of an ansible-playbook run: the exit code the run would have had for
    this host alone, the role's task results in order, its recap and its verdict."""

    def __init__(self, report: dict, host: str, verdict: dict) -> None:
        self.results = [(task["task"]["name"], task["hosts"][host]) for play in report["plays"]
                        for task in play["tasks"] if host in task["hosts"]]
        self.stats = report["stats"][host]
        self.rc = 4 if self.stats.get("unreachable") else 2 if self.stats.get("failures") else 0
        # what the run printed for the host: every message of its tasks, whitespace as one space
        self.out = " ".join(" ".join(str(result.get("msg", "")) for _name, result in self.results).split())
        self.verdict = verdict

    def result(self, task: str) -> dict:
        """The result of this test's own task of that name (never one of the role's)."""
        (found,) = [result for name, result in self.results if name.endswith(task)]
        return found

    def by_action(self, action: str) -> list[dict]:
        """The results of every run of a module, in order."""
        return [result for _name, result in self.results if result.get("action") == action]


def variables(case: Path, venv: Path, **extra) -> dict:
    values = dict(ansible_connection="local", ansible_python_interpreter=sys.executable,
                  ddtree_build_venv=str(venv), ddtree_build_state_dir=str(case / "state"),
                  ddtree_build_source="overlay", ddtree_build_src_dir=str(ddtree_overlay()),
                  ddtree_build_sglang_version=SGLANG_VERSION, ddtree_build_probe_cuda_home="/nonexistent/cuda-13.0",
                  # The libraries check loads libcudart.so.13 from this machine's loader cache, if any:
                  # the build's own check is the ELF one.
                  ddtree_build_probe_checks=["dependencies"], out=str(case / "verdict.json"))
    values.update(extra)
    return values


def play(tmp_path: Path, hosts: dict[str, dict]) -> dict[str, Run]:
    """One ansible-playbook run of the role on these hosts (name -> host vars)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    (tmp_path / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = False\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
               ANSIBLE_LOCALHOST_WARNING="0", USER="alice")
    env.pop("LD_LIBRARY_PATH", None)
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "inventory.yml", "play.yml"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError((proc.stdout + proc.stderr)[-3000:]) from None
    runs = {}
    for host, values in hosts.items():
        out = Path(values["out"])
        runs[host] = Run(report, host, json.loads(out.read_text()) if out.exists() else {})
        out.unlink(missing_ok=True)
    return runs


def manifest(case: Path) -> dict | None:
    path = case / "state" / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else None


def kernels(venv: Path) -> str:
    return os.path.join(os.path.realpath(site_packages(venv)), "sglang/srt/speculative/ddtree_kernels.so")


@pytest.fixture(scope="module")
def cases(pristine, cuda12, tmp_path_factory) -> dict:
    """Three cases, each with a venv of its own: ``ct129`` (the lab's build, no CUDA 12 runtime),
    ``committed`` (with the runtime: committed, run again, then the runtime gone) and ``previous``
    (the fixture's patch series committed, then the lab's build without the runtime). What each
    run left (its part of the run, the package's files, the manifest) is kept for the tests."""
    root = tmp_path_factory.mktemp("ddtree-role")
    case = {name: root / name for name in ("ct129", "committed", "previous")}
    venv = {name: copy_venv(pristine, path / "venv") for name, path in case.items()}
    runtime = {"ddtree_build_probe_library_path": [str(cuda12)]}
    kept: dict = {name: {"venv": venv[name], "case": path, "runs": [], "trees": [tree(site_packages(venv[name]))],
                         "manifests": []} for name, path in case.items()}
    rounds = [
        {"ct129": {}, "committed": runtime,
         "previous": {"ddtree_build_source": "patch", "ddtree_build_src_dir": str(FIXTURES / "patch")}},
        {"committed": runtime, "previous": {}},
        {"committed": {}},
    ]
    for number, hosts in enumerate(rounds, 1):
        runs = play(root / f"run-{number}", {name: variables(case[name], venv[name], **extra) for name, extra in hosts.items()})
        for name, run in runs.items():
            kept[name]["runs"].append(run)
            kept[name]["trees"].append(tree(site_packages(venv[name])))
            kept[name]["manifests"].append(manifest(case[name]))
    return kept


def test_on_ct129_the_build_is_rejected_and_no_build_is_left(cases):
    venv, (run,), (before, after), (left,) = (cases["ct129"][k] for k in ("venv", "runs", "trees", "manifests"))
    out, verdict = run.out, run.verdict
    assert run.rc == 2, out[-3000:]
    assert (f"was rejected by the runtime probe in {venv} and rolled back; SGLang's own files are in place "
            "(no DDTree build).") in out, out[-3000:]
    assert (f"libcudart.so.12 needed by {kernels(venv)} (the DDTree build) does not resolve "
            "(LD_LIBRARY_PATH=/nonexistent/cuda-13.0/lib64, RUNPATH=none)") in out
    assert after == before and left is None
    assert verdict["verdict"] == "rejected" and verdict["restored"] is None and len(verdict["errors"]) == 1
    assert verdict["environment"]["LD_LIBRARY_PATH"] == "/nonexistent/cuda-13.0/lib64"


def test_where_the_unit_has_the_cuda_12_runtime_the_build_is_committed(cases, cuda12):
    (first, again, rejected), manifests = cases["committed"]["runs"], cases["committed"]["manifests"]
    assert first.rc == 0, first.out[-3000:]
    assert manifests[0]["state"] == "applied"
    assert first.verdict["verdict"] == "passed" and first.verdict["build_id"] == manifests[0]["build_id"]
    assert first.verdict["environment"]["LD_LIBRARY_PATH"] == f"/nonexistent/cuda-13.0/lib64:{cuda12}"
    # Proven once, committed: a second run changes nothing and proves it again.
    assert again.rc == 0, again.out[-3000:]
    assert again.stats["changed"] == 1 and again.result(KEEP)["changed"]  # the verdict file this test keeps; nothing of the role's
    # the build's module runs (apply, then commit), known by their module, never by a task's name: each ok
    builds = again.by_action("inferops.sglang.ddtree_build")
    assert [r.get("state") or r.get("invocation", {}).get("module_args", {}).get("state") for r in builds][-1] == "commit", builds
    for result in builds:
        assert not (result.get("changed") or result.get("failed") or result.get("skipped")), result  # ok
    assert again.verdict["verdict"] == "passed"
    # The same build on a host that lost the runtime is not left installed: it is reverted.
    assert rejected.rc == 2 and "and reverted; SGLang's own files are in place (no DDTree build)." in rejected.out, \
        rejected.out[-3000:]
    assert manifests[2]["state"] == "reverted" and rejected.verdict["verdict"] == "rejected"


def test_the_rejected_build_is_rolled_back_to_the_previous_build(cases):
    (first, run), trees, (previous, left) = (cases["previous"][k] for k in ("runs", "trees", "manifests"))
    # The previous build: the fixture's patch series (no shared object), proven and committed.
    assert first.rc == 0 and first.verdict["verdict"] == "passed", first.out[-3000:]
    with_previous = trees[1]
    assert run.rc == 2, run.out[-3000:]
    assert f"rolled back; the previous build {previous['build_id']} is in place again." in run.out
    assert trees[2] == with_previous and left == previous
    assert run.verdict["restored"] == previous["build_id"]
