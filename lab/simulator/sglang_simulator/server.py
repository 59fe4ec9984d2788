"""The simulated SGLang server process: start-up sequence, faults and HTTP API.

Start-up follows SGLang's order and log lines: parse arguments, init torch
distributed on each rank's GPU, load the weights, size the pools, capture CUDA
graphs, load the draft model (before 0.5.14), then bind HTTP (connection
refused until then), answer /v1/models at once, run the warmup generation and
only then answer /health with 200 ("The server is fired up and ready to roll!").

Failures are SGLang's: a pool that does not fit, an out-of-memory while loading
the draft or capturing CUDA graphs log the error and the process is killed
through SGLang's "sigquit from a child" path (systemd sees ``Result: signal``);
a CUDA library that the build loads lazily and the host lacks kills the process
on the first client request, after /health passed. What only the simulator can
do on demand is a real hang (SGLANG_SIMULATOR_HANG=distributed|weights|cuda_graph):
the stage's first line, then silence, alive, never listening; and, on a server that
serves, a wedge (SIGUSR2): the scheduler stops as real SGLang's does when it is stopped
with SIGSTOP or stuck in a collective. The process stays alive and silent, /v1/models
still answers (the tokenizer manager), every generation waits forever, and /health
answers 503 after its 20 s one-token check (real 0.5.11 on CPU with its scheduler
stopped: the same).
"""

from __future__ import annotations

import hashlib
import json
import logging
import logging.config
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import hardware as hw
from . import memory
from . import model as model_mod
from . import radix
from . import server_info as info_mod
from .args import ArgumentValidationError, build_parser, ddtree_build_installed, merge_config, parser_prog, resolve, server_config
from . import metrics as metrics_mod
from .versions import DEFAULT_VERSION, Release, release as make_release

# Libraries every SGLang start loads (sgl_kernel imports need the driver library).
STARTUP_LIBRARIES = ("libcuda.so.1",)
# decide_request_auth: paths that need no key, matched by prefix (0.5.11 utils/auth.py:100;
# /ready joins them in 0.5.20, utils/auth.py:101-105).
AUTH_EXEMPT_PREFIXES = ("/health", "/metrics")
# --kv-cache-dtype auto on a bf16 checkpoint: the model's dtype
KV_CACHE_DTYPE = "torch.bfloat16"
WORDS = (
    "the model answers with a steady stream of plain words so that every request "
    "returns the same text for the same prompt and the readiness gate can check "
    "that tokens really came back from a working server"
).split()


def emulated_version() -> str:
    try:
        from sglang.version import __version__  # the simulator wheel's own version

        return __version__
    except ImportError:
        return os.environ.get("SGLANG_SIM_VERSION", DEFAULT_VERSION)


# configure_logger's format "[%(asctime)s{prefix}] %(message)s" (0.5.11
# utils/common.py:1217-1223, 0.5.23 :2630): the main process has no prefix; a
# scheduler's prefix names its rank only where the size is > 1 (" TP1" needs
# --tp-size > 1; 0.5.11 managers/scheduler.py:3845-3857). No level name.
TP_SIZE = 1


def _stamp(rank: int | None = None) -> str:
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"[{now} TP{rank}]" if rank is not None and TP_SIZE > 1 else f"[{now}]"


def log(message: str, rank: int | None = None) -> None:
    """One logging record: as Python's logging does, only its first line carries
    the stamp (a traceback in the message keeps its own lines as they are)."""
    sys.stdout.write(f"{_stamp(rank)} {message}\n")
    sys.stdout.flush()


def uvicorn_log(message: str) -> None:
    """uvicorn's own loggers, which SGLang reformats to "[%(asctime)s] %(levelprefix)s
    %(message)s" (set_uvicorn_logging_configs, 0.5.11 utils/common.py:2450-2458):
    the real 0.5.11 and 0.5.23 logs read "[2026-12-01 17:15:13] INFO:     Uvicorn running on ..."."""
    sys.stdout.write(f"{_stamp()} {message}\n")
    sys.stdout.flush()


def auth_exempt(release: Release, path: str) -> bool:
    prefixes = AUTH_EXEMPT_PREFIXES + (("/ready",) if release.ready_skips_api_key else ())
    return path.startswith(prefixes)


def bearer_matches(header: str, key: str) -> bool:
    """_check_bearer_token (0.5.11 utils/auth.py:103-112): "Bearer" in any case, one space."""
    parts = header.split(" ", 1)
    return len(parts) == 2 and parts[0].lower() == "bearer" and parts[1] == key


def configure_logger(args: object) -> None:
    """SGLang's logging set-up: prepare_server_args' basicConfig, then
    configure_logger (0.5.11 srt/utils/common.py:1206-1224): a JSON dictConfig
    from SGLANG_LOGGING_CONFIG_PATH when set (a missing file raises), else
    ``[time] message`` at --log-level on stderr."""
    path = os.environ.get("SGLANG_LOGGING_CONFIG_PATH")
    if path:
        if not os.path.exists(path):
            raise Exception(f"Setting SGLANG_LOGGING_CONFIG_PATH from env with {path} but it does not exist!")
        with open(path, encoding="utf-8") as handle:
            logging.config.dictConfig(json.loads(handle.read()))
        return
    logging.basicConfig(level=getattr(logging, str(getattr(args, "log_level", "info")).upper(), logging.INFO),
                        format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", force=True)


def open_build_kernels(algorithm: str | None) -> str | None:
    """Open the shared objects the speculative build ships, as it does on its first
    real decode: the DDTree build's ddtree_utils opens its kernels (ddtree_kernels.so,
    lab/ddtree) with ctypes.CDLL. The real dynamic loader decides, with this process's
    environment; the traceback of a failure (e.g. ``OSError: libcudart.so.12: cannot
    open shared object file: No such file or directory``) is returned, None when the
    kernels opened or there is no such build."""
    if algorithm != "DDTREE":
        return None
    import traceback
    try:
        from sglang.srt.speculative import ddtree_utils  # type: ignore[import-not-found]
    except ImportError:
        return None
    opener = getattr(ddtree_utils, "tree_kernels", None)
    if opener is None:
        return None
    try:
        opener()
    except OSError:
        return traceback.format_exc().rstrip("\n")
    return None


def cdll_traceback(library: str, where: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "{where}", line 58, in _load_tree_kernels\n'
        "    _lib = ctypes.CDLL(path)\n"
        '  File "/usr/lib/python3.11/ctypes/__init__.py", line 376, in __init__\n'
        "    self._handle = _dlopen(self._name, mode)\n"
        f"OSError: {library}: cannot open shared object file: No such file or directory"
    )


def oom_text(need_gib: float, free_gib: float, total_gib: float, gpu: int) -> str:
    in_use = max(total_gib - free_gib, 0.0)
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need_gib:.2f} GiB. "
        f"GPU {gpu} has a total capacity of {total_gib:.2f} GiB of which {free_gib * 1024:.2f} MiB is free. "
        f"Including non-PyTorch memory, this process has {in_use:.2f} GiB memory in use. "
        f"Of the allocated memory {in_use * 0.98:.2f} GiB is allocated by PyTorch, and "
        f"{in_use * 0.02 * 1024:.2f} MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "to avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


