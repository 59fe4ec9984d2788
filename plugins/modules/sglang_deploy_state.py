#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_state
short_description: Read a host's SGLang service before a deploy, and add the rotation hook's result to its record
version_added: 0.3.0
description:
  - The two things the sglang_service role does to the service's state outside the switch itself
    (M(inferops.sglang.sglang_switch), which runs the switch as one state machine).
  - O(step=inspect) reads the service's state before a deploy (active, loaded, the variant recorded as running, an
    interrupted switch's marker, a saved known-good service), as the switch's first state reads it. Read-only.
  - O(step=amend) adds the rotation hooks' results (O(rotation)) to this run's O(record). The in hook runs on the
    controller after the switch's job has recorded the switch, so its line in C(history.jsonl) (the last with the
    record's run id) is rewritten with them in one step, and the summary is made again. A record whose host is
    unchanged has no line and is only returned.
author:
  - inferops.sglang contributors (@inferops)
attributes:
  check_mode:
    description: Can run in check mode and return the changed status prediction without modifying the target.
    support: full
    details: O(step=amend) writes nothing in check mode.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
options:
  step:
    description: What to do.
    type: str
    required: true
    choices: [inspect, amend]
  service_dir:
    description: The service's state directory (C(current.json), C(switch.json), C(known-good/), C(history.jsonl)).
    type: path
    required: true
  unit:
    description: The systemd unit (O(step=inspect)).
    type: str
  files:
    description:
      - The files that make the service (name, src, mode), the unit first (O(step=inspect)).
    type: list
    elements: dict
    default: []
  record:
    description: This run's record, as M(inferops.sglang.sglang_switch) returned it (O(step=amend)).
    type: dict
  rotation:
    description: The rotation hooks' results, C(out) and C(in), each with C(ok) and C(msg) (O(step=amend)).
    type: dict
"""

EXAMPLES = r"""
- name: Read the service's state
  inferops.sglang.sglang_deploy_state:
    step: inspect
    service_dir: /var/lib/inferops-sglang/sglang-qwen
    unit: sglang-qwen.service
    files:
      - {name: sglang-qwen.service, src: /etc/systemd/system/sglang-qwen.service, mode: "0644"}
  register: before
"""

RETURN = r"""
before:
  description: O(step=inspect). C(active), C(loaded), C(variant) (recorded as running, or null), C(interrupted),
    C(argv) and C(url) (its recorded flags and the URL they give, or null), C(api_key_file) (the installed --config file, or null),
    C(marker) (the interrupted switch's marker), C(known_good) (a known-good unit is saved), C(known_good_variant), C(known_good_argv),
    C(sglang_version) and C(gpu_devices) (as recorded), C(gate_timeout) and C(known_good_gate_timeout) (the running and the
    saved service's own gate timeouts, or null).
  returned: step is inspect
  type: dict
record:
  description: O(step=amend). The record with the rotation hooks' results.
  returned: step is amend
  type: dict
summary:
  description: O(step=amend). What the operator reads.
  returned: step is amend
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _switch


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            step=dict(type="str", required=True, choices=["inspect", "amend"]),
            service_dir=dict(type="path", required=True),
            unit=dict(type="str"),
            files=dict(type="list", elements="dict", default=[]),
            record=dict(type="dict"),
            rotation=dict(type="dict"),
        ),
        required_if=[("step", "inspect", ["unit"]), ("step", "amend", ["record"])],
        supports_check_mode=True,
    )
    p = module.params
    for item in p["files"]:
        missing = [k for k in ("name", "src", "mode") if not item.get(k)]
        if missing:
            module.fail_json(msg=f"each of files needs name, src and mode; {item!r} lacks {', '.join(missing)}")
    host = _switch.SystemHost(p["unit"] or "", module.run_command)
    try:
        if p["step"] == "inspect":
            module.exit_json(changed=False, before=_switch.inspect(host, p["unit"], p["service_dir"], p["files"]))
        if module.check_mode:
            module.exit_json(changed=False, record=p["record"], summary="")
        record, summary, written = _switch.amend_rotation(host, p["service_dir"], p["record"], p["rotation"] or {})
    except _switch.HostError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=written, record=record, summary=summary)


if __name__ == "__main__":
    main()
