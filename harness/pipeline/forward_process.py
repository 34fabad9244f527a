"""The forward in a process of its own (`--forward-process`).

On a GPU the eager forward of a small model is a stream of Python calls, each giving the interpreter lock up while
its kernel is queued and taking it back before the next; every other thread of the run's process (the overlapped
workers: decode, letterbox, finishing) takes the lock in those gaps, and the forward waits for it at every call
(harness/bench/lock_convoy.py shows it on the CPU; on an H200 the forward ran 1.18-1.85x slower in the pipeline than
alone). Host processes (host_processes.py) take the host's decode out of the run's process, but the host's cores
then do the decoding that nvJPEG does on the device. Here it is the other way round: the run's process keeps every
host stage where it is (nvJPEG, the device's letterbox and NMS included) and the core runs in a spawned process whose
only thread runs it, with an interpreter lock that nothing else wants.

Batches cross through slots: an input slot per forward in flight, allocated by the run (on the core's device: a CUDA
allocation shared by its IPC handle; on the host: shared memory), and an output slot each, allocated by the forward's
process when it first sees the outputs; each the batch's own size (made anew when that changes: a slot sized for the
run's largest batch would count in a smaller cell's memory). A slot crosses the pipe when it is made, and then only
its index does. The run copies a prepared batch into its slot and waits for the copy (its own stream only) before it
sends the index; the forward's process runs the core on the slot, waits for its stream, copies the outputs into its
output slot, waits again and answers with the forward's own time (the `forward` stage: the runtime's own clock for
its call where it has one, as in the run's process, else the core's call and its stream's work; never the
hand-over, which latency mode counts as transfer). The run copies the outputs out of the slot (the slot is written
again two forwards later, while the batch may still be finishing) and waits for that copy. The process sets what
the run sets process-wide (torch's threads, TF32) before it loads the core, and loads it for one forward at a time
(OpenVINO compiles for latency, not for requests in flight).

Two forwards may be in flight (the core's `start`/`collect`): the next batch is in the slot while the forward of the
one before runs, so the forward's process never waits for the run between batches. The process ignores the signals a
terminal sends its whole process group, ends with the run (Linux: PR_SET_PDEATHSIG), and when its pipe is closed.

A replaced CUDA slot stays allocated in the process that made it after both processes let go of it, until collected
(`torch.cuda.ipc_collect`): each side collects once the other has taken the new slot, and when the process ends, so
that the old size does not count in the next cell's memory. A request or an answer that cannot cross (a CUDA handle
that does not open or share there) is answered with its reason; the process then ends, and the next forward gets a
new one.

What it cannot do, it says: no per-layer timing (the module is in the other process). Its own memory peaks come back
for the record (`memory_peaks`), added to the run's.
"""

from __future__ import annotations

import atexit
import os
import signal
import time
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

import torch
import torch.multiprocessing

from harness.backends import BackendOptions, load_detector_core
from harness.measure.device import Device
from harness.measure.env import apply_tf32
from harness.measure.memory import process_peaks
from harness.pipeline.host_processes import HostProcessTraceback, _describe_exit, _end_with, stop_signals_blocked
from harness.process_exit import STOP_SIGNALS, before_leave

SLOTS = 2  # forwards in flight: the next batch crosses while the one before runs


class ForwardProcessError(RuntimeError):
    """The forward's process ended, or could not start."""


@dataclass(frozen=True)
class CoreLoad:
    """What the forward's process needs to load the run's core: the model as the run names it (a registry id or a
    `file.py:factory` plugin), its weights, and the load's settings."""

    model: str
    weights: str | None
    backend: str
    device: Device
    precision: str
    input_size: tuple[int, int]
    options: BackendOptions
    threads: int | None


