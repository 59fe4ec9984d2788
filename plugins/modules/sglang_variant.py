#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_variant
short_description: Resolve an SGLang service variant for this host and prove it can start, before anything changes
version_added: 0.1.0
description:
  - Resolves O(name) (or an alias) in the variant table, lays the host's overrides over it, and checks every
    parameter's type and range.
  - >-
    On the host it then checks what the variant needs, read-only. The SGLang version installed in the environment
    of O(python). That C(python -m sglang.launch_server --help) accepts every flag of the rendered command line
    and offers its speculative algorithm (a removed flag or a missing DDTree build is found here, not by a crashed
    service). The model and draft model directories with their C(config.json), and that the unit's sandbox lets the
    service see them (not under C(/tmp), C(/var/tmp), C(/root), C(/home) or C(/run/user), nor through a symlink
    there: C(PrivateTmp=yes) and C(ProtectHome=yes), systemd.exec(5)). Each of O(read_write_paths) exists (a
    missing C(ReadWritePaths=) fails the unit at start). C(context_length) within the
    maximum of the model (C(max_position_embeddings)). O(tp_size) equal to the number of O(gpu_devices). Each GPU
    in O(gpu_devices) answering C(nvidia-smi) (a lost GPU fails here).
  - >-
    With O(memory_plan), it plans the variant's GPU memory for the installed SGLang version (the planner of
    M(inferops.sglang.sglang_memory_plan)) and refuses a variant that cannot fit, with the planner's reason and the
    envelope that would fit, unless O(memory_override) is set.
  - All problems are reported together; the module fails when there is any. It never changes anything.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
  - inferops.sglang.variant_table
options:
  name:
    description: The variant to resolve (a name or an alias).
    type: str
    required: true
  baseline:
    description:
      - The variant a failed switch falls back to on a host with no saved known-good service (the role's
        C(sglang_service_baseline_variant)). It is resolved and checked with every other option of this call, as
        O(name) is, and returned as RV(baseline) with its problems; they do not fail the module (the caller decides
        whether the baseline is needed).
    type: str
  python:
    description: The Python of the environment SGLang is installed in.
    type: path
    default: /opt/sglang/venv/bin/python
  model_path:
    description: The model directory on the host.
    type: path
    required: true
  served_model_name:
    description: The name the server lists in C(/v1/models).
    type: str
  draft_model_path:
    description: The draft model directory, for variants with C(draft_model=true).
    type: path
  read_write_paths:
    description:
      - The unit's C(ReadWritePaths=) (the role's C(sglang_service_read_write_paths)); each must be absolute and exist
        on the host, unless prefixed with C(-) (systemd then skips a missing one).
    type: list
    elements: str
    default: []
  bind_host:
    description: Address the server listens on.
    type: str
    default: 127.0.0.1
  port:
    description: Port the server listens on.
    type: int
    default: 30000
  metrics:
    description:
      - >-
        Render C(--enable-metrics), so that the server exposes Prometheus metrics on C(/metrics) at its own port;
        no API key is needed there (0.5.11 C(srt/utils/auth.py:100), 0.5.23 C(:101-105)).
      - >-
        Real SGLang keeps the metrics' multiprocess files in a temporary directory when C(PROMETHEUS_MULTIPROC_DIR) is
        unset (0.5.11 C(srt/utils/common.py:1394-1409)); the unit's C(PrivateTmp=yes) gives each start an empty one,
        removed at stop, so no count of an earlier run is summed into a new one.
    type: bool
    default: false
  tp_size:
    description: Tensor-parallel size; must equal the number of O(gpu_devices).
    type: int
    required: true
  gpu_devices:
    description: The GPU indexes the server may use (its C(CUDA_VISIBLE_DEVICES)).
    type: list
    elements: int
    required: true
  check_gpus:
    description: Query each GPU of O(gpu_devices) with C(nvidia-smi).
    type: bool
    default: true
  check_help:
    description:
      - Check the rendered flags and the speculative algorithm against C(python -m sglang.launch_server --help) (one
        import of SGLang, seconds of CPU on a real host).
      - The C(sglang_service) role turns it off when SGLang's own argument checks
        (M(inferops.sglang.sglang_server_args)) run on the same command lines, which refuse what C(--help) would (an
        unknown flag, an algorithm outside the choices) with SGLang's own message.
    type: bool
    default: true
  memory_plan:
    description:
      - Plan the variant's GPU memory with the planner of M(inferops.sglang.sglang_memory_plan) (the GPUs' memory is
        read with C(nvidia-smi)) and fail when it cannot fit, with the planner's explanation.
    type: bool
    default: true
  memory_override:
    description: Let a variant the planner says cannot fit pass anyway (a warning says why it would not fit).
    type: bool
    default: false
  memory_assumptions:
    description: Overrides of the planner's estimates, see M(inferops.sglang.sglang_memory_plan).
    type: dict
    default: {}
  credentials:
    description:
      - The unit hands the service a file by C(LoadCredential=) (the role does when an API key is set). Check that
        systemd on this host delivers it to a service's user, with a transient service (C(systemd-run), as
        C(nobody), C(SetCredential=)) that must read it back. Where the root mount is not shared, as in a privileged
        container, systemd 252 gives the service an empty directory and SGLang dies at start.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Resolve and preflight the balanced variant
  inferops.sglang.sglang_variant:
    name: balanced
    variants: "{{ sglang_service_variants }}"
    aliases: "{{ sglang_service_variant_aliases }}"
    model_path: /srv/models/Qwen3.6-27B
    draft_model_path: /srv/models/Qwen3.6-27B-DFlash
    tp_size: 2
    gpu_devices: [0, 2]
  register: variant
