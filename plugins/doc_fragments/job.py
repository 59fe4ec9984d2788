# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # A module its action plugin runs as an async job on the host with live progress lines, holding
    # this run's deploy lock (module_utils/_job.py, plugin_utils/_async_job.py): sglang_switch, sglang_tune.
    DOCUMENTATION = r"""
options:
  lock_file:
    description: This run's deploy lock (M(inferops.sglang.sglang_deploy_lock)); the job holds it and renews its lease.
    type: path
  progress_file:
    description: Where the job writes its progress (JSON); set by the action plugin.
    type: path
  progress_interval:
    description: Seconds between the action plugin's progress lines; V(0) runs the module as a plain call. Ignored by the module.
    type: float
    default: 15
"""
