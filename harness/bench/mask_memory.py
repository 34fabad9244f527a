"""`make bench-masks`: peak RSS of a whole segmentation run with masks over the same run with `--no-masks`
(target <= 1.5): rfdetr-seg-n (random weights: the masks of a from-scratch model cover as much of the image as a
trained one's, or more), batch 8, the sample. Masks are encoded per image, at most CHUNK detections at a time,
so a run holds compressed RLEs, never a batch of full-resolution masks.

    python -m harness.bench.mask_memory [--model rfdetr-seg-n] [--batch 8] [--limit N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from harness.bench.run_vs_loop import _measure
from harness.results.reader import read_json_object, submission_files


def measure(model: str, batch: int, limit: int | None, masks: bool, output_dir: Path) -> dict:
    """One run in a fresh process: its peak RSS, wall time, the timing window's peak and the masks substep."""
    run_id = f"bench-masks-{'on' if masks else 'off'}"
    argv = [sys.executable, "-m", "harness", "run", "--model", model, "--weights", "random", "--backend", "pytorch",
            "--batch-sizes", str(batch), "--masks" if masks else "--no-masks", "--no-layers", "--no-profile",
            "--output-dir", str(output_dir), "--run-id", run_id, *(["--limit", str(limit)] if limit else [])]
    load = os.getloadavg()[0]
    wall, _, rss, _, _ = _measure(argv, dict(os.environ))
    submission = read_json_object(submission_files(output_dir / run_id)[0])
    stages = submission["timing"]["stages_ms"]
    return {"masks": masks, "peak_rss_mb": round(rss, 1), "wall_s": round(wall, 1),
            "timing_window_peak_ram_mb": submission.get("memory", {}).get("peak_ram_mb"),
            "masks_ms_per_batch": stages.get("postprocess.masks", {}).get("p50"),
            "forward_ms_per_batch": stages["forward"]["p50"], "task": submission["model"].get("task"),
            "load_average": [round(load, 2), round(os.getloadavg()[0], 2)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="rfdetr-seg-n")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--limit", type=int, default=None, help="first N images of the sample (default: all 206)")
    parser.add_argument("--target", type=float, default=1.5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="va-bench-masks-") as tmp:
        off = measure(args.model, args.batch, args.limit, False, Path(tmp))
        on = measure(args.model, args.batch, args.limit, True, Path(tmp))
    ratio = on["peak_rss_mb"] / off["peak_rss_mb"]
    result = {"model": args.model, "batch": args.batch, "masks": on, "no_masks": off, "ratio": round(ratio, 3),
              "target": args.target, "met": ratio <= args.target}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for r in (off, on):
            print(f"{'masks' if r['masks'] else 'no masks':>9}: peak RSS {r['peak_rss_mb']} MB, wall {r['wall_s']} s, "
                  f"masks {r['masks_ms_per_batch']} ms/batch, forward {r['forward_ms_per_batch']} ms/batch")
        verdict = "met" if result["met"] else "NOT met"
        print(f"peak RSS masks / no masks: {ratio:.3f} (target <= {args.target}: {verdict})")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
