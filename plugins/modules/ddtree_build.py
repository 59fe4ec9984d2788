#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: ddtree_build
short_description: Apply or revert the DDTree build (patched SGLang files) atomically, with a build manifest
version_added: 0.1.0
description:
  - >-
    DDTree is not in upstream SGLang: it is a set of patched files (C(spec_info), C(dflash_info), C(dflash_worker),
    C(ddtree_utils), C(server_args)) over a pinned SGLang. This module lays such a build over the SGLang installed
    in O(venv) (or O(site_packages)), either as a patch series (O(source=patch), unified diffs applied in order) or
    as an overlay of whole files (O(source=overlay)).
  - >-
    Before anything changes it checks that the installed SGLang is O(sglang_version), that every input matches its
    SHA-256, that every file the build touches is the pinned SGLang's original (by O(originals) or else the checksum
    in the package's C(RECORD); a file the build creates must not exist), that every patch hunk matches exactly
    (no offset, no fuzz), and that the resulting Python files compile with the environment's interpreter.
  - >-
    The results are staged next to the package and replace the installed files by rename, with a journal. A run that
    is interrupted is rolled back by the next run, which then does what it is asked; a half-applied build never stays.
  - >-
    The originals are kept beside the manifest, so O(state=absent) puts back byte-identical files. The manifest
    (JSON) records the SGLang version, the source, the input and per-file original and result hashes, when and by
    whom, and the state (C(applied), C(reverted); C(applying) or C(reverting) while a change is under way).
  - Running it again with the same build changes nothing.
  - >-
    With O(hold=true) the build is applied but not committed: the files are in place, the journal is kept and the
    manifest says C(pending), so that the runtime probe (inferops.sglang.sglang_runtime_probe) reads the files the
    unit would load. O(state=commit) then ends the transaction (C(applied)); O(state=rollback) puts every file and
    the manifest back as they were before it: the previous build, or none. Any other run rolls a held build back
    first, so a build nobody proved is never left behind.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.WRITES
options:
  venv:
    description:
      - The virtual environment SGLang is installed in. Its C(bin/python) names the site-packages directory and
        compiles the build's Python files.
      - Exactly one of O(venv) and O(site_packages) is required.
    type: path
  site_packages:
    description:
      - The directory the C(sglang) package is installed in, when it is not a virtual environment's.
      - The build's Python files are then compiled with O(python), or the interpreter running this module.
    type: path
  python:
    description: The interpreter that compiles the build's Python files. Default C(bin/python) of O(venv).
    type: path
  state:
    description:
      - V(present) applies the build (replacing any other build applied by this module).
      - V(absent) reverts the applied build to the original files.
      - V(commit) ends the transaction of a build applied with O(hold=true); it stays, as C(applied).
      - V(rollback) undoes a build applied with O(hold=true); the previous build, or none, is back. Both do
        nothing when no build is held.
    type: str
    choices: [present, absent, commit, rollback]
    default: present
  hold:
    description:
      - With O(state=present), leave the build applied but uncommitted (manifest C(pending)) until
        O(state=commit) or O(state=rollback). A build already applied with the same inputs holds nothing.
    type: bool
    default: false
  source:
    description: How the build is shipped. Required with O(state=present).
    type: str
    choices: [patch, overlay]
  patches:
    description:
      - The patch series, applied in this order, for O(source=patch). Paths in the diffs are inside site-packages
        after stripping O(strip) leading components (C(a/sglang/srt/server_args.py) with the default).
    type: list
    elements: dict
    suboptions:
      src:
        description: The patch file on the target.
        type: path
        required: true
      sha256:
        description: Its SHA-256.
        type: str
        required: true
      name:
        description: The name recorded in the manifest. Default the base name of O(patches[].src).
        type: str
  files:
    description: The overlay's files, for O(source=overlay).
    type: list
    elements: dict
    suboptions:
      path:
        description: Where the file goes, relative to site-packages (e.g. C(sglang/srt/speculative/spec_info.py)).
        type: str
        required: true
      src:
        description: The patched file on the target.
        type: path
        required: true
      sha256:
        description: Its SHA-256.
        type: str
        required: true
  strip:
    description: Leading path components removed from the file names in the patches (as C(patch -p)).
    type: int
    default: 1
  originals:
    description:
      - The SHA-256 of the pinned SGLang's files the build touches, path (relative to site-packages) to checksum.
      - Files not listed are checked against the installed package's C(RECORD). A file in neither must not exist.
    type: dict
    default: {}
  sglang_version:
    description: The SGLang version the build is for; the module fails if the installed one differs. Required with O(state=present).
    type: str
  manifest:
    description: The build manifest on the host. The originals are kept in C(originals/) beside it.
    type: path
    default: /var/lib/inferops-sglang/ddtree/manifest.json
  built_by:
    description: Who applies or reverts the build (the controller user), recorded in the manifest. Default the remote user.
    type: str
