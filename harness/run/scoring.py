"""A cell's detections scored: written once as a COCO results file (a batch size whose detections are an earlier
one's shares its file), evaluated by pycocotools or `--evaluator` (the same file scores the same), and an int8
cell's accuracy rule, against the same model's fp32 core on the same images and runtime."""

from __future__ import annotations

from harness.backends import load_detector_core
from harness.detector.protocol import Detector
from harness.eval.coco_eval import (
    defined_stats,
    evaluate_bbox_file_per_class,
    evaluate_cell_file,
    evaluator_version,
    max_dets_for,
    operating_point_summary,
    per_class_document,
)
from harness.files import atomic_write_json, file_sha256, same_file_as
from harness.measure.stats import percent
from harness.pipeline.pipeline import DetectorPipeline
from harness.pipeline.stage_timer import StageTimer
from harness.records import AccuracyRecord, Cell, ImageDetections, LoadKey, detections_digest
from harness.results.artifacts import cell_slug, detections_file, write_coco_detections

# An int8 cell must keep this share of the same model's fp32 mAP on the same images (MLPerf's rule)
INT8_KEEP = 0.99


class CellScorer:
    """One group's scoring: its detections files, their evaluations, and its int8 cells' fp32 reference (scored once
    per group)."""

    def __init__(self, ctx, detector: Detector, key: LoadKey, task: str, label_categories: tuple[int, ...]):
        self.ctx, self.detector, self.key, self.task = ctx, detector, key, task
        self.label_categories = label_categories  # the dataset category each label is scored as
        self.saved_detections: dict[str, tuple[str, int]] = {}  # detections_digest -> (its file, its count)
        self.fp32_reference: dict | None = None  # int8: the fp32 core's accuracy on the same images

    def save_detections(self, cell: Cell, detections: list[ImageDetections]) -> tuple[str, int]:
        """detections/<cell>.json (COCO results format), written image by image: the cell holds its
        detections as arrays, never as one Python dict per box. Returns the path relative to the run
        folder and the number of detections."""
        rel = detections_file(cell)
        digest = detections_digest(detections)
        earlier = self.saved_detections.get(digest)
        if earlier is not None:  # an earlier batch size's very detections (a batch-invariant runtime): its file
            same_file_as(self.ctx.run_dir / earlier[0], self.ctx.run_dir / rel)
            return rel, earlier[1]
        count = write_coco_detections(self.ctx.run_dir / rel, detections, self.label_categories)
        self.saved_detections[digest] = rel, count
        return rel, count

    def evaluate(self, cell: Cell, detections_file: str, num_detections: int,
                  num_images: int) -> tuple[AccuracyRecord | None, str | None]:
        """pycocotools (or --evaluator) on the cell's detections file, as written."""
        ctx = self.ctx
        if ctx.dataset.layout == "synthetic":
            return None, "synthetic input (--input synthetic): a timing-only run, there is nothing to score"
        if getattr(self.detector.weights, "source", None) == "random":
            return None, "random weights: a timing-only run, accuracy is not meaningful"
        if not ctx.config.accuracy:
            return None, "accuracy evaluation skipped (--no-accuracy)"
        cap = ctx.config.eval_max_det
        digest = file_sha256(ctx.run_dir / detections_file)
        # The same detections file scores the same: a cell whose detections are byte for byte an earlier cell's
        # (a batch-invariant runtime across a sweep) takes that evaluation and says so
        key = (digest, ctx.config.evaluator, cap, self.task, ctx.config.map_ci)
        if key in ctx.scored:
            evaluation, same_as = ctx.scored[key]
        else:
            with ctx.progress.task(f"COCO eval {cell.label}", None):
                evaluation = evaluate_cell_file(ctx.dataset.coco, ctx.run_dir / detections_file,
                                                list(ctx.variant.image_ids), ctx.config.evaluator, cap, self.task,
                                                ctx.config.map_ci)
            ctx.scored[key] = evaluation, cell.label
            same_as = None
        per_class_file = f"per_class/{cell_slug(cell)}.json"
        atomic_write_json(ctx.run_dir / per_class_file, per_class_document(evaluation, ctx.dataset.categories, cap))
        # pycocotools' -1 means "no ground truth in this area range" (small subsets): not a score
        return AccuracyRecord(stats=defined_stats(evaluation.stats), evaluator=evaluator_version(ctx.config.evaluator),
                              num_images=num_images, num_detections=num_detections, batch_size=cell.batch_size,
                              detections_file=detections_file, max_dets=max_dets_for(cap),
                              per_class_file=per_class_file, iou_types=evaluation.iou_types,
                              operating_point=operating_point_summary(evaluation.primary),
                              map_interval=evaluation.primary.map_interval,
                              detections_sha256=digest, same_detections_as=same_as), None

    def int8_verdict(self, cell: Cell, accuracy: AccuracyRecord, pipeline: DetectorPipeline) -> dict:
        """The int8 cell's mAP beside the same model's fp32 mAP on the same images and backend (an untimed scoring
        pass of an fp32 core, once per group), failing when it keeps < 99 % of it (MLPerf's rule for int8)."""
        if self.fp32_reference is None:
            try:
                self.fp32_reference = self._fp32_reference(cell, pipeline)
            except Exception as exc:  # the int8 cell keeps its timing and mAP; the comparison is what is missing
                self.fp32_reference = {"status": "unavailable", "reason": f"the fp32 reference could not be scored "
                                                                          f"({type(exc).__name__}: {exc})"[:300]}
        if self.fp32_reference.get("status") == "unavailable":  # a row whose loss is unknown is not published
            return {**self.fp32_reference, "required": INT8_KEEP, "passed": None,
                    "failing": f"the int8 accuracy rule could not be checked: {self.fp32_reference['reason']}; this "
                               "row is marked failing"}
        fp32_map, int8_map = self.fp32_reference["mAP_50_95"], accuracy.stats["mAP_50_95"]
        kept = int8_map / fp32_map if fp32_map and int8_map is not None else None
        passed = kept is not None and kept >= INT8_KEEP
        verdict = {**self.fp32_reference, "int8_mAP_50_95": int8_map, "kept": None if kept is None else round(kept, 4),
                   "required": INT8_KEEP, "passed": passed,
                   "rule": "an int8 row keeps >= 99 % of the same model's fp32 mAP on the same images (MLPerf)"}
        if not passed:
            kept_text = "an undefined share" if kept is None else percent(kept, 1, "down")  # never "99.0 % < 99 %"
            verdict["failing"] = (f"int8 keeps {kept_text} of the fp32 mAP ({int8_map:.4f} vs {fp32_map:.4f}); "
                                  "below 99 %: this row is marked failing")
        return verdict

    def _fp32_reference(self, cell: Cell, pipeline: DetectorPipeline) -> dict:
        """The same model's fp32 core on the same backend, images and thresholds: an untimed scoring pass."""
        ctx = self.ctx
        fp32 = load_detector_core(self.detector, self.key.backend, ctx.device, "fp32", self.key.input_size,
                                  options=ctx.backend_options, threads=ctx.threads)
        pipeline = pipeline.copy_with(fp32)
        timer = StageTimer(ctx.device, ctx.config.stage_sync)
        with ctx.progress.task(f"fp32 reference {cell.label}", None):
            detections = [d for batch in ctx.batches(cell.batch_size) for d in pipeline.run_batch(batch, timer)]
        rel = detections_file(cell, "__fp32_reference")
        write_coco_detections(ctx.run_dir / rel, detections, self.label_categories)
        stats, _ = evaluate_bbox_file_per_class(ctx.dataset.coco, ctx.run_dir / rel, list(ctx.variant.image_ids),
                                                ctx.config.evaluator, cap=ctx.config.eval_max_det)
        return {"precision": "fp32", "backend": self.key.backend, "mAP_50_95": round(stats["mAP_50_95"], 6),
                "mAP_50": round(stats["mAP_50"], 6), "detections_file": rel}
