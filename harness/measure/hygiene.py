"""Is the device clean enough to measure on? Before a CUDA run: other compute processes on the GPU (NVML).
During each timed pass: clock-event (throttle) reasons, clocks, temperature and power of an NVIDIA GPU;
GPU devfreq and thermal trips on a Jetson (no NVML there); governor, frequencies, thermal zones and the
Raspberry Pi's throttled flags on CPUs and boards; the load and the busiest other processes.

Everything is read, nothing is changed, except `--lock-clocks`, which a user asks for on their own machine
(locked through NVML, always reset afterwards). Every path reads through a `root` folder and an `nvml`
module given as values, so tests drive them with fake sysfs trees and a fake NVML.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError

# nvmlDeviceGetCurrentClocksEventReasons bits (nvml.h, "clocks event reasons", formerly throttle reasons)
CLOCK_EVENT_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                       0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                       0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
                       0x200: "board_limit", 0x400: "reliability"}
SLOWDOWNS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
             "board_limit", "reliability")
# `vcgencmd get_throttled` bits (Raspberry Pi firmware): now (0-3) and since boot (16-19)
RPI_THROTTLED = {0: "under_voltage", 1: "arm_frequency_capped", 2: "throttled", 3: "soft_temperature_limit",
                 16: "under_voltage_occurred", 17: "arm_frequency_capped_occurred", 18: "throttling_occurred",
                 19: "soft_temperature_limit_occurred"}
RPI_POLL_S = 2.0  # vcgencmd is a process started on the board being timed; the kernel's own hwmon driver reads the
# flags (and clears the "occurred" ones) about this often, so a pass's flags are read through the pass, not at its ends
# thermal zones that are no sensor: a Jetson Nano's, TX2's and Xavier's PMIC-Die reads 100 °C whatever the board does
NOT_SENSORS = ("PMIC-Die",)
JETSON_GPU_DEVFREQ = re.compile(r"gpu|gv11b|ga10b|gp10b|gb10b", re.IGNORECASE)
BUSY_PROCESS_PERCENT = 50.0  # another process using half a core or more during a timed pass is worth naming
NO_CPUFREQ = "no cpufreq interface (/sys/devices/system/cpu/*/cpufreq)"  # a VM's or a container's CPU, often
MIN_BUSY_WINDOW_S = 0.2  # a process seen for less time than this has no share of the window worth judging
BUSY_SHARE = 0.25  # a machine whose load, less the run's own CPU, is a quarter of its cores (half a core at least)
FREQ_DROP = 0.9  # a CPU below 90 % of its maximum frequency during a timed pass (not with powersave by choice)


# How the OpenMP threads of a CPU forward (PyTorch's) wait between parallel regions: spinning (libgomp's default)
# or asleep. A settings-dependent figure: on cpu-box PASSIVE cost an idle machine's PyTorch forward a quarter to
# two fifths of its throughput, and spinning halved it beside one busy process (docs/benchmarks.md, "OpenMP's wait
# policy")
OPENMP_WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages: the kernel's, or psutil's emulation where there is none (Windows: it
    samples from its first call on, and reads 0 for the first few seconds)."""
    if hasattr(os, "getloadavg"):
        return os.getloadavg()
    import psutil

    return psutil.getloadavg()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# ------------------------------------------------------------------------------------ other GPU processes


def no_cuda_ipc(root: Path = Path("/")) -> str | None:
    """What this machine is, where CUDA cannot share device memory between processes (CUDA IPC): a Jetson, Windows,
    WSL; None elsewhere."""
    if is_jetson(root):
        return "a Jetson"
    if sys.platform == "win32":
        return "Windows"
    if "microsoft" in platform.release().lower():
        return "WSL"
    return None


@dataclass(frozen=True)
class RunParent:
    """The run that started this process (an extra process of --repeats): its PID, which holds the GPU and is idle
    meanwhile, and the PIDs NVML listed for its work there (the host's: inside a container that mounts a /proc of its
    own, no host PID can be read here)."""

    pid: int
    gpu_pids: frozenset[int] = frozenset()


def own_pids(root: Path = Path("/"), parent: RunParent | None = None) -> set[int]:
    """This process's PID in every PID namespace it is in (/proc/self/status NSpid: NVML reports the host's PIDs,
    which differ from ours inside a container), and the run that started it (`parent`), likewise."""
    pids = {os.getpid()}
    sources = ["self"]
    if parent is not None:
        pids |= {parent.pid, *parent.gpu_pids}
        sources.append(str(parent.pid))
    for source in sources:
        status = _read(root / "proc" / source / "status") or ""
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                pids.update(int(p) for p in line.split()[1:] if p.isdigit())
    return pids


