"""Conformance tests: the collection's claims checked against real SGLang
(0.5.11, the pinned release, and 0.5.23) from lab/real/build.sh's cache."""

from __future__ import annotations

import sys

import pytest

from real_sglang import REPO, paths

sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(REPO / "lab" / "simulator"))


@pytest.fixture(scope="session")
def real() -> dict[str, str]:
    return paths()
