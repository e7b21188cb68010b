"""A real IPython kernel (a subprocess started by jupyter_client) that tests send cells to, as
a notebook would: it exits normally on ``stop()`` (its atexit hooks run) or is SIGKILLed."""

from __future__ import annotations

import os
import signal
import time

from jupyter_client.manager import KernelManager


class NotebookKernel:
    """A real IPython kernel (subprocess) that we send cells to."""

    def __init__(self) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel()
        self.stopped = False
        self._client()

    def _client(self) -> None:
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 180) -> str:
        """Execute ``code``; return its stdout, stderr and text results; raise on error."""
        outputs: list[str] = []

        def collect(message: dict) -> None:
            content = message["content"]
            if message["msg_type"] == "stream":
                outputs.append(content["text"])
            elif message["msg_type"] in ("execute_result", "display_data"):
                outputs.append(content["data"].get("text/plain", "") + "\n")
            elif message["msg_type"] == "error":
                outputs.append("\n".join(content["traceback"]))

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=collect)
        text = "".join(outputs)
        if reply["content"]["status"] != "ok":
            raise AssertionError(f"kernel cell failed:\n{code}\n{text}")
        return text

    def run_interrupted(self, code: str, after: float, timeout: float = 120) -> tuple[str, str]:
        """Execute ``code``, interrupt the kernel (the notebook's ■) ``after`` seconds; return
        the cell's status and what it printed."""
        outputs: list[str] = []
        msg_id = self.client.execute(code)
        time.sleep(after)
        self.manager.interrupt_kernel()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            content = message["content"]
            if message["msg_type"] == "stream":
                outputs.append(content["text"])
            elif message["msg_type"] == "error":
                outputs.append("\n".join(content["traceback"]))
            elif message["msg_type"] == "status" and content["execution_state"] == "idle":
                break
        reply = self.client.get_shell_msg(timeout=30)
        return reply["content"]["status"], "".join(outputs)

    @property
    def pid(self) -> int:
        return int(self.run("import os; print(os.getpid())"))

    def restart(self) -> None:
        self.client.stop_channels()
        self.manager.restart_kernel(now=False)
        self._client()

    def stop(self) -> None:
        """A normal exit (a shutdown request): the kernel's atexit hooks run. Idempotent."""
        if not self.stopped:
            self.stopped = True
            self.client.stop_channels()
            self.manager.shutdown_kernel(now=False)

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a crash would: no atexit, no goodbye."""
        pid = self.pid
        self.stopped = True
        self.client.stop_channels()
        os.kill(pid, signal.SIGKILL)
        self.manager.shutdown_kernel(now=True)  # reaps it, removes its connection file