def load_nvml(nvml=None):
    """The NVML module, initialised; None (with the reason) when it cannot be used here."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML could not start ({type(exc).__name__}: {exc})"
    return nvml, None


def nvml_handle(nvml, index: int):
    """NVML's handle of torch's CUDA device `index`: found by its UUID where torch reports one (CUDA_VISIBLE_DEVICES
    and schedulers renumber CUDA devices, NVML's indices are the machine's), else by index."""
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    except Exception:  # no CUDA here (tests with a fake NVML), or an older torch
        uuid = None
    if uuid is not None and hasattr(nvml, "nvmlDeviceGetHandleByUUID"):
        text = str(uuid)
        return nvml.nvmlDeviceGetHandleByUUID(text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}")
    return nvml.nvmlDeviceGetHandleByIndex(index)


def is_jetson(root: Path = Path("/")) -> bool:
    model = _read(root / "proc" / "device-tree" / "model") or ""
    return "jetson" in model.lower() or (root / "etc" / "nv_tegra_release").is_file()


def device_processes(nvml, handle) -> list:
    """Every process NVML lists on the GPU, once each: its compute processes (the list NVML's process check is
    about), and its graphics and MPS clients, whose work shares the GPU as much (a desktop's renderer, a game) where
    this NVML lists them."""
    found = {proc.pid: proc for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    for name in ("nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
        listing = getattr(nvml, name, None)
        if listing is None:
            continue
        try:
            more = listing(handle)
        except Exception:  # NotSupported (a data-centre GPU without graphics, no MPS daemon): the compute list stands
            continue
        for proc in more:
            found.setdefault(proc.pid, proc)
    return list(found.values())


def run_gpu_pids(index: int, accepted: set[int], nvml=None, root: Path = Path("/")) -> set[int]:
    """The PIDs NVML lists for this process's own work on GPU `index` (it holds a context there now), for an extra
    process of --repeats to leave out: ours where NVML lists one of them; inside a container whose PIDs NVML does
    not translate, every PID new since the plan-time check (`accepted`: the other processes found then). Empty
    where NVML cannot tell."""
    nvml, _ = load_nvml(nvml)
    if nvml is None or is_jetson(root):
        return set()
    try:
        listed = {proc.pid for proc in device_processes(nvml, nvml_handle(nvml, index))}
    except Exception:  # the extra process's own check says what NVML could not do
        return set()
    return (listed & own_pids(root)) or (listed - accepted)


def gpu_processes(index: int, allow_shared: bool, nvml=None, root: Path = Path("/"),
                  parent: RunParent | None = None) -> dict:
    """Compute processes on GPU `index` other than this one (and the run that started it: `parent`), checked before
    this process makes a CUDA context. Refuses (UsageError) when there are some, unless `allow_shared`; the record
    says what was found."""
    if is_jetson(root):
        return {"status": "unavailable", "reason": "Jetson: no NVML process list (nothing refused)"}
    nvml, why = load_nvml(nvml)
    if nvml is None:
        return {"status": "unavailable", "reason": why}
    try:
        processes = device_processes(nvml, nvml_handle(nvml, index))
    except Exception as exc:  # NoPermission (a MIG GPU for a non-root user), NotSupported (vGPU, WSL)
        return {"status": "unavailable", "reason": f"NVML's process list: {type(exc).__name__}: {exc}"}
    ours = own_pids(root, parent)
    others = []
    for proc in processes:
        if proc.pid in ours:
            continue
        used = getattr(proc, "usedGpuMemory", None)
        others.append({"pid": proc.pid, "used_gpu_memory_mib": round(used / 2**20) if isinstance(used, int) else None})
    record = {"status": "ok", "other_processes": others, "shared_gpu_allowed": allow_shared}
    if others and not allow_shared:
        listed = ", ".join(f"pid {p['pid']}" + (f" ({p['used_gpu_memory_mib']} MiB)" if p["used_gpu_memory_mib"]
                                               is not None else "") for p in others[:3])
        raise UsageError(f"GPU {index} is in use by {len(others)} other compute process(es): {listed}; their work "
                         "would be timed with ours. Stop them, or pass --allow-shared-gpu (recorded, and the "
                         "submissions are marked)")
    return record


# ------------------------------------------------------------------------------------ clocks (users' machines)


@contextmanager
def locked_clocks(index: int, mhz: int | None, nvml=None, warn=None):
    """`--lock-clocks MHz`: the GPU's clocks locked at MHz for the block (NVML, needs root), reset afterwards
    even when the block fails. Yields the record of what was done (None when not asked). A reset NVML refuses is
    said through `warn` (default: stderr) with the command that undoes the lock; the block's own error, if any,
    is the one raised."""
    if mhz is None:
        yield None
        return
    nvml, why = load_nvml(nvml)
    if nvml is None:
        raise UsageError(f"--lock-clocks needs NVML: {why}")
    handle = nvml_handle(nvml, index)
    try:
        nvml.nvmlDeviceSetGpuLockedClocks(handle, mhz, mhz)
    except Exception as exc:  # NVMLError_NoPermission without root, NotSupported on some boards
        raise UsageError(f"--lock-clocks {mhz}: NVML refused ({type(exc).__name__}: {exc}); run as root on a GPU "
                         "that supports locked clocks, or drop the option") from exc
    try:
        yield {"locked_mhz": mhz, "reset": "nvmlDeviceResetGpuLockedClocks after the run"}
    finally:
        try:
            nvml.nvmlDeviceResetGpuLockedClocks(handle)
        except Exception as exc:  # the machine is left locked: the user must hear it, the run's outcome stands
            (warn or _stderr)(f"could not reset GPU {index}'s clocks ({type(exc).__name__}: {exc}): they may still "
                              f"be locked at {mhz} MHz; run `nvidia-smi -i {index} -rgc` as root")


def _stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# ------------------------------------------------------------------------------------ sampling


def _reasons(bits: int) -> list[str]:
    """The names of the bits set; a bit this table does not know (a newer driver's) is named by its value."""
    known = [name for bit, name in CLOCK_EVENT_REASONS.items() if bits & bit]
    rest = bits & ~sum(CLOCK_EVENT_REASONS)
    return known + [f"unknown_{1 << b:#x}" for b in range(rest.bit_length()) if rest >> b & 1]


class NvmlReader:
    """One NVIDIA GPU's clock-event reasons, clocks, temperature and power, read through NVML."""

    source = "nvml"

    def __init__(self, nvml, index: int):
        self.nvml, self.handle = nvml, nvml_handle(nvml, index)
        get = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons  # the name before driver 535
        self._reasons = get
        self.max_sm_mhz = self._try(lambda: nvml.nvmlDeviceGetMaxClockInfo(self.handle, nvml.NVML_CLOCK_SM))

    @staticmethod
    def _try(read):
        try:
            return read()
        except Exception:  # a figure this GPU does not report stays None
            return None

    def sample(self) -> dict:
        n = self.nvml
        power = self._try(lambda: n.nvmlDeviceGetPowerUsage(self.handle))
        return {"reasons": self._try(lambda: self._reasons(self.handle)),  # None: this GPU does not report them
                "sm_mhz": self._try(lambda: n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM)),
                "mem_mhz": self._try(lambda: n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_MEM)),
                "temp_c": self._try(lambda: n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU)),
                "power_w": None if power is None else power / 1000.0}