class ForwardProcessCore:
    """A core loaded and run in a spawned process of its own (see the module docstring), with the Core protocol's
    async forwards (`start`/`collect`, `async_slots` 2). Its `backend`, `format`, `provider`, `precision`, whether it
    takes device tensors and `info()` are the loaded core's."""

    forward_elsewhere = True  # CUDA events on the run's streams do not bracket its forward
    async_slots = SLOTS
    concurrent_forwards = 1  # one thread runs them one after another: the slots only hand the next batch over

    def __init__(self, load: CoreLoad):
        self.load = load
        self.device = load.device
        self._context = torch.multiprocessing.get_context("spawn")
        self._connection: Connection | None = None
        self._process = None
        self.restarts = 0  # processes started again after one ended
        self._take(self._launch())
        before_leave(self.close)
        atexit.register(self.close)

    def _take(self, ready: dict) -> None:
        """The loaded core's facts, as its process said them."""
        self.backend, self.format, self.provider, self.precision = (ready[k] for k in ("backend", "format",
                                                                                       "provider", "precision"))
        self.takes_device_tensors: bool = ready["takes_device_tensors"]
        self._info: dict = ready["info"]

    def _launch(self) -> dict:
        """Start the process and wait for its core to load: what it says of the core. Slots and counts start anew."""
        self._connection, theirs = self._context.Pipe()
        self._process = self._context.Process(target=_serve, args=(theirs, self.load, os.getpid()), daemon=True,
                                              name="va-forward-process")
        with stop_signals_blocked():  # a Ctrl-C while it starts would print its imports' traceback: the run stops it
            self._process.start()
        theirs.close()  # the child's end lives in the child: its exit then shows here as the end of the pipe
        self._inputs: list[torch.Tensor | None] = [None] * SLOTS
        self._outputs: list[list[torch.Tensor] | None] = [None] * SLOTS
        self._started = 0  # forwards started, and collected: a ticket is its start's number
        self._collected = 0
        self._released_by = None  # the ticket whose forward lets go of a replaced CUDA input slot (see collect)
        try:  # no deadline: a load may compile, capture or build an engine for minutes, as it would in the run
            return self._answer("loading the core")
        except BaseException:
            self.close()
            raise

    def _between_forwards(self) -> None:
        """A request other than a forward: its answer would be read as a forward's while one is in flight."""
        if self._started != self._collected:
            raise RuntimeError("a forward is in flight: collect it first")
        self._running()

    def _running(self) -> None:
        """A process that ended (a failed cell's, or one killed while idle: the out-of-memory killer during the
        scoring) is started again, the core loaded anew, for the group's next cell: its warm-up, not its timed
        pass, pays for the load (counted in info()'s `restarts`)."""
        if self._process is not None and not self._process.is_alive():
            self.close()
        if self._process is None:
            self._take(self._launch())
            self.restarts += 1

    def info(self) -> dict:
        """The loaded core's info, with where it runs."""
        return {**self._info, "forward_process": {"start": "spawn", "slots": SLOTS, "restarts": self.restarts},
                "layers_unavailable": "the forward runs in a process of its own (--forward-process): its layers are "
                                      "not in this one"}

    def start(self, batch: torch.Tensor) -> int:
        """Hand `batch` to the forward's process (copied into the next input slot); the ticket to collect it with."""
        if self._started == self._collected:  # nothing in flight: where the process ended, a new one
            self._running()
        ticket = self._started
        if ticket - self._collected >= SLOTS:
            raise RuntimeError(f"{SLOTS} forwards are in flight already: collect one first")
        slot, size = ticket % SLOTS, len(batch)
        held, fresh = self._inputs[slot], None
        # a slot the batch's own size (a larger one would count in a smaller cell's memory): made anew when it changes
        if (held is None or held.shape != batch.shape or held.dtype != batch.dtype or held.device != batch.device):
            if held is not None and held.is_cuda:  # the other process holds the old one until it takes this
                self._released_by = ticket
            held = torch.empty(batch.shape, dtype=batch.dtype, device=batch.device)
            if not held.is_cuda:
                held.share_memory_()
            self._inputs[slot] = fresh = held
        held.copy_(batch)
        if held.is_cuda:  # the forward's process reads the slot once told: the copy is done by then
            torch.cuda.current_stream(held.device).synchronize()
        self._send(("forward", slot, size, fresh))
        self._started += 1
        return ticket

    def collect(self, ticket: int) -> tuple[list[torch.Tensor], int]:
        """The outputs of the forward started as `ticket` (the run's own tensors) and the forward's own time (ns),
        collected in start order."""
        if self._connection is None:
            raise ForwardProcessError("the forward's process was closed")
        if ticket != self._collected:
            raise RuntimeError(f"forward {ticket} collected out of order (next: {self._collected})")
        self._collected += 1
        slot, forward_ns, fresh = self._answer("running the forward")
        if self._released_by is not None and ticket >= self._released_by:
            # a CUDA block shared with another process stays allocated here after both let go of it, until
            # collected: the replaced slot would count in this cell's memory
            self._released_by = None
            torch.cuda.ipc_collect()
        if fresh is not None:
            self._outputs[slot] = fresh
        outputs = [held.clone() for held in self._outputs[slot]]
        if any(t.is_cuda for t in outputs):  # the slot is written again two forwards on: the copies are done first
            torch.cuda.current_stream(outputs[0].device).synchronize()
        return outputs, forward_ns

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        return self.collect(self.start(batch))[0]

    def prepare_shape(self, shape: tuple[int, ...]) -> None:
        """The core's own preparation for a batch shape (compile, capture), where it has one, untimed."""
        self._between_forwards()
        self._send(("prepare_shape", shape))
        self._answer("preparing a batch shape")

    def memory_peaks(self, reset: bool = False) -> dict:
        """The forward's process's own peaks since the last reset (measure.memory.process_peaks): resident memory and
        device memory allocated through torch (None, with `vram_reason`, for a core that allocates outside it);
        `reset` starts new peaks."""
        self._between_forwards()
        self._send(("memory_peaks", reset))
        return self._answer("reading its memory")

    def close(self) -> None:
        """End the process (closing its pipe ends it; one that does not end within 5 s is terminated). A later
        forward starts a new one."""
        self._collected = self._started  # the forwards in flight, if any, are lost with it
        # its output slots let go before it ends (CUDA IPC: a producer that ends first warns of tensors still held)
        self._inputs, self._outputs = [None] * SLOTS, [None] * SLOTS
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._process is not None:
            self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join()
            self._process = None
            if self.device.is_cuda and torch.cuda.is_initialized():  # the slots it let go of, handed back
                torch.cuda.ipc_collect()
            self._released_by = None

    def _send(self, message: tuple) -> None:
        if self._connection is None:
            raise ForwardProcessError("the forward's process was closed")
        try:
            self._connection.send(message)
        except (EOFError, OSError) as exc:
            raise self._ended("taking a batch") from exc
        except BaseException:  # interrupted mid-message (Ctrl-C): what the pipe holds is no longer known
            self.close()
            raise

    def _answer(self, doing: str):
        """The next answer of the forward's process: its value, or its error raised here."""
        if self._connection is None:
            raise ForwardProcessError("the forward's process was closed")
        try:
            status, value, where = self._connection.recv()
        except (EOFError, OSError) as exc:
            raise self._ended(doing) from exc
        except BaseException:  # interrupted before the answer was read whole: a later one would be read as the next's
            self.close()
            raise
        if status == "ended":  # its last word: it is ending, and the next forward gets a new one
            self.close()
        if status in ("error", "ended"):
            raise value from HostProcessTraceback(where)
        return value

    def _ended(self, doing: str) -> ForwardProcessError:
        process = self._process
        self.close()
        ended = _describe_exit(process.exitcode) if process is not None and process.exitcode is not None else \
            "its exit status unknown"
        return ForwardProcessError(f"the forward's process ended while {doing} ({ended}); the machine's memory (and "
                                   "the device's) are the first things to check")


