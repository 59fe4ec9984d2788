"""_model_config: the one reader of model directories, on the lab's model
configs (Qwen3.6-27B keeps its language model in text_config; the DFlash
draft is a plain config) and on broken directories."""

from __future__ import annotations

import json

import pytest
from sim_helpers import MODELS

from ansible_collections.inferops.sglang.plugins.module_utils import _memplan
from ansible_collections.inferops.sglang.plugins.module_utils import _model_config as mc

QWEN = MODELS / "Qwen3.6-27B"
DRAFT = MODELS / "Qwen3.6-27B-DFlash"


def test_qwen36_reads_its_text_config():
    model = mc.read(str(QWEN))
    config = json.loads((QWEN / "config.json").read_text())
    index = json.loads((QWEN / "model.safetensors.index.json").read_text())
    assert model["config"] == config
    assert model["text_config"] == config["text_config"]
    assert model["architecture"] == config["architectures"][0] == "Qwen3_5ForConditionalGeneration"
    assert model["max_position_embeddings"] == config["text_config"]["max_position_embeddings"] == 262144
    assert model["weight_bytes"] == index["metadata"]["total_size"]
    assert mc.heads(model["config"]) == {"num_attention_heads": 24, "num_key_value_heads": 4,
                                         "linear_num_key_heads": 16, "linear_num_value_heads": 48}


def test_a_plain_config_is_its_own_text_config():
    model = mc.read(str(DRAFT), weights=False)
    assert model["text_config"] is model["config"] and model["weight_bytes"] is None


def test_llm_config_counts_as_the_text_config():
    assert mc.text_config({"llm_config": {"hidden_size": 8}, "hidden_size": 1}) == {"hidden_size": 8}
    empty = {"text_config": {}, "hidden_size": 1}
    assert mc.text_config(empty) is empty


# A language model part and a top level that differ in every number the readers take.
LANGUAGE = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 16, "num_key_value_heads": 4}
TOP = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 8}


@pytest.mark.parametrize("config, expected", [
    ({"llm_config": LANGUAGE, **TOP}, LANGUAGE),
    ({"llm_config": LANGUAGE}, LANGUAGE),
    ({"text_config": TOP, "llm_config": LANGUAGE}, LANGUAGE),
    ({"language_config": LANGUAGE, **TOP}, LANGUAGE),
    ({"thinker_config": {"text_config": LANGUAGE, "audio_config": {}}, **TOP}, LANGUAGE),
    ({"thinker_config": LANGUAGE, **TOP}, LANGUAGE),
    ({"text_config": LANGUAGE, **TOP}, LANGUAGE),
    ({"text_config": "see the top level", **TOP}, TOP),
    ({"text_config": {}, "llm_config": None, **TOP}, TOP),
    ({"architectures": ["LlavaLlamaForCausalLM"], "text_config": LANGUAGE, **TOP}, TOP),
    ({"architectures": ["LlavaForConditionalGeneration"], "text_config": LANGUAGE, **TOP}, LANGUAGE),
])
def test_heads_and_the_planner_read_the_same_language_model(config, expected):
    """text_config() is the one rule: the head counts TP must divide and the planner's
    shapes come from the same part of the config, in SGLang's order of sub-configs."""
    assert mc.text_config(config) is (config if expected is TOP else expected)
    assert mc.heads(config) == {"num_attention_heads": expected["num_attention_heads"],
                                "num_key_value_heads": expected.get("num_key_value_heads",
                                                                    expected["num_attention_heads"])}
    spec = _memplan.model_spec(config, 1 << 30)
    assert (spec["num_layers"], spec["hidden_size"], spec["num_attention_heads"]) == (
        expected["num_hidden_layers"], expected["hidden_size"], expected["num_attention_heads"])


def test_a_language_model_part_without_heads_is_not_read_past():
    """A sub-config is the language model even where it lacks the heads: the top
    level's are another model's (SGLang fails there too), so heads() says so."""
    with pytest.raises(mc.ModelConfigError, match="the language model's part of config.json has no num_attention_heads"):
        mc.heads({"text_config": {"hidden_size": 64}, **TOP})
    with pytest.raises(mc.ModelConfigError, match="^config.json has no num_attention_heads"):
        mc.heads({"hidden_size": 64})


