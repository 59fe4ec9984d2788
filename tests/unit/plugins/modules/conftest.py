"""Fixtures shared by the ddtree_build module tests (test_ddtree_build*.py): a
virtual environment with the real SGLang 0.5.11 installed, once per test
session, a fresh copy of it per test, and a CUDA 12 runtime stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest
from ddtree_helpers import copy_venv, lab_ddtree, make_venv


@pytest.fixture(scope="session")
def pristine(tmp_path_factory) -> Path:
    """SGLang installed into a throwaway venv, shared by the tests of every module: never change it, copy it."""
    return make_venv(tmp_path_factory.mktemp("ddtree-venv") / "venv")


@pytest.fixture
def venv(pristine, tmp_path) -> Path:
    """A copy of ``pristine`` of this test's own."""
    return copy_venv(pristine, tmp_path / "venv")


@pytest.fixture(scope="module")
def cuda12(tmp_path_factory) -> Path:
    """A CUDA 12 runtime stand-in (soname only, a test double): what ct200 has and ct129 lacks."""
    directory = tmp_path_factory.mktemp("cuda12")
    lab_ddtree().soname_stub(directory, "libcudart.so.12")
    return directory
