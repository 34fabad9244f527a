"""OpenVINO's synchronous `infer()` in a plain Python loop on one IR, timed by OpenVINO's own clock
(`InferRequest.latency`, benchmark_app's figure): the control of `make bench-runtimes`, which measures this loop
against benchmark_app the way it measures the harness, so the comparison's own bias is known.

    python -m harness.bench.openvino_loop IR --properties JSON --shape 1 3 416 416 --iterations 800
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

LOOP_STARTS = "timed loop starts"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ir")
    parser.add_argument("--properties", required=True, help="the compiled model's properties, JSON")
    parser.add_argument("--shape", type=int, nargs="+", required=True)
    parser.add_argument("--iterations", type=int, default=800)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    import openvino as ov

    core = ov.Core()
    model = core.read_model(args.ir)
    model.reshape({0: args.shape})
    request = core.compile_model(model, "CPU", json.loads(args.properties)).create_infer_request()
    request.set_input_tensor(ov.Tensor(np.random.default_rng(0).random(args.shape, dtype=np.float32)))
    for _ in range(args.warmup):
        request.infer()
    print(LOOP_STARTS, flush=True)
    latencies = []
    for _ in range(args.iterations):
        request.infer()
        latencies.append(request.latency)
    print(f"Median: {statistics.median(latencies):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
