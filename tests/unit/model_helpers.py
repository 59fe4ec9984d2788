"""Model directories for the tests: real safetensors files (8-byte header length, JSON
header, the tensors' bytes), a sharded model with its index, and a mirror of it with
its manifest."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from ansible_collections.inferops.sglang.plugins.module_utils import _model_stage as ms


def safetensors(tensors: dict[str, int], filler: int = 7) -> bytes:
    """A real safetensors file: 8-byte header length, JSON header, the tensors' bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, size in tensors.items():
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes((filler + i) % 251 for i in range(offset))


def make_model(root: Path, filler: int = 7) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "rev": filler}))
    (root / "model-00001-of-00002.safetensors").write_bytes(safetensors({"a": 300_000, "b": 5}, filler))
    (root / "model-00002-of-00002.safetensors").write_bytes(safetensors({"c": 200_000}, filler + 1))
    (root / ms.INDEX).write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                            "b": "model-00001-of-00002.safetensors",
                                                            "c": "model-00002-of-00002.safetensors"}}))
    return root


def publish(model: Path, mirror: Path, revision: str) -> Path:
    shutil.copytree(model, mirror)
    (mirror / ms.MANIFEST).write_text(json.dumps(ms.make_manifest(str(mirror), revision)))
    return mirror
