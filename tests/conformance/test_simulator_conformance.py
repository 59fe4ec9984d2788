"""The simulator (lab/simulator, a test double) against the real sglang wheels
of every release 0.5.9 ... 0.5.23 (INFEROPS_REAL_WHEELS): every switch of
versions.py, every flag/choice/default its parser accepts, the radix-cache
refusal and every message it prints must exist in that release's source.
Nothing is imported from the wheels: they are read with zipfile and ast."""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import inspect
import os
import re
import sys
import tempfile
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from sglang_simulator import args as sim_args
from sglang_simulator import radix as sim_radix
from sglang_simulator import server as sim_server
from sglang_simulator.versions import Release, parse_version

SIM = Path(sim_server.__file__).resolve().parent
MISSING = object()
WHEELS_DIR = None  # set by the wheels fixture


def _wheel_paths() -> list[Path]:
    from real_sglang import paths

    try:
        root = Path(paths()["INFEROPS_REAL_WHEELS"])
    except Exception:  # noqa: BLE001 - collected without a build: fail in the test
        return []
    return sorted(root.glob("sglang-*.whl"), key=lambda p: parse_version(p.name.split("-")[1]))


WHEELS = _wheel_paths()
IDS = [p.name.split("-")[1] for p in WHEELS]


def test_every_release_wheel_is_there(real):
    found = {p.name.split("-")[1] for p in Path(real["INFEROPS_REAL_WHEELS"]).glob("sglang-*.whl")}
    assert {"0.5.9", "0.5.10.post1", "0.5.11", "0.5.14", "0.5.19", "0.5.20", "0.5.23"} <= found
    assert len(WHEELS) >= 15, "lab/real/build.sh keeps the wheels of 0.5.9 ... 0.5.23"


class Wheel:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.zf = zipfile.ZipFile(path)
        m = re.match(r"sglang-(\d+)\.(\d+)\.(\d+)", path.name)
        self.version = tuple(int(x) for x in m.groups())
        self.text = path.name.split("-")[1]
        self._src: dict[str, str] = {}
        self._trees: dict[str, ast.AST] = {}

    def names(self) -> list[str]:
        return [n for n in self.zf.namelist() if n.startswith("sglang/") and n.endswith(".py")]

    def source(self, name: str) -> str:
        if name not in self._src:
            self._src[name] = self.zf.read(name).decode("utf-8", "replace")
        return self._src[name]

    def has(self, name: str) -> bool:
        try:
            self.zf.getinfo(name)
            return True
        except KeyError:
            return False

    def tree(self, name: str) -> ast.AST:
        if name not in self._trees:
            self._trees[name] = ast.parse(self.source(name))
        return self._trees[name]


def _literal(node, names: dict):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        pass
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ServerArgs":
        return names.get(("ServerArgs", node.attr), MISSING)
    return MISSING


def module_constants(tree: ast.AST) -> dict:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError):
                pass
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    value = stmt.value
                    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
                        kw = {k.arg: k.value for k in value.keywords}
                        value = kw.get("default")
                        if value is None:
                            continue
                    try:
                        out[("ServerArgs", stmt.target.id)] = ast.literal_eval(value)
                    except (ValueError, TypeError, SyntaxError):
                        pass
    return out


