"""`va-bench fleet join`: `ray start` for a device of the fleet, with what the fleet needs of it.

The node advertises `hw:<hardware id>` and `va-bench-slot` (harness/fleet/driver.py: node_resources), the
hardware id being `va-bench hw`'s (or --hardware-id). Ray sets OMP_NUM_THREADS to a task's CPU count (1
here) when it is unset, which would run every benchmark on one torch thread: the node is started with
OMP_NUM_THREADS set to what `va-bench run` uses on this machine, unless the caller set it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.config import SAFE_ID, reserved_name
from harness.errors import UsageError
from harness.results.reader import FLEET_ACCURACY_DIR

# Ray replaces a loopback node address with the machine's network address, and its servers then listen on every
# interface, unless this is set (read when ray is imported): a one-machine cluster asked for on 127.0.0.1 stays there
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
SLOT = "va-bench-slot"  # one per node: a benchmark or an accuracy shard holds the node's only one
ACCURACY_DIR = FLEET_ACCURACY_DIR  # the gathered run's folder of sharded accuracy, beside the hardware folders
RESERVED_IDS = (ACCURACY_DIR,)


def hardware_resource(hardware_id: str) -> str:
    """The Ray resource that names a node's hardware."""
    return f"hw:{hardware_id}"


def node_resources(hardware_id: str) -> dict[str, float]:
    """What a node of this hardware advertises, and what a benchmark task for it asks for."""
    return {hardware_resource(hardware_id): 1, SLOT: 1}


@dataclass
class JoinCommand:
    argv: list[str]
    env_added: dict[str, str]
    hardware_id: str


def derived_hardware_id() -> str:
    """What `va-bench hw` calls this machine."""
    from harness.measure.machine import machine_report

    return machine_report()["hardware"]["id"]


def default_threads() -> str:
    """The torch threads `va-bench run` uses here (without --threads)."""
    import torch

    return str(torch.get_num_threads())


def ray_executable() -> str:
    """The `ray` command of this environment."""
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.is_file() else shutil.which("ray")
    if not found:
        raise UsageError("`ray` is not installed in this environment: pip install 'va-bench[fleet]'")
    return found


def join_command(address: str | None, head: bool, port: int, node_ip_address: str | None, hardware_id: str | None,
                 extra: list[str]) -> JoinCommand:
    """The `ray start` command line (no shell) and the environment it adds; raises UsageError on bad input."""
    if head == (address is not None):
        raise UsageError("give either --head (start the cluster here) or --address HEAD:PORT (join one)")
    hw = hardware_id or derived_hardware_id()
    if not re.fullmatch(SAFE_ID, hw) or hw in RESERVED_IDS or reserved_name(hw):
        raise UsageError(f"hardware id {hw!r} cannot name a results folder: use letters, digits, '_', '.' and '-' "
                         f"(not {', '.join(RESERVED_IDS)}, nor a Windows device name, nor a trailing '.'); pass "
                         "--hardware-id")
    resources = json.dumps(node_resources(hw), separators=(",", ":"))
    argv = [ray_executable(), "start"]
    if head:
        argv += ["--head", f"--port={port}", "--include-dashboard=false"]
    else:
        host, _, port_text = address.removeprefix("ray://").rpartition(":")
        if not host or not port_text.isdigit():
            raise UsageError(f"--address {address!r} is not HOST:PORT (the head's address, e.g. 10.0.0.5:6379)")
        argv += [f"--address={address}"]
    argv += [f"--resources={resources}", "--disable-usage-stats"]
    if node_ip_address:
        argv.append(f"--node-ip-address={node_ip_address}")
    argv += extra
    env_added = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": default_threads()}
    if head and is_loopback(node_ip_address):  # a one-machine cluster: Ray then takes no node beside the head
        env_added.update(LOOPBACK_ENV)
    return JoinCommand(argv, env_added, hw)


def check_reachable(address: str, timeout_s: float = 5.0, given: bool = True) -> None:
    """A TCP connection to the head's port, or a UsageError naming why not (`given`: the user named the address;
    else Ray's lookup found it)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--address {address!r} is not HOST:PORT (the head's address, e.g. 10.0.0.5:6379)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        fix = ("check the address and that `va-bench fleet join --head` runs there" if given else
               "it is the cluster this machine started last (Ray's lookup, no --address given): start one with "
               "`va-bench fleet join --head` or pass --address HOST:PORT")
        raise UsageError(f"cannot reach the Ray head at {address} ({exc.strerror or exc}); {fix}") from None


def is_loopback(host: str | None) -> bool:
    """Whether `host` (an IP address, `[::1]`, or localhost) is this machine's loopback."""
    if not host:
        return False
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_driver(address: str | None) -> None:
    """Before ray is imported: a driver that joins a head on the loopback (`--address 127.0.0.1:6379`) reaches it
    there, as `fleet join --head --node-ip-address 127.0.0.1` started it (Ray would otherwise dial the machine's
    network address, where that head does not listen). A head started without it listens there too, and is reached."""
    # what connect() dials without --address: $RAY_ADDRESS, else the cluster this machine started last
    address = address or os.environ.get("RAY_ADDRESS") or last_cluster_address()
    if not address:
        return
    if address.startswith("["):  # [::1]:6379
        host = address[1:].partition("]")[0]
    else:  # 127.0.0.1:6379, localhost:6379, or a bare IPv6 address
        host = address.partition(":")[0] if address.count(":") == 1 else address
    if is_loopback(host):
        for name, value in LOOPBACK_ENV.items():
            os.environ.setdefault(name, value)


def last_cluster_address() -> str | None:
    """The head in Ray's record of the cluster this machine started last (ray_current_cluster in its temp folder:
    $RAY_TMPDIR, else /tmp on Linux), read without importing ray; None where there is none."""
    base = os.environ.get("RAY_TMPDIR") or ("/tmp" if sys.platform.startswith("linux") else tempfile.gettempdir())
    try:
        return (Path(base) / "ray" / "ray_current_cluster").read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def start(command: JoinCommand) -> int:
    """Run `ray start`; its exit status."""
    import subprocess

    return subprocess.run(command.argv, env={**os.environ, **command.env_added}, check=False).returncode
