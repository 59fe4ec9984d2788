#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_lock
short_description: One deploy at a time per host - the deploy lock, held for the whole switch, naming its holder
version_added: 0.1.0
description:
  - Takes, renews or releases a lock file on the host that says who deploys there (the controller's user, host and
    C(ansible-playbook) process, the AWX job, the variant, since when) and until when (a lease).
  - 'O(state=acquired): a free lock is created atomically (a record written to a temporary file in the lock''s
    directory, mode 0600, then hard-linked to O(path), which fails when another deploy created it first). A lock held
    by another run makes the task wait, polling every O(poll) seconds for up to O(timeout) seconds, and then fail
    before anything changes, naming the holder, for example
    "sglang-qwen.service on ct200 is being deployed by alice@ctl-1 (AWX job 42), variant shadow-balanced, since
    2026-12-01T10:00:00Z; waited 600 s (sglang_service_lock_timeout)." followed by the lock file, its run id and lease.'
  - 'A stale lock is taken over (RV(taken_over), RV(previous) is the holder it replaces, and a warning says why). Stale
    means: its lease (C(expires), on the host''s clock) has run out; or its holder ran on this controller
    (C(controller_host) equals this controller''s host name) and that C(ansible-playbook) process no longer exists
    (C(kill -0) finds no such process; one that exists but may not be signalled counts as alive). The process check is
    made on the controller, between polls. A takeover re-reads the lock under an exclusive C(flock) on
    C(<path>.guard) and replaces it (a temporary file renamed over it) only if it still holds the same stale run, so of
    two deploys taking over one stale lock exactly one wins.'
  - O(state=renewed) extends this run's lease by O(lease) seconds from now, for steps longer than the lease.
    When the lock is not this run's any more (its lease ran out and another deploy took it over, or it was removed) the
    task fails with RV(lost) (in check mode it only reports RV(lost), since nothing was acquired).
  - O(state=released) removes this run's lock. Another run's lock is never removed; the task then only warns, with RV(lost).
  - 'The run id: the plugin makes one per play and host (a 32-hex-digit id derived from the play''s id, the
    C(ansible-playbook) process and the host), so the tasks of one play share it without passing it; give O(run_id)
    (the RV(run_id) of the acquiring task) to renew or release it from another play.'
  - 'In check mode nothing is written and nothing waits: RV(holder) is the lock''s holder, RV(acquired) says whether a
    real run would get the lock now, and a warning names the holder when another deploy holds it.'
  - The module creates the lock's directory (mode 0700) when it is missing. The lock file is owned by the user the
    module runs as (root, with become).
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
attributes:
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
    support: full
options:
  path:
    description: The lock file on the host, for example C({{ _sglang_service_dir }}/deploy.lock).
    type: path
    required: true
  state:
    description: C(acquired) takes the lock (waiting for it), C(renewed) extends this run's lease, C(released) removes this run's lock.
    type: str
    choices: [acquired, renewed, released]
    default: acquired
  service:
    description:
      - The systemd unit being deployed, recorded in the lock (with O(state=acquired)) and named in messages.
      - Without it, the name of the lock's directory is recorded (C(sglang-qwen) for C(/var/lib/inferops-sglang/sglang-qwen/deploy.lock)).
    type: str
  variant:
    description: The variant being deployed, recorded in the lock.
    type: str
  run_id:
    description:
      - The run that holds the lock. By default the plugin's id for this play and host.
      - Give the RV(run_id) returned when it was acquired to renew or release the lock from another play.
    type: str
  holder:
    description:
      - Who deploys. Filled in by the action plugin on the controller (C(controller_user), C(controller_host),
        C(controller_pid), C(awx_job_id) from the task variables C(awx_job_id) or C(tower_job_id)) with O(service) and
        O(variant); keys given here are kept where the plugin has no value. Only C(service), C(variant),
        C(controller_user), C(controller_host), C(controller_pid) and C(awx_job_id) are recorded.
    type: dict
  lease:
    description: Seconds the lock stays valid from when it is acquired or renewed; a holder that neither renews nor releases it within them loses it.
    type: int
    default: 1800
  take_over_run_id:
    description:
      - Take the lock over when it still holds this run id, stale or not (the run id is in the failure message and in the lock file).
        When the lock holds another run by then, the task waits for it as usual.
      - The plugin sets it itself when the holder's C(ansible-playbook) process on this controller is gone.
    type: str
  timeout:
    description: With O(state=acquired), seconds to wait for a lock held by another run before failing; C(0) tries once. Handled on the controller.
    type: int
    default: 600
  poll:
    description: With O(state=acquired), seconds between two tries while waiting. Handled on the controller.
    type: float
    default: 2.0
  inspect:
    description:
      - With O(state=acquired), read the service O(service) once the lock is this run's (in check mode, whether or
        not a real run would get it), in the same call, and return it as RV(before). Read-only.
    type: dict
    suboptions:
      service_dir:
        description: The service's state directory (C(current.json), C(switch.json), C(known-good/)).
        type: path
        required: true
      files:
        description: The files that make the service (C(name), C(src), C(mode)), the unit first.
        type: list
        elements: dict
        default: []