@functools.lru_cache(maxsize=None)
def real_flags(path: Path) -> dict[str, dict]:
    """Every CLI flag of a release: {"--flag": {"choices":..., "default":..., "action":..., "dest":...}}."""
    wheel = Wheel(path)
    flags: dict[str, dict] = {}
    choices_consts: dict = {}
    if wheel.has("sglang/srt/arg_groups/choices.py"):
        choices_consts = module_constants(wheel.tree("sglang/srt/arg_groups/choices.py"))
    files = ["sglang/srt/server_args.py"] + [n for n in wheel.names() if n.startswith("sglang/srt/arg_groups/")]
    for name in files:
        if not wheel.has(name):
            continue
        tree = wheel.tree(name)
        consts = {**choices_consts, **module_constants(tree)}
        # argparse add_argument calls
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                opts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if not opts or not opts[0].startswith("--"):
                    continue
                kw = {k.arg: k.value for k in node.keywords if k.arg}
                info = {"choices": _literal(kw["choices"], consts) if "choices" in kw else None,
                        "default": _literal(kw["default"], consts) if "default" in kw else MISSING,
                        "action": _literal(kw["action"], consts) if "action" in kw else None,
                        "file": name, "line": node.lineno, "names": opts}
                for opt in opts:
                    flags.setdefault(opt, info)
        # 0.5.20+: msgspec field classes  name: A[T, Arg(...)|"help"] = default
        if name.startswith("sglang/srt/arg_groups/fields/") or name == "sglang/srt/server_args.py":
            for cls in tree.body:
                if not isinstance(cls, ast.ClassDef):
                    continue
                for stmt in cls.body:
                    if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                        continue
                    ann = stmt.annotation
                    if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", "") == "A"):
                        continue
                    elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                    if len(elts) < 2:
                        continue
                    meta = elts[1]
                    kw = {}
                    if isinstance(meta, ast.Call):
                        kw = {k.arg: k.value for k in meta.keywords if k.arg}
                        if meta.args and "help" not in kw:
                            kw["help"] = meta.args[0]
                    elif not isinstance(meta, ast.Constant):
                        continue
                    if kw.get("no_cli") is not None and _literal(kw["no_cli"], consts) is True:
                        continue
                    field = stmt.target.id
                    cli = _literal(kw["cli_name"], consts) if "cli_name" in kw else "--" + field.replace("_", "-")
                    aliases = _literal(kw["aliases"], consts) if "aliases" in kw else []
                    typ = ast.unparse(elts[0])
                    choices = _literal(kw["choices"], consts) if "choices" in kw else None
                    if choices is None:
                        for sub in ast.walk(elts[0]):
                            if isinstance(sub, ast.Subscript) and getattr(sub.value, "id", "") == "Literal":
                                value = _literal(sub.slice, consts)
                                choices = list(value) if isinstance(value, tuple) else [value]
                                break
                    default = _literal(stmt.value, consts) if stmt.value is not None else MISSING
                    action = "store_true" if typ == "bool" else (_literal(kw["action"], consts) if "action" in kw else None)
                    info = {"choices": choices, "default": default, "action": action, "file": name,
                            "line": stmt.lineno, "names": [cli, *(aliases or [])], "type": typ}
                    for opt in [cli, *(aliases or [])]:
                        flags.setdefault(opt, info)
    return flags


MESSAGE_DIRS = tuple(f"sglang/srt/{d}" for d in (
    "server_args.py", "arg_groups/", "entrypoints/", "managers/", "model_executor/", "mem_cache/", "configs/",
    "speculative/", "utils/", "distributed/", "environ.py", "model_loader/"))


@functools.lru_cache(maxsize=None)
def string_constants(path: Path) -> list[str]:
    """Every string literal and f-string template ({} for each placeholder) in the release."""
    wheel = Wheel(path)
    out = []
    for name in wheel.names():
        # where start-up, serving and failure messages live (models/, layers/ ... hold none the simulator prints)
        if not (name.startswith(MESSAGE_DIRS) or name in ("sglang/launch_server.py", "sglang/cli/serve.py")):
            continue
        try:
            tree = wheel.tree(name)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append(node.value)
            elif isinstance(node, ast.JoinedStr):
                parts = []
                for v in node.values:
                    if isinstance(v, ast.Constant):
                        parts.append(str(v.value))
                    else:
                        parts.append("{}")
                out.append("".join(parts))
    return out


def sim_release(wheel: Path) -> Release:
    return Release(parse_version(wheel.name.split("-")[1]))


def spec_enum(wheel: Wheel) -> list[str]:
    """Members of SpeculativeAlgorithm (srt/speculative/spec_info.py)."""
    for node in wheel.tree("sglang/srt/speculative/spec_info.py").body:
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeAlgorithm":
            return [s.targets[0].id for s in node.body if isinstance(s, ast.Assign)]
    raise AssertionError("no SpeculativeAlgorithm")


def grep(wheel: Wheel, needle: str, under: str = "sglang/srt/") -> list[str]:
    return [n for n in wheel.names() if n.startswith(under) and needle in wheel.source(n)]


