# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Full check mode support, no diff: a module that only reads the host, or one that says
    # in its own attributes (check_mode details, diff_mode) how it predicts a change.
    CHECK_MODE = r"""
attributes:
  check_mode:
    description: Can run in check mode and return the changed status prediction without modifying the target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
"""

    # A module that changes the host (ddtree_build lays files over site-packages): check mode
    # predicts the change without making it; no diff (the files are reported with their hashes).
    WRITES = r"""
attributes:
  check_mode:
    description: Can run in check mode and return the changed status prediction without modifying the target.
    support: full
    details: In check mode nothing on the target changes; the result lists the files that would change.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
    details: The changed files are reported in RV(changes) with their SHA-256, not as a diff.
"""
