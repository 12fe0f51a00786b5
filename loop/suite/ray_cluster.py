"""The Ray cluster a `suite run --ray` runs on: joined or started, then left.

`Cluster.start` joins the cluster at an address (or RAY_ADDRESS), whose nodes' workers take their
own environment, or starts a local one sized to the tasks: no dashboard, a small object store, its
workers importing this tileloop first, then Ray and the rest from the driver's own PYTHONPATH, and
its temporary root short enough for its sockets. `Cluster.stop` leaves it; a local one stops, its
logs kept in `<out-dir>/ray-logs/` (`ray_deadlines` reads them for a task that never began).

Ray is not imported here: the driver (`ray_engine`) imports it, when asked for, and hands it over."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Callable

from loop.measure.launch import with_package_path

# A local cluster's sockets live at <temp root>/ray/session_<date>_<time>_<pid>/sockets/plasma_store, and a
# socket's path may not pass 107 bytes: a temporary folder longer than this (a deep TMPDIR) is replaced for Ray
# by a short one of its own under /tmp
SOCKET_ROOT_MOST = 107 - len("/ray/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store")
LOGS = "ray-logs"  # under the output folder: the local cluster's logs
OBJECT_STORE_BYTES = 128 * 2**20  # a local cluster's object store: bundles and archives (more spills to disk)


def worker_env_vars() -> dict[str, str]:
    """The variables a local cluster's workers get: PYTHONPATH with this tileloop first, then the
    driver's own entries (where Ray itself may be, installed with `pip install --target`)."""
    driver = os.environ.get("PYTHONPATH")
    return with_package_path({"PYTHONPATH": driver} if driver else {})


class Cluster:
    """The cluster at `address` (also RAY_ADDRESS) joined, or a local one started for the suite;
    `ray`: the Ray module, imported by the driver."""

    def __init__(self, ray, address: str | None = None):
        self.ray, self.address = ray, address or None
        self.own_root: Path | None = None  # a short temporary root made for a local cluster (`temp_root`)

    def start(self, tasks: int, log: Callable[[str], None]) -> Path | None:
        """Join the cluster at the address (or RAY_ADDRESS), else start a local one sized to the
        tasks (no dashboard, a small object store); the local one's session folder, else None."""
        address = self.address or os.environ.get("RAY_ADDRESS")
        on_sigterm = signal.getsignal(signal.SIGTERM)  # the suite's: Ray's driver puts its own in place
        try:
            if address:
                # the nodes' workers take their own node's environment (PYTHONPATH included): the driver's
                # paths need not exist there, so none of them is passed on
                self.ray.init(address=address, log_to_driver=False)
                log(f"[ray] joined the cluster at {address}: {self.ray.cluster_resources()}")
                return None
            cpus = max(1, min(tasks, os.cpu_count() or 1))
            context = self.ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                                    object_store_memory=OBJECT_STORE_BYTES, runtime_env={"env_vars": worker_env_vars()},
                                    **self.temp_root())
            log(f"[ray] started a local cluster: {self.ray.cluster_resources()}")
            return Path(context.address_info["session_dir"])
        finally:
            if on_sigterm is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, on_sigterm)  # a SIGTERM ends the suite as without --ray (then the cluster)

    def temp_root(self) -> dict:
        """`ray.init`'s temporary root where the system's is too long for the cluster's sockets ({} where
        it fits): a folder of tileloop's own under /tmp, made for this cluster and removed with it."""
        if len(tempfile.gettempdir()) <= SOCKET_ROOT_MOST:
            return {}
        self.own_root = Path(tempfile.mkdtemp(prefix="tl-ray-", dir="/tmp"))
        return {"_temp_dir": str(self.own_root)}

    def stop(self, session: Path | None, out_dir: Path) -> None:
        """Leave the cluster (a local one stops); a local one's logs kept under the output folder."""
        self.ray.shutdown()
        if session is None:
            return
        if (session / "logs").is_dir():
            if (out_dir / LOGS).exists():
                shutil.rmtree(out_dir / LOGS)
            shutil.copytree(session / "logs", out_dir / LOGS, symlinks=True)
        shutil.rmtree(session, ignore_errors=True)
        if self.own_root is not None:
            shutil.rmtree(self.own_root, ignore_errors=True)