notes:
  - 'Besides O(path), the module keeps C(<path>.guard) (an empty file, mode 0600) for the C(flock) that serializes
    changes of an existing lock; it can stay.'
  - The lease runs on the host's clock (C(expires) is epoch seconds on the host).
seealso:
  - module: inferops.sglang.wait_for_sglang
"""

EXAMPLES = r"""
- name: Take the deploy lock (wait up to 10 minutes for another deploy) and read the service's state
  inferops.sglang.sglang_deploy_lock:
    path: /var/lib/inferops-sglang/sglang-qwen/deploy.lock
    service: sglang-qwen.service
    variant: shadow-balanced
    timeout: 600
    inspect:
      service_dir: /var/lib/inferops-sglang/sglang-qwen
      files:
        - {name: sglang-qwen.service, src: /etc/systemd/system/sglang-qwen.service, mode: "0644"}
  register: __sglang_service_lock

- name: Renew it before a long step
  inferops.sglang.sglang_deploy_lock:
    path: /var/lib/inferops-sglang/sglang-qwen/deploy.lock
    state: renewed
    run_id: "{{ __sglang_service_lock.run_id }}"

- name: Release it at the end
  inferops.sglang.sglang_deploy_lock:
    path: /var/lib/inferops-sglang/sglang-qwen/deploy.lock
    state: released
    run_id: "{{ __sglang_service_lock.run_id }}"

- name: Break a lock whose deploy is known to be gone (the run id from the failure message)
  inferops.sglang.sglang_deploy_lock:
    path: /var/lib/inferops-sglang/sglang-qwen/deploy.lock
    service: sglang-qwen.service
    take_over_run_id: 3f0c2b1e9a8d4c7b8e6f5a4d3c2b1a09
"""

RETURN = r"""
acquired:
  description:
    - Whether this run holds the lock after the task (O(state=acquired)); in check mode, whether a real run would get it now.
    - False after O(state=renewed) or O(state=released).
  returned: always
  type: bool
run_id:
  description: This run's id (give it to O(run_id) to renew or release from another play).
  returned: always
  type: str
  sample: 3f0c2b1e9a8d4c7b8e6f5a4d3c2b1a09
