"""Ctrl-C for the command line: a prompt stop, inside a compiled call too.

Python runs a signal handler in the main thread between two bytecodes. A Ctrl-C
during a compiled XLA call therefore waits until the call returns, and one during
tracing can land in a garbage-collection callback, which swallows it. Here the
interpreter's C-level handler writes the signal to a socket
(`signal.set_wakeup_fd`) that a watcher thread reads at once. The thread writes
what the command has finished (`keep`), removes the folders the command created
and left empty, prints one line and ends the process with the shell's status for
an interrupt (130). A compiled call cannot be cancelled, only abandoned, hence
`os._exit`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

#: The exit status of a command stopped by Ctrl-C (128 + SIGINT).
STATUS = 128 + signal.SIGINT


class Interrupt:
    """What the command is doing (`during`, named in the message), what to write
    if it is stopped now (`keep() -> str`, saying what it wrote) and the folders
    it created (removed if still empty). The main thread holds `writing()` while
    it writes its own files, so a Ctrl-C then waits for the write to finish."""

    def __init__(self):
        self.during = "starting"
        self.keep: Callable[[], str] | None = None
        self.created: list[Path] = []
        self._lock = threading.Lock()

    def install(self) -> Interrupt:
        """Take over SIGINT (from the main thread). Returns `self`."""
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        # The C-level handler still writes to the socket; the Python-level one,
        # which would raise KeyboardInterrupt in the main thread, does nothing.
        signal.signal(signal.SIGINT, lambda signum, frame: None)
        self._sockets = (reader, writer)  # kept open for the process's life
        threading.Thread(target=self._watch, args=(reader,), daemon=True,
                         name="cdiff-interrupt").start()
        return self

    @contextlib.contextmanager
    def writing(self):
        with self._lock:
            yield

    def _watch(self, reader: socket.socket) -> None:
        while signal.SIGINT not in reader.recv(64):
            pass
        with self._lock:
            kept = ""
            if self.keep is not None:
                try:
                    kept = self.keep()
                except Exception as e:  # the message still goes out
                    kept = f"could not write the finished results ({e})"
            for folder in reversed(self.created):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only if empty
            message = f"cdiff: interrupted during {self.during}; " + (
                kept or "nothing written")
            print(f"\n{message}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(STATUS)
