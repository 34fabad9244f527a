"""The GPU acceptance in one call: every check of docs/gpu-checklist.md that a PyTorch-CUDA machine can run,
each with its figure and pass/fail against its goal, written as JSON and Markdown under --out ($OUT).

Each check runs the harness as a user would (`python -m harness run ... --json`, the overhead bench), in a
subprocess of its own with a time limit, and reads the figures back from what it printed and wrote. The
whole call stays inside --budget seconds: a check that no longer fits is listed as not run, with why. GPU
settings are never changed (no clocks, power limits or modes; NVML is only read). Checks that need what
the machine lacks (onnxruntime-gpu, TensorRT: their wheels exceed what can be carried) are listed as not
run with the reason.

    python -m harness.bench.gpu_check [--device cuda] [--out $OUT] [--budget 540] [--limit N] [--checks a,b]

`--device cpu` runs the same plumbing on the CPU (the CUDA-only checks say why they did not run): how the
script is tested on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.config import RunConfig
from harness.pipeline.stage_timer import DEVICE_TIMES
from harness.run.signals import Interrupted, interrupt_handling

DEFAULT_NMS_ON = RunConfig.model_fields["nms_on"].default

# The measurements first; then the CPU suite's CUDA-path tests (84 s on the H100's host, and they run in CI too), and
# max-autotune, whose compile time is the least predictable, last.
CHECKS = ("env", "reference", "fp32", "overhead", "postprocess", "nms_on", "precisions", "compile", "runtimes",
          "parity", "segment", "preprocess", "repeats", "server", "fakes", "autotune")


@dataclass
class Check:
    """One check's outcome: its figure (text), the goal, passed (None: a figure without a goal), or why not run."""

    name: str
    figure: str = ""
    goal: str = ""
    passed: bool | None = None
    status: str = "ok"  # ok | failed | not run
    reason: str = ""
    seconds: float = 0.0
    data: dict = field(default_factory=dict)


class Runner:
    """Runs commands under one time budget; every command's output is kept in the log folder."""

    def __init__(self, device: str, out: Path, budget_s: float, limit: int | None, work: Path | None = None):
        self.device, self.out, self.limit = device, out, limit
        self.deadline = time.monotonic() + budget_s
        # the checks' run folders: a temporary folder of the call's own unless given (run_checks removes it)
        self.work = work if work is not None else Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.log = out / "gpu_check.log"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def command(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        """Run `args` for at most `timeout` s (and the budget left); past it the whole process group is killed, so
        the processes a run starts itself (--repeats) do not outlive it and hold the GPU."""
        timeout = min(timeout, max(self.left(), 1.0))
        start = time.monotonic()
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy(),
                                   start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
            code = process.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            code, stderr = 124, stderr + f"\ntimed out after {timeout:.0f} s".encode()
        except BaseException:  # the call itself stopped (a signal): what this check started goes with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            raise
        done = subprocess.CompletedProcess(args, code, stdout.decode("utf-8", "replace"),
                                           stderr.decode("utf-8", "replace"))
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(args)}  # rc {done.returncode}, {time.monotonic() - start:.1f} s\n"
                      f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}\n")
        return done

    def run(self, *options: str, timeout: float = 240) -> dict:
        """`va-bench run OPTIONS --json` on the sample; the JSON it printed (RuntimeError with its last error
        line when it printed none)."""
        args = [sys.executable, "-m", "harness", "run", "--subset", "sample", "--output-dir", str(self.work),
                "--draw-images", "0", "--json", *options]
        if self.limit:
            args += ["--limit", str(self.limit)]
        done = self.command(args, timeout)
        try:
            return json.loads(done.stdout)
        except json.JSONDecodeError:
            last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise RuntimeError(last[:300]) from None


def _cells(result: dict) -> dict[int, dict]:
    """Batch size -> cell of one run's JSON; a cell that did not finish ok raises with its reason."""
    cells = {}
    for cell in result["cells"]:
        if cell["status"] != "ok":
            raise RuntimeError(f"{cell['cell']}: {cell['status']}: {cell['reason']}")
        cells[cell["batch_size"]] = cell
    return cells


def _submission(cell: dict) -> dict:
    return json.loads(Path(cell["submission"]).read_text(encoding="utf-8"))


# NVML's compute modes (nvmlComputeMode_t): a second process's context is refused under exclusive_process
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def _mps_daemon() -> str:
    """Whether NVIDIA's MPS control daemon serves this machine: its pipe (a host's daemon seen from a container too)
    or its processes (psutil)."""
    import psutil

    pipes = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
    if (pipes / "control").exists():
        return f"running (its pipe in {pipes})"
    names = {process.info["name"] or "" for process in psutil.process_iter(["name"])}
    return "running" if {"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"} & names else "not running"


