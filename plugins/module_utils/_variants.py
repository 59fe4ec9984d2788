# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Variants are data: resolve one from the table, check its parameters, and
render the SGLang command line for the version installed on the host.

A variant is a dict of parameters (PARAMS). ``inherits`` names the variant it
starts from (``shadow-nograph`` is ``shadow-small`` without CUDA graphs), then
the host's overrides for that variant and the overrides for every variant are
laid over it, in that order.
"""

from __future__ import annotations

import os
import re

try:
    from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_releases as releases
except ImportError:  # loaded from the tree (lab/bench/planner.py, tools/)
    import _sglang_releases as releases  # type: ignore[no-redef]
try:
    from ansible_collections.inferops.sglang.plugins.module_utils import _bench as bench
except ImportError:  # loaded from the tree
    import _bench as bench  # type: ignore[no-redef]

# name -> (types, description). None in types means the parameter may be unset.
PARAMS = {
    "description": ((str,), "what the variant is for"),
    "inherits": ((str,), "the variant this one starts from"),
    "speculative_algorithm": ((str, type(None)), "NEXTN, EAGLE, EAGLE3, DFLASH, DDTREE ... or null for none"),
    "speculative_num_steps": ((int, type(None)), "draft steps"),
    "speculative_eagle_topk": ((int, type(None)), "draft top-k"),
    "speculative_num_draft_tokens": ((int, type(None)), "draft tokens verified per step"),
    "draft_model": ((bool,), "pass the host's draft model path (DFLASH/DDTREE)"),
    "ddtree_shadow_linear": ((bool,), "DDTree shadow-linear mode (patched build)"),
    "ddtree_budget": ((int, type(None)), "DDTree node budget (patched build)"),
    "context_length": ((int, type(None)), "--context-length; null = the model's"),
    "max_running_requests": ((int, type(None)), "--max-running-requests"),
    "mem_fraction_static": ((float, int, type(None)), "--mem-fraction-static"),
    "chunked_prefill_size": ((int, type(None)), "--chunked-prefill-size"),
    "kv_cache_dtype": ((str, type(None)), "--kv-cache-dtype"),
    "disable_radix_cache": (
        (bool,), "--disable-radix-cache: no prefix cache; a hybrid linear-attention model then holds exactly "
        "max_running_requests state slots"),
    "mamba_radix_cache_strategy": (
        (str, type(None)), "no_buffer or extra_buffer: how the radix cache keeps a hybrid model's linear-attention "
        "states; null = SGLang's choice"),
    "cuda_graph": ((bool,), "capture CUDA graphs"),
    "cuda_graph_max_bs": ((int, type(None)), "largest batch captured in a CUDA graph"),
    "extra_args": ((list,), "further server flags, as a list of strings"),
    "gate_timeout": ((int, float), "seconds the readiness gate waits for this variant"),
    "provenance": ((dict,), "where a tune found this variant (its run, figures, SGLang version and build); "
                   "kept in the records, never passed to SGLang"),
    "perf_thresholds": ((dict,), "the performance gate's limits on new / known-good for this variant, e.g. "
                        "{output_tokens_per_s: 1.0}"),
}
DEFAULTS = {
    "speculative_algorithm": None, "draft_model": False, "ddtree_shadow_linear": False, "cuda_graph": True,
    "disable_radix_cache": False, "mamba_radix_cache_strategy": None, "extra_args": [], "gate_timeout": 900,
}
# The module options of the variant table (doc fragment inferops.sglang.variant_table).
TABLE_ARGS = {
    "variants": {"type": "dict", "required": True},
    "aliases": {"type": "dict", "default": {}},
    "overrides": {"type": "dict", "default": {}},
    "common": {"type": "dict", "default": {}},
}
NEEDS_DRAFT = ("DFLASH", "DDTREE", "EAGLE3", "STANDALONE")
# The per-phase CUDA graph flags exist from 0.5.14, where --disable-cuda-graph becomes a
# deprecated alias (0.5.14 server_args.py:6376-6380) and --cuda-graph-max-bs stays; from
# 0.5.20 --cuda-graph-max-bs is gone (only a prefix of the per-phase flags, which argparse
# calls ambiguous), so the command line switches to the per-phase flags there.
SPLIT_CUDA_GRAPH_FLAGS = releases.first("cuda_graph_max_bs_flag", False)
# --mamba-scheduler-strategy (0.5.9-0.5.13; a deprecated alias 0.5.14-0.5.19, 0.5.14
# server_args.py:6350-6356; gone in 0.5.20) became --mamba-radix-cache-strategy in 0.5.14.
MAMBA_RADIX_CACHE_STRATEGY_FLAG = releases.first("mamba_radix_cache_strategy_flag")
# The strategies every release from 0.5.9 accepts (0.5.11 server_args.py:246).
MAMBA_STRATEGIES = ("no_buffer", "extra_buffer")


class VariantError(Exception):
    """The variant cannot be used; the message says why and what is valid."""


def parse_version(text: str) -> tuple[int, int, int]:
    match = re.match(r"\s*(\d+)\.(\d+)\.(\d+)", text or "")
    if not match:
        raise VariantError(f"cannot read an SGLang version from {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def canonical_name(name: str, variants: dict, aliases: dict) -> str:
    name = (name or "").strip()
    if name in variants:
        return name
    if name in aliases and aliases[name] in variants:
        return aliases[name]
    valid = sorted(variants)
    alias_text = ", ".join(f"{a} -> {t}" for a, t in sorted(aliases.items()) if t in variants)
    raise VariantError(f"unknown variant {name!r}; valid variants: {', '.join(valid)}" + (f" (aliases: {alias_text})" if alias_text else ""))


def resolve(name: str, variants: dict, aliases: dict | None = None, overrides: dict | None = None,
            common: dict | None = None) -> tuple[str, dict]:
    """(canonical name, parameters) of a variant, with inheritance and overrides."""
    aliases = aliases or {}
    canonical = canonical_name(name, variants, aliases)
    chain: list[str] = []
    current: str | None = canonical
    while current is not None:
        if current in chain:
            raise VariantError(f"variant {canonical!r} inherits in a loop: {' -> '.join(chain + [current])}")
        if current not in variants:
            raise VariantError(f"variant {chain[-1]!r} inherits from unknown variant {current!r}")
        chain.append(current)
        current = (variants[current] or {}).get("inherits")
    params = dict(DEFAULTS)
    for link in reversed(chain):
        params.update({k: v for k, v in (variants[link] or {}).items() if k != "inherits"})
    params.update((overrides or {}).get(canonical) or {})
    params.update(common or {})
    params["name"] = canonical
    return canonical, params


def check(params: dict) -> list[str]:
    """Every problem with the parameters themselves (types and ranges)."""
    errors = []
    for key, value in params.items():
        if key == "name":
            continue
        if key not in PARAMS:
            errors.append(f"unknown parameter {key!r} (known: {', '.join(sorted(PARAMS))})")
            continue
        types = PARAMS[key][0]
        if isinstance(value, bool) and bool not in types:
            errors.append(f"{key} must be {'/'.join(t.__name__ for t in types if t is not type(None))}, got {value!r}")
        elif not isinstance(value, types):
            errors.append(f"{key} must be {'/'.join(t.__name__ for t in types if t is not type(None))}, got {value!r}")
    if errors:
        return errors

    def in_range(key: str, low: float, high: float, low_open: bool = False, high_open: bool = False) -> None:
        value = params.get(key)
        if value is None:
            return
        below = value <= low if low_open else value < low
        above = value >= high if high_open else value > high
        if below or above:
            lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
            errors.append(f"{key} must be in {lo}{low:g}, {high:g}{hi}, got {value}")

    in_range("mem_fraction_static", 0, 1, low_open=True, high_open=True)
    in_range("context_length", 1, 10_000_000)
    in_range("max_running_requests", 1, 65536)
    in_range("chunked_prefill_size", 1, 1_000_000)
    in_range("cuda_graph_max_bs", 1, 4096)
    in_range("speculative_num_steps", 1, 64)
    in_range("speculative_eagle_topk", 1, 64)
    in_range("speculative_num_draft_tokens", 1, 256)
    in_range("ddtree_budget", 1, 4096)
    in_range("gate_timeout", 1, 86400)
    if "perf_thresholds" in params:
        errors.extend(bench.check_thresholds(params["perf_thresholds"], "perf_thresholds"))
    algo = params.get("speculative_algorithm")
    if algo in NEEDS_DRAFT and not params.get("draft_model"):
        errors.append(f"speculative_algorithm {algo} needs a draft model: set draft_model: true")
    if (params.get("ddtree_shadow_linear") or params.get("ddtree_budget")) and algo != "DDTREE":
        errors.append("ddtree_shadow_linear/ddtree_budget need speculative_algorithm DDTREE")
    strategy = params.get("mamba_radix_cache_strategy")
    if strategy is not None and strategy not in MAMBA_STRATEGIES:
        errors.append(f"mamba_radix_cache_strategy must be one of {', '.join(MAMBA_STRATEGIES)} or null, got {strategy!r}")
    if strategy == "extra_buffer" and params.get("disable_radix_cache"):
        # 0.5.11 server_args.py:2396-2401: "mamba extra_buffer is not compatible with --disable-radix-cache"
        errors.append("mamba_radix_cache_strategy extra_buffer keeps states for the radix cache, which "
                      "disable_radix_cache turns off: SGLang refuses both together; choose one")
    if not all(isinstance(x, str) for x in params.get("extra_args", [])):
        errors.append("extra_args must be a list of strings")
    secret = [x for x in params.get("extra_args", []) if isinstance(x, str) and secret_flag(x)]
    if secret:
        errors.append(f"extra_args must not carry a secret flag ({', '.join(sorted(set(secret_flag(x) for x in secret)))}): "
                      "the unit file, the records and every user's ps would show its value; set "
                      "sglang_service_api_key or sglang_service_admin_api_key (each goes to the root-only --config "
                      "file handed to the unit with LoadCredential=)")
    return errors


# The server's flags whose value is a secret. Real SGLang parses with argparse's default
# allow_abbrev (0.5.11 srt/server_args.py:7276, ArgumentParser(prog="sglang serve")): an
# unambiguous prefix (--admin-api) is the flag too.
SECRET_FLAGS = ("--api-key", "--admin-api-key")


def secret_flag(arg: str) -> str | None:
    """The secret flag ``arg`` gives (whole, abbreviated, or with =VALUE), or None."""
    flag = arg.split("=", 1)[0]
    if len(flag) <= 2 or not flag.startswith("--"):
        return None
    return next((name for name in SECRET_FLAGS if name.startswith(flag)), None)


def argv(params: dict, server: dict, version: tuple[int, int, int]) -> list[str]:
    """The server's flags for this SGLang version. ``server`` holds the host's
    model_path, served_model_name, host, port, tp_size, draft_model_path and enable_metrics
    (--enable-metrics: /metrics on the server's port, every release from 0.5.9)."""
    out = ["--model-path", str(server["model_path"])]
    if server.get("served_model_name"):
        out += ["--served-model-name", str(server["served_model_name"])]
    out += ["--host", str(server.get("host", "127.0.0.1")), "--port", str(server.get("port", 30000)),
            "--tp-size", str(server["tp_size"])]
    if server.get("enable_metrics"):
        out.append("--enable-metrics")
    algo = params.get("speculative_algorithm")
    if algo:
        out += ["--speculative-algorithm", str(algo)]
        if params.get("draft_model"):
            out += ["--speculative-draft-model-path", str(server["draft_model_path"])]
        for key in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
            if params.get(key) is not None:
                out += ["--" + key.replace("_", "-"), str(params[key])]
        if params.get("ddtree_budget") is not None:
            out += ["--speculative-ddtree-budget", str(params["ddtree_budget"])]
        if params.get("ddtree_shadow_linear"):
            out.append("--speculative-ddtree-shadow-linear")
    for key in ("context_length", "max_running_requests", "mem_fraction_static", "chunked_prefill_size", "kv_cache_dtype"):
        if params.get(key) is not None:
            out += ["--" + key.replace("_", "-"), str(params[key])]
    if params.get("disable_radix_cache"):
        out.append("--disable-radix-cache")
    if params.get("mamba_radix_cache_strategy"):
        flag = "--mamba-radix-cache-strategy" if version >= MAMBA_RADIX_CACHE_STRATEGY_FLAG else "--mamba-scheduler-strategy"
        out += [flag, str(params["mamba_radix_cache_strategy"])]
    split = version >= SPLIT_CUDA_GRAPH_FLAGS
    if not params.get("cuda_graph", True):
        # from 0.5.20 the per-phase backends (--disable-cuda-graph is a deprecated alias of
        # them from 0.5.14, still accepted; --cuda-graph-max-bs is gone in 0.5.20)
        out += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"] if split else ["--disable-cuda-graph"]
    elif params.get("cuda_graph_max_bs") is not None:
        out += ["--cuda-graph-max-bs-decode" if split else "--cuda-graph-max-bs", str(params["cuda_graph_max_bs"])]
    out += [str(x) for x in params.get("extra_args", [])]
    return out


_FLAG = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")
_CHOICES = re.compile(r"--speculative-algorithm\s+\{([^}]*)\}")


def unsupported(flags: list[str], help_text: str) -> list[str]:
    """Problems of a command line against the installed server's --help: flags
    it does not accept, and a speculative algorithm outside its choices."""
    known = set(_FLAG.findall(help_text))
    problems = [f"flag {f} is not accepted by the installed SGLang" for f in flags if f.startswith("--") and f not in known]
    if "--speculative-algorithm" in flags:
        algo = flags[flags.index("--speculative-algorithm") + 1]
        choices = _CHOICES.search(help_text)
        if choices and algo not in [c.strip() for c in choices.group(1).split(",")]:
            problems.append(f"speculative algorithm {algo} is not offered by the installed SGLang (choices: {choices.group(1)})"
                            + ("; DDTREE needs the patched DDTree build" if algo == "DDTREE" else ""))
    return problems


def quote(args: list[str]) -> str:
    """A systemd ExecStart argument list (systemd's own quoting)."""
    out = []
    for arg in args:
        if arg and re.fullmatch(r"[A-Za-z0-9_./:=,+@%-]+", arg):
            out.append(arg.replace("%", "%%"))
        else:
            out.append('"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$") + '"')
    return " ".join(out)


VERSION_PROBE = "import importlib.metadata as m; print(m.version('sglang'))"


def installed_version(run_command, python: str) -> tuple[str | None, str | None]:
    """(version, problem) of SGLang in ``python``'s environment; run_command is AnsibleModule.run_command."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return None, f"python {python} does not exist: is SGLang installed (provision.yml)?"
    rc, out, err = run_command([python, "-c", VERSION_PROBE])
    if rc != 0:
        return None, f"SGLang is not installed in {python}'s environment: {(err or out).strip()[-300:]}"
    return out.strip(), None


def read_write_path_problems(paths: list[str]) -> list[str]:
    """Why the unit's ReadWritePaths= would fail it at start, path by path.

    systemd.exec(5) (systemd 252), SANDBOXING, ReadWritePaths=: paths "may be prefixed with "-",
    in which case they will be ignored when they do not exist"; any other path that does not
    exist fails the service's mount namespace set-up (226/NAMESPACE, PROCESS EXIT CODES) at
    every start. PATHS: "the paths must be absolute and must not contain a ".." path component"."""
    problems = []
    for path in paths or []:
        text = str(path)
        optional = text.startswith("-")
        bare = text[1:] if optional else text
        if not bare.startswith("/") or ".." in bare.split("/"):
            problems.append(f"sglang_service_read_write_paths: {text!r} is not an absolute path without '..' "
                            "(systemd.exec(5), PATHS)")
        elif not optional and not os.path.exists(bare):
            problems.append(f"sglang_service_read_write_paths: {bare} does not exist on the host, and a "
                            "ReadWritePaths= path that does not exist fails the service at every start (226/NAMESPACE, "
                            "systemd.exec(5)): create it first, or prefix it with '-' for systemd to skip it")
    return problems
