#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_state
short_description: Stage a deploy's files, add the rotation hook's result to its record
version_added: 0.1.0
description:
  - The two things the sglang_service role does to the service's state outside the switch itself
    (M(inferops.sglang.sglang_switch), which runs the switch as one state machine). The service's state before a
    deploy is read under the deploy lock (M(inferops.sglang.sglang_deploy_lock)'s O(inferops.sglang.sglang_deploy_lock#module:inspect)).
  - O(step=amend) adds the rotation hooks' results (O(rotation)) to this run's O(record). The in hook runs on the
    controller after the switch's job has recorded the switch, so its line in C(history.jsonl) (the last with the
    record's run id) is rewritten with them in one step, and the summary is made again. A record whose host is
    unchanged has no line and is only returned.
  - O(step=stage) makes the service's group and account (O(account)) when missing, system ones without a login (mends
    the account's primary group, shell C(/usr/sbin/nologin) and home C(/var/lib/sglang) when they differ), the
    configuration and state directories (O(directories), root's, created or mended), this
    run's staging directory O(staging), and writes the rendered files (O(files) and O(contents); the controller
    renders them, this module never templates) into it, root only (C(0600)); with O(baseline_contents), the same
    files of the baseline variant into C(O(staging)/baseline), for a first deploy's rollback. Each staged unit (the
    first of O(files)) is checked with C(systemd-analyze verify) before the switch can install it. Staging is this
    run's scratch space (the switch removes it when it records its outcome), so it is no change; only a created or
    mended directory is.
  - In check mode O(step=stage) writes nothing; RV(differ) names the files whose installed copy (C(src), C(mode))
    differs from the rendering, and the task reports a change when one does or a directory would be made.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
attributes:
  check_mode:
    details: O(step=amend) and O(step=stage) write nothing in check mode.
options:
  step:
    description: What to do.
    type: str
    required: true
    choices: [amend, stage]
  service_dir:
    description: The service's state directory (C(current.json), C(known-good/), C(history.jsonl)).
    type: path
    required: true
  files:
    description: O(step=stage). The files rendered (name, src, mode), the unit first, in the order of O(contents).
    type: list
    elements: dict
    default: []
  directories:
    description:
      - O(step=stage). Directories made root's with their mode (C(path), C(mode)), in order (each one's parent must
        exist or come before it). A symbolic link or a file where one should be is refused, never followed.
    type: list
    elements: dict
    default: []
  account:
    description:
      - O(step=stage). The service's account, C(user) and C(group). The preflight
        (M(inferops.sglang.sglang_preflight)) refuses root's and a login account before this.
    type: dict
    suboptions:
      user:
        description: The account the server runs as.
        type: str
        required: true
      group:
        description: Its primary group.
        type: str
        required: true
  staging:
    description: O(step=stage). This run's staging directory (C(0700)); its parent must be in O(directories).
    type: path
  contents:
    description: O(step=stage). The rendered text of each of O(files), in order (the --config file holds the API key).
    type: list
    elements: str
    default: []
  baseline_contents:
    description:
      - O(step=stage). The baseline variant's rendering of each of O(files), staged under C(O(staging)/baseline) for a
        first deploy's rollback; omitted when a known-good service is saved.
    type: list
    elements: str
  record:
    description: This run's record, as M(inferops.sglang.sglang_switch) returned it (O(step=amend)).
    type: dict
  rotation:
    description: The rotation hooks' results, C(out) and C(in), each with C(ok) and C(msg) (O(step=amend)).
    type: dict
"""

EXAMPLES = r"""
- name: Stage this run's files
  inferops.sglang.sglang_deploy_state:
    step: stage
    service_dir: /var/lib/inferops-sglang/sglang-qwen
    directories:
      - {path: /var/lib/inferops-sglang, mode: "0700"}
      - {path: /var/lib/inferops-sglang/sglang-qwen, mode: "0700"}
      - {path: /var/lib/inferops-sglang/sglang-qwen/staging, mode: "0700"}
    staging: /var/lib/inferops-sglang/sglang-qwen/staging/run-1
    files:
      - {name: sglang-qwen.service, src: /etc/systemd/system/sglang-qwen.service, mode: "0644"}
    contents:
      - "{{ lookup('ansible.builtin.template', 'sglang.service.j2') }}"
"""

RETURN = r"""
record:
  description: O(step=amend). The record with the rotation hooks' results.
  returned: step is amend
  type: dict
summary:
  description: O(step=amend). What the operator reads.
  returned: step is amend
  type: str
staged:
  description: O(step=stage). The files written (none in check mode).
  returned: step is stage
  type: list
  elements: str
