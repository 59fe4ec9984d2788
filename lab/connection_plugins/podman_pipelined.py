# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's podman connection, with pipelining (a plugin of the test lab, not of the collection).

containers.podman.podman runs ``podman exec`` without ``-i``, so a module
cannot be piped to the interpreter, and it turns pipelining off: every task
then costs a temporary directory, a ``podman cp`` of the module, a chmod, the
run and a cleanup, each one ``podman exec`` (a conmon and an OCI runtime
start). This one passes stdin through (``podman exec -i``) and pipelines, so a
task is one ``podman exec``. Lab hosts are reached as root: become never needs
a tty. Files a module needs are still copied with ``podman cp``.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: podman_pipelined
short_description: Run tasks in the lab's podman containers, modules piped to the interpreter
description:
  - Runs tasks in a podman container as containers.podman.podman does, and pipes each module to the
    interpreter through C(podman exec -i) (pipelining).
author: inferops.sglang contributors (@inferops)
options:
  remote_addr:
    description: The container's name or ID.
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
  remote_user:
    description: The user to run as in the container (the container's own user when unset).
    vars:
      - name: ansible_user
  podman_executable:
    description: The podman command.
    default: podman
    vars:
      - name: ansible_podman_executable
    env:
      - name: ANSIBLE_PODMAN_EXECUTABLE
  podman_extra_args:
    description: Arguments put before podman's subcommand.
    default: ''
    vars:
      - name: ansible_podman_extra_args
    env:
      - name: ANSIBLE_PODMAN_EXTRA_ARGS
  pipelining:
    description: Pipe modules to the interpreter (one C(podman exec -i) a task).
    type: bool
    default: true
    vars:
      - name: ansible_pipelining
"""

import shlex

from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ConnectionBase
from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection


class Connection(PodmanConnection):
    """containers.podman.podman, with stdin passed to podman exec and pipelining on."""

    transport = "podman_pipelined"
    has_pipelining = True

    def exec_command(self, cmd, in_data=None, sudoable=False):
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        args = shlex.split(to_native(cmd, errors="surrogate_or_strict"))
        podman = ["exec", "-i"] if in_data is not None else ["exec"]
        if self.user:
            podman.extend(("--user", self.user))
        return self._podman(podman, args, in_data)
