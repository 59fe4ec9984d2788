"""Helpers of the AWX-as-code tests: the repository, the venv's Ansible tools,
the survey rendered by the real awx/configure.yml, and AWX's survey rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
ROLE_DEFAULTS = REPO / "roles" / "sglang_service" / "defaults" / "main.yml"


def tool(name: str) -> str:
    """A tool of the venv running the tests (ansible-playbook, ansible-doc, ansible-builder)."""
    path = BIN / name
    return str(path) if path.exists() else name


def ansible_env() -> dict:
    env = dict(os.environ)
    env.update(ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    # The controller settings must not leak in from the caller's environment.
    for name in ("CONTROLLER_HOST", "CONTROLLER_OAUTH_TOKEN", "CONTROLLER_VERIFY_SSL"):
        env.pop(name, None)
    return env


class Rendered(NamedTuple):
    proc: subprocess.CompletedProcess
    survey: dict | None
    templates: list | None


def run_configure(tmp_path: Path, *args: str, check: bool = True) -> Rendered:
    """Run awx/configure.yml --tags survey (no AWX): the process, the survey and the job templates it wrote."""
    survey_out = tmp_path / "survey.json"
    templates_out = tmp_path / "job_templates.json"
    for path in (survey_out, templates_out):
        path.unlink(missing_ok=True)
    proc = subprocess.run(
        [tool("ansible-playbook"), "awx/configure.yml", "--tags", "survey",
         "-e", f"awx_survey_out={survey_out}", "-e", f"awx_job_templates_out={templates_out}", *args],
        cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=300, check=False,
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    survey = json.loads(survey_out.read_text()) if survey_out.exists() else None
    templates = json.loads(templates_out.read_text()) if templates_out.exists() else None
    return Rendered(proc, survey, templates)


# AWX's survey rules, as AWX applies them when a survey spec is saved
# (awx/api/views/__init__.py, JobTemplateSurveySpec._validate_spec_data).
AWX_SURVEY_TYPES = {
    "text": str, "textarea": str, "password": str,
    "multiplechoice": str, "multiselect": str,
    "integer": int, "float": float,
}


def awx_survey_errors(spec: dict) -> list[str]:
    """The errors AWX would answer (HTTP 400) when this survey spec is saved, plus a default outside
    its question's min/max (AWX refuses that answer at launch); [] when AWX would take it."""
    errors = []
    for field, kind in (("name", str), ("description", str), ("spec", list)):
        if field not in spec:
            errors.append(f"Field '{field}' is missing from survey spec.")
        elif not isinstance(spec[field], kind):
            errors.append(f"Expected {kind.__name__} for field '{field}'")
    if errors:
        return errors
    if not spec["spec"]:
        return ["'spec' doesn't contain any items."]
    variables = set()
    for idx, item in enumerate(spec["spec"]):
        if not isinstance(item, dict):
            errors.append(f"Survey question {idx} is not a json object.")
            continue
        missing = False
        for field in ("type", "question_name", "variable", "required"):
            if field not in item:
                errors.append(f"'{field}' missing from survey question {idx}")
                missing = True
            elif not isinstance(item[field], bool if field == "required" else str):
                errors.append(f"'{field}' in survey question {idx} has the wrong type")
                missing = True
        if missing:
            continue
        if item["variable"] in variables:
            errors.append(f"'variable' '{item['variable']}' duplicated in survey question {idx}.")
        variables.add(item["variable"])
        qtype = item["type"]
        if qtype not in AWX_SURVEY_TYPES:
            errors.append(f"'{qtype}' in survey question {idx} is not an allowed question type")
            continue
        default = item.get("default", "")
        # bool is an int in Python; AWX's JSON would carry true/false, which it rejects for integer.
        if default != "" and (not isinstance(default, AWX_SURVEY_TYPES[qtype]) or isinstance(default, bool)):
            errors.append(f"Default value {default!r} in survey question {idx} expected to be {qtype}.")
        for key in ("min", "max"):
            if item.get(key) is not None and (not isinstance(item[key], int) or isinstance(item[key], bool)):
                errors.append(f"The {key} limit in survey question {idx} expected to be integer.")
        if qtype in ("multiplechoice", "multiselect"):
            if "choices" not in item:
                errors.append(f"Survey question {idx} of type {qtype} must specify choices.")
                continue
            choices = item["choices"]
            if isinstance(choices, str):
                choices = [c for c in choices.splitlines() if c.strip()]
            if "default" in item:
                defaults = [d for d in item["default"].splitlines() if d.strip()] if isinstance(item["default"], str) else item["default"]
                if qtype == "multiplechoice" and len(defaults) > 1:
                    errors.append("Multiple Choice (Single Select) can only have one default value.")
                if any(d not in choices for d in defaults):
                    errors.append(f"Default choice must be answered from the choices listed (question {idx}).")
        if qtype in ("integer", "float") and isinstance(default, (int, float)) and not isinstance(default, bool):
            lo, hi = item.get("min"), item.get("max")
            if (lo is not None and default < lo) or (hi is not None and default > hi):
                errors.append(f"Default {default} of survey question {idx} is outside [{lo}, {hi}].")
        if qtype in ("text", "textarea") and isinstance(default, str) and default != "":
            lo, hi = item.get("min"), item.get("max")
            if (lo is not None and len(default) < lo) or (hi is not None and len(default) > hi):
                errors.append(f"Default {default!r} of survey question {idx} has a length outside [{lo}, {hi}].")
    return errors
