"""_preflight.ensure_account: the service's system group and account, made when missing and
mended when they differ, through an injected run_command and account lookups (no account of
the machine running the tests is read or changed)."""

from __future__ import annotations

import grp
import pwd

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _preflight


def _accounts(users: dict, groups: dict):
    def getpwnam(name):
        if name not in users:
            raise KeyError(name)
        gid, shell, home = users[name]
        return pwd.struct_passwd((name, "x", 990, gid, "", home, shell))

    def getgrnam(name):
        if name not in groups:
            raise KeyError(name)
        return grp.struct_group((name, "x", groups[name], []))
    return getpwnam, getgrnam


class Commands:
    def __init__(self, rc: int = 0) -> None:
        self.rc, self.argvs = rc, []

    def __call__(self, argv):
        self.argvs.append(argv)
        return self.rc, "", "useradd: cannot lock /etc/passwd" if self.rc else ""


@pytest.mark.parametrize("users,groups,expected", [
    # a host's first deploy: both made
    ({}, {}, ["groupadd --system sglang",
              "useradd --system --gid sglang --shell /usr/sbin/nologin --home-dir /var/lib/sglang --no-create-home sglang"]),
    # as the role left it: nothing
    ({"sglang": (991, "/usr/sbin/nologin", "/var/lib/sglang")}, {"sglang": 991}, []),
    # a system account with another shell, home or primary group: mended as ansible.builtin.user would
    ({"sglang": (991, "/bin/bash", "/var/lib/sglang")}, {"sglang": 991},
     ["usermod --gid sglang --shell /usr/sbin/nologin --home /var/lib/sglang sglang"]),
    ({"sglang": (991, "/usr/sbin/nologin", "/home/sglang")}, {"sglang": 991},
     ["usermod --gid sglang --shell /usr/sbin/nologin --home /var/lib/sglang sglang"]),
    ({"sglang": (65534, "/usr/sbin/nologin", "/var/lib/sglang")}, {"sglang": 991},
     ["usermod --gid sglang --shell /usr/sbin/nologin --home /var/lib/sglang sglang"]),
    # the group missing, the account there: the group made, the account moved into it
    ({"sglang": (991, "/usr/sbin/nologin", "/var/lib/sglang")}, {},
     ["groupadd --system sglang", "usermod --gid sglang --shell /usr/sbin/nologin --home /var/lib/sglang sglang"]),
])
def test_ensure_account_makes_or_mends_only_what_differs(users, groups, expected):
    getpwnam, getgrnam = _accounts(users, groups)
    for check in (True, False):
        commands = Commands()
        done = _preflight.ensure_account("sglang", "sglang", commands, check_mode=check, getpwnam=getpwnam, getgrnam=getgrnam)
        assert done == expected
        assert [" ".join(a) for a in commands.argvs] == ([] if check else expected)


def test_ensure_account_stops_at_the_first_failed_command_with_its_words():
    getpwnam, getgrnam = _accounts({}, {})
    commands = Commands(rc=10)
    with pytest.raises(OSError, match=r"^groupadd --system sglang failed \(exit 10\): useradd: cannot lock /etc/passwd$"):
        _preflight.ensure_account("sglang", "sglang", commands, getpwnam=getpwnam, getgrnam=getgrnam)
    assert len(commands.argvs) == 1