holder:
  description:
    - The lock's record after the task; this run's when it holds the lock, the other run's when it does not, null when there is no lock.
    - In check mode, the record as found.
  returned: always
  type: dict
  contains:
    run_id:
      description: The holding run.
      type: str
    service:
      description: The unit being deployed.
      type: str
    variant:
      description: The variant being deployed.
      type: str
    controller_user:
      description: The user running C(ansible-playbook) on the controller.
      type: str
    controller_host:
      description: The controller's host name.
      type: str
    controller_pid:
      description: The C(ansible-playbook) process on the controller.
      type: int
    awx_job_id:
      description: The AWX job, or null.
      type: str
    started:
      description: When the lock was acquired (UTC, ISO 8601).
      type: str
      sample: "2026-12-01T10:00:00Z"
    renewed:
      description: When the lease was last set (UTC, ISO 8601).
      type: str
    expires:
      description: When the lease runs out (epoch seconds on the host's clock).
      type: int
    lease_s:
      description: The lease in seconds.
      type: int
previous:
  description: The stale holder's record that was taken over, or null.
  returned: always
  type: dict
taken_over:
  description: Whether a stale lock was taken over.
  returned: always
  type: bool
waited:
  description: Seconds the task waited for the lock.
  returned: always
  type: float
before:
  description:
    - With O(inspect), the service before the deploy, as the switch's first state reads it again - C(active), C(loaded),
      C(variant) (recorded as running, or null), C(interrupted), C(argv) and C(url) (its recorded flags and the URL they
      give, or null), C(api_key_file) (the installed --config file, or null), C(marker) (the interrupted switch's
      marker), C(known_good) (a known-good unit is saved), C(known_good_variant), C(known_good_argv), C(sglang_version)
      and C(gpu_devices) (as recorded), C(gate_timeout) and C(known_good_gate_timeout) (the running and the saved
      service's own gate timeouts, or null).
    - Null when the lock is another run's.
  returned: with O(inspect) and O(state=acquired)
  type: dict
lost:
  description: With O(state=renewed) or O(state=released), true when the lock is no longer this run's (RV(holder) says whose it is).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_lock as lock
from ansible_collections.inferops.sglang.plugins.module_utils import _switch


def lost_message(path: str, service: str | None, current: dict | None) -> str:
    what = f"the deploy lock of {service}" if service else "the deploy lock"
    if current is None:
        return f"{what} ({path}) is lost: it was removed"
    return f"{what} ({path}) is lost: it is held by run {current['run_id']}, {lock.describe(current)}"


def main() -> None:
    module = AnsibleModule(argument_spec=lock.ARGUMENT_SPEC, supports_check_mode=True,
                           required_by={"inspect": ["service"]})
    p = module.params
    check = module.check_mode
    if not p["run_id"]:
        module.fail_json(msg="run_id is required (the sglang_deploy_lock action plugin sets it)")
    if p["lease"] <= 0:
        module.fail_json(msg=f"lease must be a positive number of seconds, got {p['lease']}")
    problems = _switch.file_problems((p["inspect"] or {}).get("files") or [], "inspect.files")
    if problems:
        module.fail_json(msg="; ".join(problems))
    result = dict(changed=False, acquired=False, run_id=p["run_id"], holder=None, previous=None, taken_over=False,
                  waited=0.0, lost=False)
    try:
        if p["state"] == "acquired":
            holder = dict(p["holder"] or {})
            holder.update({key: p[key] for key in ("service", "variant") if p[key] is not None})
            holder["service"] = holder.get("service") or lock.default_service(p["path"])
            if not check:
                result["changed"] = lock.ensure_dir(p["path"])
            outcome = lock.acquire(p["path"], p["run_id"], holder, p["lease"], p["take_over_run_id"], check_mode=check)
            result.update(acquired=outcome["acquired"], holder=outcome["holder"], previous=outcome["previous"],
                          taken_over=outcome["taken_over"], changed=result["changed"] or outcome["changed"])
            current = outcome["holder"]
            if outcome["taken_over"]:
                prev = outcome["previous"]
                module.warn(f"{'would take' if check else 'took'} over the deploy lock {p['path']} of run {prev['run_id']} "
                            f"({lock.describe(prev)}): {outcome['stale']}")
            elif check and current is not None and current["run_id"] != p["run_id"]:
                module.warn(f"{current.get('service') or p['service']} is being deployed by {lock.describe(current)} "
                            f"(run {current['run_id']}, lock {p['path']}); a real run would wait for it")
            if p["inspect"]:
                # read under the lock: what this run found is what no other deploy can change before its switch
                result["before"] = None
                if outcome["acquired"] or check:
                    inspect = p["inspect"]
                    result["before"] = _switch.inspect(_switch.SystemHost(p["service"], module.run_command), p["service"],
                                                       inspect["service_dir"], inspect["files"])
        else:
            if p["state"] == "renewed":
                outcome = lock.renew(p["path"], p["run_id"], p["lease"], check_mode=check)
            else:
                outcome = lock.release(p["path"], p["run_id"], check_mode=check)
            current = outcome["holder"]
            result.update(changed=outcome["changed"], lost=outcome["lost"],
                          holder=None if p["state"] == "released" and not outcome["lost"] else current)
            if outcome["lost"] and not check:
                message = lost_message(p["path"], p["service"] or (current or {}).get("service"), current)
                if p["state"] == "renewed":
                    module.fail_json(msg=message + "; this deploy no longer holds the host and must stop", **result)
                module.warn(message + "; it was left alone")
    except (lock.LockError, _switch.HostError) as exc:
        module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