class JetsonReader:
    """A Jetson's GPU devfreq: current vs maximum clock (its thermal zones' trips are read on every device)."""

    source = "jetson-sysfs"

    def __init__(self, root: Path):
        devfreq = sorted(p for p in (root / "sys" / "class" / "devfreq").glob("*") if JETSON_GPU_DEVFREQ.search(p.name))
        self.gpu = devfreq[0] if devfreq else None
        self.max_sm_mhz = _khz_or_hz_to_mhz(_int(self.gpu / "max_freq")) if self.gpu else None

    def sample(self) -> dict:
        return {"sm_mhz": _khz_or_hz_to_mhz(_int(self.gpu / "cur_freq")) if self.gpu else None}


def _khz_or_hz_to_mhz(value: int | None) -> float | None:
    """devfreq reports Hz; cpufreq kHz. Either way, MHz."""
    if value is None:
        return None
    return round(value / 1e6, 1) if value > 10_000_000 else round(value / 1e3, 1)


@dataclass(frozen=True)
class TripPoint:
    """A thermal zone's passive, hot or critical trip point: where the kernel slows the chip."""

    zone: str  # its type (cpu-thermal), else its folder's name
    temp: Path  # the zone's temperature file (millidegrees)
    kind: str
    limit: int  # millidegrees


def trip_points(root: Path) -> tuple[TripPoint, ...]:
    """Every sensor zone's passive/hot/critical trip points, found once (an active trip is a fan's, not a
    slowdown; a zero limit is none)."""
    points = []
    for zone in sorted((root / "sys" / "class" / "thermal").glob("thermal_zone*")):
        name = _read(zone / "type")
        if name in NOT_SENSORS:
            continue
        for trip in sorted(zone.glob("trip_point_*_temp")):
            kind, limit = _read(zone / trip.name.replace("_temp", "_type")) or "?", _int(trip)
            if kind in ("passive", "hot", "critical") and limit:
                points.append(TripPoint(name or zone.name, zone / "temp", kind, limit))
    return tuple(points)