# --- in the forward's process ---

def _serve(connection: Connection, load: CoreLoad, parent: int) -> None:
    """The forward's process: load the core, say so (its facts, or the error), then answer each request in order:
    ("forward", slot, size, new input slot or None), ("prepare_shape", shape), ("memory_peaks", reset); until the run
    closes its end."""
    _end_with(parent)
    for number in (n for n in STOP_SIGNALS if n != signal.SIGTERM):  # the run decides how to stop, and closes this
        signal.signal(number, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # blocked by the run while this process started
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
    try:
        from harness.models.registry import get_detector

        # what the run sets process-wide, set here too: the core's threads and TF32
        if load.threads:
            torch.set_num_threads(load.threads)
        apply_tf32(load.options.tf32)
        # one forward at a time here: a runtime with streams of its own (OpenVINO) compiles for it, not for
        # requests in flight that this process's one thread would never start
        options = replace(load.options, overlap=False)
        detector = get_detector(load.model, load.weights)
        core = load_detector_core(detector, load.backend, load.device, load.precision, load.input_size,
                                  options=options, threads=load.threads)
        takes_device = getattr(core, "takes_device_tensors", getattr(core, "torch_module", None) is not None)
        ready = {"backend": core.backend, "format": core.format, "provider": core.provider,
                 "precision": core.precision, "takes_device_tensors": takes_device, "info": core.info()}
        reply = ("ok", ready, "")
    except Exception as exc:
        _reply(connection, ("error", exc, traceback.format_exc()))
        return
    if not _reply(connection, reply):
        return
    inputs: list[torch.Tensor | None] = [None] * SLOTS
    outputs: list[list[torch.Tensor] | None] = [None] * SLOTS
    served, collect_at = 0, None  # forwards answered; the one by which the run has let go of replaced outputs
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):  # the run closed it (or ended): done
            return
        except Exception as exc:  # a slot that could not be opened here (CUDA IPC): the run hears why, then ends this
            _reply(connection, ("ended", exc, traceback.format_exc()))
            return
        try:
            kind, *args = request
            if kind == "forward":
                if collect_at is not None and served >= collect_at:
                    collect_at = None  # the run answered for the replaced outputs two forwards ago: hand them back
                    torch.cuda.ipc_collect()
                answer = _forward(core, load, inputs, outputs, *args)
                if answer[2] is not None and load.device.is_cuda:
                    collect_at = served + SLOTS  # the run takes the new slot before it starts that forward
                served += 1
                reply = ("ok", answer, "")
            elif kind == "prepare_shape":
                prepare = getattr(core, "prepare_shape", None)
                if prepare is not None:
                    with torch.inference_mode():
                        prepare(*args)
                reply = ("ok", None, "")
            else:  # memory_peaks
                reply = ("ok", _memory_peaks(core, load.device, *args), "")
        except Exception as exc:
            if load.device.is_cuda:  # out of memory: what the allocator caches goes back, as the run's own does
                torch.cuda.empty_cache()
            outputs[:] = [None] * SLOTS  # whether the run got the new output slots is unknown: the next forward's
            reply = ("error", exc, traceback.format_exc())
        if not _reply(connection, reply):  # the run and this process no longer agree on the slots: it starts anew
            return


