"""The lab's case units (lab/playbooks/templates/sglang-lab.service.j2 over
lab/field_cases.yml, with lab_gpu_devices the GPUs of the host manifest as
lab/playbooks/field_cases.yml reads them): per-case Environment= lines, and the
graph-hang case run by the simulator on ct129's stand-in stalls silently in
CUDA graph capture."""

from __future__ import annotations

import shlex
import time

import jinja2
import yaml
from sim_helpers import LAB, MODELS, free_port

CASES = yaml.safe_load((LAB / "field_cases.yml").read_text())


def case(name: str) -> dict:
    return next(c for c in CASES["lab_cases"] if c["name"] == name)


def render(item: dict) -> str:
    """The unit as Ansible's template module renders it (trim_blocks on)."""
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["comment"] = lambda text: f"# {text}"
    text = (LAB / "playbooks" / "templates" / "sglang-lab.service.j2").read_text()
    return env.from_string(text).render(item=item, ansible_managed="managed", lab_gpu_devices=[0, 2],
                                        lab_common_args=CASES["lab_common_args"])


def test_a_case_env_becomes_environment_lines_and_others_get_none():
    hang = render(case("graph-hang")).splitlines()
    assert "Environment=SGLANG_SIMULATOR_HANG=cuda_graph" in hang
    assert [x for x in render(case("nextn")).splitlines() if x.startswith("Environment=")] == [
        "Environment=CUDA_VISIBLE_DEVICES=0,2", "Environment=NO_PROXY=127.0.0.1,localhost"]
    service = hang[hang.index("[Service]") + 1:]
    assert service[1:4] == ["Environment=CUDA_VISIBLE_DEVICES=0,2", "Environment=NO_PROXY=127.0.0.1,localhost",
                            "Environment=SGLANG_SIMULATOR_HANG=cuda_graph"]
    assert service[4].startswith("ExecStart=/opt/sglang/venv/bin/python -m sglang.launch_server ")  # no blank line from the loop


def test_graph_hang_is_the_nextn_server_with_the_hang():
    assert case("graph-hang")["args"] == case("nextn")["args"] and case("graph-hang")["expect"] == "stalled"


def test_graph_hang_stalls_in_capture_on_ct129(launch, monkeypatch):
    for name, value in case("graph-hang")["env"].items():
        monkeypatch.setenv(name, value)
    args = shlex.split(CASES["lab_common_args"] + " " + case("graph-hang")["args"])
    args = [str(MODELS / "Qwen3.6-27B") if a == "/srv/models/Qwen3.6-27B" else a for a in args]
    args[args.index("--port") + 1] = str(free_port())
    server = launch(args, host="ct129", gpus="0,2")
    server.port = int(args[args.index("--port") + 1])
    entered = "Capture cuda graph begin. This can take up to several minutes."  # 0.5.11 model_runner.py:2778-2780
    server.wait_for(lambda: entered in server.output(), what="capture begin")
    time.sleep(2)
    out = server.output()
    assert out.rstrip().endswith("GB") and entered in out.splitlines()[-1]
    assert server.proc.poll() is None and server.status("/v1/models") is None