# The picture SGLang's warmup sends (0.5.11 entrypoints/http_server.py:1853).
MINIMUM_PNG_PICTURE_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAYAAABzenr0AAAACXBIWXMAAA7EAAAOxAGVKw4bAAAAbUlEQVRYhe3VsQ2AMAxE0Y/lIgNQULD/OqyCMgCihC"
    "KSG4yRuKuiNH6JLsoEbMACOGBcua9HOR7Y6w6swBwMy0qLTpkeI77qdEBpBFAHBBDAGH8WrwJKI4AAegUCfAKgEgpQDvh3CR3oQCuav58qlAw73kKCSgAAAABJRU5ErkJggg=="
)


def http_json(method: str, url: str, body: dict | None, headers: dict, timeout: float) -> tuple[int, dict | None]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - local server
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, None


def cuda_graph_hint(release: Release) -> str:
    """CUDA_GRAPH_CAPTURE_FAILED_MSG of the release (0.5.11
    model_executor/cuda_graph_runner.py:1431-1438; 0.5.14+
    model_executor/runner_backend_utils/__init__.py:14-21)."""
    if release.graph_hint_names_decode_flags:
        return (
            "Possible solutions:\n"
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
            "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
            "(Not recommended. Huge performance loss)\n"
            "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
        )
    return (
        "Possible solutions:\n"
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
        "3. disable torch compile by not using --enable-torch-compile\n"
        "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
        "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
    )


# How close a late decode step's successors may follow each other while they catch up with their
# deadlines: a fraction of one step's own time (paced()).
CATCH_UP_GAP = 0.5


def stream_schedule(count: int, accept: float, per_token: float, prefill: float):
    """A streamed generation's emits: (tokens done, simulated seconds since the request). The first
    token after the prefill, then one decode step at a time, each adding its accept length of tokens
    (rounded) at ``per_token`` seconds a token."""
    done, offset = 1, prefill
    yield done, offset
    step = max(1, round(accept))
    while done < count:
        added = min(step, count - done)
        done += added
        offset += added * per_token
        yield done, offset


def pace(started: float, offset: float, clock=time.monotonic, sleep=time.sleep) -> None:
    """Wait until ``offset`` seconds after ``started`` (a ``clock`` reading). Paced against the
    deadline, not by a sleep per step: a step that wakes late (a loaded machine's scheduling, the
    emit's own work) takes it from the next ones, so the simulated speed holds as a GPU's would
    while the host's CPU is busy, as long as the CPU keeps up at all."""
    left = started + offset - clock()
    if left > 0:
        sleep(left)


def paced(schedule, started: float, scale: float = 1.0, clock=time.monotonic, sleep=time.sleep):
    """Each of ``schedule``'s emits (``stream_schedule``) when it is due, its simulated offset times
    ``scale`` after ``started``: yields the tokens done. Steps behind a late one catch up at most
    ``CATCH_UP_GAP`` of their own time apart, never together: a GPU's decode steps do not arrive at
    once, and a burst would read as an inter-token latency of zero."""
    last = previous = None
    for done, offset in schedule:
        due = offset * scale
        if last is not None:
            due = max(due, last - started + CATCH_UP_GAP * (offset - previous) * scale)
        pace(started, due, clock, sleep)
        last, previous = clock(), offset
        yield done


