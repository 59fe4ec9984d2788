# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check that every module, plugin, role entry point and option says when it was added
(part of `make lint`; docs/release.md).

    python3 tools/check_version_added.py [--root DIR]      check
    python3 tools/check_version_added.py --record          after a release: write changelogs/api.yml

The collection's documentation is read as users read it: `ansible-doc --metadata-dump` of
the collection (doc fragments merged, role argument specs included). It is compared with
changelogs/api.yml, what the last release (the newest in changelogs/changelog.yaml) offered:
every object and every option path of it.

- Every module, plugin and role entry point has `version_added`, a released version or
  galaxy.yml's version.
- One the last release offered keeps the `version_added` it had; so does each of its options.
- One the last release did not offer (new) says `version_added: <galaxy.yml's version>`, and
  galaxy.yml's version is above the last release (raise it first). A new option of an
  object that was released says it on the option itself; inherited from its object it would
  claim the object's older version.
- changelogs/api.yml is the last release's: recorded for the newest release of changelog.yaml.

Prints one line per problem and exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RECORD = Path("changelogs") / "api.yml"
# What ansible-doc reports of a collection that users call; `keyword` and the like are Ansible's own.
TYPES = ("module", "action", "callback", "filter", "test", "lookup", "inventory", "connection", "become", "role")


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(text).split("."))
    except ValueError:
        return ()


def metadata(root: Path, name: str) -> dict:
    """ansible-doc's metadata dump of the collection at root (any directory: it is linked
    into a collections path of its own, and no ansible.cfg is read)."""
    namespace, collection = name.split(".")
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / "ansible_collections" / namespace
        link.mkdir(parents=True)
        (link / collection).symlink_to(root.resolve())
        (Path(tmp) / "ansible.cfg").write_text("[defaults]\n")
        env = dict(os.environ, ANSIBLE_CONFIG=str(Path(tmp) / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=tmp)
        doc = Path(sys.executable).parent / "ansible-doc"
        proc = subprocess.run([str(doc) if doc.exists() else "ansible-doc", "--metadata-dump", "--no-fail-on-errors", name],
                              capture_output=True, text=True, cwd=tmp, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"ansible-doc --metadata-dump {name} failed: {proc.stderr.strip()}")
    dump = json.loads(proc.stdout)
    if dump.get("errors"):
        raise SystemExit(f"ansible-doc could not read: {json.dumps(dump['errors'])}")
    return dump["all"]


def _options(options: dict | None, prefix: str = "") -> dict[str, str | None]:
    """Every option path (suboptions as parent.child) with its own version_added (or None)."""
    paths: dict[str, str | None] = {}
    for key, spec in (options or {}).items():
        path = f"{prefix}{key}"
        paths[path] = (spec or {}).get("version_added")
        paths.update(_options((spec or {}).get("suboptions") or (spec or {}).get("options"), path + "."))
    return paths


def api(dump: dict, name: str) -> dict[str, dict]:
    """`type name[:entry point]` -> {version_added, options: {path: version_added}}."""
    objects: dict[str, dict] = {}
    for kind in TYPES:
        for fqcn, data in sorted((dump.get(kind) or {}).items()):
            if not fqcn.startswith(name + "."):
                continue
            short = fqcn[len(name) + 1:]
            if kind == "role":
                for entry, spec in sorted((data.get("entry_points") or {}).items()):
                    objects[f"role {short}:{entry}"] = {
                        "version_added": spec.get("version_added"), "options": _options(spec.get("options"))}
            else:
                doc = data.get("doc") or {}
                objects[f"{kind} {short}"] = {"version_added": doc.get("version_added"), "options": _options(doc.get("options"))}
    return objects


def problems(current: dict, record: dict | None, version: str, released: list[str]) -> list[str]:
    """What is wrong, one line each (empty when every version_added agrees)."""
    out: list[str] = []
    last = max(released, key=_version) if released else None
    allowed = set(released) | {version}
    if record is not None and record.get("version") != last:
        out.append(f"{RECORD} is the API of {record.get('version')}, the last release is {last}: "
                   f"record it after releasing (python3 tools/check_version_added.py --record)")
    before = (record or {}).get("objects", {})
    unreleased = last is None or _version(version) > _version(last)
    raise_it = "" if unreleased else f" (galaxy.yml's version {version} is released already: raise it first)"
    for key, obj in sorted(current.items()):
        added = obj["version_added"]
        if key not in before:
            if str(added) != version or not unreleased:
                out.append(f"{key}: new since {last or 'the first release'}, needs version_added: {version}, "
                           f"has {added!r}{raise_it}")
            for path, option_added in obj["options"].items():
                if option_added is not None and str(option_added) != version:
                    out.append(f"{key} option {path}: new since {last}, version_added {option_added!r} is not {version}")
            continue
        if added is None or str(added) not in allowed:
            out.append(f"{key}: version_added {added!r} is neither a release ({', '.join(released) or 'none'}) nor {version}")
        elif str(added) != str(before[key]["version_added"]):
            out.append(f"{key}: version_added changed from {before[key]['version_added']} to {added}")
        known = before[key]["options"]
        for path, option_added in obj["options"].items():
            if path not in known:
                if str(option_added) != version or not unreleased:
                    out.append(f"{key} option {path}: new since {last}, needs version_added: {version}, "
                               f"has {option_added!r}{raise_it}")
            elif str(option_added) != str(known[path]):
                out.append(f"{key} option {path}: version_added changed from {known[path]} to {option_added}")
    return out


def _released(root: Path) -> list[str]:
    changelog = yaml.safe_load((root / "changelogs" / "changelog.yaml").read_text()) or {}
    return sorted((changelog.get("releases") or {}), key=_version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the collection's root (default: this tree)")
    parser.add_argument("--record", action="store_true", help="write changelogs/api.yml for the last release")
    args = parser.parse_args(argv)
    galaxy = yaml.safe_load((args.root / "galaxy.yml").read_text())
    name, version = f"{galaxy['namespace']}.{galaxy['name']}", str(galaxy["version"])
    released = _released(args.root)
    current = api(metadata(args.root, name), name)
    path = args.root / RECORD
    if args.record:
        if version not in released:
            print(f"galaxy.yml's version {version} is not a release of changelogs/changelog.yaml: release it first")
            return 1
        found = [f"{key}: version_added {obj['version_added']!r} is not a release" for key, obj in current.items()
                 if str(obj["version_added"]) not in released]
        found += [f"{key} option {option}: version_added {added!r} is not a release" for key, obj in current.items()
                  for option, added in obj["options"].items() if added is not None and str(added) not in released]
        if found:
            print("\n".join(found))
            return 1
        path.write_text("---\n# What release " + version + " offered (tools/check_version_added.py --record; docs/release.md).\n"
                        + yaml.safe_dump({"version": version, "objects": current}, sort_keys=True, width=120))
        print(f"recorded {len(current)} objects, {sum(len(o['options']) for o in current.values())} options of {version}")
        return 0
    record = yaml.safe_load(path.read_text()) if path.exists() else None
    if record is None and released:
        print(f"{RECORD} is missing: record the API of {released[-1]} (python3 tools/check_version_added.py --record)")
        return 1
    found = problems(current, record, version, released)
    print("\n".join(found) if found else
          f"version_added agrees: {len(current)} objects, {sum(len(o['options']) for o in current.values())} options ({name} {version})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
