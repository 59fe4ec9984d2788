# inferops.sglang: the two entry points are `make lab` and `make test`.
SHELL := /bin/bash
VENV := .venv
SANITY_VENV := .cache/sanity-venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_FORCE_COLOR ?= 0
# Requests to the lab's local servers never go through a proxy.
export NO_PROXY := 127.0.0.1,localhost

.PHONY: setup real lab lab-down test lint docs ee ee-check sanity units conformance molecule bench bench-plan bench-perf bench-fleet bench-switch bench-tune

# The venvs live in the per-user cache, keyed by their inputs (.ci/venv.sh).
$(VENV)/.stamp: requirements.txt
	.ci/timed venv .ci/venv.sh $(VENV) -r requirements.txt

$(SANITY_VENV)/.stamp: requirements.txt
	mkdir -p .cache
	.ci/timed sanity-venv .ci/venv.sh $(SANITY_VENV) "$$(grep '^ansible-core==' requirements.txt)"
	mkdir -p ~/.ansible/test/cache
	cp tests/sanity/get_pip_offline.py ~/.ansible/test/cache/get_pip_24_2.py
	touch $@

# The gateway the collection pins (_gateway.PINNED), for the tests that run it, with its
# dependencies locked by the lock the sglang_runtime role installs hosts' gateway venvs with.
GATEWAY_VENV := .cache/gateway-venv
GATEWAY_VERSION := $(shell sed -n 's/^PINNED = "\(.*\)"$$/\1/p' plugins/module_utils/_gateway.py)
GATEWAY_LOCK := roles/sglang_runtime/files/constraints/smg-$(GATEWAY_VERSION).txt
$(GATEWAY_VENV)/.stamp: plugins/module_utils/_gateway.py $(GATEWAY_LOCK)
	mkdir -p .cache
	.ci/timed gateway-venv .ci/venv.sh $(GATEWAY_VENV) -c $(GATEWAY_LOCK) smg==$(GATEWAY_VERSION)

setup: $(VENV)/.stamp
	.ci/timed setup-machine lab/setup-machine.sh
	.ci/timed lab-image lab/image/build.sh >/dev/null

## Real SGLang (0.5.11 and 0.5.23 venvs from PyPI, the libcuda.so.1 test double,
## a tiny model, the release wheels) in the per-user cache; reused while the
## inputs are unchanged (lab/real/build.sh).
real:
	.ci/timed real lab/real/build.sh >/dev/null

## The main job on the built-in lab, told as a story (lab/step.py: a line per step and what
## it shows; each step's whole output in .cache/lab/make-lab.log). First the field story,
## which needs only the lab image and the tools' venv: lab hosts for ct129 and ct200 on the
## NEXTN baseline, then `deploy.yml -e variant=balanced`: ct129 fails as in the field and
## rolls back to NEXTN (the playbook exits 2 for it), ct200 switches; checked and each host
## reported. rollout_canary=2 makes both hosts the first batch, as in the field story (a
## plain deploy.yml makes ct129 the canary, and its failure stops the rollout before ct200).
## Then blue/green behind the gateway on both. Only then real SGLang (make real: its two
## venvs, about 10 min on a fresh machine) and the real-SGLang host cpu-real (real SGLang
## 0.5.11 on CPU under the role's unit, lab/hosts/cpu-real): its CPU variant, a switch to
## cpu-small, cpu-ngram refused by real SGLang's argument checks in the preflight (nothing
## changes; the playbook exits 2), cpu-triton dying at start (exit 2) and rolled back to
## cpu-small, checked from its history by lab/playbooks/real_job.yml.
STEP := python lab/step.py
LAB_PLAY := ansible-playbook -i inventories/lab
BLUE_GREEN := -e @lab/vars/blue_green.yml
lab: setup
	@$(STEP) --begin
	@$(STEP) "Lab hosts ct129 and ct200: podman containers running systemd, fake GPUs, the SGLang simulator" -- lab/labctl up
	@$(STEP) "The field story's lab units on both" -- $(LAB_PLAY) lab/playbooks/field_cases.yml
	@$(STEP) "Both on the NEXTN baseline (deploy.yml -e variant=nextn)" -- $(LAB_PLAY) deploy.yml -e variant=nextn
	@$(STEP) --expect 2 "The field story: deploy.yml -e variant=balanced -e rollout_canary=2" -- \
	  $(LAB_PLAY) deploy.yml -e variant=balanced -e rollout_canary=2
	@$(STEP) "Checked from each host's deploy history" -- $(LAB_PLAY) lab/playbooks/main_job.yml
	@$(STEP) "Each host as playbooks/inspect.yml reports it" -- $(LAB_PLAY) playbooks/inspect.yml
	@$(STEP) "ct129 onto SGLang's gateway with two slots: NEXTN, in place" -- $(LAB_PLAY) deploy.yml -l ct129 -e variant=nextn $(BLUE_GREEN)
	@$(STEP) --expect 2 "ct129: balanced started beside the live slot, refused there, NEXTN untouched" -- \
	  $(LAB_PLAY) deploy.yml -l ct129 -e variant=balanced $(BLUE_GREEN)
	@$(STEP) "ct129: NEXTN with max_running_requests 8, switched beside the live slot" -- \
	  $(LAB_PLAY) deploy.yml -l ct129 -e variant=nextn $(BLUE_GREEN) -e '{"sglang_service_variant_overrides": {"nextn": {"max_running_requests": 8}}}'
	@$(STEP) "ct200 onto the gateway: NEXTN, in place" -- $(LAB_PLAY) deploy.yml -l ct200 -e variant=nextn $(BLUE_GREEN)
	@$(STEP) "ct200: balanced, in place again (no free GPU for a second slot), the outage recorded" -- $(LAB_PLAY) deploy.yml -l ct200 -e variant=balanced $(BLUE_GREEN)
	@$(STEP) "Checked from the histories and the gateway's workers" -- $(LAB_PLAY) lab/playbooks/blue_green_job.yml
	@$(STEP) "Real SGLang 0.5.11 and 0.5.23 venvs, the libcuda test double, a tiny model (make real; cached)" -- \
	  .ci/timed real lab/real/build.sh
	@$(STEP) "Lab host cpu-real: real SGLang 0.5.11 on CPU under the role's unit" -- lab/labctl up cpu-real
	@$(STEP) "cpu-real: its CPU variant" -- $(LAB_PLAY) lab/playbooks/real_deploy.yml -l real_sglang -e variant=cpu
	@$(STEP) "cpu-real: switched to cpu-small" -- $(LAB_PLAY) lab/playbooks/real_deploy.yml -l real_sglang -e variant=cpu-small
	@$(STEP) --expect 2 "cpu-real: cpu-ngram, refused by real SGLang's own argument checks, nothing changes" -- \
	  $(LAB_PLAY) lab/playbooks/real_deploy.yml -l real_sglang -e variant=cpu-ngram
	@$(STEP) --expect 2 "cpu-real: cpu-triton dies at start and is rolled back to cpu-small" -- \
	  $(LAB_PLAY) lab/playbooks/real_deploy.yml -l real_sglang -e variant=cpu-triton
	@$(STEP) "Checked from cpu-real's history" -- $(LAB_PLAY) lab/playbooks/real_job.yml