notes:
  - The work directory C(.inferops-ddtree) next to the package holds the stage and the journal during a change only.
  - >-
    The module runs as root and trusts nothing it did not write itself. Every file a build touches (patched,
    created or removed) must be under the C(sglang) package directory of site-packages: the DDTree files all are,
    and a file elsewhere at the top of site-packages (a C(.pth) file, C(sitecustomize.py), a package that shadows
    another) would run in every interpreter started over the venv, root's probes included. A C(.pth) file is
    refused anywhere, by an overlay or by a patch.
  - >-
    Every existing component of each path is checked with lstat; a symbolic link is refused whether it leads out of
    the tree or stays in it (pip lays no links in a package, and through a link the file replaced would not be the
    file hashed), as is a component that is not a directory or a target that is not a regular file. The paths are
    checked when the build is planned, before anything changes, and again just before each file is replaced. A
    writer racing the module inside site-packages is not defended against: the venv is root-owned, 0755.
  - >-
    The journal (C(.inferops-ddtree/journal.json)) that an interrupted or held run leaves is validated before
    anything acts on it, and refused with nothing changed unless the work directory and the journal are a real
    directory and a regular file (no link) of the user running the module, not writable by group or others; its
    checksum (SHA-256 over its canonical JSON) matches; it names this run's O(manifest); its stage is the module's
    own (C(stage-XXXXXXXX) in the work directory, a directory of that user); every entry's path is confined as
    above and its staged copies are the stage's own; and every saved copy a roll-back would put back has the
    SHA-256 recorded. The checksum catches a journal edited, truncated or written by anything that did not
    recompute it; it is not a signature (whoever can write as root could forge one), so what bounds a planted
    journal is the confinement. A journal written by an older version of this collection (no checksum) is refused:
    roll it back with that version, or reinstall the pinned SGLang and remove the work directory.
  - >-
    The O(manifest) is read only if it is a regular file (no link) of the user running the module, not writable by
    group or others, and every file it records is confined as above. The originals directory beside it is created
    C(0700) and used only if it is a real directory of that user, with no link on the way to any kept original.
  - >-
    Files the build adds are not in the package's C(RECORD): revert the build (O(state=absent)) before upgrading or
    uninstalling SGLang with pip.
"""

EXAMPLES = r"""
- name: Apply the DDTree patch series to SGLang 0.5.11
  inferops.sglang.ddtree_build:
    venv: /opt/sglang/venv
    source: patch
    sglang_version: 0.5.11
    patches:
      - src: /var/lib/inferops-sglang/ddtree/inputs/0001-server-args-ddtree.patch
        sha256: 5a1f0c3f8f1e0e9a1b8f0cbd77d2b0a4f4a7c6c1f5d9b1c3f3f0c4a8c2b7e6d1
    built_by: "{{ lookup('ansible.builtin.env', 'USER') }}"
  register: ddtree

- name: Apply the DDTree overlay
  inferops.sglang.ddtree_build:
    venv: /opt/sglang/venv
    source: overlay
    sglang_version: 0.5.11
    files:
      - path: sglang/srt/speculative/ddtree_utils.py
        src: /var/lib/inferops-sglang/ddtree/inputs/sglang/srt/speculative/ddtree_utils.py
        sha256: 0c3e7d2a5b1f4e6d8a9c0b1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f

- name: Revert to the pinned SGLang's own files
  inferops.sglang.ddtree_build:
    venv: /opt/sglang/venv
    state: absent
