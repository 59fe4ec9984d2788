"""tools/check_argument_specs.py (part of `make lint`): a role whose defaults/main.yml and
meta/argument_specs.yml disagree is named, one line per problem; the collection's roles agree."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from sim_helpers import REPO

TOOL = REPO / "tools" / "check_argument_specs.py"


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, check=False)


def make_role(roles, name: str, defaults: str, options: str, entry: str = "main"):
    role = roles / name
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text("---\n" + textwrap.dedent(defaults))
    (role / "meta" / "argument_specs.yml").write_text(
        f"---\nargument_specs:\n  {entry}:\n    short_description: A test role\n    options:\n"
        + textwrap.indent(textwrap.dedent(options), " " * 6))
    return role


def test_drifted_undocumented_and_missing_defaults_are_each_one_line(tmp_path):
    make_role(tmp_path, "demo", """\
        demo_port: 8080
        demo_name: "{{ inventory_hostname }}-demo"
        demo_extra: 1
        """, """\
        demo_port:
          type: int
          default: 8000
        demo_name:
          type: str
          default: "{{ inventory_hostname }}-demo"
        demo_timeout:
          type: int
          default: 30
        """)
    done = run("--roles", tmp_path)
    assert done.returncode == 1, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        "demo: argument_specs main: demo_port: default 8000 differs from defaults/main.yml 8080",
        "demo: argument_specs main: demo_timeout: default 30 documented, not in defaults/main.yml",
        "demo: defaults/main.yml: demo_extra: not documented in meta/argument_specs.yml",
    ]


@pytest.mark.parametrize("defaults,options,problem", [
    ("x_on: 1\n", "x_on: {type: bool, default: 1}\n", "x_on: default 1 is not of type bool"),
    ("x_on: true\n", "x_on: {type: int, default: true}\n", "x_on: default True is not of type int"),
    ("x_on: true\n", "x_on: {type: bool, default: 1}\n", "x_on: default 1 differs from defaults/main.yml True"),
    ("x_ids: [0, a]\n", "x_ids: {type: list, elements: int, default: [0, a]}\n", "x_ids: element 'a' is not of type int"),
    ("x_mode: fast\n", "x_mode: {type: str, choices: [quick, full], default: fast}\n",
     "x_mode: default 'fast' is not one of its choices ['quick', 'full']"),
    ("x_dir: /srv\n", "x_dir: {type: path}\n", "x_dir: no default documented, defaults/main.yml has '/srv'"),
    ("x_name: a\n", "x_name: {default: a}\n", None),  # no type: str
    ("x_n: 1\n", "x_n: {default: 1}\n", "x_n: default 1 is not of type str"),
    ("x_wait: 60\n", "x_wait: {type: float, default: 60.0}\n", None),
    ("x_home: \"{{ h }}/x\"\n", "x_home: {type: path, default: \"{{ h }}/x\"}\n", None),  # a Jinja string fits a string type
    # a computed default of another type is quoted in the description, never `default:` (the docs site refuses it)
    ("x_port: \"{{ p | int + 1 }}\"\n", "x_port: {type: int, default: \"{{ p | int + 1 }}\"}\n",
     "x_port: a computed default of type int is not documented as `default:`, but quoted in the description as C({{ p | int + 1 }})"),
    ("x_port: \"{{ p | int + 1 }}\"\n", "x_port: {type: int, description: [The port.]}\n",
     "x_port: the description does not quote the default C({{ p | int + 1 }})"),
    ("x_port: \"{{ p | int + 1 }}\"\n", "x_port: {type: int, description: [The port., \"Computed default C({{ p | int + 1 }}).\"]}\n", None),
    ("x_home: \"{{ h }}/x\"\n", "x_home: {type: str, default: \"{{ h }}/y\"}\n", "x_home: default '{{ h }}/y' differs"),
    ("x_any: [1]\n", "x_any: {type: raw, default: [1]}\n", None),
])
def test_types_choices_and_jinja(tmp_path, defaults, options, problem):
    make_role(tmp_path, "demo", defaults, options)
    done = run("--roles", tmp_path)
    if problem is None:
        assert (done.returncode, done.stdout) == (0, ""), done.stdout
    else:
        assert done.returncode == 1 and problem in done.stdout, done.stdout


def test_every_entry_point_is_read_and_internal_variables_belong_in_vars(tmp_path):
    make_role(tmp_path, "demo", "demo_file: /etc/demo\n_demo_cache: {}\n",
              "demo_file: {type: path, default: /etc/demo}\n", entry="manifest")
    done = run("--roles", tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "demo: defaults/main.yml: _demo_cache: internal (leading underscore), belongs in vars/main.yml"]


def test_the_collection_roles_agree_with_their_argument_specs():
    done = run()
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
