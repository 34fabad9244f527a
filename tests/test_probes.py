"""Measurement probes: energy sources against fake sysfs/NVML, peak memory, layer timing, profiler."""

import csv
import json
import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO

from harness.measure.device import Device
from harness.measure.energy import (
    EnergyProbe,
    EnergyUnavailable,
    JetsonRailsSource,
    NvmlSource,
    RaplSource,
    energy_block,
)
from harness.measure.layers import hook_leaf_modules
from harness.measure.memory import MemoryMonitor


def _rapl_tree(root: Path, package_uj: int, core_uj: int, dram_uj: int, max_uj: int = 262143328850) -> Path:
    api = root / "intel-rapl"
    pkg = api / "intel-rapl:0"
    for folder, name, value in ((pkg, "package-0", package_uj), (pkg / "intel-rapl:0:0", "core", core_uj),
                                (pkg / "intel-rapl:0:1", "dram", dram_uj)):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "name").write_text(name + "\n")
        (folder / "energy_uj").write_text(f"{value}\n")
        (folder / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return api


def test_rapl_exact_joules_with_wraparound(tmp_path):
    api = _rapl_tree(tmp_path, package_uj=1_000_000, core_uj=500_000, dram_uj=262143328850 - 2_000_000)
    source = RaplSource(str(api))
    assert sorted(source.names) == ["core_0", "dram_0", "package_0"]
    source.start()
    _rapl_tree(tmp_path, package_uj=13_500_000, core_uj=4_500_000, dram_uj=1_000_000)  # dram counter wrapped
    reading = source.stop()
    assert reading.joules == {"package_0": 12.5, "core_0": 4.0, "dram_0": 3.0}
    assert reading.total_j == 15.5  # package + dram; core is inside package


def test_rapl_unreadable_says_how_to_fix(tmp_path, monkeypatch):
    api = _rapl_tree(tmp_path, 1, 1, 1)

    def denied(self):
        raise PermissionError("energy_uj")

    monkeypatch.setattr(RaplSource, "_read", denied)
    with pytest.raises(EnergyUnavailable, match="chmod"):
        RaplSource(str(api))
    with pytest.raises(EnergyUnavailable, match="no RAPL interface"):
        RaplSource(str(tmp_path / "absent"))


class FakeNvml:
    """Stands in for pynvml: a GPU whose energy counter (mJ) the test advances."""

    def __init__(self):
        self.energy_mj = 5_000_000

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.energy_mj


def test_nvml_exact_joules():
    nvml = FakeNvml()
    source = NvmlSource(0, nvml=nvml)
    source.start()
    nvml.energy_mj += 42_500
    assert source.stop().joules == {"nvidia_gpu_0": 42.5}


def test_nvml_error_is_unavailable():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    with pytest.raises(EnergyUnavailable, match="NVML"):
        NvmlSource(0, nvml=Broken())


def test_jetson_rails_integrate_exactly(tmp_path):
    hwmon = tmp_path / "1-0040" / "hwmon" / "hwmon3"
    hwmon.mkdir(parents=True)
    for n, label, mv, ma in ((1, "VDD_IN", 5000, 1000), (2, "VDD_CPU_GPU_CV", 5000, 400)):
        (hwmon / f"in{n}_label").write_text(label + "\n")
        (hwmon / f"in{n}_input").write_text(str(mv))
        (hwmon / f"curr{n}_input").write_text(str(ma))
    source = JetsonRailsSource(str(tmp_path / "*" / "hwmon" / "hwmon*"))
    source.start(threaded=False)
    source.samples = [(0.0, source.read_watts())]
    (hwmon / "curr1_input").write_text("2000")  # VDD_IN goes from 5 W to 10 W
    source.sample(now=2.0)
    source.sample(now=4.0)
    reading = source.integrate()
    assert reading.joules["VDD_IN"] == pytest.approx(0.5 * (5 + 10) * 2 + 10 * 2)  # trapezoid: 35 J
    assert reading.joules["VDD_CPU_GPU_CV"] == pytest.approx(2.0 * 4)
    assert reading.total_domains == ["VDD_IN"]


def test_energy_block_reports_per_image_and_unavailable(tmp_path):
    api = _rapl_tree(tmp_path, 0, 0, 0)
    probe = EnergyProbe(sources=[RaplSource(str(api))], unavailable={"nvml": "no CUDA device in this run"})
    window: dict = {}
    with probe.window(window):
        _rapl_tree(tmp_path, 20_000_000, 10_000_000, 4_000_000)
    block = energy_block(window, probe, images=48)
    assert block["status"] == "ok" and block["joules_total"] == 24.0
    assert block["joules_per_image"] == 0.5 and block["images_per_joule"] == 2.0
    assert block["domains"]["package_0"]["avg_w"] == pytest.approx(20.0 / window["duration_s"], rel=1e-3)
    empty = energy_block({}, EnergyProbe(unavailable={"rapl": "absent"}), 10)
    assert empty == {"status": "unavailable", "reason": "rapl: absent"}


def test_a_counter_that_did_not_advance_or_went_backwards_measured_nothing(tmp_path):
    # NVML's counter unmoved over a short window: not 0 J; a RAPL wrap whose range is unreadable: not negative J
    nvml = FakeNvml()
    still = EnergyProbe(sources=[NvmlSource(0, nvml=nvml)])
    window: dict = {}
    with still.window(window):
        pass
    block = energy_block(window, still, images=8)
    assert block["status"] == "unavailable" and "did not advance" in block["reason"], block
    api = _rapl_tree(tmp_path, 5_000_000, 1_000_000, 3_000_000)
    for name in ("intel-rapl:0", "intel-rapl:0/intel-rapl:0:0", "intel-rapl:0/intel-rapl:0:1"):
        (api / name / "max_energy_range_uj").unlink()
    wrapped = EnergyProbe(sources=[RaplSource(str(api))])  # its counters' range unread: a wrap cannot be undone
    with wrapped.window(window):
        _rapl_tree(tmp_path, 1_000_000, 2_000_000, 4_000_000)  # the package counter wrapped
    block = energy_block(window, wrapped, images=8)
    assert block["status"] == "unavailable" and "package_0 went backwards" in block["reason"], block


def test_this_machine_says_why_energy_is_unavailable():
    probe = EnergyProbe.detect(None)
    if probe.sources:
        pytest.skip("this machine exposes an energy counter")
    assert {"rapl", "jetson", "nvml"} <= set(probe.unavailable)
    assert all(reason for reason in probe.unavailable.values())


def test_peak_rss_sees_a_buffer_allocated_inside_the_window():
    size_mb = 256
    with MemoryMonitor(Device("cpu"), interval_s=0.01) as monitor:
        monitor.begin_window("baseline")
        baseline = monitor.end_window()["peak_ram_mb"]
        monitor.begin_window("alloc")
        # fresh pages from the kernel: a malloc'd buffer could reuse heap earlier tests freed but
        # glibc kept resident (the Makefile's GLIBC_TUNABLES disable trimming), and not raise RSS
        region = mmap.mmap(-1, size_mb * 2**20)
        pages = np.frombuffer(region, dtype=np.uint8)
        pages[:] = 1  # touches every page
        del pages
        region.close()
        peak = monitor.end_window()
    assert peak["peak_ram_mb"] - baseline >= size_mb * 0.95
    assert peak["peak_vram_mb"] is None and "CPU" in peak["vram_reason"]
    assert any(tag == "alloc" for _, tag, _, _ in monitor.rows())



def test_vmhwm_is_read_in_kib_and_given_in_mib(monkeypatch, tmp_path):
    """proc(5): /proc/[pid]/status gives VmHWM in kB (KiB); 524288 kB is 512 MiB."""
    from harness.measure import memory

    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 9999999 kB\nVmHWM:\t  524288 kB\nVmRSS:\t  400000 kB\n")
    monkeypatch.setattr(memory, "Path", lambda p: status if str(p) == "/proc/self/status" else Path(p))
    assert memory._vm_hwm_mb() == 512.0


def test_each_window_s_peaks_are_its_own_in_mib(monkeypatch):
    """A CUDA run's window (fake torch.cuda): RSS and device memory in MiB (2^20 bytes), the allocated peak as
    peak_vram_mb and the reserved one apart, the CUDA peak counters reset at each window's start; a later, smaller
    window reads its own peak, not the earlier one's; a VmHWM above every sample (a spike between them) is the
    peak."""
    from types import SimpleNamespace

    from harness.measure import memory

    resets = []
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index: 2**30)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda index: resets.append(index))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda index: 3 * 2**30 + 512 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda index: 4 * 2**30)
    monkeypatch.setattr(memory, "_reset_vm_hwm", lambda: False)  # no VmHWM here: the samples alone
    rss = [2 * 2**30]
    monitor = MemoryMonitor(Device("cuda", 1))
    monitor.process = SimpleNamespace(memory_info=lambda: SimpleNamespace(rss=rss[0]))
    monitor.begin_window("large")
    first = monitor.end_window()
    assert (first["peak_ram_mb"], first["peak_vram_mb"], first["peak_vram_reserved_mb"]) == (2048.0, 3584.0, 4096.0)
    assert first["ram_method"].startswith("psutil RSS sampling")
    rss[0] = 2**30
    monitor.begin_window("small")
    assert monitor.end_window()["peak_ram_mb"] == 1024.0
    assert resets == [1, 1]
    monkeypatch.setattr(memory, "_reset_vm_hwm", lambda: True)
    for hwm, peak in ((1500.0, 1500.0), (900.0, 1024.0)):  # the larger of VmHWM and the samples
        monkeypatch.setattr(memory, "_vm_hwm_mb", lambda hwm=hwm: hwm)
        monitor.begin_window("spike")
        window = monitor.end_window()
        assert window["peak_ram_mb"] == peak and window["ram_method"].startswith("VmHWM")


