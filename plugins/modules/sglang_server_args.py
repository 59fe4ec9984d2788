#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_server_args
short_description: Put a server command line through the installed SGLang's own argument resolution, before anything changes
version_added: 0.1.0
description:
  - >-
    Runs, in the interpreter of the SGLang virtual environment (O(python)) and as its own process, what
    C(python -m sglang.launch_server) does with its arguments before any process starts, and nothing else:
    C(sglang.srt.server_args.prepare_server_args) on O(argv) (argparse, and up to SGLang 0.5.18
    C(ServerArgs.__post_init__), where those releases validate), then the record's C(resolve_once) where it exists
    (SGLang 0.5.19 and later), then its C(check_server_args).
  - >-
    A command line that C(--help) accepts can still be refused there, for example speculative decoding on a hybrid
    linear-attention model with radix cache on (SGLang 0.5.10 to 0.5.13), or NGRAM speculative decoding on a device
    that is not CUDA (up to 0.5.15). The module fails with SGLang's own message, as the service would fail at start.
  - >-
    On a GPU host the real GPUs answer SGLang's questions (their memory size and compute capability, from the CUDA
    runtime and C(nvidia-smi)), so the answer is the one the service would get; the model's C(config.json) is read.
    No server is started and nothing is allocated beyond what those SGLang calls do themselves. Nothing is
    downloaded (C(HF_HUB_OFFLINE=1) unless O(environment) says otherwise).
  - >-
    C(--config PATH) pairs are dropped from O(argv): the role's C(--config) file carries only the API key, which SGLang
    takes as it is and does not validate, and it exists only inside the unit (C(LoadCredential=)).
  - It never changes anything.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
options:
  python:
    description: The Python of the environment SGLang is installed in.
    type: path
    default: /opt/sglang/venv/bin/python
  argv:
    description:
      - The server's flags, as M(inferops.sglang.sglang_variant) returns them in its C(argv) result, without
        C(python -m sglang.launch_server).
    type: list
    elements: str
    required: true
  environment:
    description:
      - The unit's extra environment (its C(Environment=) lines), added to the module's own for the check, for example
        C(SGLANG_USE_CPU_ENGINE) and C(LD_LIBRARY_PATH) on a CPU host. It is not returned.
    type: dict
    default: {}
  timeout:
    description: Seconds the check may take (importing SGLang takes most of it); then it is killed and the task fails.
    type: int
    default: 180
  label:
    description: What is checked, for the messages, for example C(variant shadow-balanced) or C(rollback target nextn).
    type: str
    default: the server arguments
notes:
  - The simulator of the collection's lab answers the same entry point (C(sglang.srt.server_args)) with the refusals it
    knows, in the messages of the release it emulates.
"""

EXAMPLES = r"""
- name: Resolve the variant
  inferops.sglang.sglang_variant:
    name: shadow-balanced
    variants: "{{ sglang_service_variants }}"
    model_path: /srv/models/Qwen3.6-27B
    tp_size: 2
    gpu_devices: [0, 2]
  register: variant

- name: The installed SGLang accepts the variant's command line
  inferops.sglang.sglang_server_args:
    python: /opt/sglang/venv/bin/python
    argv: "{{ variant.argv }}"
    environment:
      CUDA_VISIBLE_DEVICES: "0,2"
    label: variant {{ variant.variant }}

- name: And the rollback target's, on a CPU host
  inferops.sglang.sglang_server_args:
    argv: "{{ rollback.argv }}"
    environment:
      SGLANG_USE_CPU_ENGINE: "1"
      LD_LIBRARY_PATH: /opt/inferops-lab/libcuda-stub
    timeout: 300
    label: rollback target {{ rollback.variant }}
"""

RETURN = r"""
ok:
  description: SGLang accepted the command line (the task fails when it did not).
  returned: when the check answered
  type: bool
sglang_version:
  description: The SGLang version that checked it (the simulator's carries C(+simulator)).
  returned: when the check answered
  type: str
  sample: 0.5.11
error:
  description: Why SGLang refused it; null when it accepted.
  returned: when the check answered
  type: dict
  contains:
    type:
      description: The exception, as SGLang raised it (C(ValueError), C(AssertionError)); C(SystemExit) for argparse.
      type: str
    message:
      description: >-
        SGLang's own message; for a flag it does not take, argparse's C(sglang serve: error: ...) line.
      type: str
    where:
      description: The SGLang C(file:line) that raised it, relative to the package's directory; C(argparse) for argparse.
      type: str
    stage:
      description: The call that raised it, one of C(import), C(prepare_server_args), C(resolve_once), C(check_server_args).
      type: str
    code:
      description: argparse's exit status.
      type: int
  sample:
    type: ValueError
    message: Ngram speculative decoding only supports CUDA device.
    where: sglang/srt/server_args.py:3559
    stage: prepare_server_args
resolved:
  description:
    - A few of the arguments as SGLang resolved them (fields this release lacks are left out), for example
      C(disable_radix_cache), C(speculative_algorithm), C(mem_fraction_static), C(max_running_requests),
      C(chunked_prefill_size), C(cuda_graph_max_bs) or C(cuda_graph_max_bs_decode), C(device), C(context_length).
    - Empty when argparse refused the command line; partly resolved when resolution failed.
  returned: when the check answered
  type: dict
  sample: {"device": "cuda", "disable_radix_cache": true, "speculative_algorithm": "NEXTN", "mem_fraction_static": 0.88}
elapsed:
  description: Seconds the check took, import of SGLang included.
  returned: always
  type: float
  sample: 6.4
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _server_args as server_args


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", default="/opt/sglang/venv/bin/python"),
            argv=dict(type="list", elements="str", required=True),
            environment=dict(type="dict", default={}),
            timeout=dict(type="int", default=180),
            label=dict(type="str", default=server_args.DEFAULT_LABEL),
        ),
        supports_check_mode=True,
    )
    p = module.params
    python, label, timeout = p["python"], p["label"], p["timeout"]
    if timeout < 1:
        module.fail_json(msg=f"timeout must be at least 1 second, got {timeout}", elapsed=0.0)
    problem = server_args.python_problem(python)
    if problem:
        module.fail_json(msg=f"cannot check {label}: {problem}", elapsed=0.0)
    timeout_bin = module.get_bin_path("timeout", required=True)

    start = time.monotonic()
    try:
        rc, out, err = module.run_command(server_args.command(python, timeout, timeout_bin), data=server_args.request(p["argv"]),
                                          environ_update=server_args.environment(p["environment"]), handle_exceptions=False)
    except OSError as exc:
        # EPIPE: the request could not be written, the interpreter ended before it read it
        why = f"it ended before it read its request ({exc})" if isinstance(exc, BrokenPipeError) else str(exc)
        module.fail_json(msg=f"SGLang's argument check of {label} could not run in {python}: {why}",
                         elapsed=round(time.monotonic() - start, 2))
    elapsed = round(time.monotonic() - start, 2)
    try:
        answer = server_args.outcome(rc, out, err, python, label, timeout)
    except server_args.HarnessError as exc:
        module.fail_json(msg=str(exc), rc=rc, stderr=server_args.tail(err, 4000), elapsed=elapsed)
    result = dict(changed=False, ok=bool(answer.get("ok")), sglang_version=answer.get("sglang_version"),
                  error=answer.get("error"), resolved=answer.get("resolved") or {}, elapsed=elapsed)
    refused = server_args.refusal(answer, label, python)
    if refused:
        module.fail_json(msg=refused, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
