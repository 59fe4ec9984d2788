"""Conformance tests: the collection's claims checked against real SGLang
(0.5.11, the pinned release, and 0.5.23) from lab/real/build.sh's cache."""

from __future__ import annotations

import sys

import pytest

from real_sglang import REPO, paths, validate_gpu_cases

sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(REPO / "lab" / "simulator"))


@pytest.fixture(scope="session")
def real() -> dict[str, str]:
    return paths()


@pytest.fixture(scope="session")
def gpu_validated(real) -> dict:
    """lab/real/validate_args.py's answers to every case the modules registered
    (real_sglang.register_gpu_cases): one process per release and GPU profile, two at a time."""
    return validate_gpu_cases(real)
