"""The candidate's stdout and stderr as the parent keeps them: the last few KiB and a byte count.

The child's processes write into a FIFO that the parent drains in a thread. Whatever they write,
the parent holds at most ``keep`` bytes of it plus one read, and counts the rest: a child that
prints a gigabyte costs the parent a gigabyte of reads, never a gigabyte of memory or disk.
"""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path

from cacheon.printable import escape_controls

READ_BYTES = 1 << 16
#: how often the drain looks whether it was told to stop (a writer it cannot see may hold the FIFO)
_POLL_SECONDS = 0.2
#: the most reads one catch-up makes, so that a candidate printing without pause cannot hold the reader
_CATCH_UP_READS = 64


class OutputTail:
    """A FIFO at ``path`` (created here, 0600) and the thread that drains it into a bounded tail.
    Open the writers (the child's stdout and stderr) first, then ``start``."""

    def __init__(self, path: Path, keep: int = 4000) -> None:
        os.mkfifo(path, 0o600)
        self.path = path
        # non-blocking, so the writer's open never waits for this one; the drain selects before reading
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._keep = keep
        self._tail = bytearray()
        self._total = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="candidate-output", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def total(self) -> int:
        """Every byte the candidate wrote so far, kept or not."""
        with self._lock:
            return self._total

    def _drain(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], _POLL_SECONDS)
            if ready and self._read_once() is None:
                return  # every writer closed its end: the candidate's processes are gone

    def _read_once(self) -> int | None:
        """One read into the tail, under the lock so that reads from the drain and from ``text``
        keep their order: the bytes read (0 when none are waiting), or None at end of file."""
        with self._lock:
            if self._fd < 0:
                return None  # closed: the tail is final
            try:
                chunk = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                return 0
            if not chunk:
                return None
            self._total += len(chunk)
            self._tail += chunk
            del self._tail[: max(0, len(self._tail) - self._keep)]
            return len(chunk)

    def settle(self, seconds: float) -> None:
        """Wait (at most ``seconds``) for the drain to reach the end: once the writers are gone,
        so that the tail holds their last words."""
        if self._thread.is_alive():
            self._thread.join(seconds)

    def text(self) -> str:
        """The tail, escaped (untrusted text, for the report only), after how much was not kept.

        What is already in the FIFO is read first: a child that printed and then reported over its
        channel has its words in the pipe before the report reaches the parent, whether or not
        the drain thread has been scheduled since."""
        for _ in range(_CATCH_UP_READS):
            if not self._read_once():
                break
        with self._lock:
            data, dropped = bytes(self._tail), self._total - len(self._tail)
        text = escape_controls(data.decode("utf-8", "replace"), keep_newlines=True)
        return f"[{dropped} earlier bytes not kept]\n{text}" if dropped else text

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            os.close(self._fd)
            self._fd = -1