"""

RETURN = r"""
site_packages:
  description: The directory the build was laid over.
  returned: always
  type: str
  sample: /opt/sglang/venv/lib/python3.11/site-packages
manifest_path:
  description: The build manifest on the host.
  returned: always
  type: str
  sample: /var/lib/inferops-sglang/ddtree/manifest.json
manifest:
  description:
    - The build manifest as written (in check mode, as it would be written); null when there is none.
    - Keys C(format), C(state), C(sglang_version), C(site_packages), C(source), C(build_id) (one hash of the source
      and the inputs), C(inputs) (name, src, sha256), C(files) (path, original_sha256, result_sha256; null for a file
      that does not exist), C(applied_at), C(applied_by), and after a revert C(reverted_at), C(reverted_by).
  returned: always
  type: dict
build_id:
  description: The build's identity, one SHA-256 over its source and inputs.
  returned: when a build is applied or reverted
  type: str
changes:
  description: The files replaced, created or removed (or that would be in check mode), with their hashes.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "sglang/srt/speculative/ddtree_utils.py", "action": "create", "before": null, "after": "0c3e..."}]
held:
  description: Whether the build is now applied and held for its probe (O(hold=true)); commit or roll it back.
  returned: always
  type: bool
recovered:
  description: Files an interrupted (or held) earlier run had changed and that this run put back first.
  returned: always
  type: list
  elements: str
sglang_version:
  description: The SGLang version installed.
  returned: when SGLang is installed
  type: str
