"""AWX as code (awx/configure.yml): the deploy and plan surveys are generated
from the variant table by the real playbook (--tags survey, no AWX), AWX would
accept them, they follow the table when the table changes, no template lets a
launcher set a variable beyond a bounded survey answer, and every awx.awx call
uses only options its module has."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from awx_helpers import REPO, ROLE_DEFAULTS, ansible_env, awx_survey_errors, run_configure, tool

AWX_DIR = REPO / "awx"
TEMPLATE_NAMES = {"inferops provision", "inferops plan", "inferops deploy", "inferops tune", "inferops rollback"}


def table() -> dict:
    return yaml.safe_load(ROLE_DEFAULTS.read_text())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return run_configure(tmp_path_factory.mktemp("awx"))


def question(survey: dict, variable: str) -> dict:
    matches = [q for q in survey["spec"] if q["variable"] == variable]
    assert len(matches) == 1, f"{variable}: {len(matches)} questions"
    return matches[0]


# --- the survey against the variant table -----------------------------------

def test_variant_choices_are_the_table_names_and_aliases(rendered):
    survey = rendered.survey
    defaults = table()
    expected = list(defaults["sglang_service_variants"]) + list(defaults["sglang_service_variant_aliases"])
    variant = question(survey, "variant")
    assert variant["type"] == "multiplechoice"
    assert variant["choices"] == expected
    assert variant["required"] is True
    assert variant["default"] == defaults["sglang_service_baseline_variant"] == "nextn"


def test_awx_would_accept_the_survey(rendered):
    survey = rendered.survey
    assert awx_survey_errors(survey) == []
    for item in survey["spec"]:
        for key in ("question_name", "question_description", "variable", "type", "required", "default"):
            assert key in item, f"{item['variable']}: no {key}"
        if item["type"] in ("multiplechoice", "multiselect"):
            assert isinstance(item["choices"], list) and item["choices"]


def test_the_validator_rejects_what_awx_rejects(rendered):
    """The AWX rules above are not vacuous: each broken copy of the survey is refused."""
    survey = rendered.survey

    def broken(change) -> dict:
        copy = json.loads(json.dumps(survey))
        change(copy)
        return copy

    cases = [
        lambda s: s["spec"][0].update(type="switch"),                      # AWX has no boolean/switch type
        lambda s: s["spec"][0].update(default="no-such-variant"),          # default not among the choices
        lambda s: s["spec"][0].pop("choices"),
        lambda s: s["spec"][0].pop("question_name"),
        lambda s: s["spec"][1].update(variable="variant"),                 # duplicated variable
        lambda s: question(s, "rollout_canary").update(default="1"),       # integer question, string default
        lambda s: question(s, "rollout_canary").update(required="yes"),
        lambda s: question(s, "rollout_max_fail_percentage").update(default=101),
        lambda s: s.pop("description"),
    ]
    for case in cases:
        assert awx_survey_errors(broken(case)), case


def test_override_switch_and_rollout_settings(rendered):
    survey = rendered.survey
    override = question(survey, "memory_override")
    # AWX surveys have no boolean type: a two-way choice, read by deploy.yml with `| bool`.
    assert override["type"] == "multiplechoice"
    assert override["choices"] == ["false", "true"] and override["default"] == "false"
    canary = question(survey, "rollout_canary")
    assert canary["type"] == "integer" and canary["default"] == 1 and canary["min"] >= 1
    batch = question(survey, "rollout_batch")
    assert batch["type"] == "multiplechoice" and batch["default"] == "25%"
    assert batch["choices"] == ["1", "2", "5", "10%", "25%", "50%", "100%"]
    fail = question(survey, "rollout_max_fail_percentage")
    assert fail["type"] == "integer" and fail["default"] == 0 and (fail["min"], fail["max"]) == (0, 100)
    assert {q["variable"] for q in survey["spec"]} == {
        "variant", "memory_override", "rollout_canary", "rollout_batch", "rollout_max_fail_percentage"}


def test_every_survey_variable_is_read_by_deploy(rendered):
    survey = rendered.survey
    deploy = (REPO / "playbooks" / "deploy.yml").read_text()
    for item in survey["spec"]:
        assert re.search(rf"\b{item['variable']}\b", deploy), f"deploy.yml never reads {item['variable']}"


def test_a_variant_added_to_the_table_is_offered(tmp_path):
    """A hard-coded survey fails this: the table file gets a variant and an alias."""
    defaults = table()
    defaults["sglang_service_variants"]["shadow-tp4"] = {
        "description": "shadow on four GPUs", "inherits": "shadow", "tp_size": 4}
    defaults["sglang_service_variant_aliases"]["tp4"] = "shadow-tp4"
    changed = tmp_path / "defaults.yml"
    changed.write_text(yaml.safe_dump(defaults, sort_keys=False))
    survey = run_configure(tmp_path, "-e", f"awx_variant_table_file={changed}").survey
    choices = question(survey, "variant")["choices"]
    assert choices == list(defaults["sglang_service_variants"]) + list(defaults["sglang_service_variant_aliases"])
    assert "shadow-tp4" in choices and "tp4" in choices


def test_the_inventory_variants_are_offered(tmp_path):
    """A group of the inventory replacing the table: the survey offers its variants too."""
    defaults = table()
    variants = dict(defaults["sglang_service_variants"], **{"nextn-long": {"inherits": "nextn", "context_length": 262144}})
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"sglang_servers": {"children": {"blackwell": {"hosts": {"ct200": None}}, "ampere": {"hosts": {"ct129": None}}}}}}}))
    (inventory / "group_vars" / "blackwell.yml").write_text(yaml.safe_dump(
        {"sglang_service_variants": variants,
         "sglang_service_variant_aliases": dict(defaults["sglang_service_variant_aliases"], long="nextn-long")}))
    survey = run_configure(tmp_path, "-i", str(inventory)).survey
    choices = question(survey, "variant")["choices"]
    assert "nextn-long" in choices and "long" in choices
    assert set(defaults["sglang_service_variants"]) <= set(choices)
    assert len(choices) == len(set(choices))


def configure_with_alias(tmp_path, alias: str, target: str):
    """configure.yml run on the role's variant table with one alias added; it must fail (exit 2)."""
    defaults = table()
    defaults["sglang_service_variant_aliases"][alias] = target
    broken = tmp_path / "defaults.yml"
    broken.write_text(yaml.safe_dump(defaults))
    result = run_configure(tmp_path, "-e", f"awx_variant_table_file={broken}", check=False)
    assert result.proc.returncode == 2, result.proc.stdout
    return result


