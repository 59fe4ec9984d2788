# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang's own argument resolution, run on the host by the installed SGLang.

``python -m sglang.launch_server`` resolves its arguments before any process
starts, and that is where a real host refuses a command line that ``--help``
accepts (the radix-cache refusal of speculative decoding on hybrid models in
0.5.10-0.5.13, NGRAM on a device that is not CUDA, ...). HARNESS_SOURCE does
exactly that and nothing else, in the interpreter of the SGLang virtual
environment, as its own process (``python -c HARNESS_SOURCE``, the request as
JSON on stdin):

* ``sglang.srt.server_args.prepare_server_args(argv)``: argparse (exit 2 with
  ``sglang serve: error: ...``) and, up to 0.5.19, ``ServerArgs.__post_init__``,
  where those releases validate (0.5.11 ``sglang/launch_server.py`` ->
  ``srt/server_args.py:7265``);
* ``server_args.resolve_once()`` where it exists (0.5.20+: 0.5.23
  ``srt/server_args.py:244``, called from ``launch_server.py:29`` and
  ``srt/entrypoints/engine.py:1153``);
* ``server_args.check_server_args()`` (0.5.11 ``srt/server_args.py:6773``,
  called from ``srt/entrypoints/engine.py:673``; 0.5.23 ``server_args.py:508``,
  from ``engine.py:1165``).

It starts no server and allocates nothing on a GPU beyond what those calls do
themselves (they ask the CUDA runtime and ``nvidia-smi`` for the GPUs' memory
size and compute capability). It reads the model's ``config.json``.

``--config PATH`` pairs are dropped from the argv first: the role's
``--config`` file carries only the API key, which SGLang takes as it is and
never validates, and the file exists only inside the unit (systemd's
``LoadCredential=``), so reading it here could only fail for a reason the unit
does not have.

The harness prints one JSON object on a line starting with MARKER, on the
standard output it was given; everything SGLang and its libraries print goes to
standard error. Its exit status is 0 whenever it answered, refusal or not.
lab/real/validate_args.py runs the same sequence with the GPU's answers stood
in for, by executing HARNESS_SOURCE as a module (its ``main`` runs only as
``__main__``).
"""

from __future__ import annotations

import json
import os

MARKER = "INFEROPS_SERVER_ARGS "
# Fields of the resolved arguments reported, by their names in either release
# (0.5.14+ split cuda_graph_max_bs into _decode and _prefill; 0.5.20 removed it).
RESOLVED_FIELDS = (
    "device", "tp_size", "context_length", "mem_fraction_static", "max_running_requests", "max_total_tokens",
    "chunked_prefill_size", "cuda_graph_max_bs", "cuda_graph_max_bs_decode", "disable_cuda_graph",
    "disable_radix_cache", "mamba_scheduler_strategy", "mamba_radix_cache_strategy", "speculative_algorithm",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
)
# The harness's stages, in order; error.stage says where it stopped.
STAGES = ("import", "prepare_server_args", "resolve_once", "check_server_args")

# Runs in the SGLang venv's interpreter: the standard library, then sglang.
HARNESS_SOURCE = r'''
"""inferops.sglang: SGLang's own argument resolution of one server argv (plugins/module_utils/_server_args.py)."""
import io
import json
import os
import sys
import traceback

MARKER = __MARKER__
RESOLVED_FIELDS = __FIELDS__


def drop_config(argv):
    """argv without its --config PATH pairs (--config=PATH too), and how many there were."""
    out, dropped, index = [], 0, 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--config":
            dropped, index = dropped + 1, index + 2
            continue
        if arg.startswith("--config="):
            dropped, index = dropped + 1, index + 1
            continue
        out.append(arg)
        index += 1
    return out, dropped


def package_root():
    """The directory holding the imported sglang package (site-packages, or a --target dir)."""
    module = sys.modules.get("sglang")
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.dirname(os.path.abspath(path))) if path else None


def where(exc):
    """The sglang file:line that raised (relative to the package root), or ''."""
    root = package_root()
    if not root:
        return ""
    prefix = os.path.join(root, "sglang") + os.sep
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename).startswith(prefix)]
    if not frames:
        return ""
    return "%s:%d" % (os.path.relpath(os.path.abspath(frames[-1].filename), root), frames[-1].lineno)


def plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return dict((str(k), plain(v)) for k, v in value.items())
    return str(value)


def resolved(server_args, fields):
    """The named fields as SGLang resolved them; a field this release lacks is left out."""
    view = server_args
    try:  # 0.5.20+: the record keeps the raw input; resolution's results are read through a view
        from sglang.srt.arg_groups.overrides import resolving_view
        view = resolving_view(server_args)
    except ImportError:
        pass
    out = {}
    for name in fields:
        try:
            out[name] = plain(getattr(view, name))
        except Exception:  # a field this release does not have
            continue
    return out


class Tee(io.TextIOBase):
    """sys.stderr that also keeps what was written: argparse writes its message there."""

    def __init__(self, stream, echo=True):
        self.stream, self.echo, self.kept = stream, echo, io.StringIO()

    def write(self, text):
        self.kept.write(text)
        return self.stream.write(text) if self.echo else len(text)

    def flush(self):
        self.stream.flush()

    def text(self):
        return self.kept.getvalue()


