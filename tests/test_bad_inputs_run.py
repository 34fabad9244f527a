"""Bad run options and broken models: one line, exit 2 and nothing written for bad
input; a failed cell with the reason (exit 1) for a measurement that breaks inside the sweep."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import COCO_DIR, REPO, YOLOX_NANO, requires_coco, requires_yolox, run_in_process
from onnx import TensorProto, helper, numpy_helper

from harness.errors import UsageError

PLUGIN = Path(__file__).parent / "plugins" / "synthetic_detector.py"


def va_bench(*args, env=None):
    return run_in_process(*args, env=env)


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Error:" not in lines[0].split(":", 1)[0]
    return lines[0]


@pytest.mark.parametrize("args, expect", [
    (["--hardware-id", "../../../x"], "--hardware-id"),
    (["--hardware-id", "a/b"], "--hardware-id"),
    (["--threads", "-1"], "--threads"),
    (["--conf", "5"], "--conf"),
    (["--iou", "-1"], "--iou"),
    (["--max-det", "0"], "--max-det"),
    (["--limit", "0"], "--limit"),
    (["--warmup-seconds", "-1"], "--warmup-seconds"),
    (["--model", f"{PLUGIN}:make_detector", "--weights", "x.onnx"], "--weights"),
    (["--tf32", "maybe"], "tf32"),
    (["--resume", "x", "--retry-failed", "--config", "default"], "drop --config"),
    (["--retry-failed"], "--resume"),
    (["--warmup-seconds", "inf"], "--warmup-seconds"),
    (["--workers", "4"], "--workers applies to --overlap only"),
    (["--max-timed-batches", "1"], "--max-timed-batches"),  # one sample has no spread
])
@requires_coco
def test_bad_run_options_exit_2_with_one_line_and_no_folder(tmp_path, args, expect):
    out = tmp_path / "o"
    result = va_bench("run", "--coco-dir", str(COCO_DIR), "--output-dir", str(out), *args)
    assert result.returncode == 2, result.stderr
    assert expect in one_error_line(result)
    assert not out.exists()


@pytest.mark.parametrize("data, expect", [
    ({"warmup_seconds": float("inf")}, "--warmup-seconds): inf is not a finite number"),
    ({"target_ci": 5, "max_seconds": float("inf")}, "--max-seconds): inf is not a finite number"),
    ({"scenario": "server", "qps": float("inf"), "latency_bound_ms": 10}, "--qps): inf is not a finite number"),
    ({"workers": "4"}, "--workers applies to --overlap only; add --overlap or drop --workers"),
    ({"max_seconds": 5}, "--max-seconds applies to --target-ci only"),
    ({"server_queries": 50}, "--server-queries applies to --scenario server only"),
    ({"calibration": "/nonexistent"}, "--calibration applies to --precision int8 only"),
    ({"layer_batches": 5}, "--layer-batches applies to --layers only"),
    ({"tf32": "on"}, "--tf32 applies to --device cuda only"),
    ({"allow_shared_gpu": True}, "--allow-shared-gpu applies to --device cuda only"),
    ({"trt_workspace_mb": 100}, "--trt-workspace-mb applies to --ort-provider tensorrt only"),
    ({"trt_cache_dir": "/tmp/trt"}, "--trt-cache-dir applies to --ort-provider tensorrt only"),
    ({"min_timed_batches": 5, "max_timed_batches": 2}, "--min-timed-batches 5 is more than --max-timed-batches 2"),
    ({"scenario": "server", "qps": 5}, "invalid run configuration: --scenario server needs --latency-bound"),
])
def test_options_that_would_be_recorded_and_do_nothing_are_refused(data, expect):
    from harness.config import load_config

    with pytest.raises(UsageError) as err:
        load_config(None, data)  # as given on the command line
    assert expect in str(err.value) and "Value error" not in str(err.value) and ": :" not in str(err.value)


def test_an_option_of_another_mode_from_a_preset_or_a_record_is_kept_at_its_default(tmp_path):
    """A preset's value for a mode a flag switched off, or an older run's record, is no user mistake on this
    command line: recorded at its default (what ran), not refused. --scenario offline is --overlap."""
    from harness.config import build_config, load_config

    recorded = build_config({"max_timed_batches": 5}).model_dump()  # min 10 by default, as a run.json holds it
    assert build_config(recorded).max_timed_batches == 5
    assert load_config(None, {"max_timed_batches": 5}).max_timed_batches == 5  # the default minimum yields
    assert build_config({"workers": "4"}).workers == "auto"  # an older record: workers without overlap did nothing
    assert load_config(None, {"scenario": "offline", "workers": "4"}).workers == "4"
    preset = tmp_path / "p.yaml"
    preset.write_text("device: cuda\ntf32: 'on'\nlayers: true\nlayer_batches: 5\n")
    config = load_config(preset, {"device": "cpu", "layers": False})
    assert (config.tf32, config.layer_batches) == ("off", 3)
    home = build_config({"output_dir": "~/runs", "weights": "~/w.onnx"})
    assert home.output_dir == str(Path.home() / "runs") and home.weights == str(Path.home() / "w.onnx")
    # the shipped preset spells out the default minimum: a maximum still wins over it; a preset asking for both,
    # the minimum above the maximum, is refused
    assert load_config("default", {"max_timed_batches": 5}).max_timed_batches == 5
    preset.write_text("min_timed_batches: 20\nmax_timed_batches: 5\n")
    with pytest.raises(UsageError, match="--min-timed-batches 20 is more than --max-timed-batches 5"):
        load_config(preset, {})
    # a resumed run's command line is held to the same rule as a new one's
    from harness.run.resume import resumed_config

    with pytest.raises(UsageError, match="--tf32 applies to --device cuda only"):
        resumed_config(build_config({}).model_dump(), {"tf32": "on"}, tmp_path, "r1")


def test_a_run_folder_that_cannot_be_read_is_not_called_missing(tmp_path, monkeypatch):
    """--resume of a run whose folder cannot be entered: its permissions named, not "no run to resume"."""
    import errno
    from pathlib import Path as PathType

    from harness.results.reader import read_run_json

    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(PathType, "is_file", denied)
    with pytest.raises(UsageError, match=r"cannot be read \(Permission denied\).*permissions"):
        read_run_json(tmp_path / "r1", "r1")


def test_a_resume_given_the_same_sweep_spelt_another_way_is_the_same_run(tmp_path):
    """Batch sizes in another order (cells run from the smallest up either way) and a device name in capitals were
    "started differently", refused unless --force."""
    from harness.config import build_config
    from harness.run.resume import resumed_config

    recorded = build_config({"batch_sizes": [1, 2]}).model_dump()
    config, problems = resumed_config(recorded, {"batch_sizes": [2, 1], "device": "CPU"}, tmp_path, "r1")
    assert problems == [] and config.batch_sizes == [1, 2] and config.device == "cpu"


def test_output_dir_that_is_a_file_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = va_bench("run", "--coco-dir", str(COCO_DIR), "--output-dir", str(blocker / "sub"), "--limit", "2",
                      "--model", f"{PLUGIN}:make_detector", "--backend", "pytorch")
    assert result.returncode == 2 and "--output-dir" in one_error_line(result)


@pytest.mark.parametrize("resume", [False, True])
def test_an_output_dir_name_too_long_for_the_file_system_exits_2(tmp_path, resume):
    """A folder name over the file system's 255 bytes: Path.exists() raises ENAMETOOLONG rather than answer False,
    which came out as "error: OSError: [Errno 36] File name too long: ..." and exit 1."""
    out = tmp_path / ("a" * 300)
    args = ["--resume", "r1"] if resume else ["--model", f"{PLUGIN}:make_detector", "--backend", "pytorch"]
    result = va_bench("run", "--coco-dir", str(COCO_DIR), "--output-dir", str(out), "--limit", "2", *args)
    line = one_error_line(result)
    assert result.returncode == 2 and line.startswith(f"error: --output-dir {out}: "), result.stderr
    assert ("no run r1 to resume" if resume else "cannot be used (File name too long)") in line
    assert list(tmp_path.iterdir()) == []


def test_yaml_errors_name_line_and_column(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("models: [yolox-nano\nbatch_sizes: [1, 2]\n")
    result = va_bench("run", "--config", str(preset), "--output-dir", str(tmp_path / "o"))
    assert result.returncode == 2
    line = one_error_line(result)
    assert "line 2" in line and "column" in line and str(preset) in line
    preset.write_text("batch_size: [1]\n")  # a typo of batch_sizes: unknown keys are errors
    result = va_bench("run", "--config", str(preset), "--output-dir", str(tmp_path / "o"))
    assert result.returncode == 2 and "batch_size" in one_error_line(result)


def test_a_yaml_alias_is_refused_and_a_huge_value_is_named_in_short(tmp_path):
    """Nested aliases (a few hundred bytes expanding into gigabytes) never expand; a value quoted in a message is
    cut short (a list of 100,000 lists once made a 1.4 MB "one line")."""
    from harness.config import load_config
    from harness.errors import UsageError

    laughs = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)) + "models: [*a8]\n"
    preset = tmp_path / "laughs.yaml"
    preset.write_text(laughs)
    with pytest.raises(UsageError, match=r"line 2, column \d+ \(alias \*a0: aliases are not accepted"):
        load_config(preset, {})
    preset.write_text("models: [" + ", ".join(["[1, 2, 3]"] * 2000) + "]\n")
    with pytest.raises(UsageError) as refused:
        load_config(preset, {})
    assert len(str(refused.value)) < 200 and "got [1, 2, 3]" in str(refused.value)


@pytest.mark.parametrize("broken, kind", [("nan-scores", "NaN"), ("nan-boxes", "NaN"), ("inf-boxes", "inf")])
@requires_coco
def test_a_model_that_outputs_nan_or_inf_fails_its_cell(tmp_path, broken, kind):
    out = tmp_path / "o"
    result = va_bench("run", "--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--limit", "4",
                      "--batch-sizes", "2", "--coco-dir", str(COCO_DIR), "--output-dir", str(out), "--run-id", "r",
                      "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2", "--json",
                      env={"VA_BENCH_TEST_OUTPUT": broken, "VA_BENCH_TEST_FORWARD_MS": "1"})
    assert result.returncode == 1, result.stderr
    (cell,) = json.loads(result.stdout)["cells"]
    assert cell["status"] == "failed" and f"has {kind} values" in cell["reason"]
    assert not (out / "r" / "submissions").exists()  # nothing published


@requires_coco
def test_the_summary_fits_80_columns(tmp_path):
    result = va_bench("run", "--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--limit", "8",
                      "--batch-sizes", "1", "2", "--coco-dir", str(COCO_DIR), "--output-dir", str(tmp_path),
                      "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2",
                      env={"COLUMNS": "80", "VA_BENCH_TEST_FORWARD_MS": "1"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout  # nothing cut
    rows = [line.split() for line in lines if line.strip().startswith(("1 ", "2 "))]
    assert [r[0] for r in rows] == ["1", "2"] and all(r[1] == "ok" for r in rows)
    mAP = {r[-3] for r in rows}  # one box per image: both cells score the same, whole number shown
    assert len(mAP) == 1 and mAP.pop().startswith("0.")
    assert "[" in result.stderr and "timing synthetic-sleepy" in result.stderr  # progress lines when piped


def test_the_run_docs_list_every_run_option():
    from harness.config import run_option_fields

    readme = (REPO / "docs" / "running.md").read_text()
    missing = [f.json_schema_extra["flags"][0].split("/")[0] for f in run_option_fields().values()
               if f.json_schema_extra["flags"][0].split("/")[0] not in readme]
    assert missing == []


def test_help_shows_defaults_and_version():
    help_text = va_bench("run", "--help").stdout
    assert "[default: 1]" in help_text and "--batch-sizes" in help_text and "<bool>" not in help_text
    version = va_bench("--version")
    assert version.returncode == 0 and version.stdout.startswith("va-bench ")


# --- ONNX files that are not a YOLOX export, paths in messages, offline fetch -------------


def _save_onnx(path, nodes, inputs, outputs, initializers=(), check=True):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers)),
                              opset_imports=[helper.make_opsetid("", 11)])
    if check:  # an output declared without a shape fails onnx's checker, yet ONNX Runtime loads it
        onnx.checker.check_model(model)
    onnx.save(model, path)


def _images(size):
    return helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])


def _wrong_anchor_count(path):
    """[1, 3000, 85] from a 416 px input, where YOLOX's strides 8/16/32 give 52² + 26² + 13² = 3549 anchors."""
    zeros = numpy_helper.from_array(np.zeros((1, 3000, 85), np.float32))
    _save_onnx(path, [helper.make_node("Constant", [], ["output"], value=zeros)], [_images(416)],
               [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3000, 85])])