def test_layer_hooks_are_removed_after_the_pass():
    nested = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 1))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), nested)
    with hook_leaf_modules(model, Device("cpu"), lambda: 0) as calls:
        model(torch.zeros(2, 3, 8, 8))
    assert [c.type for c in calls] == ["Conv2d", "ReLU", "Conv2d"]
    assert calls[0].input_shapes == "2x3x8x8" and calls[0].output_shapes == "2x4x6x6"
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_a_leaf_calling_another_leaf_keeps_its_own_time_only(monkeypatch):
    """A module without children that calls a module held outside them: the inner call's time is the inner row's;
    the outer row's is what it ran itself, never the two together (a fake clock: each module advances it by its
    own known time)."""
    from harness.measure import layers

    now = [0]
    monkeypatch.setattr(layers.time, "perf_counter_ns", lambda: now[0])

    class Takes(torch.nn.Module):
        def __init__(self, ms, held=None):
            super().__init__()
            self.ns, self.held = ms * 1_000_000, [held] if held is not None else []

        def forward(self, x):
            now[0] += self.ns
            return self.held[0](x) if self.held else x

    inner = Takes(50)
    model = torch.nn.Sequential(inner, Takes(20, held=inner))
    with hook_leaf_modules(model, Device("cpu"), lambda: 0) as calls:
        model(torch.zeros(1))
    assert [(c.name, c.ms) for c in calls] == [("0", 50.0), ("0", 50.0), ("1", 20.0)]  # not 70 for "1"


