"""The CLI as a user runs it: exit codes, one-line errors, no partial output, plugins."""

import json
import sys
from pathlib import Path

import pytest
from conftest import COCO_DIR, REPO, requires_coco, requires_yolox, run_in_process

from harness.cli import expand_multi_value_options, renamed_file_options


def va_bench(*args, cwd=REPO):
    return run_in_process(*args, cwd=cwd)


def test_multi_value_options_expand():
    assert expand_multi_value_options(["run", "--batch-sizes", "1", "2", "--subset", "sample"]) == [
        "run", "--batch-sizes", "1", "--batch-sizes", "2", "--subset", "sample"]
    assert expand_multi_value_options(["run", "--backend", "a", "b", "--limit", "3"]) == [
        "run", "--backend", "a", "--backend", "b", "--limit", "3"]
    assert expand_multi_value_options(["parity", "preprocess", "--impls", "cv2", "torch", "--limit", "3"]) == [
        "parity", "preprocess", "--impls", "cv2", "--impls", "torch", "--limit", "3"]
    assert expand_multi_value_options(["compare", "--fail-on", "map:-0.01", "a", "b"]) == [
        "compare", "--fail-on", "map:-0.01", "a", "b"]  # positionals are never taken for values


def test_parity_json_path_is_json_out_now():
    assert renamed_file_options(["parity", "preprocess", "--json", "p.json", "--limit", "3"]) == [
        "parity", "preprocess", "--json-out", "p.json", "--limit", "3"]
    assert renamed_file_options(["parity", "preprocess", "--json=p.json"]) == [
        "parity", "preprocess", "--json-out=p.json"]
    assert renamed_file_options(["parity", "preprocess", "--json", "--limit", "3"]) == [
        "parity", "preprocess", "--json", "--limit", "3"]  # the flag: JSON on stdout
    assert renamed_file_options(["validate", "--json", "x"]) == ["validate", "--json", "x"]


def test_renamed_diff_options_keep_their_old_spelling_with_one_deprecation_line(tmp_path):
    """compare's --iou/--conf are the detection diff's pairing IoU and score cut: now --pair-iou/--diff-conf; the
    old names still work (hidden from --help) and say so once; the new ones are range-checked in one line."""
    dets = [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 50, 50], "score": 0.9}]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(dets))
    b.write_text(json.dumps(dets))
    new = va_bench("compare", str(a), str(b), "--pair-iou", "0.6", "--diff-conf", "0.3", "--json")
    old = va_bench("compare", str(a), str(b), "--iou", "0.6", "--conf", "0.3", "--json")
    assert new.returncode == old.returncode == 0 and json.loads(new.stdout) == json.loads(old.stdout)
    assert "deprecated" not in new.stderr
    notes = [line for line in old.stderr.splitlines() if line.strip()]
    assert len(notes) == 2 and "--iou is now --pair-iou" in notes[0] + notes[1]
    bad = va_bench("compare", str(a), str(b), "--pair-iou", "0")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--pair-iou" in bad.stderr
    help_text = va_bench("compare", "--help").stdout
    assert "--pair-iou" in help_text and "--iou" not in help_text.replace("--pair-iou", "")


@requires_coco
@requires_yolox
def test_mini500_on_the_sample_exits_2_with_one_line_and_no_files(tmp_path):
    out = tmp_path / "outputs"
    result = va_bench("run", "--subset", "mini500", "--coco-dir", str(COCO_DIR), "--output-dir", str(out))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "mini500" in lines[0] and "missing" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists()


@pytest.mark.parametrize("args, expect", [
    (["--model", "yolox-huge"], "unknown model"),
    (["--backend", "tensorflow"], "unknown backend"),
    (["--batch-sizes", "0"], "positive"),
    (["--limit", "4", "--batch-sizes", "8"], "larger than the 4 images"),
    (["--weights", "/nonexistent.onnx"], "no such file"),
    (["--device", "tpu"], "unknown --device"),
])
@requires_coco
@requires_yolox
def test_bad_input_exits_2(tmp_path, args, expect):
    result = va_bench("run", "--coco-dir", str(COCO_DIR), "--output-dir", str(tmp_path / "o"), *args)
    assert result.returncode == 2, result.stderr
    assert expect in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()


