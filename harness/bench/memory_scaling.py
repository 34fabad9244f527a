"""`make bench-memory`: peak RSS of a whole `va-bench run` at 5000 images over the same run at 500 images
(target <= 1.2), on a synthetic COCO tree (harness/bench/synthetic_coco.py: the sample's images repeated
under new ids). A run's memory must not grow with the variant beyond its detections' own size: detections
are streamed to disk per cell and evaluated from there, images are freed after their batch.

    python -m harness.bench.memory_scaling [--small 500] [--large 5000] [--tree DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from harness.bench.run_vs_loop import _measure
from harness.bench.synthetic_coco import build_tree, default_dir
from harness.results.reader import read_json_object, submission_files

RUN = ["run", "--model", "yolox-nano", "--backend", "onnxruntime", "--batch-sizes", "8", "--subset", "full",
       "--no-layers", "--no-profile"]


def measure(tree: Path, images: int, output_dir: Path) -> dict:
    """One run over the first `images` images of the tree in a fresh process: peak RSS, wall, the run's files."""
    run_id = f"bench-memory-{images}"
    load = os.getloadavg()[0]
    argv = [sys.executable, "-m", "harness", *RUN, "--limit", str(images), "--coco-dir", str(tree),
            "--output-dir", str(output_dir), "--run-id", run_id]
    wall, _, rss, _, _ = _measure(argv, dict(os.environ))
    submission = read_json_object(submission_files(output_dir / run_id)[0])
    detections = output_dir / run_id / submission["eval"]["detections"]
    return {"images": images, "peak_rss_mb": round(rss, 1), "wall_s": round(wall, 1),
            "timing_window_peak_ram_mb": submission.get("memory", {}).get("peak_ram_mb"),
            "detections_file_mb": round(detections.stat().st_size / 2**20, 1),
            "mAP_50_95": submission["accuracy"]["mAP_50_95"],
            "load_average": [round(load, 2), round(os.getloadavg()[0], 2)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=500)
    parser.add_argument("--large", type=int, default=5000)
    parser.add_argument("--tree", type=Path, default=None, help="synthetic tree (built if absent; default: temp)")
    parser.add_argument("--target", type=float, default=1.2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    tree = build_tree(args.tree or default_dir(args.large), args.large)
    with tempfile.TemporaryDirectory(prefix="va-bench-memory-") as tmp:
        small = measure(tree, args.small, Path(tmp))
        large = measure(tree, args.large, Path(tmp))
    ratio = large["peak_rss_mb"] / small["peak_rss_mb"]
    result = {"tree": str(tree), "small": small, "large": large, "ratio": round(ratio, 3), "target": args.target,
              "met": ratio <= args.target}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for r in (small, large):
            print(f"{r['images']:5d} images: peak RSS {r['peak_rss_mb']:7.1f} MB (timing window "
                  f"{r['timing_window_peak_ram_mb']} MB), detections file {r['detections_file_mb']} MB, "
                  f"{r['wall_s']} s, mAP {r['mAP_50_95']:.4f}, load {r['load_average'][0]}-{r['load_average'][1]}")
        print(f"peak RSS {args.large} / {args.small} images: {ratio:.3f} (target <= {args.target}: "
              f"{'met' if result['met'] else 'NOT MET'})")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
