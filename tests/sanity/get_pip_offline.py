"""Pip bootstrap for ansible-test on machines that reach PyPI but not ansible-test's
own download host. ansible-test runs this in place of its downloaded get-pip
script, with the pip options it wants: install pip from the standard library's
ensurepip, then let that pip install the requested versions from the configured
package index. .ci/run copies it to ~/.ansible/test/cache/get_pip_<version>.py."""

import subprocess
import sys

subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
ARGS = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", *ARGS])
