# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller side of inferops.sglang.sglang_preflight (documented with the module).

The module's first check, the deploy's input (plugins/module_utils/_inputs.py), runs
here first, on the controller, with every option as the task gives it: bad input is
refused, every problem at once, before the host is contacted. The rotation hooks in
``settings`` (sglang_service_rotation_out and _in) are checked only here and are not
sent to the host: their URLs, headers and arguments hold the load balancer's
credentials, and a module's options are logged in the host's journal and returned
(shown at -vvv). The module then makes the same input check on the rest, and the
checks of the host.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.inferops.sglang.plugins.module_utils import _inputs
from ansible_collections.inferops.sglang.plugins.module_utils import _preflight

MODULE = "inferops.sglang.sglang_preflight"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_async = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        errors = _inputs.check(_preflight.input_values(args))
        if errors:
            result.update(failed=True, changed=False, step="inputs", errors=errors,
                          msg=_inputs.refusal(errors))
            return result
        settings = args.get("settings")
        if isinstance(settings, dict):
            args["settings"] = {name: value for name, value in settings.items() if name not in _inputs.ROTATION_HOOKS}
        result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
        return result
