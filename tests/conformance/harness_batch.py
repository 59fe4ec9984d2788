"""The sglang_server_args module's harness for many argvs from one process of a real SGLang venv.

Run with the venv's interpreter; stdin: a JSON list of ``{"id": ..., "request": ...}`` (each
request is ``_server_args.request(argv)``, what the module writes to the harness's stdin)::

    $VENV/bin/python tests/conformance/harness_batch.py [--timeout 300] < cases.json

The module runs ``python -c HARNESS_SOURCE`` (plugins/module_utils/_server_args.py) once per
argv, and that process spends nearly all of its time importing sglang. Here sglang's server
arguments are imported once, then each argv runs in a child forked from this process: the
child executes HARNESS_SOURCE as ``python -c`` does (``__name__ == "__main__"``, so its own
``main()`` runs), with the request as its standard input and its standard output and error
in files, and is killed by SIGALRM after ``--timeout`` s. No child sees another's environment,
caches or globals. The answer is, per case, what the module reads of its harness process:
``{"id", "rc", "stdout", "stderr", "seconds"}`` (``_server_args.outcome`` parses it), in one
JSON object ``{"import_seconds", "results": [...]}`` on the standard output; everything SGLang
prints goes to standard error.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def harness_source() -> str:
    """HARNESS_SOURCE of plugins/module_utils/_server_args.py (which needs only the standard
    library), loaded as the tools load the collection's module utilities."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import _collection  # pylint: disable=import-outside-toplevel,import-error

    return _collection.load("_server_args").HARNESS_SOURCE


def run_forked(code, request: str, workdir: str, index: int, timeout: int) -> dict:
    out_path, err_path = os.path.join(workdir, f"{index}.out"), os.path.join(workdir, f"{index}.err")
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child: the harness process of this argv
        status = 0
        try:
            signal.alarm(timeout)
            out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            sys.stdin = io.StringIO(request)
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102 - python -c HARNESS_SOURCE
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - as an uncaught exception ends `python -c`
            import traceback  # noqa: PLC0415

            traceback.print_exc()
            status = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(status)
    _pid, wait_status = os.waitpid(pid, 0)
    seconds = time.monotonic() - started
    with open(out_path, encoding="utf-8", errors="replace") as out, open(err_path, encoding="utf-8", errors="replace") as err:
        stdout, stderr = out.read(), err.read()
    return {"rc": os.waitstatus_to_exitcode(wait_status), "stdout": stdout, "stderr": stderr, "seconds": seconds}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--timeout", type=int, default=300, help="seconds each argv's harness may take")
    opts = parser.parse_args(argv)
    cases = json.load(sys.stdin)
    # as `python -c`: the working directory first on sys.path, not this file's
    sys.path[0] = ""
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    code = compile(harness_source(), "<string>", "exec")
    started = time.monotonic()
    import sglang.srt.server_args  # noqa: F401,PLC0415 - what each harness process imports first, once
    imported = time.monotonic() - started
    with tempfile.TemporaryDirectory(prefix="harness-batch-") as workdir:
        results = [dict(run_forked(code, case["request"], workdir, index, opts.timeout), id=case["id"])
                   for index, case in enumerate(cases)]
    with os.fdopen(answer_fd, "w") as out:
        json.dump({"import_seconds": imported, "results": results}, out)
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
