# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller side of inferops.sglang.sglang_inputs (documented with the module): the
whole check, here. The deploy's input needs nothing of the host, and a module's options are
logged in the host's journal and returned (shown at -vvv): ``settings`` may hold the rotation
hooks' URLs and headers, the load balancer's credentials. So nothing is sent to the host: the
task's arguments are validated against the module's own options (``_inputs.ARGUMENT_SPEC``)
as the module would validate them, then checked."""

from __future__ import annotations

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.inferops.sglang.plugins.module_utils import _inputs

MODULE = "inferops.sglang.sglang_inputs"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_async = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validated = ArgumentSpecValidator(_inputs.ARGUMENT_SPEC).validate(dict(self._task.args))
        if validated.error_messages:
            problems = "; ".join(validated.error_messages)
            if validated.unsupported_parameters:
                problems = f"Unsupported parameters for ({MODULE}) module: {problems}"
            result.update(failed=True, changed=False, msg=problems)
            return result
        errors = _inputs.check(validated.validated_parameters)
        if errors:
            result.update(failed=True, changed=False, errors=errors, msg=_inputs.refusal(errors))
        else:
            result.update(changed=False)
        return result
