# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one reader of a model directory: its ``config.json`` and its weight size.

Every module that needs a model's configuration reads it here (gpu_facts for
the head counts tensor parallelism splits, sglang_variant for the context
length, the memory planner for the whole profile), so a directory is judged the
same way everywhere and every failure names the directory and what is wrong.

- ``read(path)``: ``{"path", "config", "text_config", "architecture",
  "model_type", "max_position_embeddings", "weight_bytes"}``. A multimodal
  model (Qwen3.6 is ``Qwen3_5ForConditionalGeneration``) keeps its language
  model's numbers in a sub-config; ``text_config`` here is that dict, or the
  config itself, by ``text_config()``, the one rule the planner and ``heads``
  use too.
- the weight size is the safetensors index's ``metadata.total_size``, else the
  sum of the ``*.safetensors`` files.
- ``heads(config)``: the head counts a TP size must divide.

- ``sandbox_problem(path)``: why the sandboxed service cannot see a directory
  (under ``/tmp``, ``/var/tmp``, ``/root``, ``/home`` or ``/run/user``, as given
  or through a symlink), or None.

Errors raise ``error`` (``ModelConfigError`` unless the caller passes its own
exception class, as the planner does with its PlanError).
"""

from __future__ import annotations

import json
import os

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"


class ModelConfigError(ValueError):
    """A model directory cannot be used; the message names it and says why."""


# What the unit's sandbox hides from the server (roles/sglang_service/templates/sglang.service.j2),
# per systemd.exec(5), SANDBOXING: PrivateTmp=yes mounts a private /tmp and /var/tmp for the
# service ("not shared by processes outside of the namespace"); ProtectHome=yes makes /home,
# /root and /run/user "inaccessible and empty for processes invoked by this unit".
SANDBOX_HIDDEN = {
    "/tmp": "PrivateTmp=yes gives the service a /tmp of its own",
    "/var/tmp": "PrivateTmp=yes gives the service a /var/tmp of its own",
    "/root": "ProtectHome=yes makes /root inaccessible to the service",
    "/home": "ProtectHome=yes makes /home inaccessible to the service",
    "/run/user": "ProtectHome=yes makes /run/user inaccessible to the service",
}
_MAX_LINKS = 40


def traversed(path: str) -> list[str]:
    """Every absolute path the kernel walks to reach ``path``: the path as given and, for
    each symbolic link on the way, where it points (component by component, as a lookup in
    the service's namespace would walk it). A missing component ends the walk there."""
    walked = [os.path.normpath(path)]
    pending = [part for part in os.path.normpath(path).split("/") if part]
    current = "/"
    links = 0
    while pending:
        part = pending.pop(0)
        candidate = os.path.normpath(os.path.join(current, part))
        if os.path.islink(candidate) and links < _MAX_LINKS:
            links += 1
            target = os.readlink(candidate)
            resolved = os.path.normpath(os.path.join(current, target))
            walked.append(os.path.normpath(os.path.join(resolved, *pending)) if pending else resolved)
            pending = [p for p in resolved.split("/") if p] + pending
            current = "/"
            continue
        current = candidate
    walked.append(current)
    return list(dict.fromkeys(walked))


def _hidden(path: str) -> tuple[str, str, str] | None:
    """(the path walked, the hidden directory, why) for the first path walked to ``path`` that the sandbox hides."""
    for seen in traversed(path):
        for hidden, why in SANDBOX_HIDDEN.items():
            if seen == hidden or seen.startswith(hidden + "/"):
                return seen, hidden, why
    return None


def sandbox_problem(path: str, what: str = "model directory") -> str | None:
    """Why the sandboxed service could not read ``path``, or None: the directory, a symlink on the
    way to it, or a symlink in it (a Hugging Face cache's snapshot links its files to blobs
    elsewhere) is under a directory the unit's sandbox hides."""
    found = _hidden(path)
    if found is None and os.path.isdir(path):
        try:
            links = sorted(entry for entry in os.listdir(path) if os.path.islink(os.path.join(path, entry)))
        except OSError:
            links = []
        for entry in links:
            found = _hidden(os.path.join(path, entry))
            if found is not None:
                break
    if found is None:
        return None
    seen, hidden, why = found
    via = "" if seen == os.path.normpath(path) else f" (through {seen})"
    return (f"{what} {path} is under {hidden}{via}, which the sandboxed service cannot see: {why} "
            "(systemd.exec(5), SANDBOXING). Put it where the service can read it, e.g. /srv/models")


# Where a multimodal config keeps its language model, in the order SGLang looks
# (get_hf_text_config, sglang 0.5.11 sglang/srt/utils/hf_transformers/common.py:204-270).
TEXT_CONFIG_KEYS = ("thinker_config", "llm_config", "language_config", "text_config")


def text_config(config: dict) -> dict:
    """The language model's part of a config, the collection's one rule for it.

    The first non-empty dict under ``thinker_config`` (its own ``text_config`` when
    it has one), ``llm_config``, ``language_config`` or ``text_config``, else the
    config itself. A ``Llava*ForCausalLM`` config is always its own: SGLang reads
    the top level of those and ignores their ``text_config``. Anything else under
    those keys (a string, a list, an empty dict) does not count.
    """
    architectures = config.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures else None
    if isinstance(name, str) and name.startswith("Llava") and name.endswith("ForCausalLM"):
        return config
    for key in TEXT_CONFIG_KEYS:
        part = config.get(key)
        if isinstance(part, dict) and part:
            inner = part.get("text_config") if key == "thinker_config" else None
            return inner if isinstance(inner, dict) and inner else part
    return config


def load_config(path: str, what: str = "model directory", error: type = ModelConfigError) -> dict:
    """``path``/config.json as a dict."""
    if not os.path.isdir(path):
        raise error(f"{what} {path} does not exist on the host")
    name = os.path.join(path, CONFIG)
    try:
        with open(name, "r", encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise error(f"{what} {path} has no readable config.json ({exc})") from exc
    if not isinstance(config, dict):
        raise error(f"{what} {path}: config.json is not a JSON object (it holds a {type(config).__name__})")
    return config


def weight_bytes(path: str, what: str = "model directory", error: type = ModelConfigError) -> int:
    """The weights' size in bytes: the index's metadata.total_size, else the *.safetensors files."""
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        try:
            with open(index, "r", encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise error(f"{what} {path}: {INDEX} is not readable ({exc})") from exc
        total = (data.get("metadata") or {}).get("total_size") if isinstance(data, dict) else None
        if total:
            try:
                return int(total)
            except (TypeError, ValueError) as exc:
                raise error(f"{what} {path}: {INDEX} metadata.total_size is not a number ({total!r})") from exc
    try:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    except OSError as exc:
        raise error(f"{what} {path} cannot be listed ({exc})") from exc
    if not files:
        raise error(f"{path} has neither {INDEX} (metadata.total_size) nor *.safetensors files")
    return sum(os.path.getsize(os.path.join(path, f)) for f in files)


def read(path: str, weights: bool = True, what: str = "model directory", error: type = ModelConfigError) -> dict:
    """A model directory: its config, the language model's part of it, and (``weights``) the weight size."""
    config = load_config(path, what, error)
    text = text_config(config)
    architectures = config.get("architectures") or text.get("architectures") or []
    max_len = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    try:
        max_len = int(max_len) if max_len else None
    except (TypeError, ValueError) as exc:
        raise error(f"{what} {path}: max_position_embeddings is not a number ({max_len!r})") from exc
    return {
        "path": path,
        "config": config,
        "text_config": text,
        "architecture": architectures[0] if isinstance(architectures, list) and architectures else None,
        "model_type": str(config.get("model_type") or text.get("model_type") or ""),
        "max_position_embeddings": max_len,
        "weight_bytes": weight_bytes(path, what, error) if weights else None,
    }


def heads(config: dict, error: type = ModelConfigError) -> dict:
    """The head counts tensor parallelism splits, from the language model's part of
    the config (``text_config()``).

    ``num_key_value_heads`` defaults to ``num_attention_heads`` (no GQA). Linear
    attention head counts (``linear_num_key_heads``, ``linear_num_value_heads``)
    are included when the model has them: they are split the same way.
    """
    source = text_config(config)
    count = source.get("num_attention_heads")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        where = "config.json" if source is config else "the language model's part of config.json"
        raise error(f"{where} has no num_attention_heads (a positive integer)")
    result = {"num_attention_heads": count, "num_key_value_heads": source.get("num_key_value_heads") or count}
    for key in ("linear_num_key_heads", "linear_num_value_heads"):
        if isinstance(source.get(key), int) and source[key] > 0:
            result[key] = source[key]
    return result
