"""Device hygiene with fakes for every condition: another GPU process (refused at plan time), our own PID
seen through a container's namespace, throttle bits during a timed pass, Jetson power modes and devfreq,
Raspberry Pi throttled flags, CPU sysfs trees, busy processes, locked clocks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import requires_coco, requires_yolox, run_in_process

from harness.backends.support import on_torch_threads
from harness.errors import UsageError
from harness.measure import hygiene
from harness.measure.hygiene import DeviceSampler, JetsonReader, NvmlReader, gpu_processes, jetson_power, locked_clocks
from harness.run.repeats import repeat_parent


class FakeNvml:
    """NVML as pynvml exposes it, with the processes, clock-event reasons and clocks a test sets."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0

    def __init__(self, processes=(), reasons=(0,), lock_error=None):
        self.processes = [SimpleNamespace(pid=pid, usedGpuMemory=mib * 2**20) for pid, mib in processes]
        self.reasons = list(reasons)
        self.calls: list[tuple] = []
        self.lock_error = lock_error

    def nvmlInit(self):
        self.calls.append(("init",))

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self.processes

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons.pop(0) if len(self.reasons) > 1 else self.reasons[0]

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return 1980 if kind == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1980

    def nvmlDeviceGetTemperature(self, handle, kind):
        return 61

    def nvmlDeviceGetPowerUsage(self, handle):
        return 312_000

    def nvmlDeviceSetGpuLockedClocks(self, handle, low, high):
        if self.lock_error:
            raise self.lock_error
        self.calls.append(("lock", low, high))

    def nvmlDeviceResetGpuLockedClocks(self, handle):
        self.calls.append(("reset",))

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA GeForce RTX 5070 Ti"  # older bindings give bytes

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=16 * 2**30)

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_another_gpu_process_is_refused_and_allowed_when_asked(tmp_path):
    nvml = FakeNvml(processes=[(4242, 3000)])
    root = _tree(tmp_path, {"proc/self/status": f"Name:\tpython\nNSpid:\t{os.getpid()}\n"})
    with pytest.raises(UsageError, match=r"GPU 0 is in use by 1 other compute process\(es\): pid 4242 \(3000 MiB\)"
                                         r".*--allow-shared-gpu"):
        gpu_processes(0, False, nvml, root)
    record = gpu_processes(0, True, nvml, root)
    assert record["shared_gpu_allowed"] and record["other_processes"] == [{"pid": 4242, "used_gpu_memory_mib": 3000}]


def test_our_own_pid_in_a_container_namespace_is_not_another_process(tmp_path):
    """NVML lists the host's PID (91234) of this process; /proc/self/status NSpid holds it beside ours."""
    root = _tree(tmp_path, {"proc/self/status": f"Name:\tpython\nNSpid:\t91234\t{os.getpid()}\n"})
    assert gpu_processes(0, False, FakeNvml(processes=[(91234, 500)]), root)["other_processes"] == []


