# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: prometheus_file_sd
short_description: Prometheus file_sd target groups for SGLang servers and their node_exporters
version_added: 0.1.0
description:
  - From one entry per host (the fact C(sglang_service_metrics_target) that the sglang_service role's
    C(metrics_target) tasks set), the target groups of two file_sd files, the servers' C(/metrics) and the
    node_exporters, each group labelled C(host) (and C(service)).
  - A server listening on loopback only is a target for a Prometheus on the same host and for no other; it is left
    out and named in RV(_value.skipped) instead.
author:
  - inferops.sglang contributors (@inferops)
options:
  _input:
    description: The entries, each with C(host), C(address), C(bind_host), C(port), C(service) and C(metrics).
    type: list
    elements: dict
    required: true
  prometheus_host:
    description: The inventory name of the host Prometheus runs on.
    type: str
    required: true
  node_exporter_port:
    description: The node_exporters' port.
    type: int
    default: 9100
"""

EXAMPLES = r"""
- name: The target groups
  ansible.builtin.set_fact:
    targets: >-
      {{ groups['sglang_servers'] | map('extract', hostvars, 'sglang_service_metrics_target')
         | inferops.sglang.prometheus_file_sd(inventory_hostname) }}
"""

RETURN = r"""
_value:
  description: The target groups of the two files, and the servers left out.
  type: dict
  contains:
    sglang:
      description: The servers' file_sd groups (C(targets), C(labels)).
      type: list
      elements: dict
    node:
      description: The node_exporters' file_sd groups (C(targets), C(labels)).
      type: list
      elements: dict
    skipped:
      description: Why a server was left out, one entry per server.
      type: list
      elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.sglang.plugins.module_utils import _prom_targets


def prometheus_file_sd(entries, prometheus_host, node_exporter_port=9100):
    try:
        return _prom_targets.file_sd(list(entries or []), str(prometheus_host), node_exporter_port)
    except _prom_targets.TargetError as exc:
        raise AnsibleFilterError(f"prometheus_file_sd: {exc}") from exc


class FilterModule:
    """The collection's filters."""

    def filters(self):
        return {"prometheus_file_sd": prometheus_file_sd}
