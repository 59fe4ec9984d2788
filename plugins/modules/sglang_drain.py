#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_drain
short_description: Wait until a serving SGLang server holds no running or queued request, before it is stopped
version_added: 0.1.0
description:
  - >-
    Polls the server's C(GET /v1/loads?include=core) (every SGLang release from 0.5.9 to 0.5.23) and sums
    C(num_running_reqs) and C(num_waiting_reqs) over its DP ranks, until both are 0 or O(timeout) passes.
  - >-
    SGLang keeps accepting new requests while it drains on SIGTERM, with no limit of its own; take the host out of
    rotation first (the role's C(sglang_service_rotation_out) hook), then drain, then stop.
  - >-
    Never fails on the server's account: a load it cannot read ends the wait at once and is returned in RV(error).
    It changes nothing; in check mode it reads the load once and does not wait.
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
  timeout:
    description: Seconds to wait for the server to drain; 0 reads the load once and does not wait.
    type: float
    default: 60
  interval:
    description: Seconds between two reads of the load.
    type: float
    default: 1
  request_timeout:
    description: Seconds one read may take.
    type: float
    default: 5
  validate_certs:
    description: Verify the server's TLS certificate (an https URL).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Drain the running service before stopping it
  inferops.sglang.sglang_drain:
    url: http://127.0.0.1:30000
    api_key_file: /etc/sglang/sglang-qwen.yaml
    timeout: 60
  register: drain
"""

RETURN = r"""
drained:
  description: The server held no running or queued request when the wait ended.
  returned: always
  type: bool
timed_out:
  description: Requests were still in flight when O(timeout) passed.
  returned: always
  type: bool
seconds:
  description: How long the drain took.
  returned: always
  type: float
in_flight_at_start:
  description: Running plus queued requests at the first read (null when it could not be read).
  returned: always
  type: int
in_flight_at_stop:
  description: Running plus queued requests at the last read (null when it could not be read).
  returned: always
  type: int
running_at_stop:
  description: Running requests at the last read.
  returned: always
  type: int
waiting_at_stop:
  description: Queued requests at the last read.
  returned: always
  type: int
polls:
  description: Reads of the load.
  returned: always
  type: int
endpoint:
  description: The endpoint read.
  returned: always
  type: str
  sample: /v1/loads
error:
  description: Why the load could not be read, or null.
  returned: always
  type: str
msg:
  description: The drain in one sentence.
  returned: always
  type: str
"""

import math

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _credentials
from ansible_collections.inferops.sglang.plugins.module_utils import _drain
from ansible_collections.inferops.sglang.plugins.module_utils import _http


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key_file=dict(type="path"),
            timeout=dict(type="float", default=60),
            interval=dict(type="float", default=1),
            request_timeout=dict(type="float", default=5),
            validate_certs=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for name, low_ok in (("timeout", True), ("interval", False), ("request_timeout", False)):
        value = p[name]
        if not math.isfinite(value) or value < 0 or (value == 0 and not low_ok):
            module.fail_json(msg=f"{name} must be a finite number of seconds {'>=' if low_ok else '>'} 0, got {value!r}")
    api_key = _credentials.module_api_key(module, None, p["api_key_file"])
    try:
        client = _http.Client(p["url"], api_key, p["validate_certs"], p["request_timeout"])
    except ValueError as exc:
        module.fail_json(msg=f"cannot drain {p['url']}: {exc}")
    result = _drain.drain(client, 0 if module.check_mode else p["timeout"], p["interval"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