def test_layer_pass_artifacts_add_up(ort_run, torch_run):
    for plan, records in (ort_run, torch_run):
        run_dir = plan.run_dir
        layered = [r for r in records if r.layers]
        assert len(layered) == 1 and layered[0].cell.batch_size == 8  # once per group, at the largest batch
        for coverage in layered[0].layers["layer_sum_over_forward"]:
            assert 0.85 <= coverage <= 1.0
        rows = list(csv.DictReader(open(run_dir / "layer_timer.csv")))
        assert {r["batch"] for r in rows} == {"0", "1", "2"}
        assert all(float(r["ms"]) >= 0 for r in rows)
        types = list(csv.DictReader(open(run_dir / "layer_types.csv")))
        assert sum(float(t["share_pct"]) for t in types) == pytest.approx(100, abs=0.1)
        conv = "Conv2d" if records[0].cell.load.backend == "pytorch" else "Conv"
        assert types[0]["layer_type"] == conv
        # every file the run wrote for a cell is named in its submission, and every name is a file
        for record in records:
            artifacts = json.loads((run_dir / record.artifacts["submission"]).read_text())["artifacts"]
            assert all((run_dir / name).is_file() for name in artifacts.values()), artifacts
            assert "memory" in artifacts
        layer_artifacts = json.loads((run_dir / layered[0].artifacts["submission"]).read_text())["artifacts"]
        assert {"layer_timer", "layer_types"} <= set(layer_artifacts), layer_artifacts