"""

import getpass
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _ddtree as ddtree

SITE_PROBE = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def _changes(site: str, ops: dict) -> list[dict]:
    out = []
    for path, data in sorted(ops.items()):
        before = ddtree.sha256_file(os.path.join(site, path))
        action = "remove" if data is None else ("create" if before is None else "replace")
        out.append({"path": path, "action": action, "before": before, "after": ddtree.sha256_bytes(data)})
    return out


def _inputs(module: AnsibleModule) -> list[dict]:
    p = module.params
    if p["source"] == "overlay":
        if not p["files"] or p["patches"]:
            module.fail_json(msg="source=overlay takes files (and no patches)")
        items = [{"name": f["path"], "src": f["src"], "sha256": f["sha256"]} for f in p["files"]]
    else:
        if not p["patches"] or p["files"]:
            module.fail_json(msg="source=patch takes patches (and no files)")
        items = [{"name": f.get("name") or os.path.basename(f["src"]), "src": f["src"], "sha256": f["sha256"]}
                 for f in p["patches"]]
    for item in items:
        item["sha256"] = ddtree.check_sha256(item["sha256"], f"the checksum of {item['name']}")
    return items


def main() -> None:
    item_patch = dict(src=dict(type="path", required=True), sha256=dict(type="str", required=True), name=dict(type="str"))
    item_file = dict(path=dict(type="str", required=True), src=dict(type="path", required=True),
                     sha256=dict(type="str", required=True))
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path"),
            site_packages=dict(type="path"),
            python=dict(type="path"),
            state=dict(type="str", choices=["present", "absent", "commit", "rollback"], default="present"),
            hold=dict(type="bool", default=False),
            source=dict(type="str", choices=["patch", "overlay"]),
            patches=dict(type="list", elements="dict", options=item_patch),
            files=dict(type="list", elements="dict", options=item_file),
            strip=dict(type="int", default=1),
            originals=dict(type="dict", default={}),
            sglang_version=dict(type="str"),
            manifest=dict(type="path", default="/var/lib/inferops-sglang/ddtree/manifest.json"),
            built_by=dict(type="str"),
        ),
        mutually_exclusive=[("venv", "site_packages")],
        required_one_of=[("venv", "site_packages")],
        required_if=[("state", "present", ("source", "sglang_version"))],
        supports_check_mode=True,
    )
    p = module.params
    built_by = p["built_by"] or getpass.getuser()
    python = p["python"] or (os.path.join(p["venv"], "bin", "python") if p["venv"] else None)
    site = p["site_packages"]
    if p["venv"]:
        if not (python and os.access(python, os.X_OK)):
            module.fail_json(msg=f"{python} does not exist: is {p['venv']} a virtual environment with SGLang (provision.yml)?")
        rc, out, err = module.run_command([python, "-c", SITE_PROBE])
        if rc != 0:
            module.fail_json(msg=f"{python} cannot name its site-packages: {(err or out).strip()[-300:]}")
        site = out.strip()
    site = os.path.realpath(site)
    result = dict(changed=False, site_packages=site, manifest_path=p["manifest"], changes=[], recovered=[], held=False)

    try:
        if p["state"] in ("commit", "rollback"):
            journal = ddtree.held(site, p["manifest"])
            if journal is None:
                result["manifest"] = ddtree.read_manifest(p["manifest"])
                result["msg"] = "no build is held: nothing to " + p["state"]
                module.exit_json(**result)
            after = journal.get("manifest_after") or {}
            result.update(changed=True, build_id=after.get("build_id"),
                          changes=[{"path": e["path"], "action": p["state"], "before": e["before"], "after": e["after"]}
                                   for e in journal["entries"]])
            if module.check_mode:
                result["manifest"] = after if p["state"] == "commit" else journal.get("manifest_before")
                module.exit_json(**result)
            if p["state"] == "commit":
                result["manifest"] = ddtree.commit(site, p["manifest"])
            else:
                result["recovered"] = ddtree.roll_back(site, p["manifest"])
                result["manifest"] = ddtree.read_manifest(p["manifest"])
            module.exit_json(**result)
        journal = ddtree.pending(site, p["manifest"])
        if journal is not None:
            if module.check_mode:
                result.update(changed=True, manifest=ddtree.read_manifest(p["manifest"]),
                              recovered=[e["path"] for e in journal.get("entries", [])
                                         if ddtree.sha256_file(os.path.join(site, e["path"])) != e["before"]],
                              msg="an interrupted build is pending: a real run rolls it back first")
                module.exit_json(**result)
            result["recovered"] = ddtree.roll_back(site, p["manifest"])
            result["changed"] = bool(result["recovered"])
        if p["state"] == "absent":
            manifest, ops = ddtree.plan_revert(site, p["manifest"])
            result["manifest"] = ddtree.read_manifest(p["manifest"])
            if manifest is not None:
                result.update(changed=True, changes=_changes(site, ops), build_id=manifest.get("build_id"))
                if module.check_mode:
                    result["manifest"] = dict(manifest, state="reverted")
                else:
                    result["manifest"] = ddtree.revert(site, manifest, ops, p["manifest"], built_by)
            module.exit_json(**result)

        if p["strip"] < 0:
            module.fail_json(msg=f"strip must be 0 or more, got {p['strip']}")
        originals = {ddtree.safe_relpath(k, "originals"): ddtree.check_sha256(str(v), f"originals[{k}]")
                     for k, v in p["originals"].items()}
        inputs = _inputs(module)
        plan, results = ddtree.plan_apply(site, p["source"], inputs, p["sglang_version"], originals, p["manifest"],
                                          p["strip"])
        result.update(sglang_version=p["sglang_version"], build_id=plan.manifest["build_id"])
        code = ddtree.compile_input(results)
        if code != "{}":
            if not (python and os.access(python, os.X_OK)):
                python = module.get_bin_path("python3", required=True)
            rc, out, err = module.run_command([python, "-c", ddtree.COMPILE_PROBE], data=code, binary_data=True)
            if rc != 0:
                module.fail_json(msg=f"{python} could not compile the build's Python files: {(err or out).strip()[-300:]}")
            errors = module.from_json(out)
            if errors:
                module.fail_json(msg="the build's Python files do not compile: " + "; ".join(errors), errors=errors)
        result["changes"] = _changes(site, plan.ops)
        if not plan.changed:
            result["manifest"] = ddtree.read_manifest(p["manifest"])
            module.exit_json(**result)
        result["changed"] = True
        if module.check_mode:
            result["manifest"] = dict(plan.manifest, applied_by=built_by)
        else:
            result["manifest"] = ddtree.apply(site, plan, p["manifest"], built_by, p["hold"])
            result["held"] = ddtree.held(site, p["manifest"]) is not None
    except ddtree.DDTreeError as exc:
        module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