def _forward(core, load: CoreLoad, inputs: list, outputs: list, slot: int, size: int,
             fresh: torch.Tensor | None) -> tuple:
    """One forward on input slot `slot` (a batch of `size`): (the slot, the forward's ns: the runtime's own time for
    its call where it measures one (Core.forward_borrowed, as the run's forward stage is in its own process), else
    the call and its stream's work; the output slot's tensors where they are new, else None)."""
    if fresh is not None:
        inputs[slot] = fresh
    borrowed = getattr(core, "forward_borrowed", None)
    clock = time.perf_counter_ns()
    with torch.inference_mode():
        if borrowed is not None:  # its outputs are the runtime's buffers until its next forward: copied below
            raw, forward_ns = borrowed(inputs[slot])
        else:
            raw = core(inputs[slot])
            load.device.synchronize_stream()
            forward_ns = time.perf_counter_ns() - clock
    if any(t.dim() == 0 or t.shape[0] != size for t in raw):
        raise ValueError(f"--forward-process needs outputs whose first dimension is the batch ({size}); the core "
                         f"gave {[tuple(t.shape) for t in raw]}: run it without --forward-process")
    held, new = outputs[slot], None
    if held is None or len(held) != len(raw) or any(
            h.shape != t.shape or h.dtype != t.dtype or h.device != t.device for h, t in zip(held, raw, strict=False)):
        held = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in raw]
        for t in held:
            if not t.is_cuda:
                t.share_memory_()
        outputs[slot] = new = held
    for h, t in zip(held, raw, strict=True):
        h.copy_(t)
    load.device.synchronize_stream()  # the run reads the slot once answered
    return slot, forward_ns, new


def _memory_peaks(core, device: Device, reset: bool) -> dict:
    if device.is_cuda and torch.cuda.is_initialized():  # output slots the run has let go of: no longer this process's
        torch.cuda.ipc_collect()
    peaks = process_peaks(device, reset)
    if device.is_cuda and getattr(core, "torch_module", None) is None:
        peaks.update(peak_vram_mb=None, peak_vram_reserved_mb=None,
                     vram_reason=f"the {core.backend} core allocates outside torch's allocator")
    return peaks


def _reply(connection: Connection, reply: tuple) -> bool:
    """Send `reply`. One that cannot cross is pickled whole before a byte is sent, so the run gets the reason
    instead: an error that does not pickle as its text (the pipe in step, True); an answer (a forward's new output
    slots that could not be shared) as "ended" (False: this process then ends, and the run, told so, starts a new one
    for its next forward)."""
    try:
        try:
            connection.send(reply)
            return True
        except (EOFError, OSError):
            raise
        except Exception as exc:
            if reply[0] == "error":
                connection.send(("error", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}"), reply[2]))
                return True
            connection.send(("ended", RuntimeError(f"its answer could not be sent ({type(exc).__name__}: {exc})"),
                             traceback.format_exc()))
            return False
    except (EOFError, OSError):  # the run is gone (stopped, killed): nobody to answer, and nothing to say about it
        os._exit(0)
