"""The ONNX Runtime backend: an ONNX source as it is, or a torch core exported (harness/backends/export.py)."""

from __future__ import annotations

import hashlib
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx
import torch

from harness.backends import BackendOptions
from harness.backends.onnx_graph import has_onnx_graph
from harness.backends.pytorch import device_name
from harness.backends.support import GPU_EXTRA, ORT_PROVIDERS, ort_provider_for
from harness.detector.source import CoreSource
from harness.errors import UsageError
from harness.files import move_into_place
from harness.measure.device import Device
from harness.storage import discard_cut_write

ORT_PROVIDER_NAMES = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "cuda",
}


# How ONNX Runtime's intra-op threads wait: the harness's setting, and the two the runtime itself offers
SPINNING = {"during-run": "spin within each Run(), stopped when it ends (session.force_spinning_stop)",
            "on": "spin, also between Run() calls (ONNX Runtime's default)",
            "off": "never spin (session.intra_op.allow_spinning 0)"}


class OnnxRuntimeCore:
    """An ONNX Runtime session. On CUDA the session copies host<->device itself (no transfer stage).

    The provider asked for (`options.ort_provider`: cpu, cuda or tensorrt) is the only one tried
    besides the CPU provider ORT always keeps for nodes no other provider takes; after the session is
    built, the provider it actually runs is read back (`session.get_providers()`), and a requested
    provider ORT dropped (it does so with only a log line when e.g. CUDA libraries are missing) is an
    error, never a CPU run under a GPU label.
    """

    backend = "onnxruntime"
    format = "onnx"

    def __init__(self, model: onnx.ModelProto, device: Device, threads: int | None, precision: str = "fp32",
                 spinning: str = "during-run", *, options: BackendOptions):
        provider = ort_provider_for(device.kind, options.ort_provider)
        self.precision_mode = "fp32 (IEEE)"
        if precision == "fp16" and provider == "cuda":
            model, self.precision_mode = to_fp16(model)
        self._wanted = [(ORT_PROVIDERS[provider], self._provider_options(provider, precision, options, device,
                                                                          model))]
        if provider == "tensorrt":  # nodes TensorRT does not take run on CUDA, not on the CPU (ORT's TensorRT EP docs)
            self._wanted.append(("CUDAExecutionProvider", {"device_id": device.index, **cuda_tf32(options.tf32)}))
        if provider != "cpu":
            self._wanted.append(("CPUExecutionProvider", {}))
        self._model = model
        self.threads = threads
        if spinning not in SPINNING:
            raise ValueError(f"spinning {spinning!r}: one of {', '.join(SPINNING)}")
        self.spinning = spinning
        self.session = self._session()
        self.input_name = self.session.get_inputs()[0].name
        self.execution_provider = self.session.get_providers()[0]
        if self.execution_provider != self._wanted[0][0]:
            raise UsageError(f"ONNX Runtime dropped the requested {self._wanted[0][0]} (the session runs on "
                             f"{', '.join(self.session.get_providers())}); check the CUDA/TensorRT libraries "
                             f"onnxruntime-gpu needs, or {GPU_EXTRA}")
        self.provider = ORT_PROVIDER_NAMES.get(self.execution_provider, self.execution_provider.lower())
        if self.execution_provider == "TensorrtExecutionProvider":
            # the site's vocabulary: TensorRT is a format (`tensorrt`) run on the `cuda` provider
            self.format, self.provider = "tensorrt", "cuda"
        self.precision = precision
        self.device = device
        self.torch_module = None
        self.takes_device_tensors = False  # host memory in; ONNX Runtime copies it to its provider's device
        self.export_info: dict[str, Any] | None = None  # set when the graph is an export of a torch core
        self.engine_build_seconds: float | None = None

    @staticmethod
    def _provider_options(provider: str, precision: str, options: BackendOptions, device: Device,
                          model: onnx.ModelProto) -> dict[str, Any]:
        if provider == "cpu":
            return {}
        # `--device cuda:1` must run on GPU 1: both GPU providers default to device 0
        gpu = {"device_id": device.index}
        if provider == "cuda":
            return {**gpu, **cuda_tf32(options.tf32)}
        # ORT names a cached engine after the graph's input, node and initializer names, not its weights or shapes:
        # one folder per graph (by its bytes' SHA-256), or another model of the same names would run this one's engine
        graph_sha = hashlib.sha256(model.SerializeToString()).hexdigest()
        cache = Path(options.trt_cache_dir).expanduser() / graph_sha[:16]
        return {**gpu, "trt_fp16_enable": precision == "fp16", "trt_engine_cache_enable": True,
                "trt_engine_cache_path": str(cache), "trt_max_workspace_size": options.trt_workspace_mb * 2**20}

    def build_engine(self, input_size: tuple[int, int], max_batch: int) -> None:
        """TensorRT: the first Run() at each shape builds (or loads from the cache) an engine; do it at load,
        for batch 1 and the largest batch, so the build is reported apart and never falls in a timed batch."""
        clock = time.perf_counter()
        for batch in sorted({1, max_batch}):
            self(torch.zeros(batch, 3, *input_size))
        self.engine_build_seconds = round(time.perf_counter() - clock, 3)

    def _session(self, profile_prefix: str | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if self.threads:
            options.intra_op_num_threads = self.threads
        options.log_severity_level = 3
        # ORT's workers spin between the parallel sections of a Run() (a plain ORT loop is ~30 % faster at batch 1
        # than without spinning) and, by default, for a while after it, which takes the cores from the host stages
        # that follow: "during-run" spins within each Run() and stops when it ends (session.force_spinning_stop).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0" if self.spinning == "off" else "1")
        if self.spinning == "during-run":
            options.add_session_config_entry("session.force_spinning_stop", "1")
        if profile_prefix is not None:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        try:
            return ort.InferenceSession(self._model.SerializeToString(), options, providers=self._wanted)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            raise UsageError(f"ONNX Runtime cannot load this graph ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:300]})") from exc

    def profiling_copy(self, prefix: str) -> OnnxRuntimeCore:
        """A second session of the same model with ORT's per-node profiler on (for the layer pass);
        `finish_profile` ends it."""
        copy = OnnxRuntimeCore.__new__(OnnxRuntimeCore)
        copy.__dict__.update(self.__dict__)
        copy.session = self._session(profile_prefix=prefix)
        return copy

    def finish_profile(self, trace_path: Path) -> tuple[list, str]:
        """End the profiling copy's session: its Chrome trace moves to `trace_path`; its node calls and how
        they were measured."""
        from harness.measure.layers import ort_profile_calls

        written = Path(self.session.end_profiling())
        try:  # read where ORT wrote it: a trace it cut short (it does not say when the disk is full) never lands
            calls = ort_profile_calls(written)
        except ValueError as exc:
            full = discard_cut_write(written, written)
            if full is not None:
                raise full from exc
            raise ValueError(f"ONNX Runtime's profile is not complete JSON ({str(exc)[:80]}): it stopped writing it "
                             "with room left on the disk") from exc
        move_into_place(written, trace_path)
        return calls, "ONNX Runtime per-node profiler (SessionOptions.enable_profiling)"

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        outputs = self.session.run(None, {self.input_name: batch.numpy()})
        return [torch.from_numpy(o) for o in outputs]

    def info(self) -> dict[str, Any]:
        import onnxruntime as ort

        return {
            "backend": self.backend,
            "execution_provider": self.execution_provider,
            "providers": self.session.get_providers(),
            "onnxruntime": ort.__version__,
            "intra_op_num_threads": self.threads,
            "intra_op_spinning": SPINNING[self.spinning],
            "device_name": device_name(self.device),
            "precision_mode": self.precision_mode,
            "provider_options": {name: opts for name, opts in self._wanted if opts},
            **({"engine_build_seconds": self.engine_build_seconds,
                "engine_build_note": "TensorRT engines built (or read from the cache) at load, for batch 1 and "
                                     "the largest batch; never inside a timed batch"}
               if self.engine_build_seconds is not None else {}),
            **({"exported_from_pytorch": self.export_info} if self.export_info else {}),
        }


def cuda_tf32(mode: str) -> dict[str, int]:
    """The CUDA provider's TF32 switch for --tf32: it runs fp32 convolutions and matmuls in TF32 unless told
    otherwise, so `off` (IEEE fp32, the default) must say so; `default` leaves ONNX Runtime's own (on)."""
    return {} if mode == "default" else {"use_tf32": int(mode == "on")}


def to_fp16(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The graph with fp16 weights and compute (onnxconverter-common), fp32 inputs/outputs kept (a Cast at
    each end), so the pipeline feeds and decodes fp32 as for every other precision."""
    from importlib.metadata import version

    from onnxconverter_common import float16

    with warnings.catch_warnings():  # it warns once per tiny weight it clamps to fp16's range: noise here
        warnings.simplefilter("ignore", UserWarning)
        converted = float16.convert_float_to_float16(model, keep_io_types=True)
    return converted, f"onnxconverter-common {version('onnxconverter-common')} float16 (keep_io_types=True)"


class OnnxRuntimeBackend:
    """ONNX Runtime (CPU; CUDA when the device is a GPU and the CUDA provider is installed)."""

    name = "onnxruntime"

    def supports(self, source: CoreSource) -> bool:
        return has_onnx_graph(source)

    def load(self, source: CoreSource, device: Device, precision: str, input_size: tuple[int, int],
             threads: int | None, options: BackendOptions) -> OnnxRuntimeCore:
        from harness.backends.export import check_export, export_core
        from harness.detector.graph import check_batch_rows

        if source.onnx_model is not None:
            core = OnnxRuntimeCore(source.onnx_model(), device, threads, precision, options=options)
            if source.check_batches:
                check_batch_rows(source.name, core, input_size, source.check_batches, source.query_rows)
        else:
            module = source.torch_module().eval()
            model, path = export_core(source.name, module, input_size)
            core = OnnxRuntimeCore(model, device, threads, precision, options=options)
            # the export is checked in IEEE fp32: an fp16 or TF32 row's own session differs from the module by more
            # than the check's tolerance, so the same graph is checked on the CPU provider instead
            ieee = precision == "fp32" and (core.provider == "cpu"
                                            or (core.execution_provider == "CUDAExecutionProvider"
                                                and options.tf32 == "off"))
            checked = core if ieee else OnnxRuntimeCore(model, Device("cpu"), threads,
                                                        options=replace(options, ort_provider="cpu"))
            core.export_info = {"file": str(path), **check_export(source.name, module, checked, input_size, path,
                                                                  rows_as_set=source.query_rows),
                                "checked_on": "this session" if ieee else "ONNX Runtime CPU, fp32"}
        if core.execution_provider == "TensorrtExecutionProvider":
            core.build_engine(input_size, options.max_batch)
        return core
