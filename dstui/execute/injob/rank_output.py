"""The ranks' output, read apart and written into the job's log in whole lines.

Ranks that share one stream tear each other's lines: an unbuffered Python
(dstui sets ``PYTHONUNBUFFERED``) writes a line's text and its newline in two
writes, ``print(a, b)`` in four, and another rank's write lands in between. Two
ranks printing the seed's line lost 81 of 300 points that way. So each rank
gets a pipe of its own; a thread per rank reads it and writes complete lines,
one rank's at a time, to the starter's own stdout (the run's ``stdout.log``).
A partial line (a prompt, a progress bar's ``\\r`` update) is written as it is
once its rank has been quiet for :data:`PARTIAL_AFTER_S`, or once it grows past
:data:`MAX_PARTIAL` bytes, so nothing waits unseen.

Stdlib only: it runs in the job (:mod:`dstui.execute.injob.ranks`).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading

PARTIAL_AFTER_S = 0.5
MAX_PARTIAL = 1 << 20
DRAIN_S = 5.0  # how long to wait for a dead rank's pipe to reach its end (a child of it may hold it open)


class RankOutput:
    """The pipes of a job's ranks and the threads that copy them, line by line, to this process's stdout."""

    def __init__(self, out_fd: int = 1) -> None:
        self.out_fd = out_fd
        self.lock = threading.Lock()
        self.threads: dict[int, threading.Thread] = {}

    def pipe_for(self, rank: int) -> int:
        """A new pipe for ``rank``: its write end is returned (for the rank's stdout and stderr)."""
        read_end, write_end = os.pipe()
        t = threading.Thread(target=self._copy, args=(read_end,), name=f"rank{rank}-output", daemon=True)
        t.start()
        self.threads[rank] = t
        return write_end

    def write(self, data: bytes) -> None:
        """One rank's complete lines (or a partial one), never interleaved with another's."""
        with self.lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self.out_fd, view)
                except InterruptedError:
                    continue
                except OSError:  # a full disk, a closed log: the rank must not block on it
                    return
                view = view[n:]

    def say(self, text: str) -> None:
        """The starter's own line (a rank's failure), between the ranks' lines."""
        self.write(text.encode() + b"\n")

    def drain(self, rank: int | None = None) -> None:
        """Wait (bounded) until a rank's output (or every rank's) has reached the log."""
        threads = [self.threads[rank]] if rank is not None and rank in self.threads else list(self.threads.values())
        for t in threads:
            t.join(timeout=DRAIN_S)

    def _copy(self, fd: int) -> None:
        pending = b""
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], PARTIAL_AFTER_S)
                if not ready:
                    if pending:  # quiet with half a line: show it
                        self.write(pending)
                        pending = b""
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                pending += chunk
                cut = pending.rfind(b"\n") + 1
                if cut:
                    self.write(pending[:cut])
                    pending = pending[cut:]
                if len(pending) > MAX_PARTIAL:
                    self.write(pending)
                    pending = b""
        except OSError:
            pass
        finally:
            if pending:
                self.write(pending)
            with contextlib.suppress(OSError):
                os.close(fd)