class Simulator:
    """One simulated server process."""

    def __init__(self, argv: list[str], prog: str) -> None:
        self.release: Release = make_release(emulated_version())
        self.argv = list(argv)  # launch_command in /server_info (0.5.20+)
        self.ddtree = ddtree_build_installed()
        parser = build_parser(self.release, parser_prog(self.release, prog), self.ddtree)
        try:
            argv = merge_config(parser, argv)
        except (OSError, ValueError) as exc:
            log("Traceback (most recent call last):\n  File \"sglang/srt/server_args.py\", in prepare_server_args\n"
                f"{type(exc).__name__}: {exc}")
            sys.exit(1)
        self.args = parser.parse_args(argv)  # exits 2 with argparse's message
        self.hardware: hw.Hardware | None = None
        self.ledger = hw.Ledger(name=f"sglang::scheduler ({self.args.model_path})")
        self.ready = threading.Event()
        self.unhealthy = False  # ServerStatus.UnHealthy after a failed /health (0.5.23 http_server.py:798)
        self.last_gen_throughput = 0.0
        self.graph_usage: dict[str, float] = {}  # GiB per memory phase, as the captures took it
        self.crashed = threading.Event()
        self.wedged = threading.Event()  # SIGUSR2: the scheduler stops (see the module's docstring)
        self.lock = threading.Lock()
        self.client_requests = 0
        self.running = 0  # generations in flight (GET /v1/loads)
        self.waiting = 0  # generations queued for a place in the batch
        self.admitted = threading.Condition(self.lock)
        self.plan: memory.MemoryPlan | None = None
        self.served_name = self.args.served_model_name or self.args.model_path
        self.context_len = 0
        self.num_draft_tokens = 0
        self.cuda_graph = True
        self.has_vision = False
        self.model_type: str | None = None
        self.architecture = ""
        self.draft_arch = ""
        self.launched = time.monotonic()
        self.startup_seconds = 0.0
        # --enable-metrics: GET /metrics (metrics.py); without it real SGLang mounts no route (404)
        self.metrics = metrics_mod.Metrics(self.release, self.served_name) if self.args.enable_metrics else None

    # -- time -----------------------------------------------------------------
    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds * self._scale()))

    # -- ways to end ----------------------------------------------------------
    def die(self, traceback_text: str, rank: int = 0) -> None:
        """SGLang's crash path: the scheduler logs the exception, the parent gets
        SIGQUIT and kills its process tree (the unit ends with Result: signal)."""
        self.crashed.set()
        log("Scheduler hit an exception: " + traceback_text, rank)
        log("Received sigquit from a child process. It usually means the child failed.")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def hang(self) -> None:
        """A real hang (NCCL, custom all-reduce during capture, upstream PR #11275)
        logs nothing at all: alive, never serving. Nothing in the simulator uses
        it for an error it has logged: a logged fatal error always kills the tree."""
        while True:
            time.sleep(3600)

    def hang_point(self, stage: str) -> None:
        """Called right after the line that enters ``stage`` is logged: with
        SGLANG_SIMULATOR_HANG=<stage> (distributed, weights or cuda_graph) the process
        stops there, silent, alive, holding what it has allocated, the port never bound.
        An environment variable and not a hardware-file fault: the hardware file is the
        host's and every case on the host reads it, a hang belongs to one unit."""
        if os.environ.get("SGLANG_SIMULATOR_HANG", "").strip() == stage:
            self.hang()

    # -- start-up -------------------------------------------------------------
    def start(self) -> None:
        # ServerArgs.__post_init__ / resolve_once: the checks, then the radix-cache
        # rule on the model's config.json, before any process starts
        # (_handle_model_specific_adjustments); a ValueError is a traceback, exit 1.
        try:
            warnings = resolve(self.release, self.args, self.ddtree)
        except radix.RadixRefusal as exc:
            log("Traceback (most recent call last):\n  File \"sglang/srt/server_args.py\", in __post_init__\n"
                f"  File \"sglang/srt/server_args.py\", in _handle_mamba_radix_cache\nValueError: {exc}")
            sys.exit(1)
        except ArgumentValidationError as exc:
            log(f"Traceback (most recent call last):\n  File \"sglang/srt/server_args.py\", in __post_init__\nValueError: {exc}")
            sys.exit(1)
        for warning in warnings:
            log(warning)
        global TP_SIZE
        TP_SIZE = self.args.tp_size
        configure_logger(self.args)
        # As real SGLang: every argument at INFO on the engine's logger, the API key
        # in clear (0.5.11 srt/entrypoints/engine.py:679, 0.5.23 :1185).
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self.args).items()) if k != "config")
        logging.getLogger("sglang.srt.entrypoints.engine").info("server_args=ServerArgs(%s)", shown)
        log(f"sglang-simulator: a test double of SGLang {self.release.text}, not SGLang")
        try:
            self.hardware = hw.load()
        except hw.HardwareError as exc:
            log(f"RuntimeError: {exc}")
            sys.exit(1)
        for library in STARTUP_LIBRARIES:
            if library not in self.hardware.cuda_libraries:
                log(cdll_traceback(library, "sgl_kernel/load_utils.py").replace("_load_tree_kernels", "_load_architecture_specific_ops"))
                log("ImportError: Could not load any common_ops library!")
                sys.exit(1)
        try:
            target = model_mod.load(self.args.model_path)
            draft = model_mod.load(self.args.speculative_draft_model_path) if self.args.speculative_draft_model_path else None
        except model_mod.ModelPathError as exc:
            log("Traceback (most recent call last):\n  File \"sglang/srt/configs/model_config.py\", in __init__\n" + str(exc))
            sys.exit(1)
        self.context_len = self.args.context_length or target.max_position_embeddings
        self.has_vision, self.model_type, self.architecture = target.has_vision, target.model_type, target.architecture
        self.draft_arch = draft.architecture if draft else ""
        if self.context_len > target.max_position_embeddings:
            # 0.5.11 configs/model_config.py:456-476
            log(
                f"ValueError: Warning: {'User-specified'} context_length ({self.context_len}) is greater than the derived "
                f"context_length ({target.max_position_embeddings}). This may lead to incorrect model outputs "
                "or CUDA errors. Note that the derived context_length may differ from max_position_embeddings in "
                "the model's config. To allow overriding this maximum, set the env var "
                "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
            )
            sys.exit(1)

        ranks = self._rank_gpus()
        cfg = server_config(self.release, self.args)
        self.num_draft_tokens = cfg.num_draft_tokens or memory.default_num_draft_tokens(cfg.speculative_algorithm, draft)
        self.cuda_graph = cfg.cuda_graph
        self._log_init_begin()
        self.hang_point("distributed")
        self.sleep(2)
        for rank, gpu in enumerate(ranks):
            if gpu.lost:
                self.die(
                    "Traceback (most recent call last):\n"
                    '  File "sglang/srt/model_executor/model_runner.py", in init_torch_distributed\n'
                    "    torch.get_device_module(self.device).set_device(self.gpu_id)\n"
                    "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n"
                    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                    "stacktrace below might be incorrect.\n"
                    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
                    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
                    rank,
                )
        free_mib = min(
            gpu.memory_total_mib - hw.CUDA_CONTEXT_MIB - hw.used_mib(gpu.index, exclude_pid=os.getpid())
            for gpu in ranks
        )
        total_mib = min(gpu.memory_total_mib for gpu in ranks)
        for gpu in ranks:
            self.ledger.hold(gpu.index, hw.CUDA_CONTEXT_MIB)
            if gpu.health.get("start_xid"):
                # a start that faults the GPU: the driver logs it, the server goes on (a gate alone passes)
                xid = int(gpu.health["start_xid"])
                hw.log_kernel(hw.xid_line(gpu, xid, hw.XID_DETAIL.get(xid, "Error"), os.getpid(), "python3"))
        self._log_init_end(2.0)

        # 0.5.11 model_executor/model_runner.py:1290, 0.5.23 :1274
        log(f"Load weight begin. avail mem={free_mib / 1024:.2f} GB", 0)
        self.hang_point("weights")
        weights_gib = target.weight_bytes / self.args.tp_size / memory.GIB
        if weights_gib > free_mib / 1024:
            self.die(
                "Traceback (most recent call last):\n"
                '  File "sglang/srt/model_loader/loader.py", in load_weights_and_postprocess\n'
                + oom_text(weights_gib, free_mib / 1024, total_mib / 1024, ranks[0].index)
            )
        self.sleep(weights_gib / 2.0 + 4)  # about 2 GiB/s from local NVMe
        for gpu in ranks:
            self.ledger.hold(gpu.index, weights_gib * 1024)
        log(
            f"Load weight end. elapsed={weights_gib / 2.0 + 4:.2f} s, type={target.architecture}, {''}"
            f"avail mem={free_mib / 1024 - weights_gib:.2f} GB, mem usage={weights_gib:.2f} GB.",
            0,
        )
        try:
            plan = memory.plan(self.release, target, draft, cfg, total_mib, free_mib)
        except memory.PoolSizingError as exc:
            self.sleep(1)
            self.die(
                "Traceback (most recent call last):\n"
                '  File "sglang/srt/managers/scheduler.py", in run_scheduler_process\n'
                '  File "sglang/srt/model_executor/model_runner.py", in init_memory_pool\n'
                '  File "sglang/srt/model_executor/pool_configurator.py", in __post_init__\n'
                f"{exc}"
            )
            return
        self.plan = plan
        self._log_pools(plan)
        for gpu in ranks:
            self.ledger.hold(gpu.index, (plan.kv_gib + plan.mamba_gib + plan.mamba_intermediate_gib) * 1024)
        free_gib = plan.headroom_gib
        log(f"Memory pool end. avail mem={free_gib:.2f} GB", 0)
        self._run_dynamic_stages(plan, ranks, total_mib)
        log(
            f"max_total_num_tokens={plan.max_total_tokens}, chunked_prefill_size={plan.chunked_prefill_size}, "
            f"max_prefill_tokens={16384}, max_running_requests={plan.max_running_requests}, "
            f"context_len={self.context_len}, {'available_gpu_mem'}={self._free_after(plan):.2f} GB",
            0,
        )
        self.serve()

    def _rank_gpus(self) -> list[hw.Gpu]:
        assert self.hardware is not None
        visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible_env is None or visible_env.strip() == "":
            visible = [g.index for g in self.hardware.gpus]
        else:
            visible = [int(x) for x in visible_env.split(",") if x.strip()]
        gpus = []
        for index in visible:
            try:
                gpus.append(self.hardware.gpu(index))
            except KeyError:
                continue
        if self.args.tp_size > len(gpus):
            log(
                "Traceback (most recent call last):\n"
                '  File "sglang/srt/model_executor/model_runner.py", in init_torch_distributed\n'
                "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
                "GPU device may be out of range, do you have enough GPUs?",
                len(gpus),
            )
            sys.exit(1)
        return gpus[: self.args.tp_size]

    def _log_init_begin(self) -> None:
        """0.5.11 model_executor/model_runner.py:1103 "Init torch distributed begin." (to
        0.5.20, distributed/bootstrap.py:81); "Init parallel begin." from 0.5.21
        (0.5.23 distributed/bootstrap.py:115)."""
        log("Init parallel begin." if self.release.logs_init_parallel else "Init torch distributed begin.", 0)

    def _log_init_end(self, elapsed: float) -> None:
        """0.5.11 model_runner.py:1235-1238 names the elapsed time and the memory the
        context took; from 0.5.21 "Init parallel ends." has the time only and "Memory
        baseline taken." the memory (0.5.23 distributed/bootstrap.py:190, :219-222)."""
        usage = hw.CUDA_CONTEXT_MIB / 1024
        if self.release.logs_init_parallel:
            log(f"Init parallel ends. elapsed={elapsed:.2f} s", 0)
            log(f"Memory baseline taken. mem usage={usage:.2f} GB", 0)
        else:
            log(f"Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage={usage:.2f} GB", 0)

    def _log_pools(self, plan: memory.MemoryPlan) -> None:
        if not self.release.kv_cache_log_names_dtype:
            log(f"Using KV cache dtype: {KV_CACHE_DTYPE}", 0)  # 0.5.11 model_executor/model_runner.py:2256
        if plan.mamba_slots:
            log(
                f"Mamba Cache is allocated. max_mamba_cache_size: {plan.mamba_slots}, "
                f"conv_state size: {plan.mamba_gib * 0.02:.2f}GB, ssm_state size: {plan.mamba_gib * 0.98:.2f}GB "
                + (f"intermediate_ssm_state_cache size: {plan.mamba_intermediate_gib:.2f}GB " if plan.mamba_intermediate_gib else ""),
                0,
            )
        half = plan.kv_gib / 2
        # 0.5.11 mem_cache/memory_pool.py:735; from 0.5.13.post1 the dtype first (memory_pool.py:819)
        dtype = f"dtype: {KV_CACHE_DTYPE}, " if self.release.kv_cache_log_names_dtype else ""
        log(f"{'KV Cache'} {'is allocated'}. {dtype}#tokens: {plan.max_total_tokens}, K size: {half:.2f} GB, V size: {half:.2f} GB", 0)

    def _free_after(self, plan: memory.MemoryPlan) -> float:
        return plan.headroom_gib - sum(s.gib for s in plan.dynamic)

    def _run_dynamic_stages(self, plan: memory.MemoryPlan, ranks: list[hw.Gpu], total_mib: int) -> None:
        """The consumers after the pool, in SGLang's order; each graph stage is one or
        more captures with SGLang's begin/end lines, the draft's weights the draft
        runner's load lines (before 0.5.14)."""
        free = plan.headroom_gib
        for stage in plan.dynamic:
            captures = self._captures(stage.name)
            if stage.name == "draft_weights":
                log(f"Load weight begin. avail mem={free:.2f} GB", 0)
                self.sleep(stage.gib / 2.0 + 2)
            share = stage.gib / max(1, len(captures))
            for index, capture in enumerate(captures):
                self._log_capture_begin(capture, plan, free)
                self.hang_point("cuda_graph")
                self.sleep(6 / len(captures))
                if index == 0 and stage.name == plan.failed_stage:
                    self._fail_stage(stage, free, total_mib, ranks, len(ranks))
                free -= share
                phase = self._memory_phase(capture)
                self.graph_usage[phase] = self.graph_usage.get(phase, 0.0) + share
                self._log_capture_end(capture, plan, share, free)
            if not captures:
                if stage.name == plan.failed_stage:
                    self._fail_stage(stage, free, total_mib, ranks, len(ranks))
                free -= stage.gib
            for gpu in ranks:
                self.ledger.hold(gpu.index, stage.gib * 1024)
            if stage.name == "draft_weights":
                # 0.5.11 model_executor/model_runner.py:1467-1474 (the draft's own runner)
                log(f"Load weight end. elapsed={stage.gib / 2.0 + 2:.2f} s, type={self._draft_architecture()}, {''}"
                    f"avail mem={free:.2f} GB, mem usage={stage.gib:.2f} GB.", 0)

    def _draft_architecture(self) -> str:
        """type(self.model).__name__ of the draft runner: the draft checkpoint's
        architecture, or for NEXTN on Qwen3.5/3.6 the MTP class SGLang swaps in
        (0.5.11 configs/model_config.py:394, models/qwen3_5_mtp.py:382)."""
        if self.draft_arch:
            return self.draft_arch
        return "Qwen3_5ForCausalLMMTP" if self.architecture == "Qwen3_5ForConditionalGeneration" else self.architecture

    def _captures(self, stage: str) -> list[str]:
        """The graph captures a stage logs: the target's ("target"); for an EAGLE-family
        draft the worker's decode capture (only with more than one step) and its extend
        capture (0.5.11 speculative/eagle_worker_v2.py:270-325, 0.5.23 :505-660); a
        DFLASH-family draft is its own runner's one capture ("draft")."""
        if stage == "cuda_graph":
            return ["target"]
        if stage != "draft_cuda_graph":
            return []
        if self.args.speculative_algorithm in memory.DFLASH_FAMILY:
            return ["draft"]
        steps = self.args.speculative_num_steps or 3
        return (["draft decode"] if steps > 1 else []) + ["draft extend"]

    def _memory_phase(self, capture: str) -> str:
        """The memory_usage["graph"] phase a capture is booked under: a draft runner's
        "draft_decode", the target's "target_verify" under speculative decoding, else
        "decode" (0.5.23 model_runner_components/cuda_graph_setup.py:703-708)."""
        if capture == "target":
            return "target_verify" if self.args.speculative_algorithm else "decode"
        return "draft_extend" if capture == "draft extend" else "draft_decode"

    def _phase_name(self, capture: str) -> str:
        """capture_name of a model runner's decode capture: "target verify" under
        speculative decoding, else "target decode" (0.5.14 model_runner.py:2550-2558)."""
        return f"{capture} verify" if self.args.speculative_algorithm else f"{capture} decode"

    def _log_capture_begin(self, capture: str, plan: memory.MemoryPlan, free: float) -> None:
        bs = memory.capture_batch_sizes(plan.cuda_graph_max_bs, bool(self.args.speculative_algorithm))
        backend = getattr(self.args, "cuda_graph_backend_decode", None) or "full"
        per = "num_tokens_per_req" if self.release.capture_log_num_tokens_per_req else "num_tokens_per_bs"
        if not self.release.capture_log_names_phase:
            if capture in ("target", "draft"):  # 0.5.11 model_executor/model_runner.py:2778-2780
                log(f"Capture {'cuda graph'} begin. This can take up to several minutes. avail mem={free:.2f} GB", 0)
            else:  # 0.5.11 speculative/eagle_worker_v2.py:277 ("draft", the decode capture), :317 ("draft extend")
                log(f"Capture {capture.removesuffix(' decode')} cuda graph begin. This can take up to several minutes. "
                    f"avail mem={free:.2f} GB", 0)
        elif capture in ("target", "draft"):
            # 0.5.14 model_runner.py:2562-2566; from 0.5.22 bs= is on the end line (0.5.23 cuda_graph_setup.py:758-762)
            tokens = self.num_draft_tokens if self.args.speculative_algorithm else 1
            shown = "" if self.release.capture_log_bs_at_end else f"bs={bs}, "
            log(f"Capture {self._phase_name(capture)} {'CUDA graph'} begin. backend={backend}, {per}={tokens}, "
                f"{shown}avail mem={free:.2f} GB", 0)
        elif capture == "draft decode":  # 0.5.14 speculative/eagle_worker_v2.py:394-397, 0.5.23 :514-518
            topk = self.args.speculative_eagle_topk or 1
            log(f"Capture draft decode CUDA graph begin. backend={backend}, {per}={topk}, bs={bs}, avail mem={free:.2f} GB", 0)
        else:  # 0.5.14 speculative/eagle_worker_v2.py:450-453, 0.5.23 :633-637
            log(f"Capture draft extend CUDA graph begin. backend={backend}, {per}={self.num_draft_tokens}, "
                f"bs={bs}, avail mem={free:.2f} GB", 0)

    def _log_capture_end(self, capture: str, plan: memory.MemoryPlan, gib: float, free: float) -> None:
        elapsed = 6.0
        if not self.release.capture_log_names_phase:
            if capture in ("target", "draft"):  # 0.5.11 model_executor/model_runner.py:2796-2799
                log(f"Capture {'cuda graph'} end. Time elapsed: {elapsed:.2f} s. mem usage={gib:.2f} GB. "
                    f"avail mem={free:.2f} GB.", 0)
            else:  # 0.5.11 speculative/eagle_worker_v2.py:284, :324
                log(f"Capture {capture.removesuffix(' decode')} cuda graph end. Time elapsed: {elapsed:.2f} s. mem usage={gib:.2f} GB. "
                    f"avail mem={free:.2f} GB.", 0)
        elif capture in ("target", "draft"):
            # 0.5.14 model_runner.py:2587-2591; 0.5.23 cuda_graph_setup.py:787-793 (bs=runner.capture_bs)
            bs = memory.capture_batch_sizes(plan.cuda_graph_max_bs, bool(self.args.speculative_algorithm))
            shown = f"bs={bs}, " if self.release.capture_log_bs_at_end else ""
            log(f"Capture {self._phase_name(capture)} {'CUDA graph'} end. {shown}elapsed={elapsed:.2f} s, "
                f"mem usage={gib:.2f} GB, avail mem={free:.2f} GB.", 0)
        else:  # 0.5.14 speculative/eagle_worker_v2.py:404-408, :462-466; 0.5.23 :532-537, :653-658
            log(f"Capture {capture} CUDA graph end. elapsed={elapsed:.2f} s, mem usage={gib:.2f} GB, "
                f"avail mem={free:.2f} GB.", 0)

    def _fail_stage(self, stage: memory.Stage, free: float, total_mib: int, ranks: list[hw.Gpu], tp: int) -> None:
        """An out-of-memory after the pool: the rank that raised logs "Scheduler hit
        an exception" and SIGQUITs the parent, which kills the tree (0.5.11
        managers/scheduler.py:3936-3939, entrypoints/engine.py:1185-1191). The other
        ranks do not keep it alive: the whole tree goes within milliseconds."""
        oom = oom_text(stage.gib, max(free, 0.0), total_mib / 1024, ranks[-1].index)
        if stage.name in ("cuda_graph", "draft_cuda_graph"):
            # raise Exception(f"Capture cuda graph failed: {e}\n{CUDA_GRAPH_CAPTURE_FAILED_MSG}")
            # (0.5.11 model_executor/cuda_graph_runner.py:715-718 and the EAGLE draft
            # runners; 0.5.14+ model_executor/runner/decode_cuda_graph_runner.py)
            if stage.name == "cuda_graph":
                where = ("sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
                         if self.release.split_cuda_graph_flags else "sglang/srt/model_executor/cuda_graph_runner.py")
            else:
                where = "sglang/srt/speculative/eagle_draft_cuda_graph_runner.py"
            text = (
                "Traceback (most recent call last):\n"
                f'  File "{where}", in __init__\n'
                "    self.capture()\n"
                + oom + "\n\n"
                "During handling of the above exception, another exception occurred:\n\n"
                "Traceback (most recent call last):\n"
                '  File "sglang/srt/managers/scheduler.py", in run_scheduler_process\n'
                f'  File "{where}", in __init__\n'
                "Exception: Capture cuda graph failed: " + oom.split(": ", 1)[1] + "\n"
                + cuda_graph_hint(self.release)
            )
            self.die(text, tp - 1)
        worker = "dflash_worker.py" if self.args.speculative_algorithm in memory.DFLASH_FAMILY else "eagle_worker.py"
        text = (
            "Traceback (most recent call last):\n"
            '  File "sglang/srt/managers/scheduler.py", in run_scheduler_process\n'
            f'  File "sglang/srt/speculative/{worker}", in __init__\n'
            '  File "sglang/srt/model_executor/model_runner.py", in load_model\n' + oom
        )
        self.die(text, tp - 1)

    # -- serving --------------------------------------------------------------
    def serve(self) -> None:
        """uvicorn.run as SGLang calls it (0.5.11 entrypoints/http_server.py:2261):
        the app's lifespan starts the warmup thread before the socket is bound
        (:390-400), so a port that is taken still gets the warmup, run against
        whoever holds the port; uvicorn then logs the bind error, shuts the
        lifespan down (which joins the warmup thread) and exits 3
        (uvicorn server.py:182-192, STARTUP_FAILURE). Real SGLang may instead
        die of SIGKILL (-9) when its subprocess watchdog sees the scheduler
        killed in that shutdown first (0.5.11 srt/utils/watchdog.py:203-221);
        the simulator takes the first of the two outcomes, which nothing here
        tells apart (conformance test_real_gate accepts both from real SGLang)."""
        handler = make_handler(self)
        uvicorn_log("INFO:     Started server process [%d]" % os.getpid())
        uvicorn_log("INFO:     Waiting for application startup.")
        warmup = threading.Thread(target=self._wait_and_warmup)
        warmup.start()
        uvicorn_log("INFO:     Application startup complete.")
        try:
            httpd = ThreadingHTTPServer((self.args.host, self.args.port), handler)
        except OSError as exc:
            uvicorn_log(
                f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                f"('{self.args.host}', {self.args.port}): {exc.strerror.lower() if exc.strerror else exc}"
            )
            uvicorn_log("INFO:     Waiting for application shutdown.")
            warmup.join()
            uvicorn_log("INFO:     Application shutdown complete.")
            self.ledger.release()
            sys.exit(3)
        httpd.daemon_threads = True
        self.httpd = httpd
        self.startup_seconds = round(time.monotonic() - self.launched, 3)
        uvicorn_log(f"INFO:     Uvicorn running on http://{self.args.host}:{self.args.port} (Press CTRL+C to quit)")
        httpd.serve_forever(poll_interval=0.2)

    def _wait_and_warmup(self) -> None:
        """_wait_and_warmup / _execute_server_warmup (0.5.11
        entrypoints/http_server.py:1856-2038): poll GET /model_info once a second
        (120 tries, 5 s timeout each), then one generation: POST /generate "The
        capital city of France is", 8 tokens, or for a model with image
        understanding a POST /v1/chat/completions with an image. Any failure logs
        "Initialization failed. warmup error: ..." and kills the process tree.
        It talks HTTP to host:port, so it reaches whoever holds the port."""
        if self.args.skip_server_warmup:
            self.ready.set()
            log("The server is fired up and ready to roll!")
            return
        url = f"http://{self.args.host}:{self.args.port}"
        headers = {"Authorization": f"Bearer {self.args.api_key}"} if self.args.api_key else {}
        timeout = max(0.2, 5 * self._scale())
        info = None
        last = ""
        for _attempt in range(120):
            self.sleep(1)
            try:
                status, info = http_json("GET", url + "/model_info", None, headers, timeout)
                if status == 200:
                    break
                last = f"AssertionError: res=<Response [{status}]>"
            except Exception as exc:  # noqa: BLE001 - requests raises many kinds
                last = f"requests.exceptions.ConnectionError: {exc}"
            info = None
        if info is None:
            self._warmup_failed(last)
            return
        if info.get("has_image_understanding"):
            path = "/v1/chat/completions"
            body = {
                "model": self.served_name,
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{MINIMUM_PNG_PICTURE_BASE64}"}},
                    {"type": "text", "text": "Describe the image."},
                ]}],
                "max_tokens": 8, "stream": False, "temperature": 0.0,
            }
        else:
            path = "/generate"
            body = {"sampling_params": {"temperature": 0, "max_new_tokens": 8}, "text": "The capital city of France is"}
        try:
            status, answer = http_json("POST", url + path, body, headers, max(1.0, 600 * self._scale()))
            if status != 200:
                raise AssertionError(json.dumps(answer))
        except Exception as exc:  # noqa: BLE001
            self._warmup_failed(f"{type(exc).__name__}: {exc}")
            return
        self.ready.set()
        log("The server is fired up and ready to roll!")

    def _warmup_failed(self, last: str) -> None:
        self.crashed.set()
        # 0.5.11 entrypoints/http_server.py:1880 / :2007
        last_traceback = f"Traceback (most recent call last):\n{last}"
        log(f"Initialization failed. warmup error: {last_traceback}")
        self.ledger.release()
        os.kill(os.getpid(), signal.SIGKILL)  # kill_process_tree(os.getpid())

    def _scale(self) -> float:
        return self.hardware.time_scale if self.hardware else 1.0

    def health(self) -> int:
        """/health and /health_generate are one handler (0.5.11
        entrypoints/http_server.py:506-578): an empty 503 while the server is
        starting, then a 1-token generation that must answer within
        HEALTH_CHECK_TIMEOUT (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s): 200, else 503."""
        if not self.ready.is_set():
            return 503
        limit = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        done = threading.Event()

        def one_token() -> None:
            self.generate("", 1, client=False, log_metrics=False)
            done.set()

        threading.Thread(target=one_token, daemon=True).start()
        tic = time.time()
        if done.wait(limit):
            self.unhealthy = False  # ServerStatus.Up (0.5.23 http_server.py:784)
            return 200
        self.unhealthy = True
        log(
            "Health check failed. Server couldn't get a response from detokenizer for last "
            f"{int(limit)} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
            f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(tic))}"
        )
        return 503

    def is_ready(self) -> bool:
        """TokenizerManager.is_ready: warmup done (ServerStatus.Up) and no failed /health
        since (0.5.20 managers/tokenizer_manager.py:672-678, 0.5.23 :728-734). The
        simulator neither pauses nor drains, the other two conditions."""
        return self.ready.is_set() and not self.unhealthy

    def server_info(self) -> dict:
        figures = {
            "last_gen_throughput": self.last_gen_throughput,
            "available_gib": self._free_after(self.plan) if self.plan else 0.0,
            "graph_usage": dict(self.graph_usage),
            "avg_spec_accept_length": self._speed()[0] if self.ready.is_set() and self.args.speculative_algorithm else None,
        }
        return info_mod.build(self.release, self.args, self.plan, self.context_len, self.argv, figures)

    def loads(self) -> dict:
        """GET /v1/loads: one DP rank, its running requests (0.5.11 srt/entrypoints/v1_loads.py:134-180,
        with the aggregate until 0.5.12; 0.5.23 :96-151, with the accelerator from 0.5.17)."""
        with self.lock:
            running, waiting = self.running, self.waiting
        total = self.plan.max_total_tokens if self.plan else 0
        rank = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting, "num_used_tokens": 0,
                "num_total_tokens": total, "token_usage": 0.0, "gen_throughput": self.last_gen_throughput,
                "cache_hit_rate": 0.0, "utilization": 0.0}
        body: dict = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "version": self.release.text}
        if self.release.loads_accelerators:
            body.update(accelerator=None, num_accelerators=max(1, self.args.tp_size))
        else:
            body["dp_rank_count"] = 1
        body["loads"] = [dict(rank, num_total_reqs=running + waiting) if self.release.loads_aggregate else rank]
        if self.release.loads_aggregate:
            body["aggregate"] = {"total_running_reqs": running, "total_waiting_reqs": waiting, "total_reqs": running + waiting,
                                 "total_used_tokens": 0, "total_tokens": total, "avg_token_usage": 0.0,
                                 "avg_throughput": self.last_gen_throughput, "avg_utilization": 0.0}
        return body

    def metrics_text(self) -> str:
        """GET /metrics (--enable-metrics): the scheduler's gauges as /v1/loads reads them."""
        assert self.metrics is not None
        with self.lock:
            running = self.running
        gauges = {"sglang:num_running_reqs": running, "sglang:gen_throughput": self.last_gen_throughput,
                  "sglang:max_total_num_tokens": self.plan.max_total_tokens if self.plan else 0}
        return self.metrics.text(gauges, self.startup_seconds)

    def generate(self, prompt: str, max_new_tokens: int, client: bool = True, emit=None, log_metrics: bool = True) -> dict:
        """One generation. With ``emit``, streamed as real SGLang streams /generate: ``emit(output)``
        after the prefill's first token and after each decode step (a speculative step adds its
        accept length of tokens), every output cumulative (0.5.11 srt/entrypoints/http_server.py:708-726)."""
        algorithm = self.args.speculative_algorithm
        if client and self.ready.is_set():  # the warmup's own request is not a client's
            with self.lock:
                self.client_requests += 1
                first = self.client_requests == 1
            if first:
                assert self.hardware is not None
                failure = open_build_kernels(algorithm)
                if failure:
                    self.die(failure)
        if self.wedged.is_set():
            self.hang()  # a stopped scheduler: the request is queued and never answered
        digest = hashlib.sha256(prompt.encode("utf-8")).digest()
        count = max(1, int(max_new_tokens))
        words = [WORDS[(digest[i % len(digest)] + i) % len(WORDS)] for i in range(count)]
        prompt_tokens = max(1, len(prompt.split()))
        limit = self._admission_limit(prompt_tokens + count)
        with self.lock:
            # the scheduler's queue (#queue-req): admitted while the running requests are under
            # max_running_requests and their tokens fit the KV pool
            self.waiting += 1
            while self.running >= limit:
                self.admitted.wait()
            self.waiting -= 1
            self.running += 1
            batch = self.running
        accept, per_token = self._speed(batch)
        started = time.monotonic()
        scale = self._generation_scale()
        try:
            if emit is None:
                pace(started, count * per_token * scale)
            else:
                schedule = stream_schedule(count, accept, per_token, self._performance().prefill_seconds)
                for done in paced(schedule, started, scale):
                    emit(self._output(prompt, words, done, accept, time.monotonic() - started))
        finally:
            with self.lock:
                self.running -= 1
                self.admitted.notify()
        self.last_gen_throughput = round(1 / per_token, 2)
        # /health's own generation is not counted: log_metrics=False (0.5.11 srt/entrypoints/http_server.py:537,547)
        if self.metrics is not None and log_metrics:
            self.metrics.observe(prompt_tokens, count, self._performance().prefill_seconds, count * per_token,
                                 emit is not None)
        return self._output(prompt, words, count, accept, round(count * per_token, 4))

    def _generation_scale(self) -> float:
        """Generations' own time scale (the performance section's), else the host's."""
        scale = self._performance().time_scale
        return self._scale() if scale is None else scale

    def _performance(self) -> hw.Performance:
        return self.hardware.performance if self.hardware else hw.Performance()

    def _speed(self, batch: int = 1) -> tuple[float, float]:
        """(accept length, simulated seconds per output token) of a request of this server on this
        host in a decode batch of ``batch`` (hardware.py's model)."""
        perf, algorithm = self._performance(), self.args.speculative_algorithm
        steps = getattr(self.args, "speculative_num_steps", None) if algorithm else None
        graph_bs = self.plan.cuda_graph_max_bs if self.plan else None
        return perf.accept_length(algorithm, steps), perf.token_seconds(algorithm, self.cuda_graph, batch, steps, graph_bs)

    def _admission_limit(self, tokens: int) -> int:
        """How many requests of ``tokens`` (prompt and output) run at once: max_running_requests,
        and the KV pool's tokens over each one's (at least one)."""
        if not self.plan:
            return 1 << 30
        running = self.args.max_running_requests or self.plan.max_running_requests or (1 << 30)
        pool = self.plan.max_total_tokens // max(1, tokens) if self.plan.max_total_tokens else running
        return max(1, min(running, pool))

    def _output(self, prompt: str, words: list[str], done: int, accept: float, latency: float) -> dict:
        """/generate's answer after ``done`` of ``words``: text and ids cumulative, meta_info as real SGLang's."""
        meta = {
            "id": uuid.uuid4().hex,
            "finish_reason": {"type": "length", "length": done} if done == len(words) else None,
            "prompt_tokens": max(1, len(prompt.split())),
            "completion_tokens": done,
            "cached_tokens": 0,
            "e2e_latency": round(latency, 4),
        }
        if self.args.speculative_algorithm:
            verify = max(1, round(done / accept))
            draft_tokens = self.num_draft_tokens or 4
            meta.update(
                spec_accept_rate=round((accept - 1) / max(1, draft_tokens - 1), 4),
                spec_accept_length=accept,
                spec_verify_ct=verify,
            )
        return {"text": " " + " ".join(words[:done]), "output_ids": list(range(done)), "meta_info": meta}


