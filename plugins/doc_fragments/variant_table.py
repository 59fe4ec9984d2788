# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The variant table and its overrides, as the role sglang_service passes them.
    DOCUMENTATION = r"""
options:
  variants:
    description: The variant table, name to parameters. See the role C(sglang_service) for the parameters.
    type: dict
    required: true
  aliases:
    description: Short names, alias to variant name.
    type: dict
    default: {}
  overrides:
    description: Per-variant parameter overrides (variant name to parameters), e.g. from host or group vars.
    type: dict
    default: {}
  common:
    description: Parameter overrides applied to whichever variant is resolved (last).
    type: dict
    default: {}
"""
