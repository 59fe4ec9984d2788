# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's module utilities for the tools, loaded from this working tree by file
(no Ansible, no installed collection): the same code the modules run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The module utilities import each other by bare name outside a collection.
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "plugins" / "module_utils" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
