"""Run `dstui` under a pseudo-terminal, as a person's terminal would (shared by the TUI benchmarks)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading


class PtyApp:
    def __init__(self, argv: list[str], env: dict[str, str], cols: int = 100, rows: int = 30) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {**env, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dstui", *argv],
            stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, close_fds=True,
        )  # fmt: skip
        os.close(slave)
        self.master = master
        self.output = bytearray()
        self._stop = False
        # drain the terminal so the app never blocks on a full pty buffer
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while not self._stop:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.output += data[-4096:]

    def send(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._stop = True
        with contextlib.suppress(OSError):
            os.close(self.master)
