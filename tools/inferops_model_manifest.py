# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Publish a model revision to a mirror: write its manifest (inferops-manifest.json: every
file's size and sha256, and the revision) into the directory the mirror serves, or check
a directory against its manifest.

    python3 tools/inferops_model_manifest.py /srv/mirror/Qwen3.6-27B/2026-11-30 --revision 2026-11-30
    python3 tools/inferops_model_manifest.py /srv/models/Qwen3.6-27B --check [--full]

The sglang_model role stages a revision from such a directory (an http(s) URL that serves
it, or the path itself): plugins/module_utils/_model_stage.py, the same code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from _collection import load

stage = load("_model_stage")
state_files = load("_state_files")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--revision", help="the revision the manifest names (writes the manifest)")
    parser.add_argument("--check", action="store_true", help="check the directory instead (sizes, headers)")
    parser.add_argument("--full", action="store_true", help="with --check: every file's sha256 too")
    args = parser.parse_args(argv)
    if args.check:
        manifest = stage.local_manifest(args.directory)
        problems = stage.check(args.directory, manifest, full=args.full)
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    if not args.revision:
        parser.error("--revision is required to write a manifest")
    try:
        stage.check_revision(args.revision)
    except stage.StageError as exc:
        parser.error(str(exc))
    manifest = stage.make_manifest(args.directory, args.revision)
    path = os.path.join(args.directory, stage.MANIFEST)
    # replaced in one step (an exclusively created temporary file, renamed), with the mode a
    # plain new file gets under the caller's umask: the mirror serves it as it serves the weights
    state_files.write_atomic(path, json.dumps(manifest, indent=1, sort_keys=True), 0o666 & ~_umask())
    print(f"{path}: revision {args.revision}, {len(manifest['files'])} files, "
          f"{sum(e['size'] for e in manifest['files'].values())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