"""

RETURN = r"""
variant:
  description: The canonical variant name.
  returned: success
  type: str
  sample: shadow-balanced
params:
  description: The resolved parameters (inheritance and overrides applied).
  returned: success
  type: dict
argv:
  description: The server's flags for the installed SGLang version (no API key).
  returned: success
  type: list
  elements: str
exec_args:
  description: RV(argv) quoted for a systemd C(ExecStart=) line.
  returned: success
  type: str
sglang_version:
  description: The SGLang version installed in O(python)'s environment.
  returned: always
  type: str
  sample: 0.5.11
max_position_embeddings:
  description: The model's longest context, from its C(config.json).
  returned: success
  type: int
memory_plan:
  description: The planner's plan for the variant on this host (see M(inferops.sglang.sglang_memory_plan)).
  returned: success and O(memory_plan)
  type: dict
memory_warnings:
  description: Why the variant passed although the planner says it does not fit (O(memory_override)), or why it was not planned.
  returned: success
  type: list
  elements: str
url:
  description: The URL the server answers on, from O(bind_host) and O(port) (a wildcard address is asked on
    the loopback of its family, C(0.0.0.0) on C(127.0.0.1), C(::) on C(::1); an IPv6 address is bracketed).
  returned: success
  type: str
  sample: http://127.0.0.1:30000
privileged_port:
  description:
    - Whether O(port) is below the host's unprivileged range (the sysctl C(net.ipv4.ip_unprivileged_port_start),
      1024 by default), so that no other local user can bind it; the role's unit then gives the server the
      capability C(CAP_NET_BIND_SERVICE) and no other.
  returned: success
  type: bool
baseline:
  description:
    - O(baseline) resolved and checked as O(name) is; null without O(baseline).
    - C(variant), C(params), C(argv), C(exec_args), C(sglang_version), C(max_position_embeddings), C(memory_plan),
      C(memory_warnings) and C(privileged_port) as for O(name), and C(errors) (empty when the baseline can run on this host), the same keys
      the role renders a variant from.
  returned: success
  type: dict
errors:
  description: Every problem found (the task fails when there is any).
  returned: failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _preflight
from ansible_collections.inferops.sglang.plugins.module_utils import _variants as variants_mod


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            baseline=dict(type="str"),
            **variants_mod.TABLE_ARGS,
            python=dict(type="path", default="/opt/sglang/venv/bin/python"),
            model_path=dict(type="path", required=True),
            served_model_name=dict(type="str"),
            draft_model_path=dict(type="path"),
            read_write_paths=dict(type="list", elements="str", default=[]),
            bind_host=dict(type="str", default="127.0.0.1"),
            metrics=dict(type="bool", default=False),
            port=dict(type="int", default=30000),
            tp_size=dict(type="int", required=True),
            gpu_devices=dict(type="list", elements="int", required=True),
            check_gpus=dict(type="bool", default=True),
            check_help=dict(type="bool", default=True),
            memory_plan=dict(type="bool", default=True),
            memory_override=dict(type="bool", default=False),
            memory_assumptions=dict(type="dict", default={}),
            credentials=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    try:
        result = _preflight.variant(module.params, module.run_command)
    except _preflight.Refused as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    for warning in result["memory_warnings"]:
        module.warn(warning)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
