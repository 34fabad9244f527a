"""Bad run options and broken models (issue 14, run side): one line, exit 2 and nothing written for bad
input; a failed cell with the reason (exit 1) for a measurement that breaks inside the sweep."""

import json
from pathlib import Path

import pytest
from conftest import COCO_DIR, REPO, requires_coco, run_in_process

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
    (["--resume", "x", "--retry-failed", "--config", "configs/default.yaml"], "drop --config"),
    (["--retry-failed"], "--resume"),
])
@requires_coco
def test_bad_run_options_exit_2_with_one_line_and_no_folder(tmp_path, args, expect):
    out = tmp_path / "o"
    result = va_bench("run", "--coco-dir", str(COCO_DIR), "--output-dir", str(out), *args)
    assert result.returncode == 2, result.stderr
    assert expect in one_error_line(result)
    assert not out.exists()


def test_output_dir_that_is_a_file_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = va_bench("run", "--coco-dir", str(COCO_DIR), "--output-dir", str(blocker / "sub"), "--limit", "2",
                      "--model", f"{PLUGIN}:make_detector", "--backend", "pytorch")
    assert result.returncode == 2 and "--output-dir" in one_error_line(result)


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


def test_readme_lists_every_run_option():
    from harness.config import run_option_fields

    readme = (REPO / "README.md").read_text()
    missing = [f.json_schema_extra["flags"][0].split("/")[0] for f in run_option_fields().values()
               if f.json_schema_extra["flags"][0].split("/")[0] not in readme]
    assert missing == []


def test_help_shows_defaults_and_version():
    help_text = va_bench("run", "--help").stdout
    assert "[default: 1]" in help_text and "--batch-sizes" in help_text and "<bool>" not in help_text
    version = va_bench("--version")
    assert version.returncode == 0 and version.stdout.startswith("va-bench ")