@requires_coco
def test_plugin_run_through_the_cli(tmp_path):
    plugin = Path(__file__).parent / "plugins" / "synthetic_detector.py"
    result = va_bench("run", "--model", f"{plugin}:make_detector", "--backend", "pytorch", "--subset", "sample",
                      "--limit", "24", "--batch-sizes", "4", "--coco-dir", str(COCO_DIR), "--output-dir",
                      str(tmp_path), "--warmup-batches", "1", "--warmup-seconds", "0", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    (cell,) = summary["cells"]
    assert cell["status"] == "ok"
    doc = json.loads(Path(cell["submission"]).read_text())
    assert doc["model"]["id"] == "synthetic-sleepy"
    assert doc["timing"]["stages_ms"]["forward"]["count"] == 10  # 6 batches, cycled up to the minimum of 10
    assert len(doc["timing"]["batch_samples_ms"]) == 10


@requires_coco
def test_forward_stage_agrees_with_the_cores_own_clock(tmp_path_factory):
    """The forward stage clock vs the plugin's own clock around its sleep: medians of the same batches.
    No absolute duration is asserted (a loaded machine oversleeps); only that the stage adds little."""
    import statistics

    from conftest import run_benchmark

    plugin = Path(__file__).parent / "plugins" / "synthetic_detector.py"
    _, (record,) = run_benchmark(tmp_path_factory, "plugin-clock", models=[f"{plugin}:make_detector"],
                                 backends=["pytorch"], limit=24, batch_sizes=[4], warmup_batches=1,
                                 energy=False, memory=False, accuracy=False, draw_images=0)
    measured = sys.modules["va_bench_plugin_synthetic_detector"].MEASURED_MS
    assert record.timing.short_batch is None  # 24 images in batches of 4: the timed batches are the last calls
    core_p50 = statistics.median(measured[-record.timing.timed_batches:])
    stage_p50 = record.timing.stages_ms["forward"].p50
    assert core_p50 <= stage_p50 + 0.05
    assert stage_p50 - core_p50 < 5.0


def test_corrupt_weights_are_a_usage_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    result = va_bench("run", "--weights", str(bad), "--output-dir", str(tmp_path / "o"))
    assert result.returncode == 2 and "not a readable ONNX model" in result.stderr
    assert not (tmp_path / "o").exists()


def test_broken_plugin_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def make():\n    return object()\n")
    result = va_bench("run", "--model", f"{bad}:make", "--output-dir", str(tmp_path / "o"))
    assert result.returncode == 2 and "returned an object without" in result.stderr


def test_the_torch_free_lists_are_the_registries():
    """A run refuses unknown model and backend names before any model or runtime is imported, from lists that must
    be exactly what the registries build."""
    from harness.backends import BUILTIN_BACKENDS, _registry
    from harness.catalogue import TORCHVISION_IDS, model_ids
    from harness.models.registry import REGISTRY
    from harness.models.torchvision_family import MODELS

    assert model_ids() == tuple(REGISTRY) and TORCHVISION_IDS == tuple(MODELS)
    assert tuple(_registry())[:len(BUILTIN_BACKENDS)] == BUILTIN_BACKENDS


@pytest.mark.parametrize("command, flag", [
    (["aggregate", "{corpus}"], "--output"),
    (["inspect", "yolox-nano"], "--csv"),
    (["parity", "preprocess", "--impls", "cv2", "torch"], "--json-out"),
    (["report", "{tmp}"], "--log"),
])
@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_an_output_file_that_cannot_be_written_is_refused_before_the_work(tmp_path, command, flag, where):
    # checked up front: these commands would otherwise do all their work and then fail on the write
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("")
    target = tmp_path / ("folder" if where == "a folder" else "file.txt/out.json")
    args = [a.format(corpus=tmp_path / "folder", tmp=tmp_path) for a in command]
    result = run_in_process(*args, flag, str(target))
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and flag in line
    assert ("is a folder" if where == "a folder" else "a file") in line, line


def test_a_value_given_twice_is_one_cell():
    # the plan listed "fp32 fp32" as two cells and ran one
    from harness.config import RunConfig

    config = RunConfig(models=["yolox-nano", "yolox-nano"], precisions=["fp32", "fp32"], batch_sizes=[1, 2, 1],
                       backends=["onnx", "onnxruntime"])
    assert (config.models, config.precisions, config.batch_sizes, config.backends) == (
        ["yolox-nano"], ["fp32"], [1, 2], ["onnxruntime"])


@requires_coco
def test_an_option_of_one_value_given_twice_says_which_value_is_used(tmp_path):
    # click keeps the last of two without a word: `--dataset A --dataset B` (as `--model` takes two) scored B only,
    # the user not told; a script's later flag overriding an earlier one still works
    result = run_in_process("run", "--dry-run", "--json", "--limit", "2", "--limit=3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dataset"]["num_images"] == 3
    assert result.stderr.strip() == ("warning: --limit is given 2 times (2, 3): it takes one value, and the last, 3, "
                                     "is the one used")
    same = run_in_process("data", "check", "--limit", "2", "--limit", "2", "--json", cwd=tmp_path)
    assert same.returncode == 0 and "warning" not in same.stderr  # the same value twice says nothing new
    # an on/off switch given both ways: the last wins, and is named
    both = run_in_process("run", "--dry-run", "--json", "--limit", "2", "--overlap", "--no-overlap", cwd=tmp_path)
    assert both.returncode == 0 and json.loads(both.stdout)["num_cells"] == 1, both.stderr
    assert both.stderr.strip() == "warning: --overlap and --no-overlap are both given: the last, --no-overlap, is " \
                                  "the one used"


@requires_coco
def test_options_of_many_values_and_flags_may_repeat(tmp_path):
    result = run_in_process("run", "--dry-run", "--model", "yolox-nano", "--model", "yolox-nano", "--batch-sizes",
                            "1", "2", "--batch-sizes", "4", "--json", "--json", "--limit", "4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (group,) = json.loads(result.stdout)["groups"]
    assert [c["batch_size"] for c in group["cells"]] == [1, 2, 4]


@pytest.mark.parametrize("command, text, line_no", [
    (["run", "--dry-run", "--config"], "batch_sizes: [1]\nbackends: [onnxruntime]\nbatch_sizes: [8]\n", 3),
    (["run", "--dry-run", "--class-map"], "person: person\nperson: car\n", 2),
    (["campaign"], "model: yolox-nano\ndatasets: []\nmodel: other\n", 3),
])
def test_a_key_given_twice_in_a_users_yaml_is_refused(tmp_path, command, text, line_no):
    # YAML keeps the last of two equal keys without a word: a preset would measure the second list silently
    path = tmp_path / "file.yaml"
    path.write_text(text)
    result = run_in_process(*command, str(path), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "appears twice" in line and f"line {line_no}," in line, line


@pytest.mark.parametrize("args, expected", [
    (["inspect", "yolox-nano", "--top", "-1"], "Invalid value for '--top'"),
    (["run", "--batch-sizes", "abc"], "Invalid value for '--batch-sizes'"),
    (["run", "--no-such-flag"], "No such option: --no-such-flag"),
    (["compare"], "Missing argument runs"),
])
def test_clicks_own_usage_errors_are_one_line_too(args, expected):
    # click's usage block (Usage:, Try ..., Error: ...) is four lines; every other refusal is one (click's own
    # wording, its quotes and case, moves between versions: compared without them)
    result = run_in_process(*args)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "--help`" in line, line
    def plain(text: str) -> str:
        return text.replace("'", "").replace("...", "").lower()

    assert plain(expected) in plain(line), line


def test_no_command_shows_the_help():
    result = run_in_process()
    assert result.returncode == 2 and "Usage: va-bench" in result.stdout + result.stderr


def test_narrow_terminals_show_what_matters_whole():
    """At 80 columns: a model that cannot be built here says so (not a bare '-' like a model without local
    weights), a probe's reason is folded rather than cut with an ellipsis, a progress line is not broken by rich."""
    from rich.console import Console

    from harness.views.commands import models_table, print_hw
    from harness.views.progress import RichProgress

    rows = [{"id": "damoyolo-ns", "family": "damoyolo", "task": "detect", "weights": None, "fetch": False,
             "available": False, "note": "not in libreyolo"},
            {"id": "yolox-s", "family": "yolox", "task": "detect", "weights": None, "fetch": True, "available": True,
             "note": ""}]
    console = Console(record=True, width=80)
    console.print(models_table(rows, 80))
    reason = "no cpufreq interface (/sys/devices/system/cpu/*/cpufreq/scaling_cur_freq absent in this container)"
    print_hw(console, {"hardware": {"id": "x", "cpu": "c", "cpu_cores": 2, "ram_gb": 24, "gpu": "none"},
                       "cpu": {"governor": "unavailable"}, "probes": {"cpu_frequency": {"status": "unavailable",
                                                                                          "reason": reason}}})
    RichProgress(console).log("export GLIBC_TUNABLES=" + "glibc.malloc.mmap_threshold=4294967296:" * 3)
    text = console.export_text()
    assert "- (not available" in text and "- (va-bench models fetch)" in text
    assert "…" not in text
    assert "scaling_cur_freq" in "".join(line.split("│")[3].strip() for line in text.splitlines() if "│" in line)
    assert "glibc.malloc.mmap_threshold=4294967296:" * 3 in text.replace("\n", "")


@requires_coco
def test_each_stage_and_the_sites_split_are_the_known_costs_of_their_own_work(tmp_path_factory, monkeypatch):
    """Known costs in all three stages, each measured by its own clock: every image's decode sleeps 3 ms on top of
    the JPEG decode (preprocess, the wrapped decoder's clock), the core's forward sleeps 40 ms (the plugin's clock),
    the detector's head decode sleeps 15 ms (postprocess, the plugin's clock). Each stage holds its own work: no
    stage's median, and no part of the site's total_ms split (per image), is below its work's, and no batch is
    shorter than the work done in it; work moved from one stage to another leaves the first short of its own. The
    forward-clock test above cannot see such a move (the stage sum still adds up). Lower bounds only: how much more
    a stage takes than its work is the machine's load."""
    import statistics
    import time

    from conftest import run_benchmark

    from harness.pipeline import pipeline as pipeline_module
    from harness.results.submission import build_submission

    read_ms, reads = 3.0, []
    decode = pipeline_module.decode_bytes

    def slow_decode(data, path):
        start = time.perf_counter()
        time.sleep(read_ms / 1000)
        image = decode(data, path)
        reads.append((time.perf_counter() - start) * 1000)  # the sleep and the real JPEG decode
        return image

    monkeypatch.setattr(pipeline_module, "decode_bytes", slow_decode)
    plugin = tmp_path_factory.mktemp("plugin") / "costly_stages.py"
    plugin.write_text(f"import sys\nimport time\nsys.path.insert(0, {str(Path(__file__).parent / 'plugins')!r})\n"
                      "import synthetic_detector\nfrom synthetic_detector import SyntheticDetector\n\n"
                      "HEAD_MS, HEAD_MEASURED = 15.0, []\n\n"
                      "class Detector(SyntheticDetector):\n"
                      "    def decode(self, raw, input_size, conf):\n"
                      "        start = time.perf_counter()\n"
                      "        time.sleep(HEAD_MS / 1000)\n"
                      "        out = super().decode(raw, input_size, conf)\n"
                      "        HEAD_MEASURED.append((time.perf_counter() - start) * 1000)\n"
                      "        return out\n\n"
                      "def make_detector():\n    return Detector()\n")
    size = 4
    _, (record,) = run_benchmark(tmp_path_factory, "stage-costs", models=[f"{plugin}:make_detector"],
                                 backends=["pytorch"], limit=24, batch_sizes=[size], warmup_batches=1,
                                 min_timed_batches=8, energy=False, memory=False, accuracy=False, layers=False,
                                 profile=False, draw_images=0)
    module = sys.modules["va_bench_plugin_costly_stages"]
    t = record.timing
    n = t.timed_batches
    assert t.short_batch is None and t.mode == "latency"  # 24 images in 4s: the timed batches are the last calls
    # each timed batch's own work, by the work's own clocks (the last n forwards / head decodes, the last 4n reads)
    forward = module.synthetic_detector.MEASURED_MS[-n:]
    head = module.HEAD_MEASURED[-n:]
    read = [sum(reads[-size * n:][size * k:size * (k + 1)]) for k in range(n)]
    for stage, own in (("preprocess", read), ("forward", forward), ("postprocess", head)):
        own_p50, stage_p50 = statistics.median(own), t.stages_ms[stage].p50
        assert own_p50 <= stage_p50 + 0.05, (stage, own_p50, stage_p50)
    for total, *parts in zip(t.batch_samples_ms, read, forward, head, strict=True):
        assert total >= sum(parts) - 0.05, (total, parts)  # a batch holds its three stages' work
    split = build_submission(record)["timing"]["total_ms"]
    for key, own in (("preprocess_ms", read), ("inference_ms", forward), ("postprocess_ms", head)):
        mean = statistics.fmean(own) / size
        assert mean - 0.05 <= split[key], (key, mean, split[key])


@requires_coco
def test_the_cold_batch_and_the_short_batch_hold_their_known_forwards(tmp_path_factory):
    """A core whose first forward takes 200 ms more (a cold start) and which records each forward's batch size and
    time by its own clock: the warm-up's samples, in order, each hold their forward (the first the cold one), and
    the short final batch's time holds the forward of a batch of that size."""
    from conftest import run_benchmark

    plugin = tmp_path_factory.mktemp("plugin") / "cold_start.py"
    plugin.write_text(f"import sys\nimport time\nsys.path.insert(0, {str(Path(__file__).parent / 'plugins')!r})\n"
                      "from synthetic_detector import SleepyCore, SyntheticDetector\n\n"
                      "COLD_MS, CALLS = 200.0, []\n\n"
                      "class ColdCore(SleepyCore):\n"
                      "    def __call__(self, batch):\n"
                      "        start = time.perf_counter()\n"
                      "        if not CALLS:\n"
                      "            time.sleep(COLD_MS / 1000)\n"
                      "        out = super().__call__(batch)\n"
                      "        CALLS.append((batch.shape[0], (time.perf_counter() - start) * 1000))\n"
                      "        return out\n\n"
                      "class Detector(SyntheticDetector):\n"
                      "    def load_core(self, backend, device, precision, input_size, threads=None):\n"
                      "        return ColdCore()\n\n"
                      "def make_detector():\n    return Detector()\n")
    _, (record,) = run_benchmark(tmp_path_factory, "cold-start", models=[f"{plugin}:make_detector"],
                                 backends=["pytorch"], limit=14, batch_sizes=[4], warmup_batches=2,
                                 min_timed_batches=2, energy=False, memory=False, accuracy=False, layers=False,
                                 profile=False, draw_images=0)
    calls = sys.modules["va_bench_plugin_cold_start"].CALLS
    t = record.timing
    warm = t.warmup_samples_ms
    assert calls[0][1] >= 200 and warm[0] >= calls[0][1] - 0.05, (warm, calls[:2])  # the cold batch, first
    for sample, (size, own) in zip(warm, calls, strict=False):
        assert size == 4 and sample >= own - 0.05, (warm, calls)
    assert t.short_batch["size"] == 2
    (short_forward,) = [ms for size, ms in calls if size == 2]
    assert t.short_batch["total_ms"] >= short_forward - 0.05, (t.short_batch, short_forward)


@requires_coco
def test_overlapped_throughput_is_bounded_by_the_forwards_it_waited_for(tmp_path_factory):
    """Overlapped mode's images/s is the timed images over the stream's wall time. The synthetic core runs one
    forward at a time (its own clock records each), so the stream lasted at least its timed batches' forwards:
    images/s is at most their images over those forwards' summed time, and at least the images over a wall clock
    taken around the whole run; the per-image intervals add up to the stream's time."""
    import time

    from conftest import run_benchmark

    plugin = Path(__file__).parent / "plugins" / "synthetic_detector.py"
    size = 4
    start = time.perf_counter()
    _, (record,) = run_benchmark(tmp_path_factory, "overlapped-bounds", models=[f"{plugin}:make_detector"],
                                 backends=["pytorch"], limit=32, batch_sizes=[size], warmup_batches=1,
                                 min_timed_batches=5, overlap=True, workers="2", energy=False, memory=False,
                                 accuracy=False, layers=False, profile=False, draw_images=0)
    wall_s = time.perf_counter() - start
    t = record.timing
    assert t.mode == "overlapped" and t.short_batch is None and t.timed_images == size * t.timed_batches
    forwards_ms = sys.modules["va_bench_plugin_synthetic_detector"].MEASURED_MS[-t.timed_batches:]
    assert t.images_per_s <= t.timed_images / (sum(forwards_ms) / 1000) * (1 + 1e-6), (t.images_per_s, forwards_ms)
    assert t.images_per_s >= t.timed_images / wall_s
    assert t.timed_seconds >= sum(forwards_ms) / 1000 - 1e-3
    assert sum(i * size for i in t.interval_samples_ms) / 1000 == pytest.approx(t.timed_seconds, abs=2e-3)


def test_an_exception_as_one_line_is_cut_at_a_word():
    from harness.errors import exception_line

    long = RuntimeError("the node died\n  while " + "running the forward " * 30 + "(use `ray status`)")
    line = exception_line(long, 60)
    assert "\n" not in line and line.startswith("RuntimeError: the node died while running")
    assert line.endswith(" ...") and not line.endswith("forwa ...") and len(line) <= len("RuntimeError: ") + 64
    assert exception_line(ValueError()) == "ValueError: (no message)"


def test_a_command_line_flag_in_a_preset_is_named_so(tmp_path):
    """`json: true` in a preset suggested `nms_on`, `config:` suggested `conf`: those are flags of the command line,
    no run option; the list the hint reads is the command's own."""
    from harness.cli.options import DRY_RUN_FLAG, RUN_FLAGS
    from harness.config import COMMAND_LINE_ONLY, load_config
    from harness.errors import UsageError

    flags = {p.default.param_decls[0].lstrip("-").replace("-", "_") for p in [*RUN_FLAGS, DRY_RUN_FLAG]}
    assert flags == set(COMMAND_LINE_ONLY)
    for key in ("json", "config", "dry_run"):
        preset = tmp_path / f"{key}.yaml"
        preset.write_text(f"{key}: true\n")
        with pytest.raises(UsageError, match=f"--{key.replace('_', '-')} is a flag of the command line only"):
            load_config(preset, {})
