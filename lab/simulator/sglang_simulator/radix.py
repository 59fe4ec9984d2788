"""Radix cache on hybrid linear-attention (Mamba-style state) models with
speculative decoding, as ServerArgs.__post_init__ of each release decides it,
before any process starts (it reads only the model's config.json)."""

from __future__ import annotations

from .versions import Release

# Architectures whose _handle_mamba_radix_cache runs with support_mamba_cache=True
# (0.5.11 srt/server_args.py:2139-2300 and configs/linear_attn_model_registry.py).
HYBRID_RADIX_ARCHITECTURES = (
    "Qwen3NextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "NemotronHForCausalLM",
    "FalconH1ForCausalLM",
    "JetNemotronForCausalLM",
    "JetVLMForConditionalGeneration",
    "GraniteMoeHybridForCausalLM",
    "Lfm2ForCausalLM",
)


class RadixRefusal(ValueError):
    """ServerArgs' ValueError (exit 1 at start); str() is SGLang's message."""


def resolve(release: Release, args, architecture: str) -> list[str]:
    """Apply the release's rule to ``args`` (may set disable_radix_cache);
    returns the warnings it logs; raises RadixRefusal with the real text."""
    if architecture not in HYBRID_RADIX_ARCHITECTURES:
        return []
    strategy = getattr(args, "mamba_radix_cache_strategy", None) or "auto"
    if release.radix_silently_disabled_for_spec:
        if args.speculative_algorithm and not args.disable_radix_cache and strategy != "extra_buffer":
            # 0.5.9 server_args.py:1760-1764
            args.disable_radix_cache = True
            return [f"Disabling radix cache since speculative decoding for {architecture} is not supported "
                    "with radix cache yet."]
        return []
    if release.radix_refuses_spec_on_hybrid:
        if strategy == "extra_buffer":
            if args.disable_radix_cache:
                # 0.5.11 server_args.py:2396-2401; 0.5.13.post1 :2699 adds a full stop
                stop = "." if release.version >= (0, 5, 13) else ""
                raise RadixRefusal(
                    f"mamba extra_buffer is not compatible with --disable-radix-cache{stop} "
                    "Overlap scheduling is already supported with no_buffer + disable_radix_cache. "
                    "Please use --mamba-scheduler-strategy no_buffer instead."
                )
            return []
        if args.speculative_algorithm and not args.disable_radix_cache:
            # 0.5.11 server_args.py:2452-2456 (the two literals join without a space)
            raise RadixRefusal(
                f"Speculative decoding for {architecture} is not compatible with radix cache when "
                "using --mamba-scheduler-strategy no_buffer."
                "To use radix cache with speculative decoding, please use --mamba-scheduler-strategy "
                "extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
            )
        return []
    # 0.5.14+: "auto" becomes extra_buffer where overlap scheduling is wanted
    # (0.5.14 server_args.py:4379-4392); radix cache stays on.
    if strategy == "auto" and not args.disable_radix_cache:
        args.mamba_radix_cache_strategy = "extra_buffer"
    return []