def test_a_broken_table_stops_the_playbook(tmp_path):
    result = configure_with_alias(tmp_path, "ghost", "no-such-variant")
    assert "the variant table cannot make a survey" in result.proc.stdout
    assert result.survey is None


# --- the job templates ------------------------------------------------------

def test_job_templates(rendered):
    survey, templates = rendered.survey, rendered.templates
    by_name = {t["name"]: t for t in templates}
    assert set(by_name) == TEMPLATE_NAMES
    for template in templates:
        assert (REPO / template["playbook"]).is_file(), template["playbook"]
        assert template["ask_limit_on_launch"] is True
        assert template["verbosity"] in range(5)
    assert {t["playbook"] for t in templates} == {"provision.yml", "plan.yml", "deploy.yml", "tune.yml"}
    deploy = by_name["inferops deploy"]
    assert deploy["playbook"] == "deploy.yml"
    assert deploy["survey_enabled"] is True and deploy["survey_spec"] == survey
    plan = by_name["inferops plan"]
    assert plan["survey_enabled"] is True and awx_survey_errors(plan["survey_spec"]) == []
    rollback = by_name["inferops rollback"]
    assert rollback["playbook"] == "deploy.yml"
    assert rollback["extra_vars"] == {"variant": table()["sglang_service_baseline_variant"]}
    assert not rollback.get("survey_enabled") and not rollback.get("ask_variables_on_launch")