def thermal_trips(points: tuple[TripPoint, ...]) -> list[str]:
    """The trip points whose zone is at or above them now (each zone's temperature read once)."""
    temps: dict[Path, int | None] = {}
    hit = []
    for point in points:
        if point.temp not in temps:
            temps[point.temp] = _int(point.temp)
        temp = temps[point.temp]
        if temp is not None and temp >= point.limit:
            hit.append(f"{point.zone} {temp / 1000:.0f}C >= {point.kind} {point.limit / 1000:.0f}C")
    return hit


@dataclass(frozen=True)
class CpuFiles:
    """The sysfs files a CPU sample reads, found once: each cpufreq policy's current frequency with that policy's
    own maximum (CPUs that share a clock share a policy; per CPU where the kernel has no policy folders; on a chip
    whose cores have different top speeds each is judged against its own) and every thermal zone's temp."""

    freqs: tuple[tuple[Path, float | None], ...]  # (scaling_cur_freq, its policy's cpuinfo_max_freq in MHz)
    temps: tuple[Path, ...]
    # each policy's base frequency (MHz) where the driver gives one (intel_pstate): cpuinfo_max_freq there is one
    # core's turbo, which every core busy at once does not reach on a healthy machine
    bases: tuple[float | None, ...] = ()
    trips: tuple[TripPoint, ...] = ()

    @classmethod
    def find(cls, root: Path) -> CpuFiles:
        cpufreq = root / "sys" / "devices" / "system" / "cpu"
        currents = sorted(cpufreq.glob("cpufreq/policy*/scaling_cur_freq")) or \
            sorted(cpufreq.glob("cpu[0-9]*/cpufreq/scaling_cur_freq"))
        freqs = tuple((cur, _khz_or_hz_to_mhz(_int(cur.with_name("cpuinfo_max_freq")))) for cur in currents)
        bases = tuple(_khz_or_hz_to_mhz(_int(cur.with_name("base_frequency"))) for cur in currents)
        temps = sorted(temp for temp in (root / "sys" / "class" / "thermal").glob("thermal_zone*/temp")
                       if _read(temp.with_name("type")) not in NOT_SENSORS)
        return cls(freqs, tuple(temps), bases, trip_points(root))

    def unavailable(self) -> dict[str, str]:
        """What this machine's sysfs cannot tell, and why (a VM or container often has neither)."""
        out = {}
        if not self.freqs:
            out["frequency"] = NO_CPUFREQ
        if not self.temps:
            out["temperature"] = "no thermal zone (/sys/class/thermal/thermal_zone*)"
        return out


def cpu_sample(files: CpuFiles) -> dict:
    """Current frequency (MHz, the lowest policy's), the policy furthest below its own maximum (its share, current
    and maximum MHz), the same among the policies below their base frequency where the driver gives one
    (`freq_capped`: what can be capping), and the hottest thermal zone."""
    freqs, lowest, capped = [], None, None
    bases = files.bases or (None,) * len(files.freqs)
    for (path, maximum), base in zip(files.freqs, bases, strict=True):
        current = _khz_or_hz_to_mhz(_int(path))
        if current:
            freqs.append(current)
            if maximum and (lowest is None or current / maximum < lowest[0]):
                lowest = (current / maximum, current, maximum)
            if maximum and (base is None or current < base) and (capped is None or current / maximum < capped[0]):
                capped = (current / maximum, current, maximum)
    temps = [t for t in (_int(p) for p in files.temps) if t is not None]
    return {"freq_mhz": min(freqs) if freqs else None, "freq_share": lowest, "freq_capped": capped,
            "temp_c": max(temps) / 1000 if temps else None, "trips": thermal_trips(files.trips)}


def cpu_static(root: Path) -> dict:
    cpus = sorted((root / "sys" / "devices" / "system" / "cpu").glob("cpu[0-9]*"))
    governors = sorted({g for g in (_read(c / "cpufreq" / "scaling_governor") for c in cpus) if g})
    maxima = [f for f in (_khz_or_hz_to_mhz(_int(c / "cpufreq" / "cpuinfo_max_freq")) for c in cpus) if f]
    return {"governors": governors or None, "max_freq_mhz": max(maxima) if maxima else None}


def rpi_throttled(run=subprocess.run) -> dict | None:
    """`vcgencmd get_throttled` (Raspberry Pi firmware): its value and flags; {"error": why} where the command is
    there but gave no value; None where it does not exist."""
    if shutil.which("vcgencmd") is None and run is subprocess.run:
        return None
    try:
        done = run(["vcgencmd", "get_throttled"], capture_output=True, text=True, timeout=5)
    except FileNotFoundError:
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"vcgencmd get_throttled failed ({exc})"}
    try:
        value = int(done.stdout.strip().split("=")[1], 16)
    except (ValueError, IndexError):  # "VCHI initialization failed": a user outside the video group
        said = ((getattr(done, "stderr", "") or "").strip() or done.stdout.strip()).splitlines()
        return {"error": "vcgencmd get_throttled failed" + (f" ({said[0][:200]})" if said else "")
                         + "; a user outside the video group cannot read it: sudo usermod -aG video $USER, then log "
                           "in again"}
    return {"value": hex(value), "flags": [name for bit, name in RPI_THROTTLED.items() if value & (1 << bit)]}