def ngram_devices(wheel: Wheel) -> tuple[str, ...]:
    """The devices the release lets NGRAM speculative decoding run on, from the condition
    guarding its "Ngram speculative decoding only supports ..." ValueError: a prefix test
    ``not device.startswith("cuda")`` (up to 0.5.15.post1) or ``device not in (...)``."""
    found = []
    for name in grep(wheel, "Ngram speculative decoding only supports"):
        tree = wheel.tree(name)
        for node in ast.walk(tree):
            if not isinstance(node, ast.If):
                continue
            raised = [r for r in node.body if isinstance(r, ast.Raise)]
            if not any("Ngram speculative decoding only supports" in ast.unparse(r) for r in raised):
                continue
            test = node.test
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and "startswith" in ast.unparse(test):
                found.append((test.operand.args[0].value,))
            elif isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.NotIn):
                found.append(tuple(ast.literal_eval(test.comparators[0])))
            else:
                raise AssertionError(f"{wheel.text} {name}:{node.lineno}: a condition not understood: {ast.unparse(test)}")
    assert len(set(found)) == 1, (wheel.text, found)
    return found[0]


SERVER_INFO_FILES = ("sglang/srt/entrypoints/http_server.py", "sglang/srt/utils/common.py")


def server_info_source(wheel: Wheel, name: str) -> str:
    """The /server_info handler and, from 0.5.22, build_server_info (utils/common.py)."""
    source = wheel.source(name)
    if name.endswith("common.py"):
        start = source.find("def build_server_info(")
        return source[start:source.find("\ndef ", start + 1)] if start >= 0 else ""
    return source


# -- 1. versions.py --------------------------------------------------------------------------

