# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: argument_checks
short_description: The command lines the host's SGLang argues before a switch
version_added: 0.1.0
description:
  - >-
    From the service's state before a deploy (M(inferops.sglang.sglang_deploy_lock)'s
    RV(inferops.sglang.sglang_deploy_lock#module:before)), the variant and the baseline as C(sglang_preflight)
    resolved them and the validated GPU list: the command lines to give
    M(inferops.sglang.sglang_server_args), each once, labelled (C(label), C(argv)). The variant's, then the rollback
    target's: the running service's, the saved known-good one's, or on a host's first deploy the baseline's.
  - >-
    A command line the active service runs under the SGLang installed now is left out: that SGLang took it when the
    service started. So is the variant's when it is that service on the same GPUs (a re-deploy that changes nothing).
  - The sglang_service role loops M(inferops.sglang.sglang_server_args) over it (C(plugins/module_utils/_deploy.py)).
author:
  - inferops.sglang contributors (@inferops)
options:
  _input:
    description:
      - The service before the deploy (M(inferops.sglang.sglang_deploy_lock)'s
        RV(inferops.sglang.sglang_deploy_lock#module:before)).
    type: dict
    required: true
  variant:
    description: The variant as C(sglang_preflight) resolved it (C(variant), C(argv), C(sglang_version)).
    type: dict
    required: true
  baseline:
    description: The baseline as C(sglang_preflight) resolved it, or null.
    type: dict
  gpus:
    description: The GPU indexes the variant runs on.
    type: list
    elements: int
    required: true
"""

EXAMPLES = r"""
- name: SGLang's own argument checks on the variant and the rollback target
  inferops.sglang.sglang_server_args:
    python: /opt/sglang/venv/bin/python
    argv: "{{ item.argv }}"
    label: "{{ item.label }}"
  loop: "{{ before | inferops.sglang.argument_checks(variant, baseline, [0, 2]) }}"
"""

RETURN = r"""
_value:
  description: The command lines to argue, each C({label, argv}), in that order.
  type: list
  elements: dict
"""

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy


def argument_checks(before, variant, baseline=None, gpus=None) -> list:
    return _deploy.argument_checks(dict(before or {}), dict(variant or {}), dict(baseline) if baseline else None,
                                   [int(g) for g in gpus or ()])


class FilterModule:
    def filters(self):
        return {"argument_checks": argument_checks}