# --- what a launcher may set --------------------------------------------------

# The prompts a launcher may answer: none of them sets a variable. Every other
# ask_*_on_launch (variables, inventory, credentials, execution environment,
# instance groups, ...) would let a launcher choose what runs as root.
PROMPTS_ALLOWED = {"ask_limit_on_launch", "ask_tags_on_launch", "ask_job_type_on_launch", "ask_verbosity_on_launch"}


def bounded(item: dict) -> bool:
    """A survey question whose every accepted answer is known: a choice among a list, or an integer within bounds."""
    if item["type"] == "multiplechoice":
        return (isinstance(item.get("choices"), list) and bool(item["choices"])
                and all(isinstance(c, str) and c.strip() == c and c for c in item["choices"])
                and item.get("default") in item["choices"])
    if item["type"] == "integer":
        lo, hi = item.get("min"), item.get("max")
        return isinstance(lo, int) and isinstance(hi, int) and lo <= item.get("default", lo) <= hi
    return False


def test_no_template_prompts_for_free_extra_variables(rendered):
    """A launcher answers bounded survey questions only: no template asks for extra variables on launch (a
    launch-time ansible_ssh_common_args with a ProxyCommand ran as root in the execution environment), and every
    survey question is a multiple choice or a bounded integer."""
    questions = 0
    for template in rendered.templates:
        asked = {k for k, v in template.items() if k.startswith("ask_") and v}
        assert asked <= PROMPTS_ALLOWED, (template["name"], sorted(asked - PROMPTS_ALLOWED))
        assert not template.get("ask_variables_on_launch"), template["name"]
        if template.get("survey_enabled"):
            for item in template["survey_spec"]["spec"]:
                assert bounded(item), (template["name"], item)
                questions += 1
        else:
            assert "survey_spec" not in template, template["name"]
    assert questions == 15  # the deploy survey's five, the plan survey's one, the tune survey's nine
    # and the check is not vacuous
    assert not bounded({"type": "text", "variable": "rollout_batch", "min": 1, "max": 8, "default": "25%"})
    assert not bounded({"type": "integer", "variable": "rollout_canary", "min": 1, "default": 1})
    assert not bounded({"type": "multiplechoice", "choices": ["1", ""], "default": "1"})


def test_configure_never_lets_a_template_ask_for_variables():
    """The awx.awx.job_template call itself: ask_variables_on_launch is false whatever a template entry says,
    and the only other prompts it sends are the allowed ones, from the entry."""
    tasks = [t for t in awx_tasks(yaml.safe_load((AWX_DIR / "configure.yml").read_text()), []) if "awx.awx.job_template" in t]
    assert len(tasks) == 1
    args = tasks[0]["awx.awx.job_template"]
    assert args["ask_variables_on_launch"] is False
    asked = {k for k in args if k.startswith("ask_")}
    assert asked - {"ask_variables_on_launch"} <= PROMPTS_ALLOWED
    assert "extra_vars" in args and "survey_spec" in args


def test_plan_survey_offers_every_variant_and_each_of_the_table(rendered):
    by_name = {t["name"]: t for t in rendered.templates}
    plan = by_name["inferops plan"]
    every = yaml.safe_load((REPO / "playbooks" / "plan.yml").read_text())[0]["vars"]["plan_every_variant"]
    (variant,) = plan["survey_spec"]["spec"]
    assert variant["variable"] == "variant" and variant["type"] == "multiplechoice" and variant["required"] is True
    assert variant["choices"] == [every] + question(rendered.survey, "variant")["choices"]
    assert variant["default"] == every