@pytest.mark.parametrize("wheel_path", WHEELS, ids=IDS)
def test_version_switches_match_the_wheel(wheel_path):
    wheel, rel = Wheel(wheel_path), sim_release(wheel_path)
    flags = real_flags(wheel_path)
    enum = spec_enum(wheel)
    spec_flag = flags["--speculative-algorithm"]
    real = {
        # DFLASH among the algorithms (0.5.11 server_args.py:5365-5369, spec_info.py)
        "has_dflash": "DFLASH" in enum,
        # choices only up to 0.5.11 (0.5.12.post1 server_args.py:5786 has none)
        "free_form_spec_algorithm": spec_flag["choices"] is None,
        "has_frozen_kv_mtp": "FROZEN_KV_MTP" in enum,
        "has_dspark": "DSPARK" in enum,
        "has_uno": "UNO" in enum,
        "split_cuda_graph_flags": "--cuda-graph-max-bs-decode" in flags,
        "disable_cuda_graph_deprecated": flags["--disable-cuda-graph"]["action"] not in ("store_true", None),
        "cuda_graph_max_bs_removed": "--cuda-graph-max-bs" not in flags,
        "new_pool_error": bool(grep(wheel, "Loaded weights leave no GPU memory for the KV cache")),
        # the draft counted in the one profile: the new error says so
        "draft_weights_in_pool": bool(grep(wheel, "draft weights are now counted")),
        "has_ready_endpoint": bool(grep(wheel, '@app.get("/ready")', "sglang/srt/entrypoints/")),
        "launch_server_warns": "'sglang serve' is the recommended entrypoint" in wheel.source("sglang/launch_server.py"),
        "has_mamba_scheduler_strategy": "--mamba-scheduler-strategy" in flags,
        "has_mamba_radix_cache_strategy": "--mamba-radix-cache-strategy" in flags,
        "radix_refuses_spec_on_hybrid": bool(grep(wheel, "is not compatible with radix cache when using")),
        "radix_silently_disabled_for_spec": bool(grep(wheel, "Disabling radix cache since speculative decoding for")),
        # 0.5.14 server_args.py:4383-4392; 0.5.20+ arg_groups/overrides.py:551
        "radix_strategy_auto_extra_buffer": any(
            re.search(r'mamba_radix_cache_strategy("\])? = "extra_buffer"', wheel.source(n))
            for n in wheel.names() if n.startswith(("sglang/srt/server_args.py", "sglang/srt/arg_groups/"))),
        "graph_hint_names_decode_flags": bool(grep(wheel, "2. set --cuda-graph-max-bs-decode to a smaller value")),
        # prepare_server_args' parser (0.5.11 server_args.py:7276; 0.5.9: ArgumentParser())
        "parser_prog_sglang_serve": 'argparse.ArgumentParser(prog="sglang serve")' in wheel.source("sglang/srt/server_args.py"),
        # 0.5.19 server_args.py:3673, called by launch_server.py:21
        "has_resolve_once": "def resolve_once(self)" in wheel.source("sglang/srt/server_args.py")
                            and "server_args.resolve_once()" in wheel.source("sglang/launch_server.py"),
        "ngram_devices": ngram_devices(wheel),
        # decide_request_auth's exempt prefixes (0.5.11 utils/auth.py:100, 0.5.20 :101-105)
        "ready_skips_api_key": 'path.startswith("/ready")' in wheel.source("sglang/srt/utils/auth.py"),
        # /server_info keys (0.5.13.post1 http_server.py:656, 0.5.20 :840, 0.5.23 :889; from 0.5.22
        # build_server_info in utils/common.py adds kv_events and launch_command, 0.5.23 :3590-3592)
        "server_info_kv_events": any('"kv_events"' in server_info_source(wheel, n) for n in SERVER_INFO_FILES),
        "server_info_launch_command": any('"launch_command"' in server_info_source(wheel, n) for n in SERVER_INFO_FILES),
        "server_info_frontend": '"frontend": "python"' in wheel.source("sglang/srt/entrypoints/http_server.py"),
        # get_internal_state's additions (0.5.23 scheduler_components/internal_state.py:67, :101)
        "internal_state_world_size": bool(grep(wheel, 'state["world_size"]', "sglang/srt/managers/")
                                          or grep(wheel, 'ret["world_size"]', "sglang/srt/managers/")),
        "internal_state_decode_graph_bs": bool(grep(wheel, 'state["decode_cuda_graph_bs"]', "sglang/srt/managers/")
                                               or grep(wheel, 'ret["decode_cuda_graph_bs"]', "sglang/srt/managers/")),
        "memory_usage_by_phase": wheel.has("sglang/srt/model_executor/graph_memory_usage.py"),
        # GET /v1/loads' body (0.5.11 srt/entrypoints/v1_loads.py:173-179, 0.5.23 :145-151)
        "loads_aggregate": '"aggregate": _compute_aggregate' in wheel.source("sglang/srt/entrypoints/v1_loads.py"),
        "loads_accelerators": '"num_accelerators"' in wheel.source("sglang/srt/entrypoints/v1_loads.py"),
        # start-up lines (0.5.23 distributed/bootstrap.py:115; 0.5.11 model_runner.py:2256)
        "logs_init_parallel": bool(grep(wheel, 'logger.info("Init parallel begin.")')),
        "kv_cache_log_names_dtype": not grep(wheel, "Using KV cache dtype"),
        "capture_log_names_phase": bool(grep(wheel, "Capture draft decode CUDA graph begin")),
        "capture_log_num_tokens_per_req": bool(grep(wheel, "num_tokens_per_req={num_tokens_per_req}", "sglang/srt/model_executor/")),
        "capture_log_bs_at_end": bool(grep(wheel, 'f"bs={runner.capture_bs}, "', "sglang/srt/model_executor/")),
    }
    simulated = {name: getattr(rel, name) for name in real}
    assert simulated == real, {k: (simulated[k], real[k]) for k in real if simulated[k] != real[k]}
    switches = {n for n, v in vars(Release).items() if isinstance(v, property) and n != "text"}
    assert switches <= set(real), f"switches not checked against the wheel: {switches - set(real)}"


# -- 2. the parser ---------------------------------------------------------------------------

def sim_actions(rel: Release, ddtree: bool = False) -> list[argparse.Action]:
    parser = sim_args.build_parser(rel, "sglang serve", ddtree)
    return [a for a in parser._actions if a.option_strings and "--help" not in a.option_strings]  # noqa: SLF001


# flags whose choices the simulator must enforce (it accepts any --kv-cache-dtype,
# --attention-backend, ... value: a known gap, those change nothing it simulates)
MODELLED_CHOICES = ("--dtype", "--speculative-algorithm", "--mamba-scheduler-strategy",
                    "--mamba-radix-cache-strategy", "--cuda-graph-backend-decode", "--cuda-graph-backend-prefill")


