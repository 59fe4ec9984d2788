#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_inputs
short_description: Refuse hostile or mistaken deploy input before anything on the host changes
version_added: 0.1.0
description:
  - >-
    Checks the sglang_service role's input, first thing in the deploy's preflight: every value that reaches the
    unit file, the C(--config) file, the logging file or C(current.json), every name that becomes part of a path,
    the API key, and every setting the switch and the rollback use after the running service is stopped.
  - >-
    Refused: control characters (below 0x20, 0x7f, U+0085, U+2028, U+2029) in any of those values (a newline in a
    unit file starts a line of its own); a service name that is not C([a-z0-9][a-z0-9._-]*.service) or holds
    C(..); variant and alias names that are not C([a-z0-9][a-z0-9._-]*) or hold C(..); user and group names that
    are not C([a-z_][a-z0-9_-]*); environment variable names that are not C([A-Za-z_][A-Za-z0-9_]*); read-write
    paths that are not absolute or hold whitespace, quotes or backslashes; an API key that is not printable ASCII,
    begins or ends with a space or begins with C(-); the settings in O(settings) out of their range; and a gate
    interval longer than the gate timeout of O(variant) or O(baseline_variant).
  - All problems are reported together; the module fails when there is any. Messages never contain the API key.
    It never changes anything.
  - >-
    The check runs on the controller (its action plugin) and nothing is sent to the host: O(settings) may hold the
    rotation hooks' URLs and headers, and a module's options are logged in the host's journal.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
options:
  service_name:
    description: The unit's name (C(sglang_service_name)).
    type: str
  user:
    description: The service user.
    type: str
  group:
    description: The service group.
    type: str
  variant:
    description: The variant asked for (a name or an alias; resolved by M(inferops.sglang.sglang_variant)).
    type: str
  baseline_variant:
    description: The variant a first deploy's rollback renders (C(sglang_service_baseline_variant)).
    type: str
  variants:
    description: The variant table; its keys and every string in it are checked.
    type: dict
    default: {}
  aliases:
    description: Variant aliases; the aliases and their targets are checked as names.
    type: dict
    default: {}
  overrides:
    description: Per-variant parameter overrides.
    type: dict
    default: {}
  common:
    description: Overrides for every variant.
    type: dict
    default: {}
  served_model_name:
    description: The name the server lists in C(/v1/models) (the unit's C(Description=)).
    type: str
  model_path:
    description: The model directory.
    type: str
  draft_model_path:
    description: The draft model directory.
    type: str
  bind_host:
    description: The address the server listens on.
    type: str
  python:
    description: The venv's python (C(ExecStart=)).
    type: str
  state_dir:
    description: Where attempts, the known-good service and the history are kept.
    type: str
  environment:
    description: The unit's environment (name to value), as the preflight resolved it.
    type: raw
  read_write_paths:
    description: The unit's C(ReadWritePaths=).
    type: raw
  api_key:
    description: The server's API key.
    type: str
  settings:
    description:
      - The settings the switch and the rollback use, by role variable name (C(sglang_service_gate_interval),
        C(sglang_service_gate_generations), C(sglang_service_gate_settle), C(sglang_service_gate_stall_budgets),
        C(sglang_service_gate_progress_interval), C(sglang_service_plan_tolerance),
        C(sglang_service_release_timeout), C(sglang_service_release_threshold_mib), C(sglang_service_lock_timeout),
        C(sglang_service_lock_lease), C(sglang_service_keep_attempts), C(sglang_service_args_timeout),
        C(sglang_service_drain_timeout), C(sglang_service_drain_interval)), the rotation hooks
        (C(sglang_service_rotation_out), C(sglang_service_rotation_in)) and the performance gate's settings
        (C(sglang_service_perf_gate), C(sglang_service_perf_load), C(sglang_service_perf_thresholds)).
      - Numbers given as strings (C(-e name=VALUE)) are read as numbers.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Refuse bad input before anything changes
  inferops.sglang.sglang_inputs:
    service_name: "{{ sglang_service_name }}"
    user: "{{ sglang_service_user }}"
    group: "{{ sglang_service_group }}"
    variants: "{{ sglang_service_variants }}"
    api_key: "{{ sglang_service_api_key }}"
    settings:
      sglang_service_gate_interval: "{{ sglang_service_gate_interval }}"
"""

RETURN = r"""
errors:
  description: Every problem found (the task fails when there is any).
  returned: failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _inputs


def main() -> None:
    module = AnsibleModule(
        argument_spec=_inputs.ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    errors = _inputs.check(module.params)
    if errors:
        module.fail_json(msg=_inputs.refusal(errors), errors=errors)
    module.exit_json(changed=False)


if __name__ == "__main__":
    main()