def check_env(r: Runner, state: dict) -> Check:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": r.device, "cpus": os.cpu_count()}
    try:  # the host processes' shared segments live there: a worker's canvas and a batch's raw outputs each
        info["dev_shm_free_gib"] = round(shutil.disk_usage("/dev/shm").free / 2**30, 2)
    except OSError as exc:
        info["dev_shm_free_gib"] = f"unavailable ({exc.strerror})"
    # what decides whether a forward process can share CUDA memory with the run (expandable segments share through
    # pidfd_getfd, which a container may forbid) and whether two processes' kernels run side by side (MPS) or take
    # turns on the device
    info["alloc_conf"] = "; ".join(f"{name}={os.environ[name]}" for name in ("PYTORCH_CUDA_ALLOC_CONF",
                                                                           "PYTORCH_ALLOC_CONF")
                                   if os.environ.get(name)) or "unset"
    info["mps_daemon"] = _mps_daemon()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(r.device).index or 0)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                 "compute_capability": f"{props.major}.{props.minor}"}
        try:
            import pynvml

            from harness.measure.hygiene import nvml_handle

            pynvml.nvmlInit()
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
            handle = nvml_handle(pynvml, torch.device(r.device).index or 0)
            info["compute_mode"] = COMPUTE_MODES.get(pynvml.nvmlDeviceGetComputeMode(handle), "unknown")
        except Exception as exc:  # NVML absent: the figure says so
            info.setdefault("driver", f"unavailable ({type(exc).__name__})")
            info["compute_mode"] = f"unavailable ({type(exc).__name__})"
    state["env"] = info
    return Check("env", ", ".join(f"{k} {v}" for k, v in info.items()), data=info)


