"""Real processes that stand for other kernels in the fast tier: a cluster object acting for
one (``SlurmRayCluster(..., process=...)``) is judged alive or gone exactly as a kernel is."""

from __future__ import annotations

import signal
import socket
import subprocess

from jupyter_slurm_ray.owner import ProcessIdentity, process_started


class StandIn:
    """A live process (``sleep``) whose identity another kernel's cluster object takes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(["sleep", "600"])
        pid = self.process.pid
        self.identity = ProcessIdentity(socket.gethostname(), pid, process_started(pid))

    def kill(self) -> None:
        """SIGKILL, as a crashed kernel: no goodbye."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()


def dead_process() -> ProcessIdentity:
    """The identity of a process of this host that has ended."""
    process = subprocess.Popen(["true"])
    process.wait()
    return ProcessIdentity(socket.gethostname(), process.pid, None)
