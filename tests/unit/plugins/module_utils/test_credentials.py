"""_credentials: the probe of systemd's credential delivery, on the answers
systemd-run gave in the lab's containers (systemd 252.39): a privileged
container with a private root mount, the same container with the root mount
shared, an unprivileged one; and the API key read back from a --config file."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _credentials

# systemd-run --wait --pipe --quiet ... in a privileged container, root mount private:
# the service's $CREDENTIALS_DIRECTORY is an empty root-only directory
PRIVATE_ROOT = (1, "", "cat: /run/credentials/run-u7.service/inferops-credential-probe: Permission denied\n")


def recorder(answer):
    calls = []

    def run_command(argv):
        calls.append(argv)
        return answer

    return calls, run_command


def test_a_delivered_credential_is_no_problem():
    calls, run_command = recorder((0, "delivered", ""))
    assert _credentials.problem(run_command) is None
    (argv,) = calls
    # as the unit uses it: a transient service, a credential set for it, a non-root user that reads it
    assert argv[:4] == ["timeout", "60", "systemd-run", "--wait"]
    assert "--collect" in argv and "--pipe" in argv
    assert argv[argv.index("-p", argv.index("-p") + 1) + 1] == "User=nobody"
    assert "SetCredential=inferops-credential-probe:delivered" in argv
    assert argv[-1] == 'cat "$CREDENTIALS_DIRECTORY/inferops-credential-probe"'


def test_an_empty_credentials_directory_is_refused_with_the_reason_and_the_fix():
    _calls, run_command = recorder(PRIVATE_ROOT)
    problem = _credentials.problem(run_command)
    assert problem.startswith("systemd on this host does not hand a service its credentials")
    assert "exit 1: cat: /run/credentials/run-u7.service/inferops-credential-probe: Permission denied" in problem
    assert "LoadCredential=" in problem and "mount --make-rshared /" in problem


@pytest.mark.parametrize("answer", [
    (0, "", ""),                                  # read nothing
    (217, "", ""),                                # no user nobody (217/USER), nothing said
    (124, "", ""),                                # timeout killed a hung systemd-run
    (1, "", "Failed to connect to bus: No such file or directory\n"),
], ids=["empty", "no-user", "timeout", "no-bus"])
def test_anything_but_the_value_read_back_is_a_problem(answer):
    _calls, run_command = recorder(answer)
    problem = _credentials.problem(run_command)
    assert problem is not None and f"exit {answer[0]}: " in problem
    assert (answer[2].strip() or "no output") in problem


def test_api_key_from_the_config_file(tmp_path):
    """The key of an SGLang --config file as the role writes it (a JSON string), or none."""
    path = tmp_path / "c.yaml"
    path.write_text('# managed\napi-key: "s3cr\\"et"\n')
    assert _credentials.api_key_from_config(str(path)) == 's3cr"et'
    path.write_text("# managed\n{}\n")
    assert _credentials.api_key_from_config(str(path)) is None
    path.write_text("api-key: 'it''s'\n")
    assert _credentials.api_key_from_config(str(path)) == "it's"
    path.write_text("api-key: plain # comment\n")
    assert _credentials.api_key_from_config(str(path)) == "plain"
