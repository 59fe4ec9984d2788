# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real SGLang's own argument validation for a GPU host, on a machine without one.

Run with a real venv's interpreter (lab/real/build.sh; ``import sgl_kernel``
needs the libcuda.so.1 test double on LD_LIBRARY_PATH)::

    $VENV/bin/python lab/real/validate_args.py --gpu-mib 49140 --capability 8.6 --gpus 2 \
        --gpu-name "NVIDIA RTX A6000" -- --model-path lab/models/Qwen3.6-27B --tp-size 2 ...
    $VENV/bin/python lab/real/validate_args.py --gpu-mib 49140 --capability 8.6 --gpus 2 --cases - < cases.json

It does what ``python -m sglang.launch_server`` does with its arguments before
any process starts, and nothing else, with the harness the collection's
``sglang_server_args`` module runs on a real host (HARNESS_SOURCE of
plugins/module_utils/_server_args.py: the sequence, the argparse message and
the error's file:line); only the stand-ins below are this file's own:

* ``sglang.srt.server_args.prepare_server_args(argv)`` (argparse, ``--config``,
  and in 0.5.11 ``ServerArgs.__post_init__``, where 0.5.11 validates:
  0.5.11 ``sglang/launch_server.py`` -> ``srt/server_args.py:7265``);
* ``server_args.resolve_once()`` where it exists (0.5.19+: 0.5.19
  ``launch_server.py:21``; 0.5.23 ``launch_server.py:29`` and
  ``srt/entrypoints/engine.py:1153``);
* ``server_args.check_server_args()`` (0.5.11 ``srt/entrypoints/engine.py:673``,
  0.5.23 ``engine.py:1165``).

Only the GPU's answers are stood in for, from the figures given on the command
line. Every place the two releases ask, found by recording each call with its
caller (``--trace-gpu-queries`` prints them again):

* the CUDA runtime through torch: ``torch.cuda.is_available``,
  ``device_count``, ``current_device``, ``get_device_capability``,
  ``get_device_name``, ``get_device_properties`` (``.major``, ``.minor``,
  ``.name``, ``.total_memory``, ``.multi_processor_count``: flashinfer
  ``gdn_kernels/gdn_decode_bf16_state.py:2262`` reads it at import) and
  ``mem_get_info``. They are replaced in
  torch before sglang is imported, because SGLang, sgl_kernel and flashinfer
  ask at import time and cache the answers (``lru_cache``), as they do on a GPU
  host. The callers: 0.5.11 ``srt/utils/common.py:130`` (``is_cuda``), ``:232``
  (``_check_cuda_device_version`` behind ``is_sm90/100/120_supported``),
  ``:1556-1557`` (``get_device_sm``), ``:1875-1876`` (``get_device_name``,
  from ``server_args.py:2326``), ``:1904`` (``get_device``, from
  ``server_args.py:1066``), ``:1982-1983`` (``get_device_capability``),
  ``server_args.py:2492`` (through ``:232``), ``server_args.py:1754`` and
  ``:2881-2882`` (capability directly, on some model branches),
  ``utils/hf_transformers_patches.py:235``, ``sgl_kernel/load_utils.py:17-22``
  (which kernel build to load), ``flashinfer/jit/core.py:10``,
  ``flashinfer/compilation_context.py:77-78``,
  ``flashinfer/gdn_kernels/gdn_decode_bf16_state.py:2262``; 0.5.23
  ``srt/platforms/__init__.py:38,46`` (the platform, the device name),
  ``srt/utils/common.py:159,757,764,1083,1172-1173`` (from
  ``layers/deep_gemm_wrapper/configurer.py:38,59``,
  ``arg_groups/serving_hook.py:652`` and others at import),
  ``srt/runtime_context.py:1874`` (from ``arg_groups/serving_hook.py:478``),
  ``utils/hf_transformers_patches.py:265``, ``sgl_kernel/load_utils.py:17-22``,
  ``flashinfer/compilation_context.py:128-129``,
  ``flashinfer/kda_kernels/__init__.py:74-77``. Libraries beneath them ask
  too while they are imported (triton's driver, torchao, transformers,
  ``torch._dynamo``, tvm_ffi) and get the same answers.
* ``nvidia-smi``, which SGLang runs for the memory size (0.5.11
  ``srt/utils/common.py:1599`` from ``get_device_memory_capacity`` at
  ``server_args.py:839``; 0.5.23 ``srt/utils/common.py:806`` from
  ``arg_groups/memory_hook.py:78``), the driver version (0.5.11
  ``common.py:3628``, 0.5.23 ``common.py:1301``) and the compute capability
  (0.5.11 ``common.py:3689``, 0.5.23 ``common.py:1339``): a stand-in
  ``nvidia-smi`` first on PATH answers exactly those three queries, so SGLang's
  own parsing runs.

Everything else is real: the model's ``config.json`` is read by SGLang's
ModelConfig (it also looks for ``generation_config.json`` and goes on without
it; each file it opens under the model paths is listed in the answer), and
the answer is what that SGLang decides. A call into the CUDA runtime beyond
these queries is not answered and fails as it would on a machine without a
GPU, which the answer shows as the error.

Each case runs in a child forked from the process that imported sglang once
(importing takes seconds), so no case sees another's environment variables,
caches or globals. One process serves one GPU profile: the answers are cached
at import time, as on a real host.

Output: one JSON object per case, ``{ok, error: {type, message, where, stage} | null,
resolved: {...}, log: [...], model_files: [...]}``; ``--cases`` prints a JSON
object ``{sglang: version, speculative_algorithms: [the names this release
knows], results: [one answer per case, in order, each with its id]}``. Exit
status 0 when every case is accepted, 1 when one is refused.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import types

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Fields of the resolved arguments the answer reports, by their names in either release.
RESOLVED_FIELDS = (
    "device", "tp_size", "mem_fraction_static", "max_running_requests", "max_total_tokens", "chunked_prefill_size",
    "context_length", "page_size", "cuda_graph_max_bs", "cuda_graph_max_bs_decode", "cuda_graph_bs",
    "disable_cuda_graph", "cuda_graph_backend_decode", "cuda_graph_backend_prefill", "disable_piecewise_cuda_graph",
    "disable_radix_cache", "disable_overlap_schedule", "mamba_scheduler_strategy", "mamba_radix_cache_strategy",
    "mamba_full_memory_ratio", "max_mamba_cache_size", "mamba_track_interval", "attention_backend",
    "prefill_attention_backend", "decode_attention_backend", "linear_attn_backend", "mamba_backend",
    "sampling_backend", "kv_cache_dtype", "speculative_algorithm", "speculative_draft_model_path",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "speculative_attention_mode", "served_model_name", "host", "port",
)
GPU_QUERY_NAMES = ("is_available", "device_count", "current_device", "get_device_capability", "get_device_name",
                   "get_device_properties", "mem_get_info")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    server_argv: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, server_argv = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--gpu-mib", type=int, required=True, help="memory.total of each GPU, MiB (nvidia-smi)")
    parser.add_argument("--capability", required=True, help="compute capability, e.g. 8.6 or 12.0")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs the server sees (CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--gpu-name", default="NVIDIA GPU", help="the GPU's name, as nvidia-smi and torch give it")
    parser.add_argument("--sm-count", type=int, help="multiprocessors per GPU (get_device_properties().multi_processor_count)")
    parser.add_argument("--driver-version", default="", help="nvidia-smi's driver_version (unset: the query fails)")
    parser.add_argument("--cases", help="a file (- for stdin) with a JSON list of cases: argv lists or {id, argv}")
    parser.add_argument("--trace-gpu-queries", action="store_true", help="list each GPU query with its callers")
    opts = parser.parse_args(argv)
    if bool(server_argv) == bool(opts.cases):
        parser.error("give the server's arguments after -- or a JSON list of cases with --cases, not both")
    try:
        major, minor = (int(x) for x in opts.capability.split("."))
    except ValueError:
        parser.error(f"--capability must be MAJOR.MINOR, got {opts.capability!r}")
    opts.cc = (major, minor)
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        parser.error("SGLANG_USE_CPU_ENGINE=1 makes SGLang resolve for a CPU host: unset it")
    return opts, server_argv


# --------------------------------------------------------------------------- the GPU's answers

TRACE: dict[str, set] = {}
TRACE_ON = False


def _caller() -> str:
    frame = sys._getframe(2)
    where = []
    while frame is not None and len(where) < 3:
        name = frame.f_code.co_filename
        if "site-packages/" in name:
            where.append(f"{name.split('site-packages/', 1)[1]}:{frame.f_lineno}")
        frame = frame.f_back
    return " <- ".join(where) or "(outside the packages)"


def _answer(name: str, value):
    def query(*_args, **_kwargs):
        TRACE.setdefault(name, set()).add(_caller())
        return value() if callable(value) else value
    query.__name__ = name
    return query


class DeviceProperties:
    """What torch.cuda.get_device_properties answers; any other attribute is not known."""

    def __init__(self, opts: argparse.Namespace) -> None:
        self.name = opts.gpu_name
        self.major, self.minor = opts.cc
        self.total_memory = opts.gpu_mib << 20
        if opts.sm_count:
            self.multi_processor_count = opts.sm_count

    def __getattr__(self, item: str):
        TRACE.setdefault(f"get_device_properties().{item}", set()).add(_caller())
        raise AttributeError(f"validate_args.py stands in for the GPU's properties and does not know {item!r}")


def stand_in_gpu(opts: argparse.Namespace, workdir: str) -> None:
    """Answer the GPU queries before sglang is imported (it caches them at import)."""
    import torch  # noqa: PLC0415 - torch must be imported to be answered for, sglang not yet

    props = DeviceProperties(opts)
    total = opts.gpu_mib << 20
    answers = {
        "is_available": True,
        "device_count": opts.gpus,
        "current_device": 0,
        "get_device_capability": opts.cc,
        "get_device_name": opts.gpu_name,
        "get_device_properties": props,
        # nothing allocated yet: all of it free
        "mem_get_info": (total, total),
    }
    for name in GPU_QUERY_NAMES:
        setattr(torch.cuda, name, _answer(name, answers[name]))
    # nvidia-smi: the three queries SGLang makes, one line per GPU as nvidia-smi prints them
    smi = os.path.join(workdir, "nvidia-smi")
    lines = {"memory.total": str(opts.gpu_mib), "compute_cap": opts.capability}
    if opts.driver_version:
        lines["driver_version"] = opts.driver_version
    cases = "".join(f'    *--query-gpu={key}\\ *|*--query-gpu={key}) value={value!r} ;;\n'
                    for key, value in lines.items())
    with open(smi, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/sh\n# validate_args.py's stand-in for nvidia-smi: the queries SGLang makes, no more\n"
                     f"echo \"$*\" >> {workdir}/nvidia-smi.calls\nvalue=''\ncase \" $* \" in\n{cases}esac\n"
                     f'[ -n "$value" ] || {{ echo "stand-in nvidia-smi: not answered: $*" >&2; exit 9; }}\n'
                     f'i=0; while [ $i -lt {opts.gpus} ]; do echo "$value"; i=$((i+1)); done\n')
    os.chmod(smi, 0o755)
    os.environ["PATH"] = workdir + os.pathsep + os.environ.get("PATH", "")


# --------------------------------------------------------------------------- one case


def _model_dirs(argv: list[str]) -> list[str]:
    out = []
    for flag in ("--model-path", "--speculative-draft-model-path", "--tokenizer-path"):
        for i, arg in enumerate(argv):
            value = arg.split("=", 1)[1] if arg.startswith(flag + "=") else (argv[i + 1] if arg == flag and i + 1 < len(argv) else None)
            if value:
                out.append(os.path.abspath(value))
    return out


def _harness():
    """The collection's harness (plugins/module_utils/_server_args.py HARNESS_SOURCE), the
    same prepare_server_args / resolve_once / check_server_args sequence and error shaping
    that the sglang_server_args module runs on a host, loaded as a module (its main() runs
    only as __main__); _server_args.py itself needs nothing but the standard library."""
    path = os.path.join(REPO, "plugins", "module_utils", "_server_args.py")
    spec = importlib.util.spec_from_file_location("inferops_server_args", path)
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    harness = types.ModuleType("inferops_server_args_harness")
    exec(compile(utils.HARNESS_SOURCE, f"{path} (HARNESS_SOURCE)", "exec"), harness.__dict__)  # noqa: S102
    return harness


HARNESS = _harness()


def run_case(argv: list[str]) -> dict:
    """SGLang's resolution of one argv, as launch_server does it before starting anything
    (the harness's check()), with the model files SGLang opened."""
    dirs = _model_dirs(argv)
    opened: list[str] = []

    def audit(event: str, args) -> None:
        if event == "open" and isinstance(args[0], str):
            path = os.path.abspath(args[0])
            if any(path.startswith(d + os.sep) for d in dirs) and path not in opened:
                opened.append(path)

    sys.addaudithook(audit)
    result = HARNESS.check(list(argv), RESOLVED_FIELDS)
    result["model_files"] = [os.path.relpath(p, d) for p in opened for d in dirs if p.startswith(d + os.sep)][:50]
    if TRACE_ON:  # every GPU query of this process: the import's (inherited) and this case's
        result["gpu_queries"] = {k: sorted(v) for k, v in sorted(TRACE.items())}
        calls = os.path.join(os.path.dirname(shutil.which("nvidia-smi") or ""), "nvidia-smi.calls")
        if os.path.isfile(calls):
            with open(calls, encoding="utf-8") as handle:
                result["gpu_queries"]["nvidia-smi"] = sorted(set(handle.read().splitlines()))
    return result


def upstream_algorithms() -> list[str]:
    """The --speculative-algorithm names this release knows: argparse's choices
    where it has them (up to 0.5.11, server_args.py add_cli_args), else (0.5.12+,
    free text) SpeculativeAlgorithm's members and reserved aliases, which
    ``from_string`` accepts (0.5.23 srt/speculative/spec_info.py:32-65; NEXTN is
    the one reserved alias, of EAGLE, spec_registry.py:183)."""
    from sglang.srt.server_args import ServerArgs  # noqa: PLC0415

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    action = next(a for a in parser._actions if "--speculative-algorithm" in a.option_strings)  # noqa: SLF001
    if action.choices:
        return sorted(str(c) for c in action.choices)
    from sglang.srt.speculative import spec_info  # noqa: PLC0415

    names = {m.name for m in spec_info.SpeculativeAlgorithm if m.name != "NONE"}
    return sorted(names | {str(a).upper() for a in getattr(spec_info, "_RESERVED_ALIASES", ())})


def run_forked(argv: list[str], timeout: int = 300) -> dict:
    """run_case in a child of this process, which has imported sglang once."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        code = 0
        try:
            signal.alarm(timeout)
            payload = json.dumps(run_case(argv)).encode()
        except BaseException as exc:  # noqa: BLE001
            payload = json.dumps({"ok": False, "error": {"type": type(exc).__name__, "message": str(exc), "where": "validate_args.py"},
                                  "resolved": {}}).encode()
            code = 1
        with os.fdopen(write_fd, "wb") as out:
            out.write(payload)
        os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as inp:
        data = inp.read()
    _pid, status = os.waitpid(pid, 0)
    if not data:
        return {"ok": False, "resolved": {}, "error": {"type": "ChildDied", "where": "validate_args.py",
                                                       "message": f"the validation child ended with wait status {status}"}}
    return json.loads(data)


def main(argv: list[str]) -> int:
    global TRACE_ON  # noqa: PLW0603
    opts, server_argv = parse_args(argv)
    TRACE_ON = opts.trace_gpu_queries
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # SGLang and its libraries print; only the answer goes to stdout
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    with tempfile.TemporaryDirectory(prefix="validate-args-") as workdir:
        stand_in_gpu(opts, workdir)
        import sglang.srt.server_args  # noqa: F401,PLC0415 - the slow import, once, with the GPU answered for
        if opts.cases:
            with (sys.stdin if opts.cases == "-" else open(opts.cases, encoding="utf-8")) as handle:
                cases = json.load(handle)
            results = []
            for index, case in enumerate(cases):
                case = case if isinstance(case, dict) else {"id": index, "argv": case}
                results.append(dict(run_forked([str(x) for x in case["argv"]]), id=case.get("id", index)))
            answer = {"sglang": HARNESS.installed_version(), "speculative_algorithms": upstream_algorithms(), "results": results}
        else:
            answer = run_forked(server_argv)
    with os.fdopen(answer_fd, "w") as out:
        json.dump(answer, out, indent=None if "results" in answer else 1)
        out.write("\n")
    return 0 if all(r.get("ok") for r in answer.get("results", [answer])) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
