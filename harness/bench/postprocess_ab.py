"""Where and how a GPU run's post-processing should run: the family's selection (class-aware NMS) and the boxes on
the device for the whole batch at once, as a run does, against torchvision's NMS one image at a time and against one
copy of the candidates to the host.

On an H100 a batch of 32 spent 9.6 ms in NMS against a 10 ms forward: one torchvision CUDA NMS call per image, each
synchronising the device. This bench takes one batch of the sample through the forward and the head's decode once,
then times, in alternating rounds, the selection + boxes of the same candidates:
- `device-whole-batch`: on the core's device, every image's NMS at once (pipeline/batch_nms.py; what a run does);
- `device-per-image`: on the device, torchvision's NMS per image on the run's NMS thread pool (a run before);
- `device-serial`: on the device, torchvision's NMS one image after another;
- `host`: the candidates copied to the host in one transfer, then torchvision's NMS per image on the thread pool.
Each variant's detections are matched against `device-per-image`'s, torchvision's own calls (same class,
IoU >= 0.99, score within 1e-3); on a CPU the work is the same but for where it runs, which is how this script is
tested.

    python -m harness.bench.postprocess_ab [--device cuda] [--batch-size 32] [--rounds 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

from harness.backends import BackendOptions, load_detector_core
from harness.config import RunConfig
from harness.data.coco import CocoDataset
from harness.detector.protocol import postprocess_spec
from harness.eval.matching import match_detections
from harness.measure.device import parse_device
from harness.models.registry import get_detector
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.postprocess import (
    BatchCandidates,
    gather_candidates,
    select,
    split_by_image,
    to_original,
)
from harness.pipeline.preprocess import decode_image, preprocess_batch, resolve_implementation
from harness.pipeline.scratch import scratch_bytes


def measure(device_spec: str, batch_size: int, rounds: int, model: str = "yolox-nano") -> dict:
    """Median ms per batch of each variant's selection + boxes, and its detections against `device-per-image`'s."""
    device = parse_device(device_spec)
    detector = get_detector(model)
    spec = resolve_implementation(detector.preprocess, "cv2", device.is_cuda)
    options = BackendOptions.from_config(RunConfig(backends=["pytorch"], device=device_spec, batch_sizes=[batch_size]))
    core = load_detector_core(detector, "pytorch", device, "fp32", spec.input_size, options=options,
                              threads=torch.get_num_threads())
    dataset = CocoDataset()
    records = dataset.records(dataset.variant("sample"))[:batch_size]
    batch, transforms = preprocess_batch([decode_image(r.path) for r in records], replace(spec, library="cv2"))
    raw = core(batch.to(device.torch_device))
    d, post = detector.defaults, postprocess_spec(detector)
    thresholds = Thresholds(d.conf, d.iou, d.max_det)
    candidates = gather_candidates(detector.decode(raw, spec.input_size, d.conf), post, d.conf, d.max_det)
    ids = [r.image_id for r in records]
    pipeline = DetectorPipeline(detector, core, device, spec, thresholds)
    executor = pipeline.host_executor  # a run's NMS pool (None with one thread)

    def finish(cands: BatchCandidates, with_pool: bool, whole_batch: bool = False):
        kept = select(cands, post, d.iou, d.max_det, transforms, executor if with_pool else None, whole_batch,
                      scratch_bytes(cands.boxes.device))  # a run's budget on this device
        return split_by_image(kept, to_original(kept, transforms), ids)

    variants = {"device-whole-batch": lambda: finish(candidates, False, True),
                "device-per-image": lambda: finish(candidates, True),
                "device-serial": lambda: finish(candidates, False),
                "host": lambda: finish(candidates.to(torch.device("cpu")), True)}
    results = {name: run() for name, run in variants.items()}  # warm-up, and the detections compared
    times: dict[str, list[float]] = {name: [] for name in variants}
    for k in range(rounds):
        for name in (list(variants) if k % 2 == 0 else list(variants)[::-1]):
            device.synchronize()
            start = time.perf_counter()
            variants[name]()
            device.synchronize()
            times[name].append((time.perf_counter() - start) * 1e3)
    reference = results["device-per-image"]
    return {"device": str(device), "batch_size": batch_size, "candidates": int(candidates.scores.numel()),
            "threads": pipeline.nms_threads, "rounds": rounds,
            "variants": {name: {"ms_per_batch_p50": round(statistics.median(values), 3),
                                "matched_vs_per_image": match_detections(reference, results[name]).match_rate}
                         for name, values in times.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.device, args.batch_size, args.rounds)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['device']}, batch {result['batch_size']}, {result['candidates']} candidates, "
          f"{result['threads']} threads:")
    for name, v in result["variants"].items():
        matched = 100 * v["matched_vs_per_image"]
        print(f"  {name:<18} {v['ms_per_batch_p50']:8.3f} ms per batch   {matched:.2f} % matched")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