differ:
  description: O(step=stage). The names of O(files) whose installed copy differs from the rendering (content or mode).
  returned: step is stage
  type: list
  elements: str
account_changed:
  description: O(step=stage). The commands that made or mended the service's account (or would, in check mode).
  returned: step is stage
  type: list
  elements: str
directories_changed:
  description: O(step=stage). The directories created or mended (or that would be, in check mode).
  returned: step is stage
  type: list
  elements: str
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _preflight
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files
from ansible_collections.inferops.sglang.plugins.module_utils import _switch

STAGED_MODE = 0o600
ROOT = 0
BASELINE = "baseline"


def stage(params: dict, run_command, check: bool) -> dict:
    """O(step=stage): the service's account, the directories, this run's staging directory and its
    files, each staged unit verified by systemd. Raises _switch.HostError with what failed."""
    files, contents = params["files"], params["contents"]
    baseline = params["baseline_contents"]
    for name, given in (("contents", contents), ("baseline_contents", baseline)):
        if given is not None and len(given) != len(files):
            raise _switch.HostError(f"{name} has {len(given)} texts for {len(files)} files")
    differ = [f["name"] for f, text in zip(files, contents)
              if _state_files.differs(f["src"], text, _switch.file_mode(f["mode"]))]
    account = params["account"]
    try:
        changed_account = _preflight.ensure_account(account["user"], account["group"], run_command, check) if account else []
    except OSError as exc:
        raise _switch.HostError(f"cannot make the service's account: {exc}") from exc
    changed_dirs = []
    for item in params["directories"]:
        try:
            if _state_files.ensure_directory(item["path"], _switch.file_mode(item["mode"]), ROOT, ROOT, check):
                changed_dirs.append(item["path"])
        except OSError as exc:
            raise _switch.HostError(f"cannot make the directory {item['path']}: {exc}") from exc
    if check:
        return {"changed": bool(differ or changed_dirs or changed_account), "differ": differ, "staged": [],
                "account_changed": changed_account, "directories_changed": changed_dirs}
    staged = []
    for directory, texts in ((params["staging"], contents), (os.path.join(params["staging"], BASELINE), baseline)):
        if texts is None:
            continue
        try:
            _state_files.ensure_directory(directory, 0o700, ROOT, ROOT)
            for item, text in zip(files, texts):
                path = os.path.join(directory, item["name"])
                _state_files.write_atomic(path, text, STAGED_MODE)
                staged.append(path)
        except OSError as exc:
            raise _switch.HostError(f"cannot stage the service's files in {directory}: {exc}") from exc
        if files:
            unit = os.path.join(directory, files[0]["name"])
            rc, out, err = run_command(["systemd-analyze", "verify", unit])
            if rc != 0:
                raise _switch.HostError(f"systemd refuses the staged unit {unit} (systemd-analyze verify, exit {rc}): "
                                        f"{(err or out).strip()[-2000:]}")
    return {"changed": bool(changed_dirs or changed_account), "differ": differ, "staged": staged,
            "account_changed": changed_account, "directories_changed": changed_dirs}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            step=dict(type="str", required=True, choices=["amend", "stage"]),
            service_dir=dict(type="path", required=True),
            files=dict(type="list", elements="dict", default=[]),
            record=dict(type="dict"),
            rotation=dict(type="dict"),
            directories=dict(type="list", elements="dict", default=[]),
            account=dict(type="dict", options=dict(user=dict(type="str", required=True),
                                                   group=dict(type="str", required=True))),
            staging=dict(type="path"),
            contents=dict(type="list", elements="str", default=[], no_log=True),
            baseline_contents=dict(type="list", elements="str", no_log=True),
        ),
        required_if=[("step", "amend", ["record"]), ("step", "stage", ["staging"])],
        supports_check_mode=True,
    )
    p = module.params
    problems = _switch.file_problems(p["files"], "files")
    if problems:
        module.fail_json(msg="; ".join(problems))
    for item in p["directories"]:
        if not item.get("path") or not (isinstance(item.get("mode"), int) or re.fullmatch(r"0?[0-7]{3,4}", str(item.get("mode")))):
            module.fail_json(msg=f"each of directories needs path and an octal mode; got {item!r}")
    host = _switch.SystemHost("", module.run_command)
    try:
        if p["step"] == "stage":
            module.exit_json(**stage(p, module.run_command, module.check_mode))
        if module.check_mode:
            module.exit_json(changed=False, record=p["record"], summary="")
        record, summary, written = _switch.amend_rotation(host, p["service_dir"], p["record"], p["rotation"] or {})
    except _switch.HostError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=written, record=record, summary=summary)


if __name__ == "__main__":
    main()
