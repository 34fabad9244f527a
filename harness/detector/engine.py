"""Serialized TensorRT engines as files (`--weights model.engine`, built by `trtexec`): what a family and a plan
need to know about one before any GPU work.

The leaderboard's own harness accepts such engines with a JSON sidecar describing the build
(`model.engine.json`, or `model.json` beside it). The sidecar needs `command` (the trtexec command
line); it may add `precision` (fp32|fp16|bf16: needed when the command is --stronglyTyped),
`tensorrt_version` and anything else, all recorded verbatim in runtime.engine_manifest. The engine's
precision and TF32 use are read from the command's flags (--fp16, --bf16, --noTF32): the run's
--precision and --tf32 must agree with them, since an engine's precision is fixed when it is built.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.detector.protocol import Core, ModelStats, WeightsInfo
from harness.detector.source import CoreSource
from harness.errors import UsageError
from harness.files import file_sha256

INSTALL = "pip install tensorrt-cu12 (or tensorrt-cu13, matching your CUDA)"
ENGINE_SUFFIXES = (".engine", ".plan")
# trtexec flags that let TensorRT pick precisions va-bench has no coordinate for (int8, fp8, int4; --best: any)
UNBENCHMARKED_FLAGS = ("--int8", "--fp8", "--int4", "--best")
SIDECAR_FIELDS = ('"command" (the trtexec command line), optional "precision" (fp32|fp16|bf16), '
                  '"tensorrt_version"')


def is_engine_file(weights: str | Path | None) -> bool:
    """Whether --weights names a serialized TensorRT engine (by its suffix: .engine or .plan)."""
    return weights is not None and str(weights).lower().endswith(ENGINE_SUFFIXES)


def tensorrt_installed() -> bool:
    return importlib.util.find_spec("tensorrt") is not None


def manifest_path(engine: Path) -> Path | None:
    """The engine's JSON sidecar: `x.engine.json`, else `x.json`; None when neither exists."""
    for candidate in (engine.with_name(engine.name + ".json"), engine.with_suffix(".json")):
        if candidate.is_file():
            return candidate
    return None


def read_manifest(engine: Path) -> dict[str, Any]:
    """The sidecar as a dict (json, never executed); a missing or unreadable one is a UsageError."""
    path = manifest_path(engine)
    if path is None:
        raise UsageError(f"--weights {engine}: no JSON sidecar ({engine.name}.json) describing how the engine was "
                         f"built; write one with {SIDECAR_FIELDS}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable JSON sidecar ({exc}); fix the file") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: the sidecar must be a JSON object")
    return data


class EngineManifest(BaseModel):
    """The sidecar fields the harness relies on; every other key is kept and recorded as it is."""

    model_config = ConfigDict(extra="allow")

    command: str = Field(min_length=1)
    precision: Literal["fp32", "fp16", "bf16"] | None = None
    tensorrt_version: str | None = None


@dataclass(frozen=True)
class EngineBuild:
    """How an engine was built, from its sidecar: the precision and TF32 use its command gives, and the
    sidecar itself (recorded verbatim)."""

    precision: str
    tf32: bool  # trtexec lets fp32 layers run in TF32 unless built with --noTF32
    sidecar: Path
    manifest: dict[str, Any]


def engine_build(engine: Path) -> EngineBuild:
    """Read and check the engine's sidecar; one UsageError line when it is missing, malformed or says a
    precision va-bench does not benchmark (int8/fp8/--best), or contradicts its own command."""
    data = read_manifest(engine)
    path = manifest_path(engine)
    try:
        manifest = EngineManifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"{path}: {where}: {err['msg']}; the sidecar needs {SIDECAR_FIELDS}") from exc
    try:
        flags = {token.split("=", 1)[0] for token in shlex.split(manifest.command)}  # tokenised, never run
    except ValueError as exc:
        raise UsageError(f"{path}: \"command\" is not a command line ({exc}); fix the file") from exc
    unbenchmarked = [f for f in UNBENCHMARKED_FLAGS if f in flags]
    if unbenchmarked:
        raise UsageError(f"{engine.name} was built with {unbenchmarked[0]} ({path.name}); va-bench benchmarks fp32, "
                         "fp16 and bf16 engines: rebuild it without that flag")
    typed = [p for p in ("fp16", "bf16") if f"--{p}" in flags]
    if len(typed) > 1:
        raise UsageError(f"{engine.name} was built with both --fp16 and --bf16 ({path.name}): TensorRT picks per "
                         "layer, and a run records one precision; rebuild it with one of them")
    # --stronglyTyped: the network's own tensor types decide, so only the sidecar can say the precision
    from_command = None if "--stronglyTyped" in flags else (typed[0] if typed else "fp32")
    if manifest.precision and from_command and manifest.precision != from_command:
        raise UsageError(f"{path}: \"precision\" is {manifest.precision}, but its command builds {from_command}; "
                         "fix the sidecar")
    precision = manifest.precision or from_command
    if precision is None:
        raise UsageError(f"{path}: the engine is --stronglyTyped, so its command does not say its precision; add "
                         "\"precision\": \"fp32\", \"fp16\" or \"bf16\" to the sidecar")
    return EngineBuild(precision, "--noTF32" not in flags, path, data)


def check_engine_weights(weights: str, device_kind: str) -> EngineBuild:
    """Refuse a serialized engine that cannot run here (before any model is loaded): no file, no GPU,
    no `tensorrt` package, a missing or bad sidecar. Returns what the sidecar says about the build."""
    engine = Path(weights)
    if not engine.is_file():
        raise UsageError(f"--weights {engine}: no such file")
    if device_kind != "cuda":
        raise UsageError(f"--weights {engine.name} is a TensorRT engine: it runs on a GPU only; add --device cuda")
    if not tensorrt_installed():
        raise UsageError(f"--weights {engine.name} is a TensorRT engine, but the `tensorrt` package is not "
                         f"installed; {INSTALL}")
    return engine_build(engine)


def engine_core_source(name: str, engine: Path) -> CoreSource:
    """A family's CoreSource for a serialized engine (only the tensorrt backend runs it)."""
    return CoreSource(name, engine_file=engine)


def engine_weights(engine: Path) -> WeightsInfo:
    """The weights identity of an engine run: the engine file and its sha256."""
    return WeightsInfo(file=engine.name, sha256=file_sha256(engine),
                       source="--weights (serialized TensorRT engine; its build: runtime.engine_manifest)")


def engine_model_stats() -> ModelStats:
    """Parameters and FLOPs are counted on an ONNX graph or torch module; an engine is neither."""
    reason = ("a serialized TensorRT engine: no ONNX graph or torch module to count on (inspect the ONNX it was "
              "built from)")
    return ModelStats(notes={"params_millions": reason, "gflops": reason})


def probe_outputs(core: Core, input_size: tuple[int, int]) -> list[tuple[int, ...]]:
    """The output shapes of one zero batch of 1 (an engine's graph cannot be read before it runs)."""
    import torch

    return [tuple(t.shape) for t in core(torch.zeros(1, 3, *input_size))]
