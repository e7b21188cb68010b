"""The hostile neighbour of the real tests: bob's squatter (``squatter.py``) run in a compute
node's namespace, what he received, and every token alice's job had meanwhile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from .bootstrap import in_node, user_uid

BOB = "bob"
SQUATTER = Path(__file__).parent / "squatter.py"
CHUNK = 8  # no 8 consecutive characters of a token may reach bob


class Bob:
    """bob's squatter in compute node N's namespace; his recordings and his log."""

    def __init__(
        self, node: int, mode: str, ports: tuple[int, ...] = (), seconds: float = 600
    ) -> None:
        self.out = Path(tempfile.mkdtemp(prefix="jsr-bob-", dir="/tmp"))
        os.chown(self.out, user_uid(BOB), user_uid(BOB))
        argv = in_node(
            node, "/usr/bin/python3", str(SQUATTER), str(user_uid()), str(self.out),
            str(seconds), mode, *map(str, ports), user=BOB,
        )  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd="/tmp")
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "watching"

    def log(self) -> list[dict]:
        try:
            lines = (self.out / "log.jsonl").read_text().splitlines()
        except OSError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def squatted(self) -> set[int]:
        return {e["port"] for e in self.log() if e["what"] == "squatting"}

    def received(self) -> dict[str, bytes]:
        return {path.name: path.read_bytes() for path in sorted(self.out.glob("*.bin"))}

    def leave(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        shutil.rmtree(self.out, ignore_errors=True)


class Tokens:
    """Every content alice's ray_token had while the test ran (root reads it every 20 ms)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[str] = []
        self.running = True
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def watch(self) -> None:
        while self.running:
            self.read()
            time.sleep(0.02)

    def read(self) -> None:
        try:
            token = self.path.read_text().strip()
        except OSError:
            return
        if token and token not in self.seen:
            self.seen.append(token)

    def stop(self) -> list[str]:
        self.running = False
        self.thread.join(5)
        self.read()
        return self.seen


def assert_no_token_reached(bob: Bob, tokens: list[str]) -> None:
    """No CHUNK consecutive characters of any token in any byte bob received."""
    received = bob.received()
    for token in tokens:
        pieces = {token[i : i + CHUNK].encode() for i in range(len(token) - CHUNK + 1)}
        for name, data in received.items():
            leaked = [piece for piece in pieces if piece in data]
            assert not leaked, f"bob's {name} holds {len(leaked)} pieces of a token: {data[:400]!r}"