def check(argv, fields=RESOLVED_FIELDS, echo=True):
    """prepare_server_args, resolve_once (0.5.20+), check_server_args: as launch_server does
    before starting anything. {ok, error: {type, message, where, stage[, code]} | null,
    resolved, log}; never raises for what SGLang or argparse raise."""
    tee = Tee(sys.stderr, echo)
    sys.stderr = tee
    result = {"ok": False, "error": None, "resolved": {}, "log": []}
    server_args = None
    stage = "import"
    try:
        from sglang.srt import server_args as sa
        stage = "prepare_server_args"
        server_args = sa.prepare_server_args(list(argv))
        if hasattr(server_args, "resolve_once"):
            stage = "resolve_once"
            server_args.resolve_once()
        stage = "check_server_args"
        server_args.check_server_args()
        result["ok"] = True
    except SystemExit as exc:  # argparse: "sglang serve: error: ...", exit 2
        lines = [x for x in tee.text().splitlines() if ": error: " in x]
        result["error"] = {"type": "SystemExit", "code": exc.code, "where": "argparse", "stage": stage,
                           "message": lines[-1] if lines else "exit %s" % (exc.code,)}
    except Exception as exc:  # every refusal, as SGLang raised it
        result["error"] = {"type": type(exc).__name__, "message": str(exc), "where": where(exc), "stage": stage}
    finally:
        sys.stderr = tee.stream
    if server_args is not None:
        result["resolved"] = resolved(server_args, fields)
    result["log"] = [x for x in tee.text().splitlines() if x.strip()][-40:]
    return result


def installed_version():
    try:
        from importlib import metadata
        return metadata.version("sglang")
    except Exception:
        module = sys.modules.get("sglang")
        return getattr(module, "__version__", None)


def main():
    request = json.loads(sys.stdin.read())
    argv, dropped = drop_config([str(a) for a in request["argv"]])
    # a preflight downloads nothing: the unit's model paths are local directories
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # SGLang and its libraries print; only the answer goes to the standard output given
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    answer = check(argv, request.get("fields") or RESOLVED_FIELDS)
    answer["sglang_version"] = installed_version()
    answer["config_dropped"] = dropped
    sys.stdout.flush()
    with os.fdopen(answer_fd, "w") as out:
        out.write("\n" + MARKER + json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
'''.replace("__MARKER__", repr(MARKER)).replace("__FIELDS__", repr(RESOLVED_FIELDS))

DEFAULT_LABEL = "the server arguments"


class HarnessError(Exception):
    """The harness gave no answer (crashed, timed out); the message says how."""


def request(argv: list[str], fields: tuple[str, ...] | None = None) -> str:
    """The harness's standard input."""
    return json.dumps({"argv": [str(arg) for arg in argv], "fields": list(fields or RESOLVED_FIELDS)})


def command(python: str, timeout: int, timeout_bin: str = "timeout") -> list[str]:
    """argv that runs the harness in ``python``, killed (with whatever it started) after ``timeout`` s."""
    return [timeout_bin, "--kill-after=10", str(int(timeout)), python, "-c", HARNESS_SOURCE]


def parse_answer(stdout: str) -> dict | None:
    """The harness's answer (the last MARKER line), or None when there is none."""
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(MARKER):
            try:
                answer = json.loads(line[len(MARKER):])
            except ValueError:
                return None
            return answer if isinstance(answer, dict) and "ok" in answer else None
    return None


def tail(text: str, limit: int = 1500) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def outcome(rc: int, stdout: str, stderr: str, python: str, label: str, timeout: int) -> dict:
    """The harness's answer; HarnessError when it gave none (timeout: ``timeout`` exits 124,
    137 after its SIGKILL)."""
    answer = parse_answer(stdout)
    if answer is not None:
        return answer
    if rc in (124, 137):
        raise HarnessError(f"SGLang's argument check of {label} did not finish within {timeout} s in {python} "
                           f"(killed); its last output: {tail(stderr or stdout) or '(none)'}")
    raise HarnessError(f"SGLang's argument check of {label} crashed in {python} (exit {rc}) without an answer: "
                       f"{tail(stderr or stdout) or '(no output)'}")


def refusal(answer: dict, label: str, python: str) -> str | None:
    """The failure message for a refused argv (None when accepted)."""
    if answer.get("ok"):
        return None
    error = answer.get("error") or {}
    message = str(error.get("message") or "").strip() or str(error.get("type") or "an unknown error")
    if error.get("stage") == "import":
        return (f"SGLang cannot be imported by {python} to check {label}: {error.get('type')}: {message}"
                + (f" (at {error['where']})" if error.get("where") else ""))
    return f"SGLang {answer.get('sglang_version') or '(unknown version)'} refuses {label}: {message}"


def environment(extra: dict) -> dict[str, str]:
    """The unit's extra environment as strings, for the harness (added to the module's own)."""
    return {str(key): "" if value is None else str(value) for key, value in (extra or {}).items()}


def python_problem(python: str) -> str | None:
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        return f"{python} does not exist or is not executable: the SGLang virtual environment is not installed"
    return None
