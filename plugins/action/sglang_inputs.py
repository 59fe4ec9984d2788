# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller side of inferops.sglang.sglang_inputs (documented with the module): the
whole check, here. The deploy's input needs nothing of the host, and a module's options are
logged in the host's journal and returned (shown at -vvv): ``settings`` may hold the rotation
hooks' URLs and headers, the load balancer's credentials. So nothing is sent to the host."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.inferops.sglang.plugins.module_utils import _inputs

# sglang_inputs' options (plugins/modules/sglang_inputs.py) and their defaults
OPTIONS = {"service_name": None, "user": None, "group": None, "variant": None, "baseline_variant": None,
           "variants": {}, "aliases": {}, "overrides": {}, "common": {}, "served_model_name": None, "model_path": None,
           "draft_model_path": None, "bind_host": None, "python": None, "state_dir": None, "environment": None,
           "read_write_paths": None, "api_key": None, "settings": {}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_async = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        unknown = sorted(set(args) - set(OPTIONS))
        if unknown:
            result.update(failed=True, changed=False, msg=f"Unsupported parameters for (inferops.sglang.sglang_inputs) "
                                                          f"module: {', '.join(unknown)}")
            return result
        errors = _inputs.check(dict(OPTIONS, **args))
        if errors:
            result.update(failed=True, changed=False, errors=errors, msg=_inputs.refusal(errors))
        else:
            result.update(changed=False)
        return result