def check_fakes(r: Runner, state: dict) -> Check:
    done = r.command([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu_paths_fakes.py"],
                     300)
    # pytest's summary line; where pytest itself is missing, Python's line saying so
    last = (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or ["no output"])[-1]
    return Check("fakes", last, "the CUDA-path tests pass here too", done.returncode == 0)


def check_reference(r: Runner, state: dict) -> Check:
    """The CPU run every CUDA figure is compared with: PyTorch fp32, batch 8."""
    cell = _cells(r.run("--backend", "pytorch", "--device", "cpu", "--batch-sizes", "8", "--no-energy"))[8]
    state["cpu_map"] = cell["mAP_50_95"]
    return Check("reference", f"CPU PyTorch fp32 b8 mAP {cell['mAP_50_95']:.4f}", data={"cell": cell["cell"]})


def check_fp32(r: Runner, state: dict) -> list[Check]:
    sizes = [str(b) for b in (1, 8, 32) if not r.limit or b <= r.limit]  # a run refuses batches > its images
    cells = _cells(r.run("--backend", "pytorch", "--device", r.device, "--tf32", "off", "--batch-sizes", *sizes))
    state["fp32"] = cells
    out = []
    if "cpu_map" in state:
        delta = abs(cells[1]["mAP_50_95"] - state["cpu_map"])
        out.append(Check("fp32.map_vs_cpu", f"mAP b1 {cells[1]['mAP_50_95']:.4f} vs CPU {state['cpu_map']:.4f} "
                         f"(|d| {delta:.4f})", "|d| <= 0.002", delta <= 0.002))
    rate = cells[8]["batch_invariance"].get("match_rate")
    out.append(Check("fp32.batch8_vs_1", f"{100 * rate:.2f}% of detections matched" if rate is not None else "absent",
                     ">= 99%", rate is not None and rate >= 0.99))
    for b, cell in sorted(cells.items()):
        # sub-steps ("preprocess.decode") and the forward's device time beside it are parts, not more stages
        stages = {k: v for k, v in cell["stages_ms_mean"].items() if "." not in k and k not in DEVICE_TIMES}
        total, mean = sum(stages.values()), cell["batch_ms"]["mean"]
        out.append(Check(f"fp32.stage_sum_b{b}", f"stages {total:.2f} ms vs batch mean {mean:.2f} ms "
                         f"({', '.join(f'{k} {v:.2f}' for k, v in stages.items())}); {cell['images_per_s']:.0f} img/s",
                         "within 5%", abs(total - mean) <= 0.05 * mean))
    energy = _submission(cells[8]).get("energy") or {}
    per_image = energy.get("joules_per_image")
    domains = ", ".join(f"{name} {d['avg_w']} W ({d['method']})" for name, d in (energy.get("domains") or {}).items())
    out.append(Check("fp32.energy_b8", f"{per_image} J/image; {domains}"
                     if per_image is not None else f"unavailable: {energy.get('reason')}",
                     "measured on a GPU" if r.device != "cpu" else "", per_image is not None if r.device != "cpu"
                     else None))
    environment = _submission(cells[8]).get("environment") or {}
    state = environment.get("device_state") or {}
    gpu = state.get("gpu") or {}
    hygiene = {"gpu_hygiene": environment.get("gpu_hygiene"), "throttled": state.get("throttled"),
               "throttle_reasons": state.get("throttle_reasons"), "clock_event_reasons": gpu.get("clock_event_reasons"),
               "sm_clock_mhz": gpu.get("sm_clock_mhz"), "max_sm_clock_mhz": gpu.get("max_sm_clock_mhz"),
               "temperature_c_max": gpu.get("temperature_c_max"), "power_w_max": gpu.get("power_w_max"),
               "samples": state.get("samples")}
    recorded = state.get("samples") is not None and (r.device == "cpu" or gpu.get("source") == "nvml")
    out.append(Check("fp32.hygiene", json.dumps(hygiene)[:400], "sampled during the timed pass (NVML on a GPU)",
                     recorded, data=hygiene))
    return out


def _map_against_eager(r: Runner, base: dict, backend: str, label: str,
                       tolerances: tuple[tuple[str, float], ...]) -> list[Check]:
    """`backend` at each (precision, tolerance), batch 8: its mAP against eager PyTorch fp32's (`base`)."""
    out = []
    for precision, tolerance in tolerances:
        name = f"{label}.{precision}"
        try:
            cell = _cells(r.run("--backend", backend, "--device", r.device, "--precision", precision,
                                "--batch-sizes", "8", "--no-energy"))[8]
        except RuntimeError as exc:
            out.append(Check(name, status="failed", reason=str(exc)))
            continue
        delta = cell["mAP_50_95"] - base["mAP_50_95"]
        out.append(Check(name, f"mAP {cell['mAP_50_95']:.4f} ({delta:+.4f} vs eager fp32), p50 "
                         f"{cell['image_ms_p50']:.3f} vs {base['image_ms_p50']:.3f} ms/image",
                         f"|d mAP| <= {tolerance}", abs(delta) <= tolerance))
    return out


def check_precisions(r: Runner, state: dict) -> list[Check]:
    if "fp32" not in state:
        return [Check("precisions", status="not run", reason="needs the fp32 check")]
    return _map_against_eager(r, state["fp32"][8], "pytorch", "precision", (("fp16", 0.005), ("bf16", 0.01)))


def _against_eager(r: Runner, state: dict, name: str, batch: int, options: tuple[str, ...], timeout: float) -> Check:
    """One compiled or captured variant of eager fp32 at `batch`: forward speed and mAP against eager's."""
    base = state["fp32"][batch]
    try:
        cell = _cells(r.run("--backend", "pytorch", "--device", r.device, "--tf32", "off", "--batch-sizes",
                            str(batch), "--no-energy", *options, timeout=timeout))[batch]
    except RuntimeError as exc:
        return Check(name, status="failed", reason=str(exc))
    delta = cell["mAP_50_95"] - base["mAP_50_95"]
    speed = base["batch_ms"]["p50"] / cell["batch_ms"]["p50"]
    return Check(name, f"b{batch} forward batch p50 {cell['batch_ms']['p50']:.2f} ms vs eager "
                 f"{base['batch_ms']['p50']:.2f} (x{speed:.2f}); mAP {delta:+.4f}",
                 "mAP within 0.001 of eager", abs(delta) <= 0.001)


def check_compile(r: Runner, state: dict) -> list[Check]:
    if "fp32" not in state:
        return [Check("compile", status="not run", reason="needs the fp32 check")]
    return [_against_eager(r, state, "compile.default", 8, ("--compile", "default"), 240),
            _against_eager(r, state, "cuda_graphs", 1, ("--cuda-graphs",), 180)]


def check_autotune(r: Runner, state: dict) -> Check:
    if "fp32" not in state:
        return Check("compile.max_autotune", status="not run", reason="needs the fp32 check")
    return _against_eager(r, state, "compile.max_autotune", 8, ("--compile", "max-autotune"), 300)


OVERHEAD_STEP_SECONDS = 30  # an overhead row needs at least this much of the budget to measure anything
# 26.8 and 155.6 GFLOPs at 640 px, against yolox-nano's 1.1 at 416. Seeded random weights score every anchor alike:
# all 8400 of a 640 px image pass the threshold (yolox-s on 4 sample images, against 606 an image for the trained
# nano), so their selection is heavier than a trained model's and these rows bound the pipeline's share from below
LARGER_MODELS = ("yolox-s", "yolox-l")


def check_overhead(r: Runner, state: dict) -> list[Check]:
    """bench-overhead at b8 and b32 as a run does it (judged); both sizes with the core in a process of its own
    (`--forward-process`; judged); both sizes with the host stages in host processes (cv2, NMS on the host,
    `--host-processes 15`; judged); both sizes with the knobs together (two finishing, 15 workers beside auto, a
    CUDA graph; judged). Then figures: the default at both sizes on YOLOX-S and -L with seeded random weights (S
    only with --limit); b8 with the forward and the host stages each in processes of their own; both sizes with the
    letterbox and NMS one image at a time (the way before: the A/B); at b32 with two batches finishing at once and
    with the forward replayed from a CUDA graph; both sizes with cv2 letterboxing on the host; then b32's overlapped
    stream under py-spy: who holds the interpreter lock while the forward waits for it (a figure).
    Each bench also says where the forward's thread spent its overlapped stream: the overhead split into contention
    and host work the forward could not hide.
    With --limit (the plumbing on a CPU) the batches are at most that size and the rounds short."""
    small, large = (8, 32) if not r.limit else (min(8, r.limit), min(32, r.limit))
    large_options = ["--batch-size", str(large)]
    sizes = [(small, ["--batch-size", str(small)], 0.9)] + ([(large, large_options, 0.8)] if large != small else [])
    # the knobs that can each shorten the stream at once (more finishing in flight, more workers, and on CUDA the
    # forward replayed from a graph, which frees the interpreter lock for the host stages): judged as the
    # configuration a fix would turn on, at both sizes
    combined = ["--finishes-in-flight", "2", "--workers", "auto", *(("15",) if not r.limit else ()),
                *(("--cuda-graphs",) if r.device.startswith("cuda") else ())]
    # cv2 letterboxes on the host, releasing the interpreter lock inside its calls, and uploads one uint8 canvas:
    # against the default (nvJPEG + the whole batch's letterbox on the device), and with more workers
    cv2_workers = ["--workers", "auto"] if r.limit else ["--workers", "auto", "15"]
    # the host's reads, decode, letterbox (cv2) and the selection (NMS on the host) in processes of their own, outside
    # the interpreter lock the eager forward's launches need; a worker a process, as many batches finishing
    processes = ["--preprocess", "cv2", "--nms-on", "host", "--host-processes", "2" if r.limit else "15"]
    judged = [(f"overhead.b{b}", options, goal) for b, options, goal in sizes]
    # the core in a process of its own, every host stage where the default has it: the forward's interpreter lock
    # its own (judged)
    judged += [(f"overhead.b{b}.forward_process", [*options, "--forward-process"], goal) for b, options, goal in sizes]
    judged += [(f"overhead.b{b}.processes", [*options, *processes], goal) for b, options, goal in sizes]
    judged += [(f"overhead.b{b}.combined", [*options, *combined], goal) for b, options, goal in sizes]
    # the default at both sizes on larger models (seeded random weights, the forward's cost is the architecture's):
    # whether the gap is the pipeline's or a tiny model's forward being too short to hide the host stages behind
    figures = [(f"overhead.b{b}.{model.replace('-', '_')}", [*options, "--model", model, "--weights", "random"], None)
               for model in LARGER_MODELS[:1 if r.limit else None] for b, options, _ in sizes]
    # nothing but the hand-overs left in the run's process: the forward in its own, the host stages in theirs (b8,
    # where the host's processors kept up with the decode)
    figures += [(f"overhead.b{small}.forward_and_host_processes", ["--batch-size", str(small), "--forward-process",
                                                                 *processes], None)]
    # the torch letterbox and the NMS one image at a time, as before they were done for the whole batch: the A/B
    figures += [(f"overhead.b{b}.per_image", [*options, "--per-image"], None) for b, options, _ in sizes]
    figures.append((f"overhead.b{large}.finishes_2", [*large_options, "--finishes-in-flight", "2"], None))
    if r.device.startswith("cuda"):
        figures.append((f"overhead.b{large}.cuda_graphs", [*large_options, "--cuda-graphs"], None))
    figures.append((f"overhead.b{small}.cv2", ["--batch-size", str(small), "--preprocess", "cv2"], None))
    if large != small:
        figures.append((f"overhead.b{large}.cv2", [*large_options, "--preprocess", "cv2", *cv2_workers], None))
    steps = [(name, lambda name=name, options=options, goal=goal: _overhead(r, name, options, goal))
             for name, options, goal in judged + figures]  # the judged rows first: a short budget keeps them
    steps.append((f"overhead.b{large}.lock_holders", lambda: _lock_holders(r, large)))
    out = []
    for name, step in steps:  # one row each: a failure is that row's, the others still run
        if r.left() < OVERHEAD_STEP_SECONDS:  # not a failure: a row the budget had no room for
            out.append(Check(name, status="not run", reason=f"time budget: {r.left():.0f} s left"))
            continue
        try:
            out.append(step())
        except Exception as exc:
            out.append(Check(name, status="failed", reason=f"{type(exc).__name__}: {str(exc)[:300]}"))
    return out


def _overhead_command(r: Runner, options: list[str], iterations: int | None = None) -> list[str]:
    """The overhead bench on PyTorch; `iterations` batches per round (default: the bench's, 4 with --limit)."""
    iterations = iterations or (4 if r.limit else None)
    return [sys.executable, "-m", "harness.bench.overhead", "--device", r.device, "--backend", "pytorch", *options,
            *(("--iterations", str(iterations)) if iterations else ()), "--json"]


def _overhead(r: Runner, name: str, options: list[str], goal: float | None) -> Check:
    """One overhead bench (PyTorch, 3 rounds): the throughput mode's ratio to the forward alone, judged against
    `goal` (None: a figure), with the latency-mode stage medians and the forward thread's overlapped stream."""
    done = r.command(_overhead_command(r, ["--rounds", "3", *options]), 200)
    try:
        (result,) = json.loads(done.stdout)
    except (json.JSONDecodeError, ValueError):
        return Check(name, status="failed", reason=(done.stderr.strip().splitlines() or ["no output"])[-1][:300])
    mode = result[result["throughput_mode"]]
    stages = result["latency_mode"].get("stages_ms_p50", {})
    spent = result["overlapped_mode"]["forward_thread"]
    return Check(name, f"selection on {result['selection_on']}, NMS {result['nms']}; {result['throughput_mode']}: "
                 f"{mode['images_per_s']:.0f} img/s = {mode['ratio_median']:.3f} of the forward alone "
                 f"({result['forward_images_per_s']:.0f}); latency mode {result['latency_mode']['ratio_median']:.3f}, "
                 "stages p50 " + ", ".join(f"{k} {v}" for k, v in stages.items())
                 + "; overlapped, the forward's thread ms per batch: "
                 + ", ".join(f"{k} {v}" for k, v in spent["ms_per_batch_p50"].items())
                 + f" (its forward calls {spent['forward_vs_alone']:.2f}x alone, the forward stage "
                   f"{result['overlapped_mode']['forward_stage_vs_alone']:.2f}x)"
                 + ("; overlapped by workers: " + ", ".join(f"{w} {m['ratio_median']:.3f}" for w, m
                                                            in result["overlapped_by_workers"].items())
                    if len(result["overlapped_by_workers"]) > 1 else ""),
                 "" if goal is None else f">= {goal}", None if goal is None else mode["ratio_median"] >= goal,
                 data=result)


def _lock_holders(r: Runner, batch: int) -> Check:
    """The overlapped stream (one round, auto workers) under py-spy: how long each thread group held the interpreter
    lock per batch inside the streams, and the functions holding it."""
    from harness.bench.gil_profile import profile

    name, iterations = f"overhead.b{batch}.lock_holders", 4 if r.limit else 40
    if r.left() < 60:
        return Check(name, status="not run", reason=f"time budget: {r.left():.0f} s left")
    raw = r.out / f"gil_b{batch}.txt"
    command = _overhead_command(r, ["--batch-size", str(batch), "--rounds", "1"], iterations)
    # the forward's thread inside the overlapped streams, and the streams' workers (they run nothing else)
    _, summary = profile(command, 200, raw, timeout=min(150, r.left() - 10), within=("run_overlapped",),
                         threads=("va-stream",))
    with r.log.open("a") as log:
        log.write(f"$ py-spy record --gil ... -- {' '.join(command)}  # {json.dumps(summary)[:2000]}\n")
    if "by_thread" not in summary:
        return Check(name, status="not run", reason=summary["reason"])
    batches = 2 * iterations  # the overlapped streams under py-spy: the warm-up's and the timed one
    holders = ", ".join(f"{group} {1000 * held['held_s'] / batches:.2f}"
                        for group, held in summary["by_thread"].items())
    top = ", ".join(f"{function} {100 * share:.0f} %"
                    for function, share in list(summary["top_functions"].items())[:6])
    return Check(name, f"overlapped b{batch}, interpreter lock held, ms per batch: {holders}; innermost functions "
                 f"holding it: {top}", "", None, data={**summary, "batches": batches})


def check_postprocess(r: Runner, state: dict) -> Check:
    """Where and how post-processing should run: the selection and boxes of one batch's candidates on the device
    for the whole batch at once (a run's way), on the device one image at a time (on the NMS pool, and one after
    another), and on the host after one copy; each matched against torchvision's calls per image."""
    batch = min(32, r.limit or 32)
    done = r.command([sys.executable, "-m", "harness.bench.postprocess_ab", "--device", r.device, "--batch-size",
                      str(batch), "--rounds", "20", "--json"], 150)
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        return Check("postprocess.where", status="failed",
                     reason=(done.stderr.strip().splitlines() or ["no output"])[-1][:300])
    v = result["variants"]
    return Check("postprocess.where", f"b{batch}, {result['candidates']} candidates, {result['threads']} threads: "
                 + ", ".join(f"{name} {x['ms_per_batch_p50']:.2f} ms ({100 * x['matched_vs_per_image']:.1f} % matched)"
                             for name, x in v.items()), "", None, data=result)


def check_parity(r: Runner, state: dict) -> Check:
    # cv2 against torch (the device's own decode and resize) on every image: PIL is a different resize by design,
    # and 64 images gave a noise floor above the tolerance on the H100
    args = [sys.executable, "-m", "harness", "parity", "preprocess", "--backend", "pytorch", "--device", r.device,
            "--impls", "cv2", "torch", *(("--limit", str(r.limit)) if r.limit else ())]
    done = r.command(args, 200)
    last = (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or ["no output"])[-1]
    return Check("parity.preprocess", last[:300], "within its noise floor (exit 0)", done.returncode == 0)


def check_runtimes(r: Runner, state: dict) -> list[Check]:
    """TorchScript (part of torch, so on the lent machine) against eager PyTorch: fp32, and fp16 on a GPU."""
    why = "its wheels exceed what can be carried to the lent machine (64 MiB): tested with fakes only"
    out = [Check("onnxruntime-gpu", status="not run", reason=why), Check("tensorrt", status="not run", reason=why)]
    if "fp32" not in state:
        return [*out, Check("torchscript", status="not run", reason="needs the fp32 check")]
    tolerances = (("fp32", 0.002), *((("fp16", 0.005),) if r.device.startswith("cuda") else ()))
    return [*out, *_map_against_eager(r, state["fp32"][8], "torchscript", "torchscript", tolerances)]


def check_segment(r: Runner, state: dict) -> list[Check]:
    """Masks on the device of a PyTorch core (RF-DETR-seg, seeded random weights): both cells finish, batch 8
    against batch 1 with masks compared, the mask stage timed."""
    sizes = [str(b) for b in (1, 8) if not r.limit or b <= r.limit]
    try:
        cells = _cells(r.run("--backend", "pytorch", "--device", r.device, "--tf32", "off", "--model", "rfdetr-seg-n",
                             "--weights", "random", "--batch-sizes", *sizes, "--no-energy", timeout=240))
    except RuntimeError as exc:
        return [Check("segment", status="failed", reason=str(exc))]
    invariance = cells[8]["batch_invariance"]
    rate = invariance.get("match_rate")
    masks_ms = cells[8]["stages_ms_mean"].get("postprocess.masks")
    memory = cells[8].get("memory") or {}
    return [Check("segment.batch8_vs_1", f"{100 * rate:.2f}% of detections matched (mask IoU >= "
                  f"{invariance.get('mask_iou_threshold')})" if rate is not None else "absent", ">= 99%",
                  rate is not None and rate >= 0.99 and invariance.get("mask_iou_threshold") is not None,
                  data=invariance),
            Check("segment.masks_b8", f"postprocess.masks {masks_ms} ms per batch; peak VRAM "
                  f"{memory.get('peak_vram_mb', 'n/a')} MB; {cells[8]['images_per_s']:.0f} img/s",
                  "the mask stage timed", masks_ms is not None)]


def check_preprocess(r: Runner, state: dict) -> list[Check]:
    """The whole input path on the device (`--preprocess torch`: nvJPEG decode, GPU letterbox), and generated
    images letterboxed on the device: mAP against the CPU reference, which decodes with libjpeg-turbo."""
    if "cpu_map" not in state:
        return [Check("preprocess", status="not run", reason="needs the reference check")]
    out = []
    try:
        result = r.run("--backend", "pytorch", "--device", r.device, "--tf32", "off", "--preprocess", "torch",
                       "--batch-sizes", "8", "--no-energy")
        cell = _cells(result)[8]
        delta = cell["mAP_50_95"] - state["cpu_map"]
        decode = (cell.get("preprocess") or {}).get("decode")
        out.append(Check("preprocess.device", f"mAP {cell['mAP_50_95']:.4f} ({delta:+.4f} vs CPU cv2); decode "
                         f"{decode}; {cell['images_per_s']:.0f} img/s", "|d| <= 0.005 (a different resize and "
                         "JPEG decoder)", abs(delta) <= 0.005))
    except RuntimeError as exc:
        out.append(Check("preprocess.device", status="failed", reason=str(exc)))
    try:
        cell = _cells(r.run("--backend", "pytorch", "--device", r.device, "--input", "synthetic", "--preprocess",
                            "torch", "--batch-sizes", "8", "--no-energy"))[8]
        decode = (cell.get("preprocess") or {}).get("decode")
        out.append(Check("preprocess.synthetic", f"decode {decode}; {cell['images_per_s']:.0f} img/s",
                         "decode skipped", decode == "skipped"))
    except RuntimeError as exc:
        out.append(Check("preprocess.synthetic", status="failed", reason=str(exc)))
    return out


def check_nms_on(r: Runner, state: dict) -> Check:
    """A run with the selection in the other place (`--nms-on`): mAP against the CPU reference, and the postprocess
    stage against the fp32 check's cells at the same batch sizes."""
    if "cpu_map" not in state:
        return Check("nms_on", status="not run", reason="needs the reference check")
    other = "host" if DEFAULT_NMS_ON == "device" else "device"
    sizes = [str(b) for b in (8, 32) if not r.limit or b <= r.limit]
    try:
        cells = _cells(r.run("--backend", "pytorch", "--device", r.device, "--tf32", "off", "--nms-on", other,
                             "--batch-sizes", *sizes, "--no-energy"))
    except RuntimeError as exc:
        return Check(f"nms_on.{other}", status="failed", reason=str(exc))
    base = state.get("fp32", {})
    parts = []
    for b, cell in sorted(cells.items()):
        post = cell["stages_ms_mean"].get("postprocess")
        before = base.get(b, {}).get("stages_ms_mean", {}).get("postprocess")
        parts.append(f"b{b} postprocess {post} ms" + (f" ({DEFAULT_NMS_ON}: {before} ms)" if before else "")
                     + f", {cell['images_per_s']:.0f} img/s")
    first = cells[min(cells)]
    delta = first["mAP_50_95"] - state["cpu_map"]
    return Check(f"nms_on.{other}", f"mAP {first['mAP_50_95']:.4f} ({delta:+.4f} vs CPU); " + "; ".join(parts),
                 "|d| <= 0.002", abs(delta) <= 0.002, data={str(b): c["stages_ms_mean"] for b, c in cells.items()})


def check_repeats(r: Runner, state: dict) -> Check:
    """`--repeats 3`: the extra processes pass the device's process check although the run holds the device."""
    try:
        cell = _cells(r.run("--backend", "pytorch", "--device", r.device, "--batch-sizes", "8", "--no-energy",
                            "--repeats", "3", timeout=240))[8]
    except RuntimeError as exc:
        return Check("repeats", status="failed", reason=str(exc))
    block = cell.get("repeats") or {}
    values = block.get("batch_ms_p50") or []
    return Check("repeats", f"batch p50 per process {values} ms, spread {block.get('spread_pct')}%"
                 + (f"; failed: {block['failed']}" if block.get("failed") else ""), "3 processes timed",
                 len(values) == 3, data=block)


# Loose for a batch-1 query of the sample's model on a GPU (a few ms): the rate found is near the pipeline's capacity,
# where queueing decides; a trial near it takes about 2 s on an H200. A rehearsal on a CPU (--device cpu: an eager
# query takes 20-350 ms on cpu-box) gets a bound it can hold, and with --limit 5 queries a sample image (10
# at least, a run's least).
SERVER_BOUND_MS = {"cuda": 50.0, "cpu": 2000.0}
SERVER_QUERIES = 300


def check_server(r: Runner, state: dict) -> Check:
    """`--scenario server --find-max-qps` at batch 1 on the device: the highest Poisson rate whose p99 holds the bound.
    A query's latency runs until its detections are on the host, so it holds the device's work: the fastest query
    cannot beat the timed pass's fastest image by much, where a clock stopped before the device finished would."""
    bound = SERVER_BOUND_MS["cuda" if r.device.startswith("cuda") else "cpu"]
    queries = min(SERVER_QUERIES, max(10, 5 * r.limit)) if r.limit else SERVER_QUERIES
    try:
        cell = _cells(r.run("--backend", "pytorch", "--device", r.device, "--batch-sizes", "1", "--no-energy",
                            "--scenario", "server", "--find-max-qps", "--latency-bound", f"{bound:g}",
                            "--server-queries", str(queries), timeout=240))[1]
    except RuntimeError as exc:
        return Check("server", status="failed", reason=str(exc))
    return server_check(_submission(cell), Path(cell["submission"]).parent.parent)


def server_check(doc: dict, run_dir: Path) -> Check:
    """The server row from a run's batch-1 submission and its samples file: the rate found, and the fastest query
    against the timed pass's fastest image (goal: at least 0.9 of it)."""
    block = doc["server"]
    fastest_image = doc["timing"]["per_image_ms"]["min"]
    trials = json.loads((run_dir / block["samples"]).read_text(encoding="utf-8"))["trials"]
    bound = f"p99 <= {block['latency_bound_ms']:g} ms"
    if block["max_qps"] is None:
        found = f"no rate held {bound}: {block['search']['why_none']}"
    else:  # the rate found is a trial's that held
        at = max((t for t in block["search"]["trials"] if t["bound_held"]), key=lambda t: t["qps"])
        found = (f"max {block['max_qps']} qps at {bound} (p99 {at['latency_ms']['p99']:.2f} ms, achieved "
                 f"{at['achieved_qps']:.1f} qps)")
    data = {"max_qps": block["max_qps"], "trials": block["search"]["trials"], "fastest_image_ms": fastest_image}
    goal = ">= 0.9x the timed pass's fastest"
    if not trials:  # the timed pass's fastest image already missed the bound: no query was served
        return Check("server", found, goal, status="not run", reason="no query served", data=data)
    fastest_query = data["fastest_query_ms"] = min(min(t["latency_samples_ms"]) for t in trials)
    ratio = fastest_query / fastest_image
    return Check("server", f"{found}; {len(trials)} trials; fastest query {fastest_query:.2f} ms, the timed pass's "
                           f"fastest image {fastest_image:.2f} ms ({ratio:.2f}x)", goal, ratio >= 0.9, data=data)


STEPS = {"env": check_env, "fakes": check_fakes, "reference": check_reference, "fp32": check_fp32,
         "precisions": check_precisions, "overhead": check_overhead, "postprocess": check_postprocess,
         "nms_on": check_nms_on, "compile": check_compile, "runtimes": check_runtimes, "parity": check_parity,
         "segment": check_segment, "preprocess": check_preprocess, "repeats": check_repeats,
         "server": check_server, "autotune": check_autotune}
CUDA_ONLY = {"precisions", "compile", "autotune"}
MIN_SECONDS = {"fakes": 20, "reference": 30, "fp32": 60, "precisions": 60, "overhead": 120, "postprocess": 30,
               "nms_on": 45, "compile": 90, "runtimes": 30, "parity": 30, "segment": 45, "preprocess": 40,
               "repeats": 45, "server": 45, "autotune": 90}


def run_checks(device: str, out: Path, budget_s: float, limit: int | None, names: tuple[str, ...]) -> list[Check]:
    out.mkdir(parents=True, exist_ok=True)
    # a signal (the device call's own time limit: SIGTERM) raises, so that the finally below still runs
    with interrupt_handling():
        runner, state, results = Runner(device, out, budget_s, limit), {}, []
        try:
            _run_each(runner, state, results, names, device, out)
        finally:  # the checks' run folders (their figures are in the results and the log)
            shutil.rmtree(runner.work, ignore_errors=True)
    return results


def _run_each(runner: Runner, state: dict, results: list[Check], names: tuple[str, ...], device: str,
              out: Path) -> None:
    for name in names:
        start = time.monotonic()
        if name in CUDA_ONLY and not device.startswith("cuda"):
            found = [Check(name, status="not run", reason="needs a CUDA device")]
        elif runner.left() < MIN_SECONDS.get(name, 0):
            found = [Check(name, status="not run", reason=f"time budget: {runner.left():.0f} s left")]
        else:
            try:
                found = STEPS[name](runner, state)
            except Exception as exc:  # one check's failure is its own line; the others still run
                found = [Check(name, status="failed", reason=f"{type(exc).__name__}: {str(exc)[:300]}")]
        found = found if isinstance(found, list) else [found]
        for check in found:
            check.seconds = round(time.monotonic() - start, 1)
            if check.passed is False and check.status == "ok":
                check.status = "failed"
        results.extend(found)
        write_reports(out, results, device)  # after every check: a call cut short still brings its figures back


def markdown(results: list[Check], env: dict) -> str:
    tag = f"{env.get('gpu', env.get('device'))}, driver {env.get('driver', '-')}, torch {env.get('torch')}"
    lines = [f"GPU acceptance ({tag})", "", "| check | figure | goal | result |", "|---|---|---|---|"]
    for c in results:
        result = c.status if c.status != "ok" else ("pass" if c.passed else "figure" if c.passed is None else "FAIL")
        text = c.figure or c.reason
        lines.append(f"| {c.name} | {text.replace('|', '/')} | {c.goal} | {result}"
                     f"{': ' + c.reason if c.reason and c.figure else ''} |")
    return "\n".join(lines) + "\n"


def write_reports(out: Path, results: list[Check], device: str) -> None:
    """gpu_check.json and gpu_check.md under `out`, for the checks done so far."""
    env = next((c.data for c in results if c.name == "env"), {"device": device})
    (out / "gpu_check.json").write_text(json.dumps({"env": env, "checks": [asdict(c) for c in results]}, indent=2,
                                                   default=str))  # a figure a check left as bytes or a path
    (out / "gpu_check.md").write_text(markdown(results, env))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for the whole call")
    parser.add_argument("--limit", type=int, default=None, help="first N sample images (default: all 206)")
    parser.add_argument("--checks", nargs="+", default=list(CHECKS), help=f"some of: {' '.join(CHECKS)}")
    args = parser.parse_args(argv)
    names = tuple(n for item in args.checks for n in item.split(",") if n)  # "a,b" was the old spelling
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        parser.error(f"unknown checks {unknown}; use some of {', '.join(CHECKS)}")
    try:
        results = run_checks(args.device, Path(args.out), args.budget, args.limit, names)
    except Interrupted as exc:  # the figures so far are already in gpu_check.json / .md under --out
        print(f"gpu_check: stopped by {exc} after the checks written to {args.out}", file=sys.stderr)
        return exc.exit_code
    print((Path(args.out) / "gpu_check.md").read_text(encoding="utf-8"))
    return 1 if any(c.status == "failed" for c in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
