"""plugins/module_utils/_sglang_releases.py against the real sglang wheels of
0.5.9 ... 0.5.23: every entry whose probe is a (paths, regex) pair has the
regex in one of those files of every release inside its range and of none
outside it; the piecewise-graph architecture lists are compared member by
member. Nothing is imported from the wheels: they are read with zipfile.
Skipped when the wheels are not there (lab/real/build.sh keeps them)."""

from __future__ import annotations

import ast
import functools
import os
import re
import zipfile
from pathlib import Path

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_releases as rel


def _wheel_dir() -> Path | None:
    try:
        from real_sglang import paths

        found = Path(paths()["INFEROPS_REAL_WHEELS"])
    except Exception:  # noqa: BLE001 - no build: fall back to the default cache
        found = Path(os.path.expanduser("~/.cache/inferops-sglang/real/wheels"))
    return found if found.is_dir() and any(found.glob("sglang-*.whl")) else None


WHEEL_DIR = _wheel_dir()
WHEELS = sorted(WHEEL_DIR.glob("sglang-*.whl"), key=lambda p: rel.parse(p.name.split("-")[1])) if WHEEL_DIR else []
pytestmark = pytest.mark.skipif(not WHEELS, reason="no real sglang wheels (lab/real/build.sh)")


@functools.lru_cache(maxsize=None)
def _sources(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        return {n[len("sglang/"):]: zf.read(n).decode("utf-8", "replace")
                for n in zf.namelist() if n.startswith("sglang/") and n.endswith(".py")}


def _found(wheel: Path, paths, regex: str) -> bool:
    sources = _sources(wheel)
    paths = (paths,) if isinstance(paths, str) else paths
    pattern = re.compile(regex)
    for path in paths:
        names = [n for n in sources if n.startswith(path)] if path.endswith("/") else [path]
        if any(pattern.search(sources.get(n, "")) for n in names):
            return True
    return False


def _version(wheel: Path) -> tuple:
    return rel.parse(wheel.name.split("-")[1])


CHECKED = [f for f in rel.FACTS if isinstance(f.probe, tuple)]


def test_all_releases_are_there():
    assert {"0.5.9", "0.5.11", "0.5.14", "0.5.20", "0.5.23"} <= {w.name.split("-")[1] for w in WHEELS}
    assert len(WHEELS) >= 15


@pytest.mark.parametrize("entry", CHECKED, ids=[f"{f.name}@{'.'.join(map(str, f.since))}" for f in CHECKED])
def test_text_marks_the_range(entry):
    wrong = []
    for wheel in WHEELS:
        version = _version(wheel)
        inside = entry.since <= version and (entry.until is None or version <= entry.until)
        if _found(wheel, *entry.probe) != inside:
            wrong.append(f"{wheel.name.split('-')[1]}: {'missing' if inside else 'present'}")
    assert not wrong, f"{entry.name} {entry.since}-{entry.until} ({entry.source}): {', '.join(wrong)}"


def _archs(wheel: Path, variable: str):
    source = _sources(wheel).get("srt/configs/model_config.py", "")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == variable for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


@pytest.mark.parametrize("name,variable", [
    ("piecewise_disabled_archs", "piecewise_cuda_graph_disabled_model_archs"),
    ("breakable_multimodal_archs", "multimodal_breakable_cuda_graph_supported_model_archs"),
])
def test_architecture_lists_per_release(name, variable):
    wrong = {}
    for wheel in WHEELS:
        want = rel.fact(name, _version(wheel))
        got = _archs(wheel, variable)
        if set(got) != set(want):
            wrong[wheel.name.split("-")[1]] = got
    assert not wrong


def test_small_gpu_tier_per_release():
    """The 20-35 GiB tier: the chunked-prefill value in the code, not only the comment."""
    for wheel in WHEELS:
        tiers = dict(rel.fact("gpu_tiers", _version(wheel)))
        chunked = tiers[35][0]
        sources = _sources(wheel)
        body = "".join(sources.get(n, "") for n in sources
                       if n in ("srt/server_args.py", "srt/arg_groups/memory_hook.py"))
        block = body[body.index("elif gpu_mem < 35 * 1024:"):body.index("elif gpu_mem < 60 * 1024:")]
        assert re.search(rf"chunked_prefill_size\s*=\s*{chunked}\b", block), wheel.name


def test_every_fact_has_a_check_or_a_reason():
    for entry in rel.FACTS:
        assert isinstance(entry.probe, tuple) or (isinstance(entry.probe, str) and len(entry.probe) > 15), entry