@pytest.mark.parametrize(("answer", "planned"), [
    ("every variant", []), ("", []), ("balanced", ["balanced"]), ("nextn", ["nextn"]),
])
def test_plan_reads_the_survey_answer(answer, planned):
    """plan.yml's own expression, templated as Ansible does: the "every variant" answer plans the whole table
    (sglang_service_plan_variants: []), a variant's name plans that one."""
    play = yaml.safe_load((REPO / "playbooks" / "plan.yml").read_text())[0]
    expression = play["tasks"][0]["vars"]["sglang_service_plan_variants"]
    assert play["vars"]["plan_every_variant"] == "every variant"
    templar = Templar(loader=DataLoader(), variables=dict(play["vars"], variant=answer))
    assert templar.template(trust_as_template(expression)) == planned


def test_a_variant_named_as_the_every_answer_stops_the_playbook(tmp_path):
    result = configure_with_alias(tmp_path, "every variant", "nextn")
    assert 'none may be named "every variant"' in result.proc.stdout
    assert result.templates is None


# --- awx.awx calls against the modules' argument specs ----------------------

def awx_tasks(node, found: list) -> list:
    """Every task of a playbook or task file (blocks included)."""
    if isinstance(node, list):
        for item in node:
            awx_tasks(item, found)
    elif isinstance(node, dict):
        if any(k in node for k in ("hosts", "import_playbook")):
            for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                awx_tasks(node.get(section, []), found)
        elif any(k in node for k in ("block", "rescue", "always")):
            for section in ("block", "rescue", "always"):
                awx_tasks(node.get(section, []), found)
        else:
            found.append(node)
    return found


def awx_files() -> list:
    return sorted(p for p in AWX_DIR.glob("*.yml") if isinstance(yaml.safe_load(p.read_text()), list))


@pytest.fixture(scope="module")
def awx_docs():
    """ansible-doc -j for every awx.awx module the playbooks use."""
    modules = set()
    for path in awx_files():
        for play in yaml.safe_load(path.read_text()):
            for group in (play.get("module_defaults") or {}):
                assert group == "group/awx.awx.controller", group
        for task in awx_tasks(yaml.safe_load(path.read_text()), []):
            modules.update(k for k in task if k.startswith("awx.awx."))
    assert {"awx.awx.organization", "awx.awx.project", "awx.awx.inventory", "awx.awx.inventory_source",
            "awx.awx.execution_environment", "awx.awx.job_template"} <= modules
    proc = subprocess.run([tool("ansible-doc"), "-j", *sorted(modules)], cwd=REPO, env=ansible_env(),
                          capture_output=True, text=True, timeout=300, check=True)
    docs = json.loads(proc.stdout)
    assert set(docs) == modules
    return {name: doc["doc"]["options"] for name, doc in docs.items()}


def option_names(options: dict) -> set:
    names = set(options)
    for spec in options.values():
        names.update(spec.get("aliases", []))
    return names


def test_awx_module_calls_use_only_their_options(awx_docs):
    checked = 0
    for path in awx_files():
        plays = yaml.safe_load(path.read_text())
        for task in awx_tasks(plays, []):
            for key, args in task.items():
                if key.startswith("awx.awx."):
                    unknown = set(args) - option_names(awx_docs[key])
                    assert not unknown, f"{path.name}: {task.get('name')}: {key} has no option {sorted(unknown)}"
                    checked += 1
        for play in plays:
            defaults = (play.get("module_defaults") or {}).get("group/awx.awx.controller", {})
            for module, options in awx_docs.items():
                assert not set(defaults) - option_names(options), f"module_defaults: {module}"
    assert checked >= 7


def argument_spec(options: dict) -> dict:
    """An Ansible argument spec from ansible-doc's options (types, choices, list elements, aliases)."""
    spec = {}
    for name, doc in options.items():
        entry = {"type": doc.get("type", "str")}
        for key in ("choices", "elements", "aliases"):
            if key in doc:
                entry[key] = doc[key]
        spec[name] = entry
    return spec