def test_weights_from_safetensors_files(tmp_path):
    (tmp_path / "config.json").write_text('{"num_attention_heads": 4}')
    (tmp_path / "a.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "b.safetensors").write_bytes(b"y" * 5)
    assert mc.read(str(tmp_path))["weight_bytes"] == 15


@pytest.mark.parametrize("files, message", [
    ({}, "has no readable config.json"),
    ({"config.json": "{oops"}, "has no readable config.json"),
    ({"config.json": "[1]"}, "config.json is not a JSON object (it holds a list)"),
    ({"config.json": "{}"}, "has neither model.safetensors.index.json (metadata.total_size) nor *.safetensors files"),
    ({"config.json": "{}", "model.safetensors.index.json": "{bad"}, "model.safetensors.index.json is not readable"),
    ({"config.json": '{"max_position_embeddings": "long"}'}, "max_position_embeddings is not a number"),
])
def test_errors_name_the_directory(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(mc.ModelConfigError) as exc:
        mc.read(str(tmp_path), what="model_path")
    assert message in str(exc.value) and str(tmp_path) in str(exc.value)


def test_missing_directory_and_own_error_class(tmp_path):
    class PlanError(Exception):
        pass

    with pytest.raises(PlanError) as exc:
        mc.read(str(tmp_path / "absent"), what="model_path", error=PlanError)
    assert str(exc.value) == f"model_path {tmp_path / 'absent'} does not exist on the host"


def test_heads():
    assert mc.heads({"num_attention_heads": 8}) == {"num_attention_heads": 8, "num_key_value_heads": 8}
    with pytest.raises(mc.ModelConfigError):
        mc.heads({"num_attention_heads": True})
    with pytest.raises(mc.ModelConfigError):
        mc.heads({"text_config": {"hidden_size": 1}})


@pytest.mark.parametrize("path, hidden", [
    ("/tmp/models/qwen", "/tmp"),
    ("/var/tmp/qwen", "/var/tmp"),
    ("/root/models/qwen", "/root"),
    ("/home/ops/qwen", "/home"),
    ("/run/user/0/qwen", "/run/user"),
    ("/srv/../root/qwen", "/root"),
])
def test_the_sandbox_hides_tmp_and_home_from_the_service(path, hidden):
    problem = mc.sandbox_problem(path, "model_path")
    assert problem is not None and problem.startswith(f"model_path {path} is under {hidden}")
    assert "systemd.exec(5)" in problem


@pytest.mark.parametrize("path", ["/srv/models/qwen", "/homes/qwen", "/opt/tmp/qwen", "/run/users/qwen"])
def test_paths_the_service_sees(path):
    assert mc.sandbox_problem(path) is None


def test_a_symlink_into_a_hidden_directory_is_followed(tmp_path, monkeypatch):
    """A model directory reached through a symlink into a hidden directory, and a directory whose
    files link into one (a Hugging Face cache snapshot), are as invisible to the service."""
    home = tmp_path / "home"
    monkeypatch.setattr(mc, "SANDBOX_HIDDEN", {str(home): "ProtectHome=yes (test stand-in)"})
    (home / "ops" / "qwen").mkdir(parents=True)
    (home / "ops" / "qwen" / "config.json").write_text("{}")
    srv = tmp_path / "srv"
    srv.mkdir()
    (srv / "qwen").symlink_to(home / "ops" / "qwen")
    problem = mc.sandbox_problem(str(srv / "qwen"), "model_path")
    assert problem is not None and f"is under {home} (through {home / 'ops' / 'qwen'})" in problem
    # a link on the way, not the last component
    (srv / "models").symlink_to(home / "ops")
    assert f"(through {home / 'ops' / 'qwen'})" in mc.sandbox_problem(str(srv / "models" / "qwen"))
    # a snapshot directory whose files are links to blobs in a hidden cache
    snapshot = srv / "snapshot"
    snapshot.mkdir()
    (snapshot / "config.json").symlink_to(home / "ops" / "qwen" / "config.json")
    assert f"(through {home / 'ops' / 'qwen' / 'config.json'})" in mc.sandbox_problem(str(snapshot))
    plain = srv / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    assert mc.sandbox_problem(str(plain)) is None