def test_jetson_and_missing_nvml_are_unavailable_not_refused(tmp_path):
    jetson = _tree(tmp_path / "j", {"proc/device-tree/model": "NVIDIA Jetson AGX Orin Developer Kit\0"})
    assert gpu_processes(0, False, FakeNvml(processes=[(1, 1)]), jetson)["status"] == "unavailable"

    class Broken(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")
    record = gpu_processes(0, False, Broken(), _tree(tmp_path / "x", {}))
    assert record["status"] == "unavailable" and "NVML Shared Library Not Found" in record["reason"]


@requires_coco
@requires_yolox
def test_plan_time_refusal_is_one_line_exit_2_and_no_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(hygiene, "load_nvml", lambda nvml=None: (FakeNvml(processes=[(4242, 3000)]), None))
    out = tmp_path / "o"
    result = run_in_process("run", "--device", "cuda", "--backend", "pytorch", "--output-dir", str(out))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "pid 4242" in lines[0], result.stderr
    assert not out.exists()


def _sampler(gpu=None, root=None, run=None, processes=None, uptime=None):
    sampler = DeviceSampler(gpu, root or Path("/nonexistent"), run=run or _no_vcgencmd,
                            processes=processes or (lambda: []), uptime=uptime, boot_time=0.0)
    return sampler


def _no_vcgencmd(*args, **kwargs):
    raise FileNotFoundError("vcgencmd")


def test_a_thermal_throttle_bit_during_the_pass_marks_the_cell(tmp_path):
    reader = NvmlReader(FakeNvml(reasons=[0x1, 0x20, 0x1]), 0)  # idle, sw thermal slowdown, idle
    sampler = _sampler(reader)
    sampler.begin_window("cell")
    sampler._sample()
    state = sampler.end_window()
    assert state["throttled"] and state["throttle_reasons"] == ["sw_thermal_slowdown"]
    assert state["gpu"]["clock_event_reasons"] == ["gpu_idle", "sw_thermal_slowdown"]
    assert state["gpu"]["sm_clock_mhz"] == [1980, 1980] and state["gpu"]["power_w_max"] == 312.0
    assert state["warnings"][0].startswith("throttled during the timed pass (sw_thermal_slowdown)")
    idle = _sampler(NvmlReader(FakeNvml(reasons=[0x1]), 0))
    idle.begin_window("cell")
    assert idle.end_window()["throttled"] is False  # an idle GPU between batches is no slowdown


def test_jetson_power_mode_clocks_and_trips(tmp_path, monkeypatch):
    root = _tree(tmp_path, {
        "sys/class/devfreq/17000000.ga10b/cur_freq": "510000000", "sys/class/devfreq/17000000.ga10b/max_freq":
        "1300500000", "sys/class/devfreq/17000000.ga10b/min_freq": "306000000",
        "sys/class/thermal/thermal_zone0/type": "gpu-thermal", "sys/class/thermal/thermal_zone0/temp": "99500",
        "sys/class/thermal/thermal_zone0/trip_point_0_temp": "99000",
        "sys/class/thermal/thermal_zone0/trip_point_0_type": "passive"})
    for out, expected in (("NV Power Mode: MAXN\n0\n", {"name": "MAXN", "id": 0}),
                          ("NVPM WARN: ...\nNV Power Mode: 15W\n2\n", {"name": "15W", "id": 2})):
        power = jetson_power(root, run=lambda *a, out=out, **k: SimpleNamespace(stdout=out))
        assert power["nvpmodel"] == expected and power["jetson_clocks"] is False and power["gpu_max_mhz"] == 1300.5
    (root / "sys/class/devfreq/17000000.ga10b/min_freq").write_text("1300500000")
    assert jetson_power(root, run=_no_vcgencmd)["jetson_clocks"] is True
    assert "nvpmodel not found" in jetson_power(root, run=_no_vcgencmd)["nvpmodel"]
    sampler = _sampler(JetsonReader(root), root)
    sampler.begin_window("cell")
    state = sampler.end_window()
    assert state["throttled"] and state["gpu"]["sm_clock_mhz"] == [510.0, 510.0]
    assert state["throttle_reasons"] == ["thermal trip: gpu-thermal 100C >= passive 99C"]
    # a clock below its maximum is recorded and warned about, not called throttling (idle clocks scale down)
    assert any(w.startswith("GPU clock at most 510 MHz of 1300 MHz") for w in state["warnings"])
    (root / "sys/class/thermal/thermal_zone0/temp").write_text("50000")
    cool = _sampler(JetsonReader(root), root)
    cool.begin_window("cell")
    assert cool.end_window()["throttled"] is False
    # a CPU run on a Jetson samples no GPU at all; both record the board's power mode with every timed pass
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/model").write_text("NVIDIA Jetson AGX Orin")
    from harness.measure.device import Device
    monkeypatch.setattr(hygiene, "jetson_power", lambda r: jetson_power(
        r, run=lambda *a, **k: SimpleNamespace(stdout="NV Power Mode: MAXN\n0\n")))
    on_cpu, on_gpu = DeviceSampler.for_device(Device("cpu"), root), DeviceSampler.for_device(Device("cuda", 0), root)
    assert on_cpu.gpu is None and isinstance(on_gpu.gpu, JetsonReader)
    for sampler in (on_cpu, on_gpu):
        sampler.processes, sampler.boot_time, sampler.run = (lambda: []), 0.0, _no_vcgencmd
        sampler.begin_window("cell")
        assert sampler.end_window()["jetson_power"] == {"nvpmodel": {"name": "MAXN", "id": 0},
                                                        "jetson_clocks": True, "gpu_max_mhz": 1300.5}
    assert "jetson_power" not in _sampler().end_window()


def test_raspberry_pi_throttled_flags(tmp_path):
    run = lambda *a, **k: SimpleNamespace(stdout="throttled=0x50005\n")  # noqa: E731
    sampler = _sampler(run=run)
    sampler.begin_window("cell")
    state = sampler.end_window()
    assert state["rpi_throttled"]["flags"] == ["under_voltage", "throttled", "under_voltage_occurred",
                                               "throttling_occurred"]
    assert state["throttled"]
    assert state["throttle_reasons"] == ["raspberry pi: under_voltage", "raspberry pi: throttled"]
    past = _sampler(run=lambda *a, **k: SimpleNamespace(stdout="throttled=0x50000\n"))
    past.begin_window("cell")
    assert past.end_window()["throttled"] is False  # only "occurred since boot": recorded, not this pass


class Proc:
    """A psutil.Process as the sampler reads it: CPU seconds that move on between calls, a creation time."""

    def __init__(self, pid, name, cpu_seconds, created=0.0):
        self.pid, self.info, self.created = pid, {"name": name}, created
        self.seconds = list(cpu_seconds)

    def cpu_times(self):
        seconds = self.seconds.pop(0) if len(self.seconds) > 1 else self.seconds[0]
        return SimpleNamespace(user=seconds, system=0.0)

    def create_time(self):
        return self.created


def test_cpu_sysfs_frequency_drop_and_busy_processes_warn(tmp_path):
    files = {}
    for cpu in (0, 1):
        files |= {f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor": "performance",
                  f"sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq": "2400000",
                  f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq": "1500000" if cpu else "2400000"}
    root = _tree(tmp_path, files | {"sys/class/thermal/thermal_zone0/temp": "81000"})
    clock = iter([1000.0, 1002.0])  # the window: 2 s since boot's 1000th
    procs = [Proc(os.getpid(), "va-bench", [10.0, 14.0]), Proc(777, "stress", [50.0, 51.94]),
             Proc(778, "idle", [3.0, 3.02]),
             Proc(0, "System Idle Process", [900.0, 903.9])]  # Windows' pid 0: its CPU time is the idle time
    sampler = _sampler(root=root, processes=lambda: procs, uptime=lambda: next(clock))
    sampler.begin_window("cell")
    state = sampler.end_window()
    assert state["cpu"]["governors"] == ["performance"] and state["cpu"]["max_freq_mhz"] == 2400.0
    assert state["cpu"]["freq_mhz"] == [1500.0, 1500.0] and state["cpu"]["temperature_c_max"] == 81.0
    assert state["busiest_other_processes"] == [{"pid": 777, "name": "stress", "cpu_percent": 97}]
    assert any("fell to 62% of its core's maximum (1500 of 2400 MHz)" in w for w in state["warnings"])
    assert state["cpu"]["freq_share_of_max_min"] == 0.625
    assert any("stress (pid 777, 97% CPU)" in w for w in state["warnings"])
    assert "unavailable" not in state["cpu"]
    # recorded and warned; a CPU's frequency alone is no throttle flag: with no device that reports one, unknown
    assert state["throttled"] is None and state["throttle_signal"].startswith("unavailable: no throttle signal")
    assert "(CPU frequency and temperature recorded under cpu)" in state["throttle_signal"]


def test_busy_processes_count_cpu_seconds_over_the_window_a_newcomer_over_its_own_time():
    """A process present throughout: its CPU seconds in the window over the window; one started inside it (the
    busy neighbour that began mid-pass, which a primed cpu_percent never saw): over the time since it started; a
    reused pid is a newcomer; this process and a process seen for an instant are not judged."""
    start = {1: (0.0, 100.0), 2: (0.0, 5.0), 3: (50.0, 7.0), 4: (0.0, 1.0)}
    end = {1: ("old", 0.0, 100.4), 2: ("steady", 0.0, 6.6), 3: ("reused", 99.0, 0.9), 5: ("new", 101.0, 0.95),
           6: ("instant", 101.9, 0.1), 4: ("me", 0.0, 3.0)}
    busy = hygiene.busy_processes(start, 100.0, end, 102.0, ours={4})
    assert busy == [{"pid": 5, "name": "new", "cpu_percent": 95}, {"pid": 2, "name": "steady", "cpu_percent": 80}]
    # pid 1: 0.4 s of 2 s (20 %); pid 3: 0.9 s over the 3 s since its creation (30 %)


def test_the_runs_own_child_processes_are_not_busy_others():
    """The run's host processes and forward process work for the run: a child busy through the window is not named
    as another busy process (it was, as python3.11 at 113 % CPU beside a --forward-process run); a stranger is."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ours = hygiene.run_process_tree()
        assert os.getpid() in ours and child.pid in ours
        start = {child.pid: (0.0, 1.0), 99999: (0.0, 1.0)}
        end = {child.pid: ("python3", 0.0, 3.0), 99999: ("stranger", 0.0, 3.0)}
        assert hygiene.busy_processes(start, 100.0, end, 102.0, ours) == [
            {"pid": 99999, "name": "stranger", "cpu_percent": 100}]
    finally:
        child.kill()
        child.wait()


def test_each_core_is_judged_against_its_own_maximum(tmp_path):
    """Cores with different top speeds (P and E cores, big.LITTLE): every policy at its own maximum is no drop, one
    policy below its own is."""
    def tree(big_now: str) -> Path:
        files = {}
        for policy, (now, top) in {0: (big_now, "4900000"), 1: ("3600000", "3600000")}.items():
            folder = f"sys/devices/system/cpu/cpufreq/policy{policy}"
            files |= {f"{folder}/scaling_cur_freq": now, f"{folder}/cpuinfo_max_freq": top,
                      f"sys/devices/system/cpu/cpu{policy}/cpufreq/scaling_governor": "performance",
                      f"sys/devices/system/cpu/cpu{policy}/cpufreq/cpuinfo_max_freq": top}
        return _tree(tmp_path / big_now, files)
    at_top = _sampler(root=tree("4800000"))
    at_top.begin_window("cell")
    assert not any("fell to" in w for w in at_top.end_window()["warnings"])
    capped = _sampler(root=tree("2900000"))
    capped.begin_window("cell")
    assert any("fell to 59% of its core's maximum (2900 of 4900 MHz)" in w  # the slow core, not the E core's 3600
               for w in capped.end_window()["warnings"])


def test_a_process_start_is_read_on_the_windows_clock():
    """psutil's create_time() adds the boot's whole second from /proc/stat: against time.time() a start read up to
    1 s early, and a busy process begun late in a pass was judged over time it did not run. On the sampler's clock
    (seconds since boot) a child's start lies between the clock read before and after starting it (one 10 ms tick
    of /proc's resolution either side)."""
    import subprocess
    import sys

    sampler = DeviceSampler(None, Path("/nonexistent"), run=_no_vcgencmd)
    before = sampler.uptime()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        after = sampler.uptime()
        _, created, _ = sampler._cpu_seconds()[child.pid]
        assert before - 0.011 <= created <= after + 0.011, (before, created, after)
    finally:
        child.kill()
        child.wait()


def test_a_machine_without_cpufreq_or_thermal_zones_says_so():
    sampler = _sampler()  # a root with neither (this box, a VM, a container)
    sampler.begin_window("cell")
    state = sampler.end_window()
    assert state["cpu"]["freq_mhz"] is None and "no cpufreq interface" in state["cpu"]["unavailable"]["frequency"]
    assert "no thermal zone" in state["cpu"]["unavailable"]["temperature"]
    assert "nor a CPU frequency or temperature" in state["throttle_signal"]


def test_nvml_without_clock_event_reasons_is_unknown_not_unthrottled():
    class NoReasons(FakeNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
    sampler = _sampler(NvmlReader(NoReasons(), 0))
    sampler.begin_window("cell")
    state = sampler.end_window()
    assert state["throttled"] is None and "does not report clock-event reasons" in state["throttle_signal"]
    assert state["gpu"]["sm_clock_mhz"] == [1980, 1980]


def test_a_core_mask_narrower_than_the_machine_is_recorded():
    from harness.measure.affinity import inherited_affinity

    allowed = sorted(os.sched_getaffinity(0))
    record = inherited_affinity(cpu_count=len(allowed) + 2)  # as under taskset on a larger machine
    assert record["cores"] == allowed and record["of"] == len(allowed) + 2 and record["source"].startswith("inherited")
    assert inherited_affinity(cpu_count=len(allowed)) is None  # every core: nothing to say


def test_the_allocator_is_what_the_process_mapped_not_what_was_asked(tmp_path, monkeypatch):
    from harness.measure.env import allocator

    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/libjemalloc.so.2")  # the loader ignored it
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert allocator(maps)["allocator"] == "glibc (default)"
    maps.write_text(maps.read_text() + "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
    assert allocator(maps)["allocator"] == "jemalloc"


def test_locked_clocks_are_reset_even_when_the_run_fails():
    nvml = FakeNvml()
    with pytest.raises(RuntimeError, match="cell blew up"):
        with locked_clocks(0, 1500, nvml) as record:
            assert record["locked_mhz"] == 1500
            raise RuntimeError("cell blew up")
    assert nvml.calls[-2:] == [("lock", 1500, 1500), ("reset",)]
    with pytest.raises(UsageError, match="--lock-clocks 1500: NVML refused .*run as root"):
        with locked_clocks(0, 1500, FakeNvml(lock_error=PermissionError("Insufficient Permissions"))):
            pass


def test_lock_clocks_on_a_cpu_run_is_refused():
    result = run_in_process("run", "--lock-clocks", "1500")
    assert result.returncode == 2 and "--lock-clocks applies to an NVIDIA GPU" in result.stderr


def test_a_real_cpu_run_records_the_device_state(ort_run):
    plan, records = ort_run
    sub = json.loads(next((plan.run_dir / "submissions").glob("*.json")).read_text())
    state = sub["environment"]["device_state"]
    assert sub["timing"]["throttled"] is None and state["samples"] >= 2  # a CPU reports no throttle flag
    assert set(state) >= {"cpu", "load_average", "busiest_other_processes", "throttled"}
    assert sub["environment"]["gpu_hygiene"]["status"] == "not a CUDA run"


def test_validate_warns_on_throttled_and_shared_gpu_submissions(tmp_path, ort_run):
    plan, _ = ort_run
    doc = json.loads(next((plan.run_dir / "submissions").glob("*.json")).read_text())
    doc["timing"]["throttled"] = True
    doc["environment"]["gpu_hygiene"] = {"status": "ok", "shared_gpu_allowed": True,
                                         "other_processes": [{"pid": 1, "used_gpu_memory_mib": 10}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    result = run_in_process("validate", str(path))
    assert "throttled during the timed pass" in result.stdout and "measured on a shared GPU" in result.stdout



def test_nvml_refusing_the_process_list_is_unavailable_not_a_crash(tmp_path):
    """A MIG GPU gives a non-root user NVMLError_NoPermission for the whole GPU's process list."""
    class NoPermission(FakeNvml):
        def nvmlDeviceGetComputeRunningProcesses(self, handle):
            raise PermissionError("Insufficient Permissions")
    record = gpu_processes(0, False, NoPermission(), _tree(tmp_path, {}))
    assert record["status"] == "unavailable" and "Insufficient Permissions" in record["reason"]


def test_a_failing_sample_is_recorded_and_the_window_still_closes():
    class Flaky(NvmlReader):
        def sample(self):
            raise RuntimeError("GPU is lost")
    sampler = _sampler(Flaky(FakeNvml(), 0))
    sampler.begin_window("cell")
    state = sampler.end_window()
    assert state["sample_errors"][0] == "RuntimeError: GPU is lost" and state["throttled"] is None
    assert state["throttle_signal"] == "unavailable: no GPU sample was taken during the pass"
    assert _sampler().end_window()["status"] == "unavailable"  # no window open: a record, not a crash


def test_hardware_ids_match_gpu_names_as_whole_words():
    from harness.hardware import derive_hardware_id

    assert derive_hardware_id("NVIDIA A100-SXM4-80GB", "x") == "a100"
    assert derive_hardware_id("NVIDIA H100 80GB HBM3", "x") == "h100"
    assert derive_hardware_id("NVIDIA RTX A1000 Laptop GPU", "x") == "nvidia_rtx_a1000_laptop_gpu"  # not an A100
    assert derive_hardware_id("NVIDIA GH200 480GB", "x") == "nvidia_gh200_480gb"  # not an H200
    assert derive_hardware_id("NVIDIA GeForce RTX 5070 Ti Laptop GPU", "x") != "nvidia_geforce_rtx_5070_ti"
    assert derive_hardware_id("Orin (nvgpu)", "x") == "jetson_orin"


def test_a_cpu_run_names_the_machine_it_ran_on(monkeypatch, tmp_path):
    """The hardware id is the machine's whatever the run computes on (the site's CPU rows of a Jetson say
    jetson_orin): a GPU machine's through NVML (no CUDA context), a Jetson's by its board; logical CPUs counted."""
    from harness.measure import env
    from harness.measure.device import parse_device

    cpu = parse_device("cpu")
    monkeypatch.setattr(env, "board_model", lambda: None)
    block = env.hardware_block(cpu, None, nvml=FakeNvml())
    assert block["id"] == "nvidia_geforce_rtx_5070_ti" and block["gpu"] == "NVIDIA GeForce RTX 5070 Ti"
    assert block["gpu_memory_gb"] == 16.0 and block["driver_version"] == "580.159.04"
    assert block["cpu_cores"] == os.cpu_count() and block["cpu_physical_cores"] >= 1

    class NoNvml(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    class TwoKinds(FakeNvml):  # an A100 and a T4 in one box: which names the machine is not guessed
        def nvmlDeviceGetCount(self):
            return 2

        def nvmlDeviceGetName(self, handle):
            return "NVIDIA A100-SXM4-80GB" if handle == "gpu0" else "Tesla T4"

    assert env.hardware_block(cpu, None, nvml=TwoKinds())["gpu"] == "none"
    monkeypatch.setattr(env, "board_model", lambda: "NVIDIA Jetson AGX Orin Developer Kit")
    jetson = env.hardware_block(cpu, None, nvml=NoNvml())
    assert jetson["id"] == "jetson_orin" and jetson["gpu"] == "NVIDIA Jetson AGX Orin Developer Kit"
    monkeypatch.setattr(env, "board_model", lambda: None)
    plain = env.hardware_block(cpu, None, nvml=NoNvml())
    assert plain["gpu"] == "none" and plain["id"].startswith("cpu_") and plain["id"].endswith(f"_{os.cpu_count()}c")


def test_a_process_start_reads_on_the_clock_it_is_compared_with():
    """The run's start-up figures subtract the process's start from time.time(): psutil's create_time adds a boot time
    cut to the whole second and read up to 1 s early (imports_s 1.94 s where the load began 1.15 s in)."""
    import subprocess
    import sys

    before = time.time()
    shown = subprocess.run([sys.executable, "-c", "import time; from harness.measure.hygiene import "
                            "process_start_time; print(process_start_time(), time.time())"],
                           capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    start, then = map(float, shown.stdout.split())
    assert before - 0.05 <= start <= then  # the start's clock ticks are 10 ms; psutil's own read ~0.8 s early here


# nvml.h's nvmlClocksEventReason* bits (the names NVML gives them), written out by hand from the header
NVML_EVENT_BITS = {"GpuIdle": 0x1, "ApplicationsClocksSetting": 0x2, "SwPowerCap": 0x4, "HwSlowdown": 0x8,
                   "SyncBoost": 0x10, "SwThermalSlowdown": 0x20, "HwThermalSlowdown": 0x40,
                   "HwPowerBrakeSlowdown": 0x80, "DisplayClockSetting": 0x100}
NVML_SLOWDOWNS = {"SwPowerCap": "sw_power_cap", "HwSlowdown": "hw_slowdown", "SwThermalSlowdown": "sw_thermal_slowdown",
                  "HwThermalSlowdown": "hw_thermal_slowdown", "HwPowerBrakeSlowdown": "hw_power_brake_slowdown"}


def _one_pass(reader, root=None):
    sampler = _sampler(reader, root)
    sampler.begin_window("cell")
    sampler._sample()
    return sampler.end_window()


def test_the_nvml_bit_table_is_nvml_h_s():
    pynvml = pytest.importorskip("pynvml")
    assert {name: getattr(pynvml, f"nvmlClocksEventReason{name}") for name in NVML_EVENT_BITS} == NVML_EVENT_BITS


def test_every_nvml_slowdown_bit_throttles_under_its_own_name_and_the_benign_ones_do_not():
    """Each power/thermal slowdown bit, alone beside the idle bit, marks the pass with its own name; the bits that
    only say why clocks are where they are (idle, application clocks, sync boost, display clock) never do."""
    for nvml_name, name in NVML_SLOWDOWNS.items():
        state = _one_pass(NvmlReader(FakeNvml(reasons=[NVML_EVENT_BITS["GpuIdle"] | NVML_EVENT_BITS[nvml_name]]), 0))
        assert state["throttled"] is True and state["throttle_reasons"] == [name], (nvml_name, state)
        assert state["gpu"]["clock_event_reasons"] == sorted(["gpu_idle", name])
    benign = sum(NVML_EVENT_BITS[n] for n in ("GpuIdle", "ApplicationsClocksSetting", "SyncBoost",
                                              "DisplayClockSetting"))
    state = _one_pass(NvmlReader(FakeNvml(reasons=[benign]), 0))
    assert state["throttled"] is False and state["throttle_reasons"] == []
    assert state["gpu"]["clock_event_reasons"] == ["applications_clocks_setting", "display_clock_setting", "gpu_idle",
                                                   "sync_boost"]
    both = NVML_EVENT_BITS["SwPowerCap"] | NVML_EVENT_BITS["HwThermalSlowdown"]  # two at once: both named
    assert _one_pass(NvmlReader(FakeNvml(reasons=[both]), 0))["throttle_reasons"] == ["hw_thermal_slowdown",
                                                                                       "sw_power_cap"]


def test_a_driver_before_535_reports_reasons_under_the_throttle_name():
    class OldDriver(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None  # absent in bindings for drivers before 535

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
            return NVML_EVENT_BITS["HwSlowdown"]
    state = _one_pass(NvmlReader(OldDriver(), 0))
    assert state["throttled"] is True and state["throttle_reasons"] == ["hw_slowdown"]


def test_nvml_clocks_temperature_and_power_are_each_read_from_their_own_figure():
    """SM clock below its maximum, a memory clock of its own, a temperature that peaks mid-pass: each recorded as
    read (power from milliwatts)."""
    class Boosting(FakeNvml):
        temps = [55, 70, 62]

        def nvmlDeviceGetClockInfo(self, handle, kind):
            return {self.NVML_CLOCK_SM: 1410, self.NVML_CLOCK_MEM: 1593}[kind]

        def nvmlDeviceGetTemperature(self, handle, kind):
            return self.temps.pop(0)

        def nvmlDeviceGetPowerUsage(self, handle):
            return 245_500
    gpu = _one_pass(NvmlReader(Boosting(), 0))["gpu"]
    assert gpu["sm_clock_mhz"] == [1410, 1410] and gpu["max_sm_clock_mhz"] == 1980
    assert gpu["mem_clock_mhz"] == [1593, 1593]
    assert gpu["temperature_c_max"] == 70 and gpu["power_w_max"] == 245.5


def test_a_repeat_run_s_parent_is_ours_only_when_named(tmp_path, monkeypatch):
    """An extra process of --repeats names its parent in VA_BENCH_REPEAT_OF: the parent's host PID (its NSpid, as
    NVML lists it) is not another process; with the variable naming another pid it is."""
    parent = os.getppid()
    root = _tree(tmp_path, {"proc/self/status": f"Name:\tpython\nNSpid:\t91234\t{os.getpid()}\n",
                            f"proc/{parent}/status": f"Name:\tva-bench\nNSpid:\t91200\t{parent}\n"})
    nvml = FakeNvml(processes=[(91200, 700)])
    monkeypatch.setenv("VA_BENCH_REPEAT_OF", str(parent))
    assert gpu_processes(0, False, nvml, root, parent=repeat_parent())["other_processes"] == []
    monkeypatch.setenv("VA_BENCH_REPEAT_OF", str(parent + 1))
    with pytest.raises(UsageError, match="pid 91200 "):
        gpu_processes(0, False, nvml, root, parent=repeat_parent())
    monkeypatch.delenv("VA_BENCH_REPEAT_OF")
    assert hygiene.own_pids(root) == {os.getpid(), 91234}


# `vcgencmd get_throttled`, as the Raspberry Pi documentation lists its bits
RPI_DOC_BITS = {0: "under_voltage", 1: "arm_frequency_capped", 2: "throttled", 3: "soft_temperature_limit",
                16: "under_voltage_occurred", 17: "arm_frequency_capped_occurred", 18: "throttling_occurred",
                19: "soft_temperature_limit_occurred"}


def test_each_raspberry_pi_throttled_bit_is_read_by_its_documented_meaning():
    for bit, name in RPI_DOC_BITS.items():
        out = f"throttled={hex(1 << bit)}\n"
        record = hygiene.rpi_throttled(run=lambda *a, out=out, **k: SimpleNamespace(stdout=out))
        assert record == {"value": hex(1 << bit), "flags": [name]}, bit
        sampler = _sampler(run=lambda *a, out=out, **k: SimpleNamespace(stdout=out))
        sampler.begin_window("cell")
        state = sampler.end_window()
        now = bit < 16  # bits 16-19: since boot, not this pass
        assert state["throttled"] is now and state["throttle_reasons"] == ([f"raspberry pi: {name}"] if now else [])


def test_a_thermal_zone_at_its_trip_point_counts_and_only_throttling_trips_do(tmp_path):
    """sysfs thermal: millidegrees Celsius; a zone at (not only above) a passive, hot or critical trip is a trip; an
    active trip (a fan's) is not a slowdown."""
    zones = {"0": ("gpu-thermal", "95000", "95000", "passive"), "1": ("soc-thermal", "104500", "104000", "critical"),
             "2": ("cpu-thermal", "90000", "89000", "hot"), "3": ("fan-zone", "60000", "50000", "active")}
    files = {}
    for n, (kind, temp, trip, trip_type) in zones.items():
        files |= {f"sys/class/thermal/thermal_zone{n}/type": kind, f"sys/class/thermal/thermal_zone{n}/temp": temp,
                  f"sys/class/thermal/thermal_zone{n}/trip_point_0_temp": trip,
                  f"sys/class/thermal/thermal_zone{n}/trip_point_0_type": trip_type}
    assert sorted(hygiene.thermal_trips(hygiene.trip_points(_tree(tmp_path, files)))) == [
        "cpu-thermal 90C >= hot 89C", "gpu-thermal 95C >= passive 95C", "soc-thermal 104C >= critical 104C"]


def test_devfreq_hz_and_cpufreq_khz_both_read_as_mhz(tmp_path):
    """devfreq gives Hz (a Jetson Nano's GPU idles at 76.8 MHz), cpufreq kHz (a 600 MHz little core)."""
    root = _tree(tmp_path, {"sys/class/devfreq/57000000.gpu/cur_freq": "76800000",
                            "sys/class/devfreq/57000000.gpu/max_freq": "921600000",
                            "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq": "600000",
                            "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq": "1479000"})
    reader = JetsonReader(root)
    assert reader.sample()["sm_mhz"] == 76.8 and reader.max_sm_mhz == 921.6
    assert hygiene.cpu_sample(hygiene.CpuFiles.find(root))["freq_mhz"] == 600.0


def test_a_jetson_gpu_that_reached_its_maximum_during_the_pass_is_not_warned_about(tmp_path):
    folder = "sys/class/devfreq/17000000.ga10b"
    root = _tree(tmp_path, {f"{folder}/cur_freq": "1300500000", f"{folder}/max_freq": "1300500000",
                            f"{folder}/min_freq": "306000000"})
    sampler = _sampler(JetsonReader(root), root)
    sampler.begin_window("cell")  # at its maximum, then idle between batches
    (root / folder / "cur_freq").write_text("306000000")
    state = sampler.end_window()
    assert state["gpu"]["sm_clock_mhz"] == [306.0, 1300.5]
    assert not any("GPU clock at most" in w for w in state["warnings"]) and state["throttled"] is False


def test_a_cpu_below_its_maximum_is_a_warning_only_under_the_performance_governor(tmp_path):
    """powersave (or schedutil) lowers the clock by choice: the frequency is recorded, not warned about."""
    for governor, warned in (("powersave", False), ("schedutil", False), ("performance", True)):
        root = _tree(tmp_path / governor, {"sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": governor,
                                           "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq": "2400000",
                                           "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq": "1200000"})
        sampler = _sampler(root=root)
        sampler.begin_window("cell")
        state = sampler.end_window()
        assert state["cpu"]["freq_share_of_max_min"] == 0.5
        assert any("fell to 50%" in w for w in state["warnings"]) is warned, governor


def test_every_core_s_governor_maximum_and_the_hottest_zone_are_recorded(tmp_path):
    root = _tree(tmp_path, {"sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "performance",
                            "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq": "2400000",
                            "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": "powersave",
                            "sys/devices/system/cpu/cpu1/cpufreq/cpuinfo_max_freq": "3600000",
                            "sys/class/thermal/thermal_zone0/temp": "81000",
                            "sys/class/thermal/thermal_zone1/temp": "45000"})
    assert hygiene.cpu_static(root) == {"governors": ["performance", "powersave"], "max_freq_mhz": 3600.0}
    assert hygiene.cpu_sample(hygiene.CpuFiles.find(root))["temp_c"] == 81.0


def test_half_a_core_is_busy_and_a_reused_pid_is_judged_as_a_newcomer():
    """BUSY_PROCESS_PERCENT is "at least": 1 CPU second over a 2 s window is 50 %, named. A pid reused during the
    window (its start differs) is a new process: its CPU seconds over its own time (1.2 s over 1.5 s: 80 %), not
    the difference with the old process's seconds (0.7 s over 2 s)."""
    start = {10: (0.0, 4.0), 11: (50.0, 0.5)}
    end = {10: ("half", 0.0, 5.0), 11: ("reused", 100.5, 1.2)}
    assert hygiene.busy_processes(start, 100.0, end, 102.0, ours={1}) == [
        {"pid": 11, "name": "reused", "cpu_percent": 80}, {"pid": 10, "name": "half", "cpu_percent": 50}]


def test_the_hardware_block_gives_memory_in_gib_and_counts_logical_cores(monkeypatch):
    """On a (faked) A100 machine with 96 logical CPUs on 48 cores and 64 GiB of RAM: memory in GiB (2^30 bytes),
    the driver as NVML gives it, cores logical (the site's a100 rows: 96); a CPU-only machine's derived id counts
    logical CPUs; an id given is kept and said to be given."""
    import psutil

    from harness.measure import env
    from harness.measure.device import Device, parse_device

    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(name="NVIDIA A100-SXM4-80GB", total_memory=80 * 2**30))
    monkeypatch.setattr(env, "_nvidia_driver", lambda: "550.54.15")
    monkeypatch.setattr(env, "board_model", lambda: None)
    monkeypatch.setattr(os, "cpu_count", lambda: 96)
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 96 if logical else 48)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=64 * 2**30))
    block = env.hardware_block(Device("cuda", 0), None)
    assert (block["id"], block["id_source"], block["gpu_memory_gb"], block["driver_version"]) == (
        "a100", "derived", 80.0, "550.54.15")
    assert (block["cpu_cores"], block["cpu_physical_cores"], block["ram_gb"]) == (96, 48, 64.0)

    class NoNvml(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    cpu = env.hardware_block(parse_device("cpu"), None, nvml=NoNvml())
    assert cpu["id"].startswith("cpu_") and cpu["id"].endswith("_96c") and cpu["gpu_memory_gb"] is None
    given = env.hardware_block(parse_device("cpu"), "my_box", nvml=NoNvml())
    assert (given["id"], given["id_source"]) == ("my_box", "--hardware-id")
    # a fleet node joined without --hardware-id runs its cells under its own derived id: derived, as it was
    joined = env.hardware_block(parse_device("cpu"), cpu["id"], nvml=NoNvml())
    assert (joined["id"], joined["id_source"]) == (cpu["id"], "derived")


def test_nvml_without_a_gpu_names_no_gpu(monkeypatch):
    from harness.measure import env
    from harness.measure.device import parse_device

    class NoGpus(FakeNvml):  # NVML loads (a driver is installed) but lists no device
        def nvmlDeviceGetCount(self):
            return 0
    monkeypatch.setattr(env, "board_model", lambda: None)
    block = env.hardware_block(parse_device("cpu"), None, nvml=NoGpus())
    assert block["gpu"] == "none" and block["gpu_memory_gb"] is None and block["id"].startswith("cpu_")


def test_the_thread_record_names_each_pool_as_set(monkeypatch):
    from harness.measure import env
    from harness.measure.device import parse_device

    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    intra = torch.get_num_interop_threads() + 7  # never the inter-op count
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setenv("KMP_BLOCKTIME", "0")
    record = env.collect_environment(parse_device("cpu"), "default", ["run"], intra)
    assert record["threads"] == {"torch_intra_op": intra, "torch_inter_op": torch.get_num_interop_threads(),
                                 "OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None,
                                 "KMP_BLOCKTIME": "0"}


@pytest.mark.parametrize(("backend", "on_gpu", "threads", "settings", "said"), [
    ("pytorch", False, 2, {}, True), ("torchscript", False, 4, {"OMP_WAIT_POLICY": "active"}, True),
    ("pytorch", False, 2, {"OMP_WAIT_POLICY": " passive "}, False),
    ("pytorch", False, 2, {"GOMP_SPINCOUNT": "0"}, False),
    ("pytorch", False, 2, {"KMP_BLOCKTIME": "0"}, False), ("pytorch", False, 2, {"GOMP_SPINCOUNT": "10000"}, True),
    ("pytorch", False, 1, {}, False), ("onnxruntime", False, 2, {}, False), ("pytorch", True, 2, {}, False)])
def test_a_busy_machine_names_torchs_spinning_openmp_threads_where_they_spin(monkeypatch, backend, on_gpu, threads,
                                                                            settings, said):
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    text = hygiene.spinning_openmp(on_torch_threads(backend), on_gpu, threads)
    assert (text is not None) == said
    if said:
        assert "OMP_WAIT_POLICY=PASSIVE" in text


def test_a_busy_machine_names_a_runtimes_own_spinning_openmp_threads():
    """ncnn's OpenMP threads spin openmp_blocktime (20 ms by default) after each parallel region: the busy machine's
    warning said nothing of it, though a loaded 2-core box ran its 2-thread forward 3-5x slower than 1 thread's."""
    ncnn = pytest.importorskip("ncnn")  # the edge extra's
    blocktime = ncnn.Option().openmp_blocktime
    text = hygiene.spinning_openmp(False, False, 2, blocktime)
    assert blocktime > 0 and f"spin {blocktime} ms after each parallel region (its openmp_blocktime)" in text
    assert "--threads 1" in text
    assert hygiene.spinning_openmp(False, False, 1, blocktime) is None  # one thread: none waits for another
    assert hygiene.spinning_openmp(False, False, 2, 0) is None


@requires_coco
def test_a_pytorch_cell_on_a_busy_cpu_warns_of_spinning_openmp_threads(tmp_path_factory, monkeypatch):
    from conftest import run_benchmark

    from harness.run import executor

    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"):
        monkeypatch.delenv(name, raising=False)
    busy = lambda: (float(os.cpu_count() + 10), 0.0, 0.0)  # noqa: E731
    monkeypatch.setattr(executor, "load_average", busy)
    monkeypatch.setattr(hygiene, "load_average", busy)  # the pass's own window reads it there
    plugin = Path(__file__).parent / "plugins" / "batch_dependent_detector.py"
    _, records = run_benchmark(tmp_path_factory, "busy", models=[f"{plugin}:make"], backends=["pytorch"],
                               batch_sizes=[2], warmup_batches=1, warmup_seconds=0.0, min_timed_batches=2,
                               layers=False, profile=False, energy=False, draw_images=0, limit=4, accuracy=False,
                               threads=2)  # a team of two, which spins (one thread has no team)
    (busy,) = [w for w in records[0].timing.warnings if w.startswith("machine busy")]
    assert "torch's OpenMP threads spin while they wait" in busy


# the two bits nvml.h names only under the older "throttle reasons" (nvmlClocksThrottleReasonBoardLimit, ...)
NVML_THROTTLE_ONLY_BITS = {"BoardLimit": 0x200, "Reliability": 0x400}


def test_board_limit_and_reliability_are_slowdowns_and_an_unknown_bit_is_recorded_and_said():
    pynvml = pytest.importorskip("pynvml")
    assert {name: getattr(pynvml, f"nvmlClocksThrottleReason{name}") for name in NVML_THROTTLE_ONLY_BITS} == \
        NVML_THROTTLE_ONLY_BITS
    for bit, name in ((0x200, "board_limit"), (0x400, "reliability")):
        state = _one_pass(NvmlReader(FakeNvml(reasons=[bit | 0x1]), 0))
        assert state["throttled"] is True and state["throttle_reasons"] == [name]
    state = _one_pass(NvmlReader(FakeNvml(reasons=[0x800 | 0x1]), 0))  # a bit no driver here defines yet
    assert state["gpu"]["clock_event_reasons"] == ["gpu_idle", "unknown_0x800"] and state["throttled"] is False
    assert any("unknown_0x800" in w and "not judged" in w for w in state["warnings"])


def test_a_raspberry_pi_that_throttled_inside_the_pass_is_throttled():
    """vcgencmd is read through the pass: a flag of now in a middle reading, or an "occurred" flag that was clear
    and then set (the kernel's hwmon driver clears those as it polls), throttled the pass; "occurred" from the
    start on may be older than the pass: recorded, not counted."""
    def sampler_reading(values):
        values = iter(values)
        sampler = _sampler(run=lambda *a, **k: SimpleNamespace(stdout=f"throttled={next(values)}\n", stderr=""))
        return sampler

    sampler = sampler_reading(["0x0", "0x40000"])  # only the start and the end read: the end's new flag counts
    sampler.begin_window("cell")
    state = sampler.end_window()
    assert state["throttled"] is True and state["throttle_reasons"] == ["raspberry pi: throttling_occurred"]
    assert state["rpi_throttled"] == {"start": "0x0", "end": "0x40000", "readings": 2,
                                      "flags": ["throttling_occurred"], "during_pass": ["throttling_occurred"]}
    original = hygiene.RPI_POLL_S
    try:
        hygiene.RPI_POLL_S = 0.0  # every sample reads it
        sampler = sampler_reading(["0x0", "0x0", "0x4", "0x0", "0x0"])  # throttled in the middle, clear at both ends
        sampler.begin_window("cell")
        sampler._sample()
        state = sampler.end_window()
        assert state["throttled"] is True and state["throttle_reasons"] == ["raspberry pi: throttled"]
        assert state["rpi_throttled"]["readings"] == 5  # the ends, and each sample
        sampler = sampler_reading(["0x40000", "0x0", "0x0", "0x40000", "0x40000"])  # cleared by the driver, then again
        sampler.begin_window("cell")
        sampler._sample()
        assert sampler.end_window()["throttle_reasons"] == ["raspberry pi: throttling_occurred"]
    finally:
        hygiene.RPI_POLL_S = original


def test_vcgencmd_that_fails_says_why_not_no_signal():
    failing = lambda *a, **k: SimpleNamespace(stdout="", stderr="VCHI initialization failed\n")  # noqa: E731
    record = hygiene.rpi_throttled(run=failing)
    assert "VCHI initialization failed" in record["error"] and "video group" in record["error"]
    sampler = _sampler(run=failing)
    sampler.begin_window("cell")
    state = sampler.end_window()
    assert state["throttled"] is None and "VCHI initialization failed" in state["throttle_signal"]
    assert "usermod -aG video" in state["rpi_throttled"]["unavailable"]


def test_a_jetson_pmic_zone_is_no_temperature_and_trips_count_on_every_device(tmp_path, monkeypatch):
    """A Jetson Nano's PMIC-Die zone reads 100 °C always: not the board's temperature. A zone at its trip point
    throttles a CPU cell too: on a Jetson (a signal there: cool is "no"), and on any machine (hot is "yes")."""
    files = {"sys/class/thermal/thermal_zone0/type": "CPU-therm", "sys/class/thermal/thermal_zone0/temp": "41500",
             "sys/class/thermal/thermal_zone0/trip_point_0_temp": "99000",
             "sys/class/thermal/thermal_zone0/trip_point_0_type": "passive",
             "sys/class/thermal/thermal_zone4/type": "PMIC-Die", "sys/class/thermal/thermal_zone4/temp": "100000",
             "sys/class/thermal/thermal_zone4/trip_point_0_temp": "100000",
             "sys/class/thermal/thermal_zone4/trip_point_0_type": "critical",
             "proc/device-tree/model": "NVIDIA Jetson Nano Developer Kit"}
    root = _tree(tmp_path, files)
    monkeypatch.setattr(hygiene, "jetson_power", lambda r: {"nvpmodel": "unavailable (nvpmodel not found)"})
    from harness.measure.device import Device

    def one_cpu_pass(root):
        sampler = DeviceSampler.for_device(Device("cpu"), root)
        sampler.processes, sampler.boot_time, sampler.run = (lambda: []), 0.0, _no_vcgencmd
        sampler.begin_window("cell")
        return sampler.end_window()
    state = one_cpu_pass(root)
    assert state["cpu"]["temperature_c_max"] == 41.5 and state["thermal_trips"] == []
    assert state["throttled"] is False
    (root / "sys/class/thermal/thermal_zone0/temp").write_text("99500")
    state = one_cpu_pass(root)
    assert state["throttled"] is True and state["throttle_reasons"] == ["thermal trip: CPU-therm 100C >= passive 99C"]
    (root / "proc/device-tree/model").unlink()  # not a board: a trip reached still says yes; none says nothing
    assert one_cpu_pass(root)["throttled"] is True
    (root / "sys/class/thermal/thermal_zone0/temp").write_text("50000")
    assert one_cpu_pass(root)["throttled"] is None


def test_graphics_and_mps_processes_are_other_processes_too(tmp_path):
    class Desktop(FakeNvml):
        def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
            return [SimpleNamespace(pid=1500, usedGpuMemory=None), SimpleNamespace(pid=4242, usedGpuMemory=None)]

        def nvmlDeviceGetMPSComputeRunningProcesses(self, handle):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
    root = _tree(tmp_path, {"proc/self/status": f"Name:\tpython\nNSpid:\t{os.getpid()}\n"})
    record = gpu_processes(0, True, Desktop(processes=[(4242, 3000)]), root)
    assert record["other_processes"] == [{"pid": 4242, "used_gpu_memory_mib": 3000},
                                         {"pid": 1500, "used_gpu_memory_mib": None}]


def test_a_repeat_in_a_container_leaves_out_the_pids_nvml_gave_its_parent(tmp_path, monkeypatch):
    """A container that mounts its own /proc gives no host PID (NSpid: one entry); NVML lists the host's. The run
    passes its extra processes the PIDs NVML lists for its work: ours where NVML lists one of ours, else those new
    since its plan-time check (an allowed neighbour found then is not the run's)."""
    root = _tree(tmp_path, {"proc/self/status": f"Name:\tpython\nNSpid:\t{os.getpid()}\n"})
    assert hygiene.run_gpu_pids(0, {4242}, FakeNvml(processes=[(4242, 1), (91200, 700)]), root) == {91200}
    assert hygiene.run_gpu_pids(0, set(), FakeNvml(processes=[(os.getpid(), 700), (4243, 1)]), root) == {os.getpid()}
    parent = os.getppid()
    monkeypatch.setenv("VA_BENCH_REPEAT_OF", str(parent))
    monkeypatch.setenv("VA_BENCH_REPEAT_GPU_PIDS", "91200")
    assert gpu_processes(0, False, FakeNvml(processes=[(91200, 700)]), root,
                         parent=repeat_parent())["other_processes"] == []
    with pytest.raises(UsageError, match="pid 4242 "):
        gpu_processes(0, False, FakeNvml(processes=[(91200, 700), (4242, 1)]), root, parent=repeat_parent())
    monkeypatch.setenv("VA_BENCH_REPEAT_OF", str(parent + 1))  # not this process's parent: its list is not ours
    with pytest.raises(UsageError, match="pid 91200 "):
        gpu_processes(0, False, FakeNvml(processes=[(91200, 700)]), root, parent=repeat_parent())


def test_a_reset_nvml_refuses_is_said_and_the_runs_own_error_stands():
    class Lost(FakeNvml):
        def nvmlDeviceResetGpuLockedClocks(self, handle):
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
    said = []
    with pytest.raises(ValueError, match="the cell's own error"):
        with locked_clocks(0, 1500, Lost(), warn=said.append):
            raise ValueError("the cell's own error")
    assert len(said) == 1 and "NVML_ERROR_GPU_IS_LOST" in said[0] and "nvidia-smi -i 0 -rgc" in said[0]


@pytest.mark.parametrize(("load", "run_cores", "cores", "busy"), [
    (2.03, 2.0, 2, False),  # a quiet 2-core box under a run on both cores: its own threads make the load
    (3.1, 1.4, 2, True),    # another core's worth of work beside it
    (2.4, 2.0, 2, False),   # 0.4 beyond the run: below half a core
    (6.0, 1.5, 16, True), (4.0, 1.5, 16, False),  # a quarter of 16 cores
    (3.0, None, 2, True), (2.0, None, 2, False)])  # the run's own use unknown: the load over the cores
def test_a_machine_is_busy_by_the_load_beyond_the_runs_own_cpu(load, run_cores, cores, busy):
    assert (hygiene.machine_busy(load, run_cores, cores) is not None) == busy


def test_the_runs_own_cpu_in_a_window_counts_its_processes_only():
    start = {1: (0.0, 10.0), 2: (0.0, 5.0), 3: (0.0, 1.0)}
    end = {1: ("run", 0.0, 13.0), 2: ("host", 0.0, 6.0), 3: ("other", 0.0, 3.0), 4: ("forward", 101.0, 0.5)}
    assert hygiene.run_cpu_cores(start, 100.0, end, 102.0, ours={1, 2, 4}) == 2.25  # (3 + 1 + 0.5) / 2 s
    assert hygiene.run_cpu_cores(start, 100.0, end, 100.1, ours={1}) is None


def test_all_core_turbo_above_base_is_not_capping(tmp_path):
    """intel_pstate's cpuinfo_max_freq is one core's turbo (5.3 GHz); every core busy at 4.6 GHz, above the base
    frequency (3.6 GHz), is a healthy machine; below its base it is capped."""
    files = {"sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "performance",
             "sys/devices/system/cpu/cpufreq/policy0/scaling_cur_freq": "4600000",
             "sys/devices/system/cpu/cpufreq/policy0/cpuinfo_max_freq": "5300000",
             "sys/devices/system/cpu/cpufreq/policy0/base_frequency": "3600000"}
    root = _tree(tmp_path, files)
    state = _one_pass(None, root)
    assert state["cpu"]["freq_share_of_max_min"] == round(4600 / 5300, 4)
    assert not any("CPU frequency fell" in w for w in state["warnings"])
    (root / "sys/devices/system/cpu/cpufreq/policy0/scaling_cur_freq").write_text("2800000")
    assert any("fell to 53% of its core's maximum (2800 of 5300 MHz)" in w for w in _one_pass(None, root)["warnings"])
