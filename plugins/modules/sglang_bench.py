#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_bench
short_description: Measure a serving SGLang server under a short fixed load, and compare it with known-good figures
version_added: 0.1.0
description:
  - >-
    Sends a warmup round, then O(rounds) rounds of O(requests) streamed C(POST /generate) requests at O(concurrency)
    on fixed prompts (greedy, O(max_tokens) tokens each, the end of sequence ignored), and reports the median of the
    rounds of output tokens/s, time to first token p50 and p95, inter-token latency p50 and the speculative accept
    length (C(meta_info.spec_accept_length); none without speculative decoding).
  - >-
    With O(baseline) (the known-good service's figures, measured the same way), compares figure by figure: output
    tokens/s at least 0.90x, TTFT p95 at most 1.20x (or at most 50 ms more), accept length at least 0.90x, unless O(thresholds) says
    otherwise. RV(passed) is false on a regression or when a request failed.
  - A client of its own, not C(sglang.bench_serving), which needs a tokenizer, a dataset and the server's venv.
  - Never fails on the server's account; it changes nothing. Check mode measures nothing.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
options:
  url:
    description: The server's base URL.
    type: str
    required: true
  api_key_file:
    description: The server's C(--config) YAML file; its C(api-key), if any, is sent as a bearer token.
    type: path
  requests:
    description: Requests per round (default twice O(concurrency)).
    type: int
  concurrency:
    description: Requests in flight at once (default the variant's O(max_running_requests), at most 8).
    type: int
  max_tokens:
    description: Output tokens per request (default a quarter of O(context_length), at most 128).
    type: int
  rounds:
    description: Measured rounds after the warmup; each figure is their median.
    type: int
    default: 3
  warmup:
    description: Send an uncounted warmup round first.
    type: bool
    default: true
  max_running_requests:
    description: The variant's running-request limit, for the default concurrency.
    type: int
  context_length:
    description: The variant's context length, for the default output length.
    type: int
  timeout:
    description: Seconds one request may take.
    type: float
    default: 60
  budget:
    description:
      - Seconds the measurement may take; a round that would end past it (judged by the round before) is not started.
        At least one round is measured; the C(rounds_measured) of RV(load) says how many were. Unset, every round runs.
    type: float
  baseline:
    description: The known-good service's figures (RV(figures) of an earlier run).
    type: dict
  thresholds:
    description:
      - Limits on new / known-good per figure, over the defaults C(output_tokens_per_s) (at least 0.90),
        C(ttft_p95) (at most 1.20, or 50 ms more whatever the ratio) and C(accept_length) (at least 0.90).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Measure the new variant against the known-good figures
  inferops.sglang.sglang_bench:
    url: http://127.0.0.1:30000
    api_key_file: /etc/sglang/sglang-qwen.yaml
    max_running_requests: 48
    context_length: 262144
    baseline: "{{ known_good_figures }}"
  register: bench
"""

RETURN = r"""
passed:
  description: Measured, and no figure regressed past its threshold.
  returned: always
  type: bool
figures:
  description: The medians (output_tokens_per_s, ttft_p50, ttft_p95, itl_p50 in seconds, accept_length).
  returned: when measured
  type: dict
rounds:
  description: Each measured round's figures, request counts and errors.
  returned: when measured
  type: list
  elements: dict
comparison:
  description: The checks against O(baseline) (figure, new, known_good, ratio, limit, ok) and a sentence.
  returned: when measured
  type: dict
load:
  description: The load sent (requests, concurrency, max_tokens, rounds, warmup, budget, rounds_measured).
  returned: when measured
  type: dict
seconds:
  description: How long the measurement took.
  returned: when measured
  type: float
msg:
  description: The figures and the comparison in one sentence.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _bench
from ansible_collections.inferops.sglang.plugins.module_utils import _credentials
from ansible_collections.inferops.sglang.plugins.module_utils import _http


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key_file=dict(type="path"),
            requests=dict(type="int"),
            concurrency=dict(type="int"),
            max_tokens=dict(type="int", no_log=False),
            rounds=dict(type="int", default=3),
            warmup=dict(type="bool", default=True),
            max_running_requests=dict(type="int"),
            context_length=dict(type="int"),
            timeout=dict(type="float", default=60),
            budget=dict(type="float"),
            baseline=dict(type="dict"),
            thresholds=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    # the module's own defaults (rounds 3, warmup, 60 s, no budget) over the variant's load; an unset
    # requests, concurrency or max_tokens is the variant's
    errors = []
    load = _bench.compose_load(p["max_running_requests"], p["context_length"],
                               {k: p[k] for k in _bench.LOAD_SETTINGS if p[k] is not None or k == "budget"})
    errors += _bench.check_thresholds(p["thresholds"])
    if errors:
        module.fail_json(msg="; ".join(errors))
    try:
        client = _http.Client(p["url"], _credentials.module_api_key(module, None, p["api_key_file"]), True, load["timeout"])
    except (_bench.BenchError, ValueError) as exc:
        module.fail_json(msg=str(exc))
    if module.check_mode:
        module.exit_json(changed=False, passed=True, msg=f"check mode: would measure {load}")
    try:
        result = _bench.measure(client, load, p["baseline"], p["thresholds"])
    except _bench.BenchError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