def rpi_during(readings: list[dict]) -> tuple[list[str], list[str]]:
    """From the readings of one pass (its start first): every flag seen, and what throttled during it: a flag of
    now (bits 0-3) in any reading, an "occurred" flag (16-19) that was clear in one reading and set in a later one.
    An "occurred" flag set from the start on may be from before the pass: recorded, not counted."""
    seen: set[str] = set()
    during: set[str] = set()
    clear: set[str] = set()
    for reading in readings:
        flags = set(reading["flags"])
        seen |= flags
        during |= {f for f in flags if not f.endswith("_occurred")}
        during |= {f for f in flags if f.endswith("_occurred") and f in clear}
        clear |= {name for name in RPI_THROTTLED.values() if name not in flags}
    order = list(RPI_THROTTLED.values())
    return sorted(seen, key=order.index), sorted(during, key=order.index)


def jetson_power(root: Path, run=subprocess.run) -> dict:
    """The power mode (nvpmodel -q) and whether jetson_clocks pinned the GPU clock (devfreq min = max)."""
    mode = None
    try:
        out = run(["nvpmodel", "-q"], capture_output=True, text=True, timeout=5).stdout
        found = re.search(r"NV Power Mode:\s*(\S+)", out)
        number = re.search(r"^\s*(\d+)\s*$", out, re.MULTILINE)
        mode = {"name": found.group(1) if found else None, "id": int(number.group(1)) if number else None}
    except (OSError, subprocess.TimeoutExpired):
        mode = None
    reader = JetsonReader(root)
    pinned = None
    if reader.gpu is not None:
        low, high = _int(reader.gpu / "min_freq"), _int(reader.gpu / "max_freq")
        pinned = low is not None and low == high
    return {"nvpmodel": mode or "unavailable (nvpmodel not found)", "jetson_clocks": pinned,
            "gpu_max_mhz": reader.max_sm_mhz}


@dataclass
class _Window:
    tag: str
    started: float  # seconds since boot
    samples: list[dict] = field(default_factory=list)
    cpu: list[dict] = field(default_factory=list)
    load_start: tuple[float, ...] = ()
    rpi: list[dict] = field(default_factory=list)  # vcgencmd's readings, the start's first (a board that has it)
    rpi_error: str | None = None
    rpi_polled: float = 0.0  # when it was last read (time.monotonic)
    cpu_start: dict[int, tuple[float, float]] = field(default_factory=dict)  # pid -> (created, CPU seconds)