lab-down:
	lab/labctl down

## Benchmarks (figures, not pass/fail): readiness time to verdict on the lab
## (every field case, the stall of graph-hang included) and against real SGLang
## 0.5.11/0.5.23 on CPU (lab/bench/readiness_real.py, about 10 min), each gate
## against the naive uri loop; and the memory planner's plans per second (no
## lab needed: make bench-plan); and the performance gate's cost and verdict on
## real SGLang (make bench-perf); what a switch behind the gateway costs clients
## (make bench-switch).
bench: setup real bench-plan bench-perf bench-switch
	lab/labctl up
	ansible-playbook -i inventories/lab lab/playbooks/field_cases.yml
	python lab/bench/readiness.py
	python lab/bench/readiness_real.py

bench-perf: setup real
	python lab/bench/perf_gate.py

bench-plan: $(VENV)/.stamp
	python lab/bench/planner.py

## Failed requests, cut streams and the longest gap under constant load through the
## real gateway, for a switch and a refused candidate, on the simulator and on real
## SGLang (lab/bench/switch.py; figures in .cache/bench/switch.json).
bench-switch: setup real $(GATEWAY_VENV)/.stamp
	python lab/bench/switch.py --server sim
	python lab/bench/switch.py --server real

## A tune against the exhaustive grid on ct129's stand-in, with the live server under
## constant load (lab/bench/tune.py; figures in .cache/bench/tune.json; about 20 min).
bench-tune: $(VENV)/.stamp
	python lab/bench/tune.py

## A lab fleet of simulated hosts (lab/labctl fleet): rolling deploy wall time
## against N and forks, a failing canary and a failing third batch (figures in
## .cache/bench/rollout.json; tens of minutes on a 2-core machine).
bench-fleet: setup
	python lab/bench/rollout.py --down