def _output_without_shape(path):
    """The output's shape is not declared and shape inference cannot find it (a reshape to a runtime shape)."""
    _save_onnx(path, [helper.make_node("Reshape", ["images", "shape"], ["output"])],
               [_images(416), helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
               [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)], check=False)


def _classifier(path):
    """A 1000-class image classifier: pool, flatten, one dense layer -> [1, 1000]."""
    weights = np.random.default_rng(0).standard_normal((1000, 3)).astype(np.float32)
    _save_onnx(path, [helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
                      helper.make_node("Flatten", ["pooled"], ["flat"]),
                      helper.make_node("Gemm", ["flat", "w"], ["output"], transB=1)],
               [_images(224)], [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1000])],
               [numpy_helper.from_array(weights, "w")])


def _two_outputs(path):
    _save_onnx(path, [helper.make_node("Identity", ["images"], ["a"]), helper.make_node("Identity", ["images"], ["b"])],
               [_images(416)], [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, 416, 416]) for n in "ab"])


BAD_ONNX = {
    "wrong anchor count": (_wrong_anchor_count,
                           "the model's output has 3000 anchors where its input size 416x416 implies 3549"),
    "output without shape": (_output_without_shape, "its output 'output' has no shape information"),
    "classifier": (_classifier, "its output 'output' is [1, 1000], not YOLOX's [B, N, 85]"),
    "two outputs": (_two_outputs, "it has 2 outputs (a, b)"),
}