def test_profiler_trace_is_chrome_json_with_the_forward_ops(ort_run, torch_run):
    trace = json.loads((torch_run[0].run_dir / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"aten::conv2d", "forward", "preprocess", "postprocess"} <= names
    assert all("ph" in e for e in trace["traceEvents"][:100])
    ops = list(csv.DictReader(open(torch_run[0].run_dir / "profiler_ops.csv")))
    assert any(o["name"] == "aten::mkldnn_convolution" for o in ops)
    ort_dir = ort_run[0].run_dir
    assert {"forward", "torchvision::nms"} <= {e.get("name") for e in
                                               json.loads((ort_dir / "trace.json").read_text())["traceEvents"]}
    ort_nodes = json.loads(next(ort_dir.glob("ort_profile__*.json")).read_text())
    assert any(e.get("args", {}).get("op_name") == "Conv" for e in ort_nodes)


def test_probe_results_in_submissions(ort_run):
    plan, records = ort_run
    for path in (plan.run_dir / "submissions").glob("*.json"):
        doc = json.loads(path.read_text())
        assert doc["memory"]["peak_ram_mb"] > 100
        energy = doc["energy"]
        assert energy["status"] in ("ok", "unavailable")
        if energy["status"] == "unavailable":
            assert energy["reason"]
    energy_rows = list(csv.DictReader(open(plan.run_dir / "energy.csv")))
    assert len(energy_rows) == 2 and all(float(r["duration"]) > 0 for r in energy_rows)
    memory_rows = list(csv.DictReader(open(plan.run_dir / "memory.csv")))
    assert len(memory_rows) > 5 and all(float(r["rss_mb"]) > 0 for r in memory_rows)


def test_hw_json_names_every_probe():
    result = subprocess.run([sys.executable, "-m", "harness", "hw", "--json"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["hardware"]["id"]
    assert {"energy.rapl", "energy.nvml", "energy.jetson", "memory.host_peak", "memory.cuda_peak", "profiler.cpu",
            "profiler.cuda", "onnxruntime", "device_state.cpu_frequency", "device_state.cpu_temperature"} \
        <= set(report["probes"])
    # the device sampler's CPU sources, against this machine's own sysfs
    has_cpufreq = any(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"))
    has_thermal = any(Path("/sys/class/thermal").glob("thermal_zone*/temp"))
    assert (report["probes"]["device_state.cpu_frequency"]["status"] == "ok") == has_cpufreq
    assert (report["probes"]["device_state.cpu_temperature"]["status"] == "ok") == has_thermal
    assert all(p["status"] in ("ok", "unavailable") for p in report["probes"].values())
    assert all(p.get("reason") for p in report["probes"].values() if p["status"] == "unavailable")


def test_a_layer_pass_that_timed_no_layer_says_so_rather_than_zero(tmp_path):
    """A core whose torch_module is not what its forward runs: no leaf module is called during the pass, and the
    record says the layers are unavailable (it said every layer summed to 0.00 of the forward)."""
    from conftest import COCO_DIR, run_in_process

    if not COCO_DIR.is_dir():
        pytest.skip("COCO sample not found")
    plugin = tmp_path / "unhooked.py"
    plugin.write_text(f"import sys\nsys.path.insert(0, {str(REPO / 'tests' / 'plugins')!r})\nimport torch\n"
                      "from synthetic_detector import SleepyCore, SyntheticDetector\n\n"
                      "class Core(SleepyCore):\n    def __call__(self, batch):\n"
                      "        self.torch_module = torch.nn.Identity()  # the one called is not the one hooked\n"
                      "        return super().__call__(batch)\n\n"
                      "class Detector(SyntheticDetector):\n"
                      "    def load_core(self, backend, device, precision, input_size, threads=None):\n"
                      "        return Core()\n\n"
                      "def make_detector():\n    return Detector()\n")
    done = run_in_process("run", "--model", f"{plugin}:make_detector", "--backend", "pytorch", "--limit", "4",
                          "--batch-sizes", "1", "--coco-dir", str(COCO_DIR), "--no-accuracy", "--layers",
                          "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2", "--no-energy",
                          "--draw-images", "0", "--output-dir", str(tmp_path), env={"VA_BENCH_TEST_FORWARD_MS": "1"})
    assert done.returncode == 0, done.stderr
    layers = json.loads(next(tmp_path.glob("*/submissions/*.json")).read_text())["layers"]
    assert layers["status"] == "unavailable" and "no layer was timed" in layers["reason"]


def test_the_memory_timeline_is_kept_as_columns_and_read_back_as_sampled():
    """MemoryMonitor keeps its samples as typed columns (a long sustained run's timeline must not add to the RSS it
    measures at ~120 bytes a sample as tuples of floats): rows() gives each sample back, tags and missing CUDA figures
    included, in order."""
    from harness.measure.device import Device
    from harness.measure.memory import MemoryMonitor

    monitor = MemoryMonitor(Device("cpu"))
    expected = []
    for tag in ("start", "start", "timing a b1", "between", "timing a b1"):
        monitor.tag = tag
        before = len(list(monitor.rows()))
        monitor._sample()
        (sample,) = list(monitor.rows())[before:]
        expected.append((tag, sample[2]))
        assert sample[3] is None and sample[2] > 0
    rows = list(monitor.rows())
    assert [(tag, rss) for _, tag, rss, _ in rows] == expected
    assert [t for t, *_ in rows] == sorted(t for t, *_ in rows)
    assert monitor._times.itemsize == monitor._rss.itemsize == 8 and monitor._tag_names == ["start", "timing a b1",
                                                                                           "between"]


def test_a_runs_energy_per_image_is_the_windows_energy_over_the_images_the_core_ran_in_it(tmp_path_factory,
                                                                                          monkeypatch):
    """A real run with a constant-power source (50 W, its own clock for its window) in place of the machine's
    counters: the submission's joules are 50 W x the source's window, and its images are those the core itself
    forwarded inside that window (the synthetic core's own count: the timed batches, not the warm-up, not the short
    batch), so joules/image and images/joule are the energy over the core's images; the average power is 50 W."""
    import time

    from conftest import COCO_DIR, run_benchmark

    from harness.measure.energy import SourceReading
    from harness.results.submission import build_submission

    if not COCO_DIR.is_dir():
        pytest.skip("COCO sample not found")
    watts, size, seen = 50.0, 4, {}

    def forwards() -> int:  # the plugin's own list: one entry per forward it ran
        return len(sys.modules["va_bench_plugin_synthetic_detector"].MEASURED_MS)

    class ConstantPower:
        method = "constant-power (test)"

        def start(self):
            seen["start"], seen["forwards"] = time.perf_counter(), forwards()

        def stop(self):
            seen["window_s"] = time.perf_counter() - seen["start"]
            seen["images"] = (forwards() - seen["forwards"]) * size
            return SourceReading(self.method, {"package_0": watts * seen["window_s"]}, ["package_0"])

    monkeypatch.setattr(EnergyProbe, "detect", classmethod(lambda cls, gpu_index=None: cls(sources=[ConstantPower()])))
    plugin = REPO / "tests" / "plugins" / "synthetic_detector.py"
    _, (record,) = run_benchmark(tmp_path_factory, "energy-known", models=[f"{plugin}:make_detector"],
                                 backends=["pytorch"], limit=14, batch_sizes=[size], warmup_batches=1,
                                 min_timed_batches=6, memory=False, accuracy=False, layers=False, profile=False,
                                 draw_images=0)
    energy = build_submission(record)["energy"]
    assert record.timing.short_batch["size"] == 2  # a short batch ran after the window, outside it
    joules = watts * seen["window_s"]
    assert energy["status"] == "ok" and energy["methods"] == ["constant-power (test)"]
    assert energy["images"] == seen["images"] == record.timing.timed_images
    assert energy["joules_total"] == pytest.approx(joules, abs=2e-6)
    assert energy["joules_per_image"] == pytest.approx(joules / seen["images"], abs=2e-6)
    assert energy["images_per_joule"] == pytest.approx(seen["images"] / joules, abs=2e-4)
    # the run's window lies inside the source's (started before it, stopped after it): never longer, so never less
    # than the source's power on average
    assert 0 < energy["window_s"] <= seen["window_s"] + 5e-5
    assert energy["domains"]["package_0"]["avg_w"] >= watts - 0.01


def test_ort_layer_figures_are_onnx_runtimes_own_profile_summed(ort_run):
    """The ONNX Runtime layer pass against the runtime's own profile, read here with json alone: each op type's total
    and count in layer_types.csv are its kernel events summed, and each batch's layer_sum_over_forward (layer time
    over the harness's forward wall time) is at most the layer time over ONNX Runtime's own model_run span of that
    batch, which the harness's wall time encloses."""
    plan, records = ort_run
    (layered,) = [r for r in records if r.layers]
    (profile,) = plan.run_dir.glob("ort_profile__*.json")
    events = json.loads(profile.read_text())
    runs = sorted((e["ts"], e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    totals, counts = {}, {}
    for e in kernels:
        op = e["args"]["op_name"]
        totals[op] = totals.get(op, 0.0) + e["dur"] / 1000
        counts[op] = counts.get(op, 0) + 1
    rows = {r["layer_type"]: r for r in csv.DictReader(open(plan.run_dir / "layer_types.csv"))}
    assert set(rows) == set(totals)
    for op, row in rows.items():
        assert float(row["total_ms"]) == pytest.approx(totals[op], abs=1e-3) and int(row["count"]) == counts[op], op
    coverage = layered.layers["layer_sum_over_forward"]
    assert len(coverage) == len(runs) == layered.layers["batches"]
    for share, (start, duration) in zip(coverage, runs, strict=True):
        inside = sum(e["dur"] for e in kernels if start <= e["ts"] <= start + duration)
        assert 0 < share <= inside / duration + 1e-4, (share, inside, duration)


def test_other_processes_peaks_are_added_each_where_it_has_one_and_unknown_where_one_is():
    """--forward-process and --host-processes: the record's peaks are the sum of each process's own (the host
    processes use no device: they add RAM only), the run's own kept beside them; a peak one process cannot give
    makes the sum unknown, with that process's reason."""
    from harness.measure.memory import with_other_processes

    run = {"peak_ram_mb": 800.0, "ram_method": "VmHWM", "peak_vram_mb": 300.0, "peak_vram_reserved_mb": 400.0}
    forward = {"peak_ram_mb": 700.0, "peak_vram_mb": 1200.5, "peak_vram_reserved_mb": 1500.0}
    host = {"peak_ram_mb": 1100.25, "processes": 2}
    out = with_other_processes(run, {"forward_process": forward, "host_processes": host})
    assert (out["peak_ram_mb"], out["peak_vram_mb"], out["peak_vram_reserved_mb"]) == (2600.25, 1500.5, 1900.0)
    assert out["run_process"] == {"peak_ram_mb": 800.0, "peak_vram_mb": 300.0, "peak_vram_reserved_mb": 400.0}
    assert out["forward_process"] == forward and out["host_processes"] == host and out["ram_method"] == "VmHWM"
    outside = {"peak_ram_mb": 700.0, "peak_vram_mb": None, "peak_vram_reserved_mb": None,
               "vram_reason": "the onnxruntime core allocates outside torch's allocator"}
    out = with_other_processes(run, {"forward_process": outside, "host_processes": {"peak_ram_mb": None,
                                                                                    "processes": 2}})
    assert out["peak_ram_mb"] is None and out["peak_vram_mb"] is None and "onnxruntime" in out["vram_reason"]