## Every check: lint, sanity, unit tests, conformance against real SGLang,
## molecule scenarios. First the real-SGLang cache; then two lanes side by side
## (.ci/molecule-lanes.sh): the unit tests (three workers: they mostly wait on
## real processes and HTTP), the deploy scenario and the real one; and the
## provision and fleet scenarios, the lab scenario once the deploy scenario has
## ended (they share the ct129/ct200 host names), and the conformance tests last:
## their real SGLang servers on CPU then run beside the real scenario (whose
## performance gate only reports), not beside the deploy scenario's replay, whose
## enforced gate compares simulated speeds and first-token times a loaded CPU
## moves (one run: TTFT p95 1.23x beside them). Lint and sanity start once the
## deploy scenario has ended (its marker in .cache/molecule/ended; set at the end
## in any case, so they always run), niced, beside the second half, which leaves
## the cores partly idle: run from the start they took about 140 s of CPU from the
## first half, which keeps both cores busy (as did the unit tests niced beside the
## lanes, which made the suite slower). Their output is printed whole when both
## have ended. Any part failing fails the whole.
LANES := make:units,deploy,real provision,fleet,after:deploy,lab,make:conformance
CHECKS_AFTER := .cache/molecule/ended/deploy
test: setup real
	@mkdir -p .cache; rm -f $(CHECKS_AFTER); \
	( until [[ -e $(CHECKS_AFTER) ]]; do sleep 5; done; \
	  $(MAKE) --no-print-directory -j2 --output-sync=target lint sanity NICE="nice -n 10" >.cache/lint+sanity.log 2>&1; \
	  rc=$$?; cat .cache/lint+sanity.log; exit $$rc ) & checks=$$!; \
	$(MAKE) --no-print-directory molecule MOLECULE_LANES="$(LANES)"; rc=$$?; \
	mkdir -p $(dir $(CHECKS_AFTER)); : >$(CHECKS_AFTER); \
	wait $$checks || rc=1; exit $$rc

## ansible-lint; each role's defaults against its meta/argument_specs.yml
## (tools/check_argument_specs.py); every version_added against the last release
## (tools/check_version_added.py); the changelog fragments (antsibull-changelog lint);
## the documentation's markup and references (antsibull-docs lint-collection-docs);
## the documentation site built from the code, every warning an error (make docs).
## All run; any failing fails lint.
LINT_STEPS := ansible-lint; python tools/check_argument_specs.py; python tools/check_version_added.py; \
  antsibull-changelog lint; antsibull-docs lint-collection-docs --plugin-docs .; docs/site/build.sh
lint: $(VENV)/.stamp
	.ci/timed lint bash -c 'rc=0; while read -r step; do $(NICE) bash -c "$$step" || { echo "lint: failed: $$step"; rc=1; }; done \
	  <<<"$$(tr ";" "\n" <<<"$(LINT_STEPS)")"; exit $$rc'

## The execution environment (ee/build.sh; docs/awx.md, "Execution environment"): its
## base image made here (ee/base/build.sh), the collection's tarball, then ansible-builder
## with podman: inferops-sglang-ee:<version>, its size and build times printed.
ee: setup
	.ci/timed ee ee/build.sh

## deploy.yml run through the EE as AWX runs a job (ee/check.py): ansible-runner with the
## image, on the lab's ct129 and ct200: the baseline, then the field story (ct129 rolled
## back, ct200 switched, exit 2), checked from the runner's artifacts.
ee-check: ee
	.ci/timed ee-check python ee/check.py

## The documentation site from the code (docs/site/build.sh): .cache/docs-site/html.
docs: $(VENV)/.stamp
	docs/site/build.sh

# ansible-test needs the collection at ansible_collections/<ns>/<name> and outside
# any other git work tree; collections/ (the link to this tree) stays behind.
# Each run gets its own copy, so two runs never share one.
sanity: $(SANITY_VENV)/.stamp
	dir=$$(mktemp -d $(or $(TMPDIR),/tmp)/inferops-sglang-sanity.XXXXXX) && trap 'rm -rf "$$dir"' EXIT && \
	  mkdir -p $$dir/ansible_collections/inferops/sglang && \
	  git ls-files --cached --others --exclude-standard | grep -v '^collections/' \
	    | tar -cT - | tar -xC $$dir/ansible_collections/inferops/sglang && \
	  cd $$dir/ansible_collections/inferops/sglang && \
	  $(CURDIR)/.ci/timed sanity $(NICE) $(CURDIR)/$(SANITY_VENV)/bin/ansible-test sanity --local --requirements --python 3.11 --color no

## Three workers, each a file at a time (a module's fixtures are built once).
UNIT_WORKERS ?= 3
units: $(VENV)/.stamp $(GATEWAY_VENV)/.stamp
	.ci/timed units python -m pytest -n $(UNIT_WORKERS) --dist loadfile --durations=20 tests/unit

## The collection's claims checked against real SGLang 0.5.11 and 0.5.23 on CPU,
## in two workers (tests/conformance/conftest.py: which cases share one).
CONFORMANCE_WORKERS ?= 2
conformance: $(VENV)/.stamp $(GATEWAY_VENV)/.stamp real
	.ci/timed conformance python -m pytest -n $(CONFORMANCE_WORKERS) --dist loadscope --durations=20 tests/conformance

## molecule/real mounts the real venv, stub and model from INFEROPS_REAL_ROOT.
## The scenarios run in lanes side by side (.ci/molecule-lanes.sh): deploy and
## lab share the ct129/ct200 host names, so they share a lane (or the later waits).
MOLECULE_LANES ?= deploy,lab,real provision,fleet
molecule: setup real
	INFEROPS_LAB_IMAGE=$$(lab/image/build.sh) \
	  INFEROPS_REAL_ROOT=$$(lab/real/build.sh --print | sed -n 's/^INFEROPS_REAL_ROOT=//p') \
	  .ci/molecule-lanes.sh $(MOLECULE_LANES)