@requires_coco
@pytest.mark.parametrize("row", BAD_ONNX, ids=list(BAD_ONNX))
def test_an_onnx_that_is_not_a_yolox_export_is_one_line_exit_2_no_folder(tmp_path, row):
    build, expected = BAD_ONNX[row]
    build(tmp_path / "bad.onnx")
    result = run_in_process("run", "--model", "yolox-nano", "--weights", "bad.onnx", "--backend", "onnxruntime",
                            "--limit", "2", "--coco-dir", str(COCO_DIR), "--output-dir", "o", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert expected in line
    assert line.startswith("error: ONNX model bad.onnx: ") and f"({tmp_path / 'bad.onnx'})" in line  # as given
    assert "; " in line.split(expected, 1)[1]  # and how to fix it
    assert not (tmp_path / "o").exists()


@requires_coco
@requires_yolox
def test_another_variants_weights_are_refused_not_named_as_this_variant(tmp_path):
    # the Nano export run as yolox-s would be a yolox-s submission with Nano's speed and accuracy
    result = run_in_process("run", "--model", "yolox-s", "--weights", str(YOLOX_NANO), "--limit", "2",
                            "--coco-dir", str(COCO_DIR), "--output-dir", "o", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert "has 0.90 M parameters, YOLOX-s 9.0 M: it looks like yolox-nano; run it as --model yolox-nano" in line
    assert not (tmp_path / "o").exists()


@requires_yolox
def test_a_quantized_export_is_not_judged_by_its_float_parameters(tmp_path):
    # its weights are integers, which the float count leaves out: it is still Nano
    from onnxruntime.quantization import quantize_dynamic

    from harness.models.yolox import YoloxDetector

    quantize_dynamic(str(YOLOX_NANO), str(tmp_path / "int8.onnx"))
    assert YoloxDetector("nano", tmp_path / "int8.onnx").model_id == "yolox-nano"


@requires_yolox
def test_the_real_export_passes_and_its_output_shape_is_inferred_when_missing(tmp_path):
    from harness.models.yolox import YoloxDetector

    model = onnx.load(str(YOLOX_NANO))
    model.graph.output[0].type.tensor_type.ClearField("shape")  # what a careless graph edit leaves
    onnx.save(model, tmp_path / "no_output_shape.onnx")
    detector = YoloxDetector("nano", tmp_path / "no_output_shape.onnx")
    assert detector.preprocess.input_size == (416, 416)
    assert YoloxDetector("nano", YOLOX_NANO).preprocess.input_size == (416, 416)


@requires_yolox
def test_an_anchor_count_found_only_at_run_time_names_both_counts(tmp_path):
    """An export with symbolic shapes cannot be checked at load: decode says what is wrong, not --input-size."""
    import torch

    from harness.models.yolox import YoloxDetector

    detector = YoloxDetector("nano", YOLOX_NANO)
    with pytest.raises(UsageError) as err:
        detector.decode([torch.zeros(1, 100, 85)], (416, 416), 0.001)
    assert "the model's output has 100 anchors where the input size 416x416 implies 3549" in str(err.value)
    assert "--input-size a multiple" not in str(err.value)


def _bad_yaml(tmp_path):
    (tmp_path / "bad.yaml").write_text("models: [yolox-nano\nbatch_sizes: [1]\n")


def _coco_without_annotations(tmp_path):
    (tmp_path / "c" / "val2017").mkdir(parents=True)


def _coco_with_broken_annotations(tmp_path):
    (tmp_path / "c" / "annotations").mkdir(parents=True)
    (tmp_path / "c" / "annotations" / "instances_val2017_subset.json").write_text('{"images": [')


def _file_where_the_output_dir_goes(tmp_path):
    (tmp_path / "blocker").write_text("x")


RUN = ["--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--limit", "2"]
# (args, set-up, the path as typed, where it resolves, what is wrong); run in tmp_path, so every path is relative
PATH_MESSAGES = {
    "--coco-dir missing": (["--coco-dir", "../nope"], None, "--coco-dir ../nope", "../nope", "no such folder"),
    "--coco-dir without annotations": (["--coco-dir", "c"], _coco_without_annotations, "--coco-dir c", "c",
                                       "no COCO val2017 annotations in it (looked for annotations/"),
    "annotations not JSON": (["--coco-dir", "c"], _coco_with_broken_annotations,
                             "--coco-dir c", "c/annotations/instances_val2017_subset.json",
                             "annotations/instances_val2017_subset.json is not valid JSON"),
    "--weights missing": (["--model", "yolox-nano", "--weights", "w/nope.onnx", "--limit", "2"], None,
                          "--weights w/nope.onnx", "w/nope.onnx", "no such file"),
    "--output-dir under a file": ([*RUN, "--output-dir", "blocker/sub"], _file_where_the_output_dir_goes,
                                  "--output-dir blocker/sub", "blocker/sub", "cannot create it (Not a directory)"),
    "--config missing": (["--config", "nope.yaml"], None, "--config nope.yaml", "nope.yaml", "no such file"),
    "--config not YAML": (["--config", "bad.yaml"], _bad_yaml, "--config bad.yaml", "bad.yaml",
                          "not valid YAML at line 2, column"),
    "--resume in another folder": (["--resume", "r1", "--output-dir", "elsewhere"], None, "--output-dir elsewhere",
                                   "elsewhere", "no run r1 to resume"),
}


@requires_coco
@pytest.mark.parametrize("row", PATH_MESSAGES, ids=list(PATH_MESSAGES))
def test_messages_name_a_path_as_given_then_absolute(tmp_path, row):
    args, setup, named, resolved, problem = PATH_MESSAGES[row]
    cwd = tmp_path.resolve() / "work"
    cwd.mkdir()
    if setup is not None:
        setup(cwd)
    if "--coco-dir" not in args:
        args = [*args, "--coco-dir", str(COCO_DIR)]
    result = run_in_process("run", *args, cwd=cwd)
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert line.startswith(f"error: {named}: "), line
    assert problem in line and f"({os.path.normpath(cwd / resolved)})" in line, line


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, then closed: nothing listens there, a connection is refused
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_models_fetch_offline_is_exit_1_in_one_line_and_unknown_ids_exit_2(tmp_path, monkeypatch):
    """Offline: every request goes to a proxy that refuses connections. A network failure is not bad usage."""
    download = pytest.importorskip("libreyolo.utils.download")
    monkeypatch.setattr(download, "_DOWNLOAD_BACKOFF_SECONDS", 0.0)  # its retries, without the waits
    proxy = f"http://127.0.0.1:{_closed_port()}"
    env = {"VA_BENCH_WEIGHTS": str(tmp_path), "NO_PROXY": "", "no_proxy": "",
           **{name: proxy for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")}}
    result = run_in_process("models", "fetch", "yolov9t", env=env)
    assert result.returncode == 1, result.stderr
    line = one_error_line(result)  # libreyolo's retry warnings are not printed
    assert "could not download LibreYOLO9t.pt for yolov9t" in line and "check the network" in line
    assert not (tmp_path / "LibreYOLO9t.pt").exists()
    unknown = run_in_process("models", "fetch", "yolov9-nope", env=env)
    assert unknown.returncode == 2 and "unknown model 'yolov9-nope'" in one_error_line(unknown)
    listed = run_in_process("models", "fetch", "damoyolo-ns", env=env)  # named by the leaderboard, not built here
    assert listed.returncode == 2 and "damoyolo-ns is not available: not in libreyolo" in one_error_line(listed)


def test_models_fetch_tells_a_bad_libreyolo_checkpoint_and_force_replaces_it(tmp_path, monkeypatch):
    """A damaged LibreYOLO9t.pt in the cache was "already present" (exit 0) while every run refused it, and --force
    did not download again (libreyolo downloads only to a path holding no file): no fix from va-bench at all."""
    download = pytest.importorskip("libreyolo.utils.download")
    import torch

    (tmp_path / "LibreYOLO9t.pt").write_bytes(b"the first kilobytes of a cut download")
    env = {"VA_BENCH_WEIGHTS": str(tmp_path)}
    present = run_in_process("models", "fetch", "yolov9t", env=env)
    assert present.returncode == 2 and "is there but is not its weights" in one_error_line(present), present.stderr
    assert "--force downloads them again" in present.stderr

    def offline(path, size):  # as libreyolo fails offline: its lock file made, no byte of the partial file
        Path(path).with_name(Path(path).name + ".download.lock").write_bytes(b"\0")
        raise RuntimeError(f"Failed to download weights from https://x after 3 attempts: no network. Partial "
                           f"download kept at {path}.part (0 bytes).")

    monkeypatch.setattr(download, "download_weights", offline)
    failed = run_in_process("models", "fetch", "yolov9t", "--force", env=env)
    assert failed.returncode == 1 and "could not download" in one_error_line(failed)
    assert "no network" in failed.stderr and "Partial download kept" not in failed.stderr  # nothing was kept
    assert not list(tmp_path.glob("*.download.lock"))
    assert (tmp_path / "LibreYOLO9t.pt").read_bytes().startswith(b"the first")  # what was there stays
    monkeypatch.setattr(download, "download_weights", lambda path, size: torch.save({"w": torch.ones(2)}, path))
    forced = run_in_process("models", "fetch", "yolov9t", "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    assert torch.equal(torch.load(tmp_path / "LibreYOLO9t.pt", weights_only=True)["w"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LibreYOLO9t.pt"]


REFUSED_FROM_OPTIONS = [
    (["--precision", "fp16", "--device", "cpu", "--backend", "pytorch"], "precision fp16 on the CPU"),
    (["--precision", "fp16", "--backend", "onnxruntime"], "ONNX Runtime's CPU provider"),
    (["--backend", "ncnn", "--batch-sizes", "1", "4"], "one image per call"),
    (["--backend", "onnxrunt"], "did you mean onnxruntime"),
    (["--model", "yolox-nan"], "did you mean yolox-nano"),
    (["--device", "cuda:x"], "must be a number"),
    (["--device", "mps"], "not supported yet"),
    (["--weights", "/nonexistent/w.onnx"], "no such file"),
    (["--precision", "int8", "--backend", "openvino", "--calibration", "/nonexistent"], "not a folder"),
    (["--cuda-graphs"], "needs --device cuda"),
    (["--batch-sizes", "0"], "positive"),
    (["--coco-dir", "/nonexistent"], "no such folder"),
]


def test_refusals_decided_by_the_options_come_before_torch_is_imported():
    """Every refusal the options alone decide is one line, exit 2, before torch, ONNX Runtime or a model's library
    is imported (what made them take seconds): checked in one fresh interpreter, command after command."""
    script = (
        "import io, sys, contextlib\n"
        "from harness import cli\n"
        "cases = " + repr(REFUSED_FROM_OPTIONS) + "\n"
        "for args, expect in cases:\n"
        "    sys.argv = ['va-bench', 'run', *args]\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        try:\n"
        "            cli.main()\n"
        "        except SystemExit as exc:\n"
        "            code = exc.code\n"
        "    heavy = sorted(m for m in ('torch', 'onnxruntime', 'torchvision', 'cv2') if m in sys.modules)\n"
        "    lines = [line for line in err.getvalue().splitlines() if line.strip()]\n"
        "    print(args, code, len(lines), expect in err.getvalue(), heavy, repr(err.getvalue()[:200]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "VA_BENCH_COCO": str(COCO_DIR)})
    rows = done.stdout.strip().splitlines()
    assert done.returncode == 0 and len(rows) == len(REFUSED_FROM_OPTIONS), done.stderr[-2000:]
    for row in rows:
        assert " 2 1 True [] " in row, row


def test_a_plugins_model_id_too_long_for_a_file_name_is_refused_before_it_runs(tmp_path):
    plugin = tmp_path / "long_id.py"
    plugin.write_text(f"import sys\nsys.path.insert(0, {str(PLUGIN.parent)!r})\n"
                      "from synthetic_detector import make_detector\n\n"
                      "def make():\n    detector = make_detector()\n    detector.model_id = 'm' * 200\n"
                      "    return detector\n")
    result = va_bench("run", "--model", f"{plugin}:make", "--backend", "pytorch", "--limit", "2", "--coco-dir",
                      str(COCO_DIR), "--output-dir", str(tmp_path / "o"))
    assert result.returncode == 2 and "is not a name of 1 to 64 characters" in one_error_line(result)
    assert not (tmp_path / "o").exists()


def test_missing_yolox_weights_name_every_way_to_give_them(monkeypatch, tmp_path):
    """Where the weights were looked for, and the three ways to give them: fetch, --weights, the variable."""
    from harness.models import yolox

    monkeypatch.delenv("VA_BENCH_YOLOX_NANO", raising=False)
    monkeypatch.setattr(yolox, "weight_candidates", lambda variant: [tmp_path / f"yolox_{variant}.onnx"])
    with pytest.raises(UsageError, match=r"weights for yolox-nano not found \(looked in .*yolox_nano.onnx\); run "
                                         r"`va-bench models fetch yolox-nano`, pass --weights PATH \(or --weights "
                                         r"random to time and inspect the architecture\), or set "
                                         r"VA_BENCH_YOLOX_NANO to the file$"):
        yolox.YoloxDetector("nano")


@pytest.mark.parametrize("line, expect", [
    ("backendz: [onnxruntime]", "unknown key 'backendz'; did you mean `backends`?"),
    ("model: yolox-nano", "unknown key 'model'; the key of --model is `models`"),
    ("batch_size: [1]", "unknown key 'batch_size'; the key of --batch-sizes is `batch_sizes`"),
    ("zzz: 1", "unknown key 'zzz'; a preset's keys are the run options' field names"),
    ("no-energy: true", "the key of --energy/--no-energy is `energy`: write `energy: false` for --no-energy"),
])
def test_a_presets_unknown_key_names_the_file_and_the_key_to_write(tmp_path, line, expect):
    """A typo in a preset, or a flag's name used as its key, says which file and what to write instead (pydantic's
    own line was "backendz: Extra inputs are not permitted")."""
    from harness.config import load_config

    preset = tmp_path / "preset.yaml"
    preset.write_text(line + "\n")
    with pytest.raises(UsageError) as err:
        load_config(preset, {})
    assert str(preset) in str(err.value) and expect in str(err.value), str(err.value)


@pytest.mark.parametrize("line, expect", [
    ("target_ci: true", "target_ci (--target-ci): true is a yes/no, not a number"),
    ("min_seconds: true", "min_seconds (--min-seconds): true is a yes/no, not a number"),
    ("draw_images: true", "draw_images (--draw-images): true is a yes/no, not a number"),
    ("conf: false", "conf (--conf): false is a yes/no, not a number"),
    ("batch_sizes: [1, true]", "batch_sizes (--batch-sizes): true in [1, True] is a yes/no, not a number"),
])
def test_a_presets_yes_or_no_for_a_number_is_refused(tmp_path, line, expect):
    """YAML's true/false where a number goes was read as 1 or 0 (pydantic's lax mode: `target_ci: true` timed to
    +-1 %, `min_seconds: true` for one second), a toggle silently taken for a value; a yes/no option still takes
    one."""
    from harness.config import load_config

    preset = tmp_path / "preset.yaml"
    preset.write_text(line + "\n")
    with pytest.raises(UsageError) as err:
        load_config(preset, {})
    assert expect in str(err.value), str(err.value)
    preset.write_text("accuracy: false\nlimit: 8\n")
    config = load_config(preset, {})
    assert (config.accuracy, config.limit) == (False, 8)


@requires_coco
def test_an_evaluation_cap_beyond_the_evaluator_is_refused_before_the_run(tmp_path):
    """`--eval-max-det 100000000` ran every cell's timed pass and then failed it in faster-coco-eval (std::bad_alloc;
    past 2**31 "Unable to cast Python instance of type <class 'int'> to C++ type '?'"), exit 1 with a run folder.
    Refused up front now; a cap of a million (no cap, for any detector) still scores."""
    from harness.config import MAX_EVAL_DET
    from harness.data.coco import CocoDataset
    from harness.eval.coco_eval import evaluate_cell_file

    out = tmp_path / "o"
    result = va_bench("run", "--coco-dir", str(COCO_DIR), "--output-dir", str(out), "--limit", "2",
                      "--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--eval-max-det", "100000000")
    assert result.returncode == 2 and "--eval-max-det" in one_error_line(result) and not out.exists()
    coco = CocoDataset(COCO_DIR).coco
    image_id = sorted(coco.getImgIds())[0]
    ann = coco.loadAnns(coco.getAnnIds(imgIds=image_id, iscrowd=False))[0]
    results = tmp_path / "detections.json"
    results.write_text(json.dumps([{"image_id": image_id, "category_id": ann["category_id"], "bbox": ann["bbox"],
                                    "score": 0.9}]))
    for evaluator in ("faster-coco-eval", "pycocotools"):
        cell = evaluate_cell_file(coco, results, [image_id], evaluator, MAX_EVAL_DET)
        assert cell.stats["AR_max_det"] > 0, evaluator


def test_a_mistyped_weights_variable_is_refused_not_passed_over(tmp_path, monkeypatch):
    """$VA_BENCH_YOLOX_NANO naming no file ran the cached weights in silence (exit 0); $VA_BENCH_COCO is refused."""
    missing = tmp_path / "yolox_nano_typo.onnx"
    result = run_in_process("run", "--limit", "2", "--output-dir", str(tmp_path / "o"),
                            env={"VA_BENCH_YOLOX_NANO": str(missing)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"error: $VA_BENCH_YOLOX_NANO {missing}: no such file; point it at yolox-nano's "
                                     "ONNX file, or unset it to use the weights cache")
    assert not (tmp_path / "o").exists()
