"""The server command line of the emulated SGLang release, parsed by argparse as
SGLang does, so rejected flags fail with argparse's real messages (exit 2)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os

from . import model as model_mod
from . import radix
from .memory import ServerConfig
from .versions import Release

# --speculative-algorithm choices up to 0.5.11 (0.5.9 server_args.py, 0.5.11
# server_args.py:5365-5369); from 0.5.12 the builtins of SpeculativeAlgorithm
# (srt/speculative/spec_info.py) plus NEXTN, an alias of EAGLE.
UPSTREAM_ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
# --dtype choices, the same in every release 0.5.9-0.5.23.
DTYPE_CHOICES = ["auto", "half", "float16", "bfloat16", "float", "float32"]
# --mamba-scheduler-strategy (0.5.9-0.5.13) / --mamba-radix-cache-strategy (0.5.14+).
MAMBA_SCHEDULER_STRATEGIES = ["auto", "no_buffer", "extra_buffer"]
MAMBA_RADIX_CACHE_STRATEGIES = ["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"]
# 0.5.14+ Literal types of cuda_graph_backend_decode / _prefill (server_args.py:1925-1933).
CUDA_GRAPH_BACKENDS_DECODE = ["full", "breakable", "tc_piecewise", "disabled"]
CUDA_GRAPH_BACKENDS_PREFILL = ["breakable", "tc_piecewise", "disabled"]


def ddtree_build_installed() -> bool:
    """DDTree is not upstream: it exists only where the patched build's files
    were laid over the installed package (sglang/srt/speculative/ddtree_utils.py)."""
    try:
        return importlib.util.find_spec("sglang.srt.speculative.ddtree_utils") is not None
    except (ImportError, ValueError):
        return False


def spec_algorithms(release: Release, ddtree: bool) -> list[str]:
    algorithms = list(UPSTREAM_ALGORITHMS)
    if release.has_dflash:
        algorithms.insert(0, "DFLASH")
    if release.has_frozen_kv_mtp:
        algorithms.append("FROZEN_KV_MTP")
    if release.has_dspark:
        algorithms.append("DSPARK")
    if release.has_uno:
        algorithms.append("UNO")
    if ddtree:
        algorithms.append("DDTREE")
    return algorithms


def parser_prog(release: Release, script: str | None) -> str | None:
    """The name argparse's messages start with: "sglang serve" from 0.5.10 whatever the
    entry point (prepare_server_args, 0.5.11 server_args.py:7276), else the script's
    (0.5.9's ArgumentParser(); None: argparse's own default, sys.argv[0]'s name)."""
    return "sglang serve" if release.parser_prog_sglang_serve else script


def build_parser(release: Release, prog: str | None, ddtree: bool | None = None) -> argparse.ArgumentParser:
    ddtree = ddtree_build_installed() if ddtree is None else ddtree
    p = argparse.ArgumentParser(prog=prog)
    add = p.add_argument
    add("--model-path", "--model", type=str, required=True)
    add("--tokenizer-path", type=str)
    add("--served-model-name", type=str)
    add("--host", type=str, default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--tp-size", "--tensor-parallel-size", type=int, default=1, dest="tp_size")
    add("--dp-size", type=int, default=1)
    add("--pp-size", type=int, default=1)
    add("--context-length", type=int)
    add("--mem-fraction-static", type=float)
    add("--max-running-requests", type=int)
    add("--max-total-tokens", type=int)
    add("--chunked-prefill-size", type=int)
    add("--page-size", type=int)
    add("--dtype", type=str, default="auto", choices=DTYPE_CHOICES)
    add("--kv-cache-dtype", type=str, default="auto")
    add("--trust-remote-code", action="store_true")
    add("--api-key", type=str)
    add("--config", type=str)  # every release from 0.5.9; read by merge_config before parsing
    add("--skip-server-warmup", action="store_true")
    add("--disable-radix-cache", action="store_true")
    add("--log-level", type=str, default="info")
    add("--log-level-http", type=str)
    add("--watchdog-timeout", type=float, default=300)
    add("--enable-metrics", action="store_true")
    add("--attention-backend", type=str)
    add("--reasoning-parser", type=str)
    add("--tool-call-parser", type=str)
    # 0.9 up to 0.5.19; from 0.5.20 None, resolved by the mamba hook (still 0.9).
    add("--mamba-full-memory-ratio", type=float, default=None if release.cuda_graph_max_bs_removed else 0.9)
    add("--device", type=str)
    add("--sampling-backend", type=str)
    # every release (0.5.11 srt/server_args.py:408 and 4802): the scheduler waits on its sockets
    # instead of spinning while idle (srt/managers/scheduler.py:537 and 3722-3749, IdleSleeper);
    # the simulator never spins, so it only parses it
    add("--sleep-on-idle", action="store_true")
    if release.has_mamba_radix_cache_strategy:
        add("--mamba-radix-cache-strategy", type=str, default="auto", choices=MAMBA_RADIX_CACHE_STRATEGIES)
        if release.has_mamba_scheduler_strategy:
            # 0.5.14-0.5.19: a deprecated alias of --mamba-radix-cache-strategy.
            add("--mamba-scheduler-strategy", type=str, dest="mamba_radix_cache_strategy")
    else:
        # 0.5.13.post1 adds extra_buffer_lazy (MAMBA_SCHEDULER_STRATEGY_CHOICES)
        add("--mamba-scheduler-strategy", type=str, default="auto", dest="mamba_radix_cache_strategy",
            choices=MAMBA_SCHEDULER_STRATEGIES + (["extra_buffer_lazy"] if release.version >= (0, 5, 13) else []))
    add("--max-mamba-cache-size", type=int)
    add("--random-seed", type=int)
    if release.free_form_spec_algorithm:
        add("--speculative-algorithm", type=str)
    else:
        add("--speculative-algorithm", type=str, choices=spec_algorithms(release, ddtree))
    add("--speculative-draft-model-path", "--speculative-draft-model", type=str)
    add("--speculative-num-steps", type=int)
    add("--speculative-eagle-topk", type=int)
    add("--speculative-num-draft-tokens", type=int)
    if release.has_dflash:
        add("--speculative-dflash-block-size", type=int)
    if ddtree:
        # Flags of the team's patched DDTree build (not upstream SGLang).
        add("--speculative-ddtree-budget", type=int, default=32)
        add("--speculative-ddtree-shadow-linear", action="store_true")
    add("--disable-cuda-graph", action="store_true")
    if release.split_cuda_graph_flags:
        add("--cuda-graph-max-bs-decode", type=int)
        add("--cuda-graph-max-bs-prefill", type=int)
        add("--cuda-graph-backend-decode", type=str, choices=CUDA_GRAPH_BACKENDS_DECODE)
        add("--cuda-graph-backend-prefill", type=str, choices=CUDA_GRAPH_BACKENDS_PREFILL)
    if not release.cuda_graph_max_bs_removed:
        # 0.5.14-0.5.19 keep it next to -decode/-prefill; 0.5.20 removed it, so
        # argparse's prefix matching calls it ambiguous.
        add("--cuda-graph-max-bs", type=int)
    return p


def _yaml_mapping(text: str) -> dict:
    """The YAML subset a --config file of flat options needs (the simulator's venv
    has no PyYAML): ``key: value`` lines, ``#`` comments, ``{}``; a value is JSON
    when it parses as JSON (quoted strings, numbers, true/false, [lists]), else a
    plain string."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        yaml = None
    if yaml is not None:
        return yaml.safe_load(text)
    data: dict = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or line == "{}":
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"Config file must contain a dictionary at root level (line {raw!r})")
        value = value.strip()
        if value.startswith("#") or not value:
            data[key.strip()] = None
            continue
        try:
            data[key.strip()] = json.loads(value)
        except ValueError:
            data[key.strip()] = {"true": True, "false": False}.get(value.lower(), value)
    return data


def merge_config(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """SGLang's ConfigArgumentMerger (0.5.11 srt/server_args_config_parser.py:51-184,
    0.5.23 srt/utils/server_args_config_parser.py:75-210, called from
    prepare_server_args when "--config" is in argv): the YAML file's options become
    flags placed before the command line's, so the command line wins; store_true
    options become the bare flag when true. Raises ValueError with SGLang's messages."""
    indices = [i for i, arg in enumerate(argv) if arg == "--config"]
    if not indices:
        return argv
    if len(indices) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    index = indices[0]
    if index == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = argv[index + 1]
    if os.path.splitext(path)[1].lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {os.path.splitext(path)[1]}")
    if not os.path.exists(path):
        raise ValueError(f"Config file not found: {path}")
    with open(path, "r", encoding="utf-8") as handle:
        data = _yaml_mapping(handle.read())
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    store_true = {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}  # noqa: SLF001
    merged: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            if key.replace("-", "_") in store_true:
                merged += [f"--{key}"] if value else []
            else:
                merged += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            merged += ([f"--{key}"] + [str(v) for v in value]) if value else []
        elif isinstance(value, dict):
            merged += [f"--{key}", json.dumps(value)]
        else:
            merged += [f"--{key}", str(value)]
    return merged + argv[:index] + argv[index + 2:]


class ArgumentValidationError(ValueError):
    """SGLang's ValueError from resolving the parsed arguments (ServerArgs.__post_init__
    up to 0.5.18, resolve_once from 0.5.19); str() is SGLang's message."""


def validate(release: Release, args: argparse.Namespace, ddtree: bool | None = None) -> list[str]:
    """Checks SGLang runs after parsing. Returns warnings; raises on errors."""
    warnings = []
    ddtree = ddtree_build_installed() if ddtree is None else ddtree
    algo = args.speculative_algorithm
    if algo and release.free_form_spec_algorithm and algo.upper() not in spec_algorithms(release, ddtree):
        # SpeculativeAlgorithm.from_string (0.5.12.post1 spec_info.py:54, 0.5.23 :65)
        raise ArgumentValidationError(f"Unknown speculative algorithm name: {algo}")
    if algo in ("DFLASH", "DDTREE") and not args.speculative_draft_model_path:
        # 0.5.11 server_args.py:3331-3333
        raise ArgumentValidationError("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    if algo == "NGRAM":
        # the device SGLang resolves: --device, else cuda on a GPU host (the simulator's)
        device = args.device or "cuda"
        if release.ngram_devices == ("cuda",):
            if not device.startswith("cuda"):
                # 0.5.11 server_args.py:3557-3561 (raised at :3559)
                raise ArgumentValidationError("Ngram speculative decoding only supports CUDA device.")
        elif device not in release.ngram_devices:
            if release.ngram_devices == ("cuda", "cpu"):
                # 0.5.16 arg_groups/speculative_hook.py:651-655
                raise ArgumentValidationError("Ngram speculative decoding only supports CUDA or CPU devices.")
            else:
                # 0.5.23 arg_groups/speculative_hook.py:1286-1290
                raise ArgumentValidationError("Ngram speculative decoding only supports CUDA, CPU, or XPU devices.")
    # No release range-checks --mem-fraction-static (the simulator used to invent one).
    if release.disable_cuda_graph_deprecated and args.disable_cuda_graph:
        # DeprecatedStoreTrueAction (0.5.14 arg_groups/argparse_actions.py:63-66,
        # new_flag from server_args.py:6376-6380)
        option_string, new_flag = "--disable-cuda-graph", "--cuda-graph-backend-{decode,prefill}=disabled"
        replacement = f" Use '{new_flag}' instead."
        warnings.append(f"'{option_string}' is deprecated and will be removed in a future release.{replacement}")
    return warnings


def server_config(release: Release, args: argparse.Namespace) -> ServerConfig:
    if release.split_cuda_graph_flags:
        graph = not args.disable_cuda_graph and args.cuda_graph_backend_decode != "disabled"
        graph_bs = args.cuda_graph_max_bs_decode or getattr(args, "cuda_graph_max_bs", None)
    else:
        graph = not args.disable_cuda_graph
        graph_bs = args.cuda_graph_max_bs
    draft_tokens = args.speculative_num_draft_tokens
    if getattr(args, "speculative_dflash_block_size", None):
        draft_tokens = args.speculative_dflash_block_size
    return ServerConfig(
        tp_size=args.tp_size,
        mem_fraction_static=args.mem_fraction_static,
        context_length=args.context_length,
        max_running_requests=args.max_running_requests,
        max_total_tokens=args.max_total_tokens,
        chunked_prefill_size=args.chunked_prefill_size,
        cuda_graph=graph,
        cuda_graph_max_bs=graph_bs,
        speculative_algorithm=args.speculative_algorithm,
        num_draft_tokens=draft_tokens,
        disable_radix_cache=args.disable_radix_cache,
        mamba_radix_cache_strategy=getattr(args, "mamba_radix_cache_strategy", None),
        mamba_full_memory_ratio=args.mamba_full_memory_ratio if args.mamba_full_memory_ratio is not None else 0.9,
        max_mamba_cache_size=args.max_mamba_cache_size,
        page_size=args.page_size or 1,
    )


def resolve(release: Release, args: argparse.Namespace, ddtree: bool | None = None) -> list[str]:
    """What SGLang decides from the parsed arguments before any process starts, as far as
    the simulator models it: ServerArgs.__post_init__ up to 0.5.18, resolve_once from
    0.5.19 (the radix-cache rule for the model's architecture, read from its
    config.json, then the checks of validate(): _handle_model_specific_adjustments
    runs before _handle_speculative_decoding, 0.5.11 server_args.py:845 and :882,
    0.5.12.post1 :929 and :976, so a hybrid model's radix refusal comes first). The
    server's start-up and the ``sglang.srt.server_args`` entry point both run this.
    Returns the warnings; raises ArgumentValidationError or radix.RadixRefusal (both
    ValueError)."""
    ddtree = ddtree_build_installed() if ddtree is None else ddtree
    try:
        architecture = model_mod.load(args.model_path).architecture
    except model_mod.ModelPathError:
        # the model directory is checked where the weights load (server start)
        architecture = ""
    warnings: list[str] = []
    # The team's DDTree build replaces server_args.py with a later source snapshot
    # (lab/ddtree), which does not refuse: the field story's shadow variants reached
    # the pool on 0.5.11.
    if not ddtree:
        warnings += radix.resolve(release, args, architecture)
    return warnings + validate(release, args, ddtree)
