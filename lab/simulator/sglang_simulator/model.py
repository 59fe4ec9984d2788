"""What the simulator reads from a model directory: config.json and the weight index.

Only the numbers SGLang's memory profile depends on are read: layer layout,
attention and linear-attention (Gated DeltaNet) shapes, dtype, and the weight
bytes (``metadata.total_size`` of ``model.safetensors.index.json``, else the
sum of the ``*.safetensors`` files). No weights are needed: lab model
directories hold the real config and index only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


class ModelPathError(Exception):
    """The model path cannot be used; the message is what SGLang prints."""


@dataclass(frozen=True)
class ModelSpec:
    path: str
    architecture: str
    model_type: str
    dtype: str
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_layers: int
    full_attention_layers: int
    linear_attention_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    max_position_embeddings: int
    mtp_layers: int
    weight_bytes: int
    block_size: int | None = None  # DFlash drafts: the verify block (draft tokens)
    # ModelConfig.is_image_understandable_model: hasattr(hf_config, "vision_config")
    # (0.5.11 configs/model_config.py:233-235)
    has_vision: bool = False

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 2)

    @property
    def hybrid_linear(self) -> bool:
        return self.linear_attention_layers > 0

    def decoder_layer_bytes(self) -> int:
        """Weight bytes of one dense decoder layer (attention + FFN), used for MTP heads."""
        h = self.hidden_size
        attn = h * self.num_attention_heads * self.head_dim * 2  # q and its gate
        attn += h * self.num_kv_heads * self.head_dim * 2  # k, v
        attn += self.num_attention_heads * self.head_dim * h  # o
        ffn = 3 * h * self.intermediate_size
        return (attn + ffn + 2 * h * h) * self.dtype_bytes  # + MTP fusion projection


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def _weight_bytes(directory: Path) -> int:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text(encoding="utf-8"))
        total = data.get("metadata", {}).get("total_size")
        if total:
            return int(total)
    return sum(p.stat().st_size for p in directory.glob("*.safetensors"))


def load(path: str) -> ModelSpec:
    directory = Path(path)
    if not directory.is_dir():
        # A path that is not a local directory is taken for a Hugging Face repo id.
        raise ModelPathError(
            "huggingface_hub.errors.HFValidationError: Repo id must be in the form "
            f"'repo_name' or 'namespace/repo_name': '{path}'. Use `repo_type` argument if needed."
        )
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ModelPathError(
            f"OSError: {path} does not appear to have a file named config.json. "
            f"Checkout 'https://huggingface.co/{path}/tree/None' for available files."
        )
    config = json.loads(config_file.read_text(encoding="utf-8"))
    text = _text_config(config)
    num_layers = int(text["num_hidden_layers"])
    layer_types = text.get("layer_types")
    if layer_types:
        full = sum(1 for t in layer_types if t == "full_attention")
    elif "full_attention_interval" in text:
        full = num_layers // int(text["full_attention_interval"])
    else:
        full = num_layers
    linear = num_layers - full
    heads = int(text["num_attention_heads"])
    return ModelSpec(
        path=path,
        architecture=(config.get("architectures") or ["Unknown"])[0],
        model_type=str(config.get("model_type", "")),
        dtype=str(text.get("torch_dtype") or config.get("torch_dtype") or text.get("dtype") or "bfloat16"),
        hidden_size=int(text["hidden_size"]),
        intermediate_size=int(text.get("intermediate_size", 4 * int(text["hidden_size"]))),
        vocab_size=int(text.get("vocab_size", 0)),
        num_layers=num_layers,
        full_attention_layers=full,
        linear_attention_layers=linear,
        num_attention_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads", heads)),
        head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
        linear_num_key_heads=int(text.get("linear_num_key_heads", 0)),
        linear_num_value_heads=int(text.get("linear_num_value_heads", 0)),
        linear_key_head_dim=int(text.get("linear_key_head_dim", 0)),
        linear_value_head_dim=int(text.get("linear_value_head_dim", 0)),
        linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
        max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
        mtp_layers=int(text.get("mtp_num_hidden_layers", 0)),
        weight_bytes=_weight_bytes(directory),
        block_size=int(config["block_size"]) if "block_size" in config else None,
        has_vision="vision_config" in config,
    )
