"""Typed view of `va.submission.v1` (pydantic): reads the site's files unchanged (legacy
`eval.numImages`, no `dataset` block, `benchmark.libreyolo_commit`) and the additions va-bench
writes. Every block allows extra keys: v1 is open, and nothing a submission carries is dropped."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harness.data.variants import KNOWN_FINGERPRINTS, VAL2017_NUM_IMAGES
from harness.hardware import derive_hardware_id
from harness.results.site_rules import as_stated_by_site, parse_iso8601

# the runtime a format names when a file does not say which ran it (the site's files name none)
FORMAT_RUNTIME = {"onnx": "onnxruntime"}


class Block(BaseModel):
    # protected_namespaces: pydantic < 2.10 warns of the `model_stats` field (a `model_` prefix) on every import
    model_config = ConfigDict(extra="allow", populate_by_name=True, protected_namespaces=())


SEGMENT_TASKS = ("segment", "segmentation")  # the site's model.task values of its segmentation board


class ModelBlock(Block):
    id: str | None = None
    family: str | None = None
    variant: str | None = None
    task: str | None = None
    input_size: float | None = None


class ConfigBlock(Block):
    batch_size: int | None = None
    input_size: float | None = None
    conf: float | None = None
    iou: float | None = None
    max_det: int | None = None


class HardwareBlock(Block):
    id: str | None = None
    gpu: str | None = None
    cpu: str | None = None
    cpu_cores: int | None = None
    ram_gb: float | None = None


class RuntimeBlock(Block):
    format: str | None = None
    precision: str | None = None
    provider: str | None = None
    device: str | None = None
    tf32: dict[str, Any] | None = None


class DatasetBlock(Block):
    id: str | None = None
    split: str | None = None
    num_images: int | None = None
    variant: str | None = None
    image_id_sha256: str | None = None


class EvalBlock(Block):
    num_images: int | None = Field(None, alias="numImages")
    max_dets: Any = Field(None, alias="maxDets")  # COCOeval's maxDets; absent in the site's COCO rows (COCO's)


class BenchmarkBlock(Block):
    harness: str | None = None
    harness_version: str | None = None
    libreyolo_commit: str | None = None


class Submission(Block):
    """One submission; blocks the site requires are Optional here so that validation, not parsing,
    reports what is missing."""

    schema_version: str | None = None
    submission_id: str | None = None
    created_at: str | None = None
    benchmark: BenchmarkBlock = Field(default_factory=BenchmarkBlock)
    model: ModelBlock = Field(default_factory=ModelBlock)
    config: ConfigBlock = Field(default_factory=ConfigBlock)
    hardware: HardwareBlock = Field(default_factory=HardwareBlock)
    runtime: RuntimeBlock = Field(default_factory=RuntimeBlock)
    dataset: DatasetBlock | None = None
    eval: EvalBlock | None = None
    accuracy: dict[str, Any] = Field(default_factory=dict)
    timing: dict[str, Any] = Field(default_factory=dict)
    throughput: dict[str, Any] = Field(default_factory=dict)
    memory: dict[str, Any] | None = None
    model_stats: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    repro: dict[str, Any] | None = None

    # -- coordinates, derived the same way everywhere ------------------------------------------
    @property
    def num_images(self) -> int | None:
        for value in (self.dataset.num_images if self.dataset else None,
                      self.eval.num_images if self.eval else None, self.timing.get("num_images")):
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    @property
    def image_id_sha256(self) -> str | None:
        if self.dataset and self.dataset.image_id_sha256:
            return self.dataset.image_id_sha256
        dataset = (self.repro or {}).get("dataset")
        return dataset.get("image_id_sha256") if isinstance(dataset, dict) else None

    @property
    def annotations_sha256(self) -> str | None:
        """The ground truth the file was scored on (repro.dataset.annotations_sha256), where recorded."""
        dataset = (self.repro or {}).get("dataset")
        value = dataset.get("annotations_sha256") if isinstance(dataset, dict) else None
        return value if isinstance(value, str) else None

    @property
    def backend(self) -> str:
        """The runtime that ran the core: runtime.backend where recorded (va-bench's files), else the runtime the
        format names (the site's files name none: onnx is ONNX Runtime's). Two runtimes can share a format and
        provider (ONNX Runtime's TensorRT provider and a native TensorRT engine are both tensorrt/cuda)."""
        backend = getattr(self.runtime, "backend", None)
        if isinstance(backend, str) and backend:
            return backend
        return FORMAT_RUNTIME.get(self.runtime.format or "", self.runtime.format or "?")

    @property
    def preprocess(self) -> str:
        """The preprocessing implementation that made the model's input (cv2, torch, pil: its pixels, so its mAP,
        differ; docs/parity.md); "?" where the file does not say (the site's files)."""
        block = getattr(self.runtime, "preprocess", None)
        name = block.get("implementation") if isinstance(block, dict) else None
        if not isinstance(name, str):
            spec = self.config.preprocess if isinstance(getattr(self.config, "preprocess", None), dict) else {}
            name = spec.get("library")
        return name if isinstance(name, str) and name else "?"

    @property
    def preprocess_choice(self) -> str:
        """The preprocessing as a row's identity: "default" where it is what `--preprocess auto` takes for the family
        on its device (and where a file does not say: the site's, va-bench's before it was recorded), else the
        implementation (a `--preprocess pil` row is another measurement than the family's own cv2 one)."""
        block = getattr(self.runtime, "preprocess", None)
        default = block.get("default") if isinstance(block, dict) else None
        return "default" if not isinstance(default, str) or self.preprocess in ("?", default) else self.preprocess

    @property
    def dataset_id(self) -> str:
        return (self.dataset.id if self.dataset and self.dataset.id else None) or "coco2017"

    @property
    def board(self) -> str:
        """The site's board for the file (its transform.ts): "segmentation" when model.task is "segment" or
        "segmentation", else "detection" (a segmentation model's file without a task lands on detection)."""
        return "segmentation" if self.model.task in SEGMENT_TASKS else "detection"

    @property
    def is_rf100vl(self) -> bool:
        """The site's rule for its RF100-VL section: an `rf100vl` block, or dataset id rf100_vl."""
        return isinstance(getattr(self, "rf100vl", None), dict) or self.dataset_id == "rf100_vl"

    @property
    def rf100vl_variant(self) -> str | None:
        """The site's RF100-VL variant: full100 when every expected dataset is there, else partial{n}."""
        block = getattr(self, "rf100vl", None)
        if not isinstance(block, dict) or not isinstance(block.get("datasets"), list):
            return None
        expected = (block.get("protocol") or {}).get("expected_datasets", 100)
        n = len(block["datasets"])
        return f"full{n}" if n == expected else f"partial{n}"

    @property
    def dataset_variant(self) -> str | None:
        """Declared variant, else derived from the image count (5000 -> full, 500 -> mini500)."""
        if self.dataset and self.dataset.variant:
            return self.dataset.variant
        n = self.num_images
        if n is None:
            return None
        if self.dataset_id != "coco2017":
            return f"{self.dataset_id}-{n}"
        if n == VAL2017_NUM_IMAGES:
            return "full"
        if n == KNOWN_FINGERPRINTS["mini500"][0]:
            return "mini500"
        return f"subset{n}"

    @property
    def is_full_val(self) -> bool:
        return self.dataset_variant == "full"

    @property
    def hardware_id(self) -> str:
        """Trust hardware.id; derive from GPU/CPU names only when it is absent."""
        if self.hardware.id and str(self.hardware.id).strip():
            return str(self.hardware.id).strip()
        return derive_hardware_id(self.hardware.gpu, self.hardware.cpu, self.hardware.cpu_cores)

    @property
    def protocol(self) -> tuple:
        """(conf, iou, max_det) as rows are keyed by: a top-k model at its validator's thresholds as the site's rows
        state that protocol (RF100-VL rows as they are: their section has its own)."""
        conf, max_det = self.config.conf, self.config.max_det
        if not self.is_rf100vl:
            conf, max_det = as_stated_by_site(self.model.id, conf, max_det)
        return conf, self.config.iou, max_det

    @property
    def eval_cap(self) -> int | None:
        """The detections per image COCOeval read AP at (its largest maxDets; RF100-VL's protocol: 500); None where
        not recorded, as in the site's COCO rows, which COCO's evaluation reads at 100."""
        max_dets = self.eval.max_dets if self.eval else None
        if isinstance(max_dets, list) and max_dets and all(isinstance(m, int) and not isinstance(m, bool)
                                                           for m in max_dets):
            return max(max_dets)
        return None

    @property
    def batch_size(self) -> int | None:
        return self.config.batch_size if self.config.batch_size is not None else self.timing.get("batch_size")

    @property
    def input_size(self) -> int | None:
        size = self.config.input_size if self.config.input_size is not None else self.model.input_size
        return int(size) if isinstance(size, (int, float)) else None

    @property
    def commit(self) -> tuple[str | None, bool | None, str]:
        """(commit, dirty, where): the harness commit when recorded, else the model library's."""
        repro = self.repro or {}
        if repro.get("harness_commit"):
            return repro.get("harness_commit"), repro.get("harness_dirty"), "repro.harness_commit"
        extra = self.benchmark.model_extra or {}
        return self.benchmark.libreyolo_commit, extra.get("libreyolo_dirty"), "benchmark.libreyolo_commit"

    @property
    def weights_identity(self) -> str:
        """What tells two runs' weights apart: `sha256:<digest>` from repro.weights, else `source:<source>`,
        else "unrecorded". model.weights is not used: it is a display name (the site's corpus names one
        checkpoint both "LibreYOLOXs.pt" and "yolox-s")."""
        weights = (self.repro or {}).get("weights")
        weights = weights if isinstance(weights, dict) else {}
        if isinstance(weights.get("sha256"), str) and weights["sha256"].strip():
            return f"sha256:{weights['sha256'].strip()}"
        if isinstance(weights.get("source"), str) and weights["source"].strip():
            return f"source:{weights['source'].strip()}"
        return "unrecorded"

    @property
    def random_weights(self) -> bool:
        """A timing-only run on randomly initialised weights (its accuracy means nothing)."""
        weights = (self.repro or {}).get("weights")
        source = weights.get("source") if isinstance(weights, dict) else None
        return (self.model.model_extra or {}).get("weights") == "random" or source == "random"

    @property
    def tf32(self) -> str:
        """Whether fp32 ran with TF32 tensor-core math: "on", "off", or "unrecorded" (no runtime.tf32).

        TF32 is in effect on a GPU when it was pinned on, or when torch's flags allowed it (mode
        "default" keeps torch's defaults, and cudnn.allow_tf32 defaults to True), or the float32
        matmul precision is below "highest". On a CPU the flags do nothing."""
        state = self.runtime.tf32
        if not isinstance(state, dict):
            return "unrecorded"
        if self.runtime.device == "cpu":
            return "off"
        on = (state.get("mode") == "on" or state.get("matmul_allow_tf32") is True
              or state.get("cudnn_allow_tf32") is True
              or state.get("float32_matmul_precision") in ("high", "medium"))
        return "on" if on else "off"

    @property
    def timestamp(self) -> datetime | None:
        for value in (self.created_at, self.metadata.get("benchmark_date")):
            if isinstance(value, str):
                try:
                    stamp = parse_iso8601(value)
                except ValueError:
                    continue
                return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)
        return None