def test_job_templates_validate_against_the_module(rendered, awx_docs):
    """What configure.yml sends for each job template passes awx.awx.job_template's argument spec."""
    templates = rendered.templates
    validator = ArgumentSpecValidator(argument_spec(awx_docs["awx.awx.job_template"]))
    for template in templates:
        params = dict(template, organization="inferops", project="inferops.sglang", inventory="inferops production",
                      execution_environment="inferops-sglang", credentials=["inferops machine"], job_type="run")
        result = validator.validate(params)
        assert not result.error_messages, (template["name"], result.error_messages)
    # and the check is not vacuous
    assert validator.validate(dict(templates[0], verbosity=7)).error_messages
    assert validator.validate(dict(templates[0], survey_spec=["not", "a", "dict"])).error_messages


def test_secrets_never_logged():
    """The token reaches a module only as controller_oauthtoken (no_log in awx.awx's spec); every task
    that templates it in otherwise is no_log."""
    for path in awx_files():
        for task in awx_tasks(yaml.safe_load(path.read_text()), []):
            if any(not k.startswith("awx.awx.") and "awx_controller_oauthtoken" in json.dumps(v) for k, v in task.items()):
                assert task.get("no_log") is True, task.get("name")
    assert "oauthtoken:" not in (AWX_DIR / "vars" / "main.yml").read_text().replace("awx_controller_oauthtoken:", "")


def test_syntax_check():
    proc = subprocess.run([tool("ansible-playbook"), "--syntax-check", "awx/configure.yml"], cwd=REPO,
                          env=ansible_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the tune survey ----------------------------------------------------------

def test_tune_survey_offers_the_variants_and_tune_reads_every_answer(rendered):
    by_name = {t["name"]: t for t in rendered.templates}
    tune = by_name["inferops tune"]
    assert tune["playbook"] == "tune.yml" and tune["survey_enabled"] is True
    assert awx_survey_errors(tune["survey_spec"]) == []
    assert question(tune["survey_spec"], "base")["choices"] == question(rendered.survey, "variant")["choices"]
    playbook = (REPO / "playbooks" / "tune.yml").read_text()
    for item in tune["survey_spec"]["spec"]:
        assert re.search(rf"\b{item['variable']}\b", playbook), f"tune.yml never reads {item['variable']}"


@pytest.mark.parametrize(("answers", "objective", "budget"), [
    ({"concurrency": "8", "max_tokens": "128", "ttft_p95_ms": "0", "min_output_tokens_per_s": "0", "trials": "12",
      "minutes": "60"}, {"concurrency": 8, "max_tokens": 128}, {"trials": 12, "minutes": 60}),
    ({"concurrency": 4, "max_tokens": 64, "ttft_p95_ms": 800, "min_output_tokens_per_s": 150, "trials": 6, "minutes": 20},
     {"concurrency": 4, "max_tokens": 64, "ttft_p95_ms": 800, "min_output_tokens_per_s": 150}, {"trials": 6, "minutes": 20}),
    ({}, {}, {}),
    ({"objective": {"concurrency": 2}, "budget": {"trials": 3}, "concurrency": 9}, {"concurrency": 2}, {"trials": 3}),
])
def test_tune_reads_the_survey_answers_as_its_objective_and_budget(answers, objective, budget):
    """tune.yml's own expressions, templated as Ansible does: each answer (AWX sends integers; the CLI strings)
    becomes the objective's or the budget's field, a 0 limit none; -e objective/budget win."""
    play = yaml.safe_load((REPO / "playbooks" / "tune.yml").read_text())[0]
    templar = Templar(loader=DataLoader(), variables=dict(answers))
    assert templar.template(trust_as_template(play["vars"]["sglang_service_tune_objective"])) == objective
    assert templar.template(trust_as_template(play["vars"]["sglang_service_tune_budget"])) == budget