def seconds_since_boot() -> float:
    """Linux's CLOCK_BOOTTIME (suspend included, as /proc's start times are); elsewhere from psutil's boot time."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is not None:
        return time.clock_gettime(clock)
    import psutil

    return time.time() - psutil.boot_time()


def process_start_time() -> float:
    """This process's start as a time.time() value: its start in seconds since boot (psutil's create_time less the
    boot time it added) against CLOCK_BOOTTIME; psutil's create_time itself adds /proc/stat's whole-second boot time
    and reads up to 1 s early."""
    import psutil

    since_boot = psutil.Process().create_time() - psutil.boot_time()
    return time.time() - (seconds_since_boot() - since_boot)


class DeviceSampler:
    """Samples the device's state on a thread during each timed pass (begin_window / end_window), like the
    memory monitor; end_window returns what was seen, a `throttled` flag and warnings."""

    def __init__(self, gpu_reader=None, root: Path = Path("/"), interval_s: float = 0.5, run=subprocess.run,
                 processes=None, uptime=None, boot_time: float | None = None, board: dict | None = None):
        self.gpu, self.interval_s, self.run = gpu_reader, interval_s, run
        self.board = board  # a Jetson's power mode and jetson_clocks, read once (jetson_power)
        self.static = cpu_static(root)
        self.cpu_files = CpuFiles.find(root)
        self.errors: list[str] = []  # a sample that failed (recorded with the window, the thread goes on)
        self.processes = processes  # psutil-like process_iter, for tests; None: psutil's
        # Process starts and the window on one clock, seconds since boot: psutil's create_time() is ticks since boot
        # plus /proc/stat's btime, a whole second that drops the boot's fraction (starts read up to 1 s early
        # against time.time(), and a process begun late in a pass was judged over time it did not run)
        self.uptime = uptime or seconds_since_boot
        self.boot_time = boot_time
        self._window: _Window | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @classmethod
    def for_device(cls, device, root: Path = Path("/"), nvml=None) -> DeviceSampler:
        """NVML on an NVIDIA GPU, devfreq on a Jetson, the CPU side alone on a CPU run."""
        reader, board = None, None
        if is_jetson(root):  # the power mode bounds the CPU's clocks too: recorded whatever the device
            board = jetson_power(root)
            reader = JetsonReader(root) if getattr(device, "is_cuda", False) else None
        elif getattr(device, "is_cuda", False):
            nvml, _ = load_nvml(nvml)
            reader = NvmlReader(nvml, device.index) if nvml is not None else None
        return cls(reader, root, board=board)

    def __enter__(self) -> DeviceSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        with self._lock:
            window = self._window
        if window is None:
            return
        try:
            if self.gpu is not None:
                window.samples.append(self.gpu.sample())
            window.cpu.append(cpu_sample(self.cpu_files))
            if window.rpi and time.monotonic() - window.rpi_polled >= RPI_POLL_S:
                self._read_rpi(window)
        except Exception as exc:  # a sysfs file that vanished, an NVML hiccup: the pass goes on, the record says so
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _process_iter(self):
        if self.processes is not None:
            return self.processes()
        import psutil

        return psutil.process_iter(["pid", "name"])

    def _cpu_seconds(self) -> dict[int, tuple[str | None, float, float]]:
        """pid -> (name, start in seconds since boot, CPU seconds so far) of every process readable now."""
        if self.boot_time is None:
            import psutil

            self.boot_time = psutil.boot_time()
        out = {}
        for proc in self._process_iter():
            if proc.pid == 0:  # Windows' "System Idle Process": its CPU time is the idle time
                continue
            try:
                times = proc.cpu_times()
                out[proc.pid] = (proc.info.get("name"), proc.create_time() - self.boot_time, times.user + times.system)
            except Exception:  # a process that ended meanwhile, or one we may not read
                pass
        return out

    def _read_rpi(self, window: _Window) -> None:
        """One `vcgencmd get_throttled` reading into the window (a board without the command: none, ever)."""
        reading = rpi_throttled(self.run)
        window.rpi_polled = time.monotonic()
        if reading is not None and "error" in reading:
            window.rpi_error = reading["error"]
        elif reading is not None:
            window.rpi.append(reading)

    def begin_window(self, tag: str) -> None:
        started = self.uptime()
        cpu = {pid: (created, seconds) for pid, (_, created, seconds) in self._cpu_seconds().items()}
        window = _Window(tag, started, load_start=load_average(), cpu_start=cpu)
        self._read_rpi(window)
        with self._lock:
            self._window = window
        self._sample()

    def end_window(self) -> dict:
        self._sample()
        with self._lock:
            window, self._window = self._window, None
        if window is None:
            return {"status": "unavailable", "reason": "no window was open", "throttled": None, "warnings": []}
        if window.rpi:
            self._read_rpi(window)
        end, now, ours = self._cpu_seconds(), self.uptime(), run_process_tree()
        busiest = busy_processes(window.cpu_start, window.started, end, now, ours)
        state = summarize_window(window, self.gpu, self.static, busiest[:3], load_average(),
                                 self.cpu_files.unavailable(), board=self.board is not None)
        state["run_cpu_cores"] = run_cpu_cores(window.cpu_start, window.started, end, now, ours)
        if self.board is not None:
            state["jetson_power"] = self.board
        if self.errors:
            state["sample_errors"], self.errors = self.errors[:5], []
        return state


def run_process_tree() -> set[int]:
    """This process and every process it started, still running (the run's own work: host processes, a forward
    process, multiprocessing's helpers)."""
    import psutil

    me = psutil.Process()
    pids = {me.pid}
    try:
        pids.update(child.pid for child in me.children(recursive=True))
    except psutil.Error:  # a child that ended while listed: the others still count
        pass
    return pids


def busy_processes(start: dict[int, tuple[float, float]], started: float,
                   end: dict[int, tuple[str | None, float, float]], now: float, ours: set[int]) -> list[dict]:
    """Other processes that used at least BUSY_PROCESS_PERCENT of a core during the window: CPU seconds over the
    window's wall time, or, for a process started during it, over the time since it started (a busy neighbour that
    began mid-pass is named too). `ours` (the run's own processes: run_process_tree) are not others."""
    busiest = []
    for pid, (name, created, seconds) in end.items():
        before = start.get(pid)
        if before is not None and abs(before[0] - created) < 1e-3:  # the same process (pids are reused)
            used, since = seconds - before[1], started
        else:
            used, since = seconds, max(created, started)
        if pid in ours or now - since < MIN_BUSY_WINDOW_S:
            continue
        percent = 100 * used / (now - since)
        if percent >= BUSY_PROCESS_PERCENT:
            busiest.append({"pid": pid, "name": name, "cpu_percent": round(percent)})
    return sorted(busiest, key=lambda p: -p["cpu_percent"])


def run_cpu_cores(start: dict[int, tuple[float, float]], started: float,
                  end: dict[int, tuple[str | None, float, float]], now: float, ours: set[int]) -> float | None:
    """The CPU the run's own processes (`ours`) used during the window, in cores: their CPU seconds over its
    seconds (None for a window too short to judge)."""
    if now - started < MIN_BUSY_WINDOW_S:
        return None
    used = 0.0
    for pid in ours & end.keys():
        _, created, seconds = end[pid]
        before = start.get(pid)
        used += seconds - before[1] if before is not None and abs(before[0] - created) < 1e-3 else seconds
    return round(used / (now - started), 2)


def machine_busy(load: float, run_cores: float | None, cores: int) -> str | None:
    """What to say of a machine busy with other work during a pass, or None: the 1-min load average less the CPU the
    run's own processes used then (its threads count in the load: a run on every core keeps it near the core count
    on a quiet machine) at BUSY_SHARE of the cores or more. Without the run's own figure, the load over the cores."""
    if run_cores is None:
        return None if load <= cores else f"machine busy: 1-min load average {load:.1f} on {cores} cores"
    others = load - run_cores
    if others < max(0.5, BUSY_SHARE * cores):
        return None
    return (f"machine busy: 1-min load average {load:.1f} on {cores} cores, {others:.1f} beyond this run's own "
            f"{run_cores:.1f}")


def _span(values: list) -> list | None:
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if values else None


def summarize_window(window: _Window, gpu, static: dict, busiest: list[dict], load_end: tuple,
                     unavailable: dict[str, str] | None = None, board: bool = False) -> dict:
    """What one timed pass saw, whether the device throttled, and the warnings to show (`unavailable`: the CPU
    figures this machine's sysfs cannot give, and why; `board`: a Jetson, whose thermal trips are its throttle
    signal whatever the device)."""
    unavailable = unavailable or {}
    out: dict[str, Any] = {"samples": len(window.cpu)}
    reasons: list[str] = []
    warnings: list[str] = []
    reasons_read = gpu is not None and gpu.source == "nvml" and any(s["reasons"] is not None for s in window.samples)
    if gpu is not None and gpu.source == "nvml":
        seen = sorted({r for s in window.samples if s["reasons"] is not None for r in _reasons(s["reasons"])})
        reasons = [r for r in seen if r in SLOWDOWNS]
        unknown = [r for r in seen if r.startswith("unknown_")]
        if unknown:  # a newer driver's reason: recorded, and said, rather than read as nothing
            warnings.append(f"NVML reported clock-event reasons this va-bench does not know ({', '.join(unknown)}; "
                            "nvml.h names them): recorded under gpu.clock_event_reasons, not judged")
        out["gpu"] = {"source": "nvml", "clock_event_reasons": seen,
                      "sm_clock_mhz": _span([s["sm_mhz"] for s in window.samples]), "max_sm_clock_mhz": gpu.max_sm_mhz,
                      "mem_clock_mhz": _span([s["mem_mhz"] for s in window.samples]),
                      "temperature_c_max": max((s["temp_c"] for s in window.samples if s["temp_c"] is not None),
                                               default=None),
                      "power_w_max": max((s["power_w"] for s in window.samples if s["power_w"] is not None),
                                         default=None)}
    elif gpu is not None:  # Jetson: a GPU clock below its maximum during the pass
        clocks = _span([s["sm_mhz"] for s in window.samples])
        out["gpu"] = {"source": gpu.source, "sm_clock_mhz": clocks, "max_sm_clock_mhz": gpu.max_sm_mhz}
        if clocks and gpu.max_sm_mhz and clocks[1] < FREQ_DROP * gpu.max_sm_mhz:  # never near its maximum
            warnings.append(f"GPU clock at most {clocks[1]:.0f} MHz of {gpu.max_sm_mhz:.0f} MHz during the pass "
                            "(jetson_clocks off, or capped)")
    freqs = _span([c["freq_mhz"] for c in window.cpu])
    lowest = min((c["freq_share"] for c in window.cpu if c["freq_share"] is not None), default=None)
    out["cpu"] = {**static, "freq_mhz": freqs,
                  "freq_share_of_max_min": None if lowest is None else round(lowest[0], 4),
                  "temperature_c_max": max((c["temp_c"] for c in window.cpu if c["temp_c"] is not None), default=None)}
    if unavailable:
        out["cpu"]["unavailable"] = unavailable
    # a zone at a trip point during the pass: the kernel slows the chip there, whichever device the cell runs on
    trips = sorted({t for c in window.cpu for t in c.get("trips", ())})
    out["thermal_trips"] = trips
    reasons += [f"thermal trip: {t}" for t in trips]
    rpi = bool(window.rpi)
    if rpi:
        seen, during = rpi_during(window.rpi)
        out["rpi_throttled"] = {"start": window.rpi[0]["value"], "end": window.rpi[-1]["value"],
                                "readings": len(window.rpi), "flags": seen, "during_pass": during}
        reasons += [f"raspberry pi: {f}" for f in during]
    elif window.rpi_error:
        out["rpi_throttled"] = {"unavailable": window.rpi_error}
    governors = static.get("governors") or []
    capped = min((c["freq_capped"] for c in window.cpu if c.get("freq_capped") is not None), default=None)
    if capped is not None and capped[0] < FREQ_DROP and governors == ["performance"]:  # below its own maximum
        warnings.append(f"CPU frequency fell to {100 * capped[0]:.0f}% of its core's maximum ({capped[1]:.0f} of "
                        f"{capped[2]:.0f} MHz) with the performance governor: thermal or power capping")
    out["load_average"] = {"start": [round(v, 2) for v in window.load_start], "end": [round(v, 2) for v in load_end]}
    out["busiest_other_processes"] = busiest
    if busiest:
        warnings.append("other processes busy during the timed pass: " + ", ".join(
            f"{p['name']} (pid {p['pid']}, {p['cpu_percent']}% CPU)" for p in busiest))
    # "no" needs a device that reports throttling (NVML, a Jetson's clocks and trips, vcgencmd); elsewhere a
    # trip point reached says yes, but a CPU's own frequency and temperature flag nothing: unknown, not "no"
    if reasons:
        out["throttled"] = True
    elif gpu is None and not rpi and not board:
        recorded = [what for what in ("frequency", "temperature") if what not in unavailable]
        out["throttled"], out["throttle_signal"] = None, (
            "unavailable: no throttle signal on this device" + (f" (CPU {' and '.join(recorded)} recorded under cpu)"
                                                                 if recorded else " (nor a CPU frequency or "
                                                                                  "temperature: see cpu.unavailable)"))
        if window.rpi_error:
            out["throttle_signal"] = f"unavailable: {window.rpi_error}"
    elif gpu is not None and not window.samples and not rpi:
        out["throttled"], out["throttle_signal"] = None, "unavailable: no GPU sample was taken during the pass"
    elif gpu is not None and gpu.source == "nvml" and not reasons_read and not rpi:
        out["throttled"], out["throttle_signal"] = None, ("unavailable: NVML does not report clock-event reasons "
                                                          "for this GPU (clocks, temperature and power recorded)")
    else:
        out["throttled"] = bool(reasons)
    out["throttle_reasons"] = reasons
    if reasons:
        warnings.insert(0, "throttled during the timed pass (" + ", ".join(reasons) + "): timings are suspect")
    out["warnings"] = warnings
    return out


def spinning_openmp(torch_threads: bool, on_gpu: bool, threads: int, blocktime_ms: int | None = None) -> str | None:
    """What to say of a busy machine's timing of a CPU forward on torch's OpenMP threads (`torch_threads`: the
    backend's runs there) on `threads` threads when they spin while they wait (OMP_WAIT_POLICY not PASSIVE, and
    neither GOMP_SPINCOUNT nor KMP_BLOCKTIME 0), or on a runtime's own OpenMP threads that spin `blocktime_ms`
    after each parallel region (ncnn's openmp_blocktime): spinning threads lose most to other busy processes. None
    where nothing spins (another runtime's threads, a GPU run, one thread, a setting that stops the spinning). The
    settings as this process was started with them: OpenMP reads them once."""
    if on_gpu or threads <= 1:
        return None
    if blocktime_ms:
        return (f"the runtime's OpenMP threads spin {blocktime_ms} ms after each parallel region (its "
                "openmp_blocktime), which other busy processes slow most: rerun on a quiet machine, or with "
                "--threads 1")
    if not torch_threads:
        return None
    if (os.environ.get("OMP_WAIT_POLICY") or "").strip().upper() == "PASSIVE":
        return None
    if any((os.environ.get(name) or "").strip() == "0" for name in ("GOMP_SPINCOUNT", "KMP_BLOCKTIME")):
        return None
    return ("torch's OpenMP threads spin while they wait (OMP_WAIT_POLICY is not PASSIVE), which other busy "
            "processes slow most: rerun on a quiet machine, or with OMP_WAIT_POLICY=PASSIVE (slower when idle)")
