# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check each role's defaults/main.yml against its meta/argument_specs.yml (part of `make lint`).

    python3 tools/check_argument_specs.py [--roles DIR]

For every role under roles/ (or DIR), over all its entry points:

- a variable of defaults/main.yml must be documented, with a default equal to it
  (compared as YAML loads them; a Jinja default is compared as the string it is);
- a documented option with a default must be in defaults/main.yml (argument_specs
  defaults are documentation only: Ansible takes the value from defaults/);
- the default must fit the option's type (and elements, and choices); a Jinja
  string, a null and type raw fit any;
- a default computed by Jinja for an option of type int, float, bool, list or dict is not
  `default:` (a template is not of that type; the docs site refuses it): the option's
  description quotes it, C(<the expression>);
- a variable named with a leading underscore is internal: it belongs in vars/main.yml.

Prints one line per problem and exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

# The YAML types that fit each argument_specs type; a type not named here is not checked.
_TYPES = {
    "str": (str,),
    "path": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
}


# Types whose default, computed by Jinja in defaults/main.yml, is quoted in the description.
_COMPUTED = ("int", "float", "bool", "list", "dict")


def _lines(description) -> list[str]:
    return description if isinstance(description, list) else [description or ""]


class _Loader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """SafeLoader that also reads Ansible's tags (!unsafe, !vault) as their plain value."""


def _tagged(loader, _suffix, node):
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


_Loader.add_multi_constructor("!", _tagged)


def _load(path: Path):
    with path.open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_Loader)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _jinja(value) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _same(one, other) -> bool:
    """Equal as YAML values: true is not 1, 60 is 60.0, containers compared item by item."""
    if isinstance(one, bool) or isinstance(other, bool):
        return isinstance(one, bool) and isinstance(other, bool) and one == other
    if isinstance(one, (int, float)) and isinstance(other, (int, float)):
        return one == other
    if isinstance(one, dict) and isinstance(other, dict):
        return one.keys() == other.keys() and all(_same(one[key], other[key]) for key in one)
    if isinstance(one, list) and isinstance(other, list):
        return len(one) == len(other) and all(_same(a, b) for a, b in zip(one, other))
    return type(one) is type(other) and one == other


def _fits(value, kind: str) -> bool:
    if value is None or _jinja(value) or kind not in _TYPES:
        return True
    if isinstance(value, bool) and kind != "bool":
        return False
    return isinstance(value, _TYPES[kind])


def _type_problems(name: str, option: dict, value) -> list[str]:
    kind = option.get("type", "str")
    if not _fits(value, kind):
        return [f"{name}: default {_show(value)} is not of type {kind}"]
    problems = []
    if kind == "list" and isinstance(value, list) and "elements" in option:
        problems += [f"{name}: element {_show(item)} is not of type {option['elements']}"
                     for item in value if not _fits(item, option["elements"])]
    choices = option.get("choices")
    if choices and value is not None and not _jinja(value):
        items = value if kind == "list" and isinstance(value, list) else [value]
        problems += [f"{name}: default {_show(item)} is not one of its choices {choices}"
                     for item in items if not _jinja(item) and not any(_same(item, c) for c in choices)]
    return problems


def check_role(role: Path) -> list[str]:
    """The problems of one role directory, each prefixed with the role's name."""
    defaults_file = role / "defaults" / "main.yml"
    specs_file = role / "meta" / "argument_specs.yml"
    defaults = (_load(defaults_file) if defaults_file.is_file() else None) or {}
    specs = ((_load(specs_file) if specs_file.is_file() else None) or {}).get("argument_specs") or {}
    problems = []

    documented: set[str] = set()
    for entry, spec in specs.items():
        for name, option in ((spec or {}).get("options") or {}).items():
            option = option or {}
            documented.add(name)
            where = f"argument_specs {entry}: {name}"
            if name in defaults and _jinja(defaults[name]) and option.get("type", "str") in _COMPUTED:
                # A typed default cannot be a template in the spec (the docs site refuses it): the
                # description quotes the expression instead, so the two cannot drift apart.
                if "default" in option:
                    problems.append(f"{where}: a computed default of type {option['type']} is not documented as `default:`, "
                                    f"but quoted in the description as C({defaults[name].strip()})")
                elif f"C({defaults[name].strip()})" not in " ".join(_lines(option.get("description"))):
                    problems.append(f"{where}: the description does not quote the default C({defaults[name].strip()})")
            elif name in defaults:
                if "default" not in option:
                    problems.append(f"{where}: no default documented, defaults/main.yml has {_show(defaults[name])}")
                elif not _same(option["default"], defaults[name]):
                    problems.append(f"{where}: default {_show(option['default'])} differs from defaults/main.yml {_show(defaults[name])}")
                problems += [f"argument_specs {entry}: {line}" for line in _type_problems(name, option, defaults[name])]
            elif "default" in option:
                problems.append(f"{where}: default {_show(option['default'])} documented, not in defaults/main.yml")
                problems += [f"argument_specs {entry}: {line}" for line in _type_problems(name, option, option["default"])]

    for name in defaults:
        if name.startswith("_"):
            problems.append(f"defaults/main.yml: {name}: internal (leading underscore), belongs in vars/main.yml")
        elif name not in documented:
            problems.append(f"defaults/main.yml: {name}: not documented in meta/argument_specs.yml")
    return [f"{role.name}: {problem}" for problem in problems]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roles", type=Path, default=ROOT / "roles", help="directory of roles (default: roles/)")
    args = parser.parse_args(argv)
    roles = sorted(path for path in args.roles.iterdir() if (path / "defaults").is_dir() or (path / "meta").is_dir())
    problems = [problem for role in roles for problem in check_role(role)]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
