#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_model_stage
short_description: Stage a model directory from a mirror, verified, swapped into place atomically; or verify one
version_added: 0.1.0
description:
  - >-
    O(state=present) fetches every file the mirror's manifest (C(inferops-manifest.json): each file's size and sha256)
    lists into a staging directory beside the model, verifies sizes, sha256 and every safetensors header, and points
    the model path (a symlink to C(.<name>.revisions/<revision>)) at the new revision in one rename. A directory that
    was the model path before is exchanged with the symlink in one step and kept beside the revisions.
  - >-
    An interrupted download is refused and kept: the next run resumes it (an HTTP Range request, or a seek in a local
    file). A corrupt file (sha256) is refused and removed from the staging directory; a file missing at the mirror is
    refused; a file larger than the manifest says is refused and removed, never read past that size. A stage the file
    system cannot hold (its free space against what the manifest still needs) is refused before anything is fetched.
    In every refusal the model path is unchanged, and the staging directory is root's only (0700) until the swap.
  - >-
    A plain V(http://) mirror is refused unless it is on the host's loopback or O(allow_http) is set; a redirect to
    another scheme or host is refused; a local mirror's files are opened without following a symbolic link, regular
    files only. O(manifest_sha256) pins the manifest itself, and with it every file's size and sha256. The source's
    credentials (C(user:password@)) appear in no message and no marker.
  - >-
    O(state=verified) changes nothing: the quick check (every file the manifest lists is there with its size, every
    safetensors header parses and its tensors end at the file's end, every shard the safetensors index names is there;
    without a manifest, the index and the headers alone), and with O(verify=full) every file's sha256 too.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
attributes:
  check_mode:
    details: In check mode nothing is fetched or written; RV(msg) says what would be staged.
options:
  path:
    description: The model path the server is given (C(--model-path)), e.g. C(/srv/models/Qwen3.6-27B).
    type: path
    required: true
  state:
    description: V(present) stages O(revision) from O(source) unless it is there already; V(verified) only checks.
    type: str
    choices: [present, verified]
    default: present
  source:
    description:
      - The mirror of this revision's files, an http(s) base URL or a local or NFS directory; its O(manifest) lists them.
      - Required with O(state=present). With O(state=verified), the manifest is read from the model directory instead.
    type: str
  revision:
    description: The pinned revision (1-128 of V(A-Z a-z 0-9 . _ -)); the mirror's manifest must name it, when it names one.
    type: str
  manifest:
    description: The manifest's file name at the source (and in the staged directory).
    type: str
    default: inferops-manifest.json
  verify:
    description: With O(state=verified), V(quick) checks presence, sizes and headers; V(full) adds every file's sha256.
    type: str
    choices: [quick, full]
    default: quick
  keep:
    description: Revisions kept in C(.<name>.revisions/), the current one included.
    type: int
    default: 2
  timeout:
    description: Seconds one HTTP read may wait.
    type: float
    default: 60
  validate_certs:
    description: Verify the mirror's TLS certificate.
    type: bool
    default: true
  allow_http:
    description:
      - Accept a plain V(http://) O(source) on another host than this one's loopback. Anyone on the network path can
        then choose the weights; O(manifest_sha256) still detects it.
    type: bool
    default: false
  manifest_sha256:
    description:
      - The sha256 of the source's manifest (C(sha256sum inferops-manifest.json) where it was made). Another manifest
        is refused before anything is fetched. Empty or omitted, the manifest is taken as the mirror serves it.
    type: str
notes:
  - Staged files are written with the module's umask; the revision's directories are 0755 once verified (the service
    user reads the model).
"""

EXAMPLES = r"""
- name: Stage the pinned revision of the model from the mirror
  inferops.sglang.sglang_model_stage:
    path: /srv/models/Qwen3.6-27B
    source: https://models.example.internal/Qwen3.6-27B/2026-11-30
    revision: "2026-11-30"

- name: Check the model directory before a deploy (sizes and headers)
  inferops.sglang.sglang_model_stage:
    path: /srv/models/Qwen3.6-27B
    state: verified
"""

RETURN = r"""
msg:
  description: What was done or found.
  returned: always
  type: str
path:
  description: The model path.
  returned: always
  type: str
revision:
  description: The revision staged or found (from the directory's marker when O(state=verified)).
  returned: always
  type: str
previous:
  description: Where the previous model is now (the revision directory the symlink left, or the kept directory).
  returned: when a revision was staged
  type: str
files:
  description: Files in the manifest.
  returned: when a manifest was read
  type: int
bytes:
  description: Bytes in the manifest.
  returned: when a manifest was read
  type: int
fetched_bytes:
  description: Bytes fetched by this run (less than RV(bytes) after a resumed or partly staged run).
  returned: with O(state=present)
  type: int
resumed:
  description: Files whose download this run continued.
  returned: with O(state=present)
  type: list
  elements: str
problems:
  description: What the check found wrong (empty when it passed).
  returned: with O(state=verified)
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _model_stage as ms
from ansible_collections.inferops.sglang.plugins.module_utils import _preflight


def _verified(module: AnsibleModule) -> None:
    p = module.params
    try:
        result = _preflight.model_verified(p["path"], p["verify"], p["revision"])
    except _preflight.Refused as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    module.exit_json(changed=False, **result)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="present", choices=["present", "verified"]),
            source=dict(type="str"),
            revision=dict(type="str"),
            manifest=dict(type="str", default=ms.MANIFEST),
            verify=dict(type="str", default="quick", choices=["quick", "full"]),
            keep=dict(type="int", default=2),
            timeout=dict(type="float", default=60),
            validate_certs=dict(type="bool", default=True),
            allow_http=dict(type="bool", default=False),
            manifest_sha256=dict(type="str"),
        ),
        required_if=[("state", "present", ("source", "revision"))],
        supports_check_mode=True,
    )
    p = module.params
    if p["state"] == "verified":
        _verified(module)
    if p["keep"] < 1 or ms.safe_relpath(p["manifest"]) is None:
        module.fail_json(msg="keep must be >= 1 and manifest a file name inside the model")
    try:
        source = ms.Source(p["source"], timeout=p["timeout"], validate_certs=p["validate_certs"], allow_http=p["allow_http"])
        result = ms.stage(p["path"], source, p["revision"], manifest_name=p["manifest"], keep=p["keep"],
                          check_mode=module.check_mode, manifest_sha256=p["manifest_sha256"] or None)
    except (ms.StageError, OSError) as exc:
        module.fail_json(msg=f"model {p['path']} revision {p['revision']} refused: {exc}", path=p["path"],
                         revision=p["revision"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