def make_handler(sim: Simulator):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server API
            # uvicorn's access log: '%(client_addr)s - "%(request_line)s" %(status_code)s'
            code = str(args[1]) if len(args) > 1 else ""
            phrase = HTTPStatus(int(code)).phrase if code.isdigit() else ""
            uvicorn_log(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {code} {phrase}'.rstrip())

        def _send(self, status: int, body: object | None = None) -> None:
            data = b"" if body is None else json.dumps(body).encode("utf-8")
            self.send_response(status, HTTPStatus(status).phrase)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, produce) -> None:
            """A text/event-stream answer: 'data: <json>' per output, then 'data: [DONE]', chunked
            as uvicorn sends a StreamingResponse (0.5.11 srt/entrypoints/http_server.py:710-726)."""
            self.send_response(200, "OK")
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()

            def chunk(data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            produce(lambda out: chunk(b"data: " + json.dumps(out).encode("utf-8") + b"\n\n"))
            chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _authorized(self) -> bool:
            """The API-key middleware runs before routing, so an unknown path without
            the key is 401, not 404 (0.5.11 utils/auth.py:149-200)."""
            path = self.path.split("?", 1)[0]
            if not sim.args.api_key or auth_exempt(sim.release, path):
                return True
            return bearer_matches(self.headers.get("Authorization", ""), sim.args.api_key)

        def _body(self) -> dict:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            try:
                data = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                return {}
            return data if isinstance(data, dict) else {}

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            path = self.path.split("?", 1)[0]
            if not self._authorized():
                self._send(401, {"error": "Unauthorized"})
                return
            if path == "/v1/models":
                self._send(200, {"object": "list", "data": [self._model_card()]})
            elif path in ("/health", "/health_generate"):
                self._send(sim.health())
            elif path == "/ready" and sim.release.has_ready_endpoint:
                # 0.5.20 entrypoints/http_server.py:662-666, 0.5.23 :714-718: an empty 200/503
                self._send(200 if sim.is_ready() else 503)
            elif path in ("/model_info", "/get_model_info"):
                # 0.5.11 entrypoints/http_server.py:591-608
                self._send(200, {
                    "model_path": sim.args.model_path, "tokenizer_path": sim.args.tokenizer_path,
                    "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                    "has_image_understanding": sim.has_vision, "has_audio_understanding": False,
                    "model_type": sim.model_type, "architectures": [sim.architecture] if sim.architecture else None,
                })
            elif path in ("/server_info", "/get_server_info"):
                self._send(200, sim.server_info())
            elif path == "/v1/loads" and sim.metrics is not None and not sim.release.fact("metrics_keep_v1_loads"):
                # real 0.5.9-0.5.15 with --enable-metrics: the metrics middleware reads route.path of the
                # included v1_loads router, which fastapi 0.165.0 lacks (0.5.11 srt/utils/common.py:1511-1519):
                # starlette's plain 500 and the traceback's last line in the log (measured on real 0.5.11)
                uvicorn_log("ERROR:    Exception in ASGI application")
                log("AttributeError: '_IncludedRouter' object has no attribute 'path'")
                data = b"Internal Server Error"
                self.send_response(500, "Internal Server Error")
                self.send_header("content-type", "text/plain; charset=utf-8")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif path == "/v1/loads":
                self._send(200, sim.loads())
            elif path == "/metrics" and sim.metrics is not None:
                # prometheus_client's make_asgi_app: the text format 0.0.4
                data = sim.metrics_text().encode("utf-8")
                self.send_response(200, "OK")
                self.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802 - http.server API
            path = self.path.split("?", 1)[0]
            if not self._authorized():
                self._send(401, {"error": "Unauthorized"})
                return
            body = self._body()
            if path == "/generate":
                params = body.get("sampling_params") or {}
                text = body.get("text") or ""
                if body.get("stream"):
                    self._stream(lambda emit: sim.generate(str(text), int(params.get("max_new_tokens", 128)), emit=emit))
                else:
                    self._send(200, sim.generate(str(text), int(params.get("max_new_tokens", 128))))
            elif path == "/v1/completions":
                result = sim.generate(str(body.get("prompt") or ""), int(body.get("max_tokens") or 16))
                choice = {"index": 0, "text": result["text"], "logprobs": None, "finish_reason": "length", "matched_stop": None}
                self._send(200, self._openai(result, "text_completion", choice))
            elif path == "/v1/chat/completions":
                messages = body.get("messages") or []
                prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
                result = sim.generate(prompt, int(body.get("max_tokens") or body.get("max_completion_tokens") or 16))
                message = {"role": "assistant", "content": result["text"].strip(), "reasoning_content": None, "tool_calls": None}
                choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length", "matched_stop": None}
                self._send(200, self._openai(result, "chat.completion", choice))
            elif path == "/flush_cache":
                self._send(200)
            else:
                self._send(404, {"detail": "Not Found"})

        def _model_card(self) -> dict:
            return {
                "id": sim.served_name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "sglang",
                "root": sim.served_name,
                "parent": None,
                "max_model_len": sim.context_len,
            }

        def _openai(self, result: dict, kind: str, choice: dict) -> dict:
            meta = result["meta_info"]
            return {
                "id": meta["id"],
                "object": kind,
                "created": int(time.time()),
                "model": sim.served_name,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": meta["prompt_tokens"],
                    "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
                    "completion_tokens": meta["completion_tokens"],
                    "prompt_tokens_details": None,
                },
            }

    return Handler


def main(argv: list[str] | None = None, prog: str = "launch_server.py") -> None:
    sim = Simulator(sys.argv[1:] if argv is None else argv, prog)

    def stop(signum: int, _frame: object) -> None:
        # 0.5.11 managers/tokenizer_manager.py:2732-2734 (the simulator does not drain)
        log(f"SIGTERM received. {signum=} {_frame=}. Draining requests and shutting down...")
        sim.sleep(2)  # the driver frees memory a moment after the process ends
        sim.ledger.release()
        os._exit(0)

    def wedge(_signum: int, _frame: object) -> None:
        sim.wedged.set()  # logs nothing: a stopped scheduler has nothing to say

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGUSR2, wedge)
    try:
        sim.start()
    finally:
        if not sim.crashed.is_set():
            sim.ledger.release()


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0