# flags whose defaults the simulator models (the others it only accepts)
MODELLED_DEFAULTS = ("--host", "--port", "--tp-size", "--dp-size", "--pp-size", "--context-length",
                     "--mem-fraction-static", "--max-running-requests", "--max-total-tokens",
                     "--chunked-prefill-size", "--page-size", "--dtype", "--kv-cache-dtype", "--log-level",
                     "--watchdog-timeout", "--mamba-full-memory-ratio", "--max-mamba-cache-size",
                     "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                     "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--cuda-graph-backend-decode",
                     "--cuda-graph-backend-prefill", "--mamba-radix-cache-strategy", "--api-key")


@pytest.mark.parametrize("wheel_path", WHEELS, ids=IDS)
def test_every_simulator_flag_choice_and_default_is_the_releases(wheel_path):
    rel = sim_release(wheel_path)
    flags = real_flags(wheel_path)
    problems = []
    for action in sim_actions(rel):
        for opt in action.option_strings:
            if opt not in flags:
                problems.append(f"{opt}: not a flag of {rel.text}")
        info = flags.get(action.option_strings[0])
        if info is None:
            continue
        if action.choices is not None and isinstance(info["choices"], (list, tuple, set)):
            want = list(info["choices"])
            if sorted(action.choices) != sorted(want):
                problems.append(f"{opt}: choices {sorted(action.choices)} != real {sorted(want)}")
        if action.choices is None and isinstance(info["choices"], (list, tuple)) and opt in MODELLED_CHOICES:
            problems.append(f"{opt}: real choices {info['choices']}, the simulator takes any value")
        if opt in MODELLED_DEFAULTS and info["default"] is not MISSING and action.default != info["default"]:
            problems.append(f"{opt}: default {action.default!r} != real {info['default']!r} ({info['file']}:{info['line']})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("wheel_path", WHEELS, ids=IDS)
def test_flags_the_collection_and_real_hosts_use_exist(wheel_path):
    rel = sim_release(wheel_path)
    accepted = {o for a in sim_actions(rel) for o in a.option_strings}
    needed = {"--disable-radix-cache", "--device", "--sampling-backend", "--max-total-tokens", "--enable-metrics",
              "--log-level", "--skip-server-warmup", "--watchdog-timeout", "--config", "--api-key"}
    if rel.has_mamba_scheduler_strategy:
        needed.add("--mamba-scheduler-strategy")
    if rel.has_mamba_radix_cache_strategy:
        needed.add("--mamba-radix-cache-strategy")
    assert needed <= accepted, needed - accepted
    assert needed <= set(real_flags(wheel_path)), needed - set(real_flags(wheel_path))


@pytest.mark.parametrize("wheel_path", WHEELS, ids=IDS)
def test_speculative_algorithms_are_the_releases(wheel_path):
    rel, wheel = sim_release(wheel_path), Wheel(wheel_path)
    flags = real_flags(wheel_path)
    choices = flags["--speculative-algorithm"]["choices"]
    if choices is None:  # builtins of SpeculativeAlgorithm plus the NEXTN alias
        choices = [m for m in spec_enum(wheel) if m != "NONE"] + ["NEXTN"]
    assert sorted(sim_args.spec_algorithms(rel, ddtree=False)) == sorted(choices)


def test_no_mem_fraction_static_range_check_in_any_release():
    # no release checks the range (real-sglang.md); neither may the simulator
    ns = sim_args.build_parser(Release((0, 5, 11)), "x").parse_args(["--model-path", "m", "--mem-fraction-static", "1.5"])
    assert sim_args.validate(Release((0, 5, 11)), ns, ddtree=False) == []
    for path in WHEELS:
        assert not grep(Wheel(path), "mem_fraction_static must be in"), path.name


# -- 3a. the radix-cache refusal -------------------------------------------------------------

@pytest.mark.parametrize("wheel_path", WHEELS, ids=IDS)
def test_hybrid_architectures_are_the_releases(wheel_path):
    rel, wheel = sim_release(wheel_path), Wheel(wheel_path)
    if not rel.radix_refuses_spec_on_hybrid:
        return
    source = wheel.source("sglang/srt/server_args.py")
    assert "def _handle_mamba_radix_cache" in source
    for arch in sim_radix.HYBRID_RADIX_ARCHITECTURES:
        assert f'"{arch}"' in source, f"{arch} not handled by {rel.text} server_args.py"


# -- 3h. every message the simulator prints ----------------------------------------------------

def branch_taken(conditions: list[tuple[ast.expr, bool]], rel: Release) -> bool:
    """Whether the simulator takes the branches a message sits in, for this release:
    conditions on the release (``self.release.X``, ``release.version < (...)``) are
    evaluated; any other condition counts as taken."""
    for test, wanted in conditions:
        code = ast.unparse(test)
        if "release" not in code:
            continue
        try:
            value = eval(code, {}, {"self": argparse.Namespace(release=rel), "release": rel})  # noqa: S307
        except Exception:  # noqa: BLE001 - a condition on something else as well
            continue
        if bool(value) != wanted:
            return False
    return True


def _parents(tree: ast.AST) -> dict:
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def conditions_of(node, parents) -> list[tuple[ast.expr, bool]]:
    out = []
    child = node
    while child in parents:
        parent = parents[child]
        if isinstance(parent, (ast.If, ast.IfExp)):
            body = parent.body if isinstance(parent.body, list) else [parent.body]
            if child in body:
                out.append((parent.test, True))
            elif child is not parent.test:
                out.append((parent.test, False))
        child = parent
    return out


def simulator_messages(rel: Release | None = None) -> list[tuple[str, int, str]]:
    """(file, line, template) of every string passed to log(), uvicorn_log(), a
    raised simulator error or returned as an error text, f-string holes as {};
    with ``rel``, only those on the branches the simulator takes for that release."""
    out = []
    for path in sorted(SIM.glob("*.py")):
        if path.name in ("nvidia_smi.py", "hardware.py", "__init__.py"):
            continue
        tree = ast.parse(path.read_text())
        parents = _parents(tree)
        for node in ast.walk(tree):
            if rel is not None and isinstance(node, (ast.Call, ast.Return)) and not branch_taken(
                    conditions_of(node, parents), rel):
                continue
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name in ("log", "uvicorn_log", "RadixRefusal", "ArgumentValidationError", "PoolSizingError",
                            "ModelPathError", "die") or (name == "append" and getattr(node.func.value, "id", "") == "warnings"):
                    for arg in node.args[:1]:
                        out.append((path.name, node.lineno, template(arg)))
            if isinstance(node, ast.Return) and isinstance(node.value, (ast.JoinedStr, ast.BinOp, ast.Constant)) \
                    and path.name == "memory.py":
                out.append((path.name, node.lineno, template(node.value)))
    return [(f, n, t) for f, n, t in out if t.strip("{} \n")]


def template(node) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return template(node.left) + template(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return re.sub(r"%[sd]", "{}", template(node.left))
    return "{}"


# lines that are the simulator's own, honestly named, or not SGLang's (uvicorn, Python, torch, HF)
NOT_SGLANG = (
    "sglang-simulator",
    "INFO:     ", "ERROR:    ",  # uvicorn
    "Traceback (most recent call last)", '  File "', "    ", "During handling of the above exception",
    "torch.", "OSError: ", "huggingface_hub.", "RuntimeError: CUDA error", "ImportError: Could not load any common_ops",
    "RuntimeError: {}",  # the hardware file of the lab (not a real host)
    # torch / CUDA runtime text (c10/cuda/CUDAException.cpp), not SGLang's
    "GPU device may be out of range", "CUDA kernel errors might be asynchronously", "For debugging consider passing",
    "Compile with `TORCH_USE_CUDA_DSA`",
    # fastapi 0.165.0's included router met by 0.5.9-0.5.15's metrics middleware (measured on real 0.5.11)
    "AttributeError: '_IncludedRouter' object has no attribute 'path'",
)
REAL_PREFIX = re.compile(r"^(ValueError|RuntimeError|Exception|AssertionError): ")


def pieces(text: str) -> list[str]:
    """The literal runs of a template, per line, long enough to mean something."""
    out = []
    for line in text.splitlines():
        if line.startswith(NOT_SGLANG):
            continue
        line = REAL_PREFIX.sub("", line)
        # literal runs between holes, cut at sentence ends (SGLang often joins a
        # message from separate literals: msg += f" Current value: ...")
        out += [q for p in line.split("{}") for q in re.split(r"(?<=\.) ", p) if len(q.strip()) >= 12]
    return out


MESSAGES_TEST = "test_every_simulator_message_exists_in_the_release"


def corpus_of(path: Path) -> str:
    return "\n".join(string_constants(path))


# A release's corpus depends on nothing but its wheel's bytes, the code that reads it and the
# interpreter's ast: it is kept in the per-user cache under a key of all three, so a fresh
# clone on a machine that parsed a wheel once reads it back (parsing the 15 releases takes
# about 200 s of CPU on a 2-core machine). test_the_corpus_cache_gives_what_parsing_gives
# checks a cached corpus against a fresh parse.
CORPUS_CACHE = Path(os.environ.get("INFEROPS_CACHE_DIR")
                    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "inferops-sglang") / "corpora"


def corpus_key(path: Path) -> str:
    digest = hashlib.sha256()
    for code in (inspect.getsource(Wheel), inspect.getsource(string_constants), repr(MESSAGE_DIRS), sys.version):
        digest.update(code.encode() + b"\0")
    with open(path, "rb") as wheel:
        for chunk in iter(lambda: wheel.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:32]


def cached_corpus(path: Path) -> str:
    """corpus_of(path), from the cache when this exact wheel was read by this exact code before;
    a new entry is written to a temporary file and renamed into place."""
    entry = CORPUS_CACHE / f"{path.name}.{corpus_key(path)}.txt"
    try:
        return entry.read_text(encoding="utf-8")
    except FileNotFoundError:
        pass
    corpus = corpus_of(path)
    CORPUS_CACHE.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=CORPUS_CACHE, prefix=".corpus.")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(corpus)
    os.replace(tmp, entry)
    return corpus


@pytest.fixture(scope="module")
def corpora(request) -> dict[Path, str]:
    """wheel -> its string constants (string_constants), for the wheels whose message case is
    selected: from the cache, or parsed, two processes sharing the work (seconds of CPU each)."""
    wanted = [item.callspec.params["wheel_path"] for item in request.session.items
              if getattr(item, "originalname", None) == MESSAGES_TEST and hasattr(item, "callspec")]
    with ProcessPoolExecutor(max_workers=2) as pool:
        return dict(zip(wanted, pool.map(cached_corpus, wanted)))


def test_the_corpus_cache_gives_what_parsing_gives(corpora):
    """The pinned release's corpus as the message cases got it (from the cache on a warm machine)
    is what parsing its wheel gives now; and a wheel with other bytes has another key."""
    (pinned,) = [path for path in WHEELS if path.name.startswith("sglang-0.5.11-")]
    assert corpora.get(pinned, cached_corpus(pinned)) == corpus_of(pinned)
    assert (CORPUS_CACHE / f"{pinned.name}.{corpus_key(pinned)}.txt").is_file()
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / pinned.name
        other.write_bytes(pinned.read_bytes() + b"\0")
        assert corpus_key(other) != corpus_key(pinned)


@pytest.mark.parametrize("wheel_path", WHEELS, ids=IDS)
def test_every_simulator_message_exists_in_the_release(wheel_path, corpora):
    corpus = corpora[wheel_path]
    rel = sim_release(wheel_path)
    missing = []
    for file, line, text in simulator_messages(rel):
        for piece in pieces(text):
            if piece not in corpus and piece.strip() not in corpus:
                missing.append(f"{file}:{line}: {piece!r}")
    # messages that exist only in some releases
    allowed = set()
    # messages whose guard is not a condition on the release in the same function
    allowed = set()
    if not rel.new_pool_error:
        allowed |= {m for m in missing if "Loaded weights" in m or "minimum viable" in m or "draft weights are now" in m
                    or "Raise --mem-fraction-static above" in m}
    if not rel.radix_refuses_spec_on_hybrid:  # radix.resolve raises only on 0.5.10-0.5.13
        allowed |= {m for m in missing if "radix.py" in m and "Disabling radix cache" not in m}
    if not rel.has_dflash:  # validate() is reached only with an algorithm the parser accepted
        allowed |= {m for m in missing if "DFLASH speculative decoding requires" in m}
    left = [m for m in missing if m not in allowed]
    assert not left, "simulator messages with no counterpart in " + rel.text + ":\n" + "\n".join(left)
