"""Progress of long work: one animated line on stderr, only for a person watching a terminal.

Quiet when stderr is not a terminal (a pipe, a file, CI logs) and with ``--json``; rich decides what
a terminal is (``TTY_COMPATIBLE=1`` or ``FORCE_COLOR`` force one). A command whose work runs for
minutes may ask for a heartbeat instead: off a terminal, the status as a plain line on stderr every
``heartbeat_s`` seconds, so a log shows the work is alive and how far it has got. Progress never touches stdout, so
stdout stays the command's result; a result line printed while the status shows goes through
:meth:`Progress.print`, which lifts the status line off a shared terminal first.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text


class _Line:
    """The status text with the time since the work began, rendered at each refresh."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.began = time.monotonic()

    def __str__(self) -> str:
        elapsed = int(time.monotonic() - self.began)
        return f"{self.text}  {elapsed // 60}:{elapsed % 60:02d}"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(str(self), no_wrap=True, overflow="ellipsis")


class Progress:
    """``with Progress("checking seams", quiet=args.json) as progress: progress.update(...)``."""

    def __init__(self, text: str, *, quiet: bool = False, heartbeat_s: float | None = None) -> None:
        console = Console(stderr=True)
        self._line = _Line(text)
        self._live: Live | None = None
        self._beat: threading.Thread | None = None
        self._stopped = threading.Event()
        if not quiet and console.is_terminal:
            self._live = Live(Spinner("dots", text=self._line), console=console, transient=True,
                              redirect_stdout=False, redirect_stderr=False, refresh_per_second=8)
        elif not quiet and heartbeat_s is not None:
            self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat_s,), daemon=True, name="heartbeat")

    @property
    def shown(self) -> bool:
        return self._live is not None

    def __enter__(self) -> Progress:
        if self._live is not None:
            self._live.start()
        if self._beat is not None:
            self._beat.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.stop()
        self._stopped.set()
        if self._beat is not None:
            self._beat.join()

    def _heartbeat(self, every_s: float) -> None:
        while not self._stopped.wait(every_s):
            print(self._line, file=sys.stderr, flush=True)

    def update(self, text: str) -> None:
        self._line.text = text

    def print(self, line: str) -> None:
        """A result line on stdout; on a terminal shared with the status, the status steps aside."""
        if self._live is None or not sys.stdout.isatty():
            print(line, flush=True)
            return
        self._live.stop()
        print(line, flush=True)
        self._live.start()
