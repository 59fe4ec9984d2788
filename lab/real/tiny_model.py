"""Build a deterministic tiny model for real SGLang on CPU: no hub, no download.

A Qwen2ForCausalLM (2 layers, hidden 64, 4 heads / 2 KV heads, vocabulary 1024)
with weights from a fixed seed, saved as safetensors, and a byte-level BPE
tokenizer trained here on a few fixed sentences, with a chat template so the
OpenAI chat endpoint works. Its answers are noise; what matters is that real
SGLang loads it, warms up, serves /generate and the OpenAI endpoints, and logs
as it does for any model.

    python tiny_model.py OUT_DIR     (run with a real SGLang venv's interpreter)
"""

from __future__ import annotations

import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

VOCAB = 1024
CORPUS = [
    "The capital city of France is Paris.",
    "SGLang serves large language models over an OpenAI compatible API.",
    "A readiness gate sends a real generation request before it says ready.",
    "Speculative decoding drafts tokens and verifies them in one step.",
    "The known good service is restored when a new variant fails.",
    "Hello, how are you today? I am fine, thank you.",
    "user assistant system <|im_start|> <|im_end|>",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
] * 8
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 16, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, torch_dtype="bfloat16",
                         bos_token_id=None, eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"))
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as handle:
        json.dump({"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id,
                   "max_new_tokens": 32}, handle)
    print(f"tiny model in {out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main(sys.argv[1])
