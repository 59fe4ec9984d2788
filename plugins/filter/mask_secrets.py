# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: mask_secrets
short_description: Text with its secrets masked, by the collection's one secret grammar
version_added: 0.9.0
description:
  - >-
    Each of O(secrets) wherever it appears in the text, and the value of every secret-looking name (C(name=value),
    C(name: value), C(--api-key VALUE), C(Bearer TOKEN), a name holding key, token, secret, password or passwd)
    replaced by C(********); nothing else changes. The grammar is the one the gate's progress lines, the watchdog's
    journal and the records use (C(plugins/module_utils/_mask.py)).
  - The sglang_service role passes a rotation hook's standard error and the HTTP client's message through it before
    they reach the deploy record, C(set_stats) and the summary.
author:
  - inferops.sglang contributors (@inferops)
options:
  _input:
    description: The text.
    type: str
    required: true
  secrets:
    description: Values known to be secret (a hook's header values, say); empty ones are ignored.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: A hook's error, masked
  ansible.builtin.debug:
    msg: "{{ hook_result.stderr | inferops.sglang.mask_secrets(hook.headers.values() | list) }}"
"""

RETURN = r"""
_value:
  description: The text with every secret replaced by C(********).
  type: str
"""

from ansible_collections.inferops.sglang.plugins.module_utils import _mask


def mask_secrets(text, secrets=None) -> str:
    return _mask.mask(str(text), [str(s) for s in secrets or () if s not in (None, "")])


class FilterModule:
    def filters(self):
        return {"mask_secrets": mask_secrets}
