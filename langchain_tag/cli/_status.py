"""A status line on stderr: redrawn in place on a terminal, a line a step elsewhere."""

from __future__ import annotations

from typing import TextIO


class StatusLine:
    """Shows the latest status: on a terminal in place; in a log, once per `step`.

    A log (a file, a CI job) gets a new line only when the caller's `step` changes,
    so it is not flooded with one line per update.
    """

    def __init__(self, stream: TextIO) -> None:
        """Write to `stream` (normally stderr)."""
        self.stream = stream
        self.tty = stream.isatty()
        self._step: object = None
        self._shown = False

    def show(self, line: str, step: object) -> None:
        """Show `line`; off a terminal, only if `step` differs from the last one."""
        if self.tty:
            self.stream.write(f"\r\033[K{line}")
        elif step != self._step:
            self.stream.write(line + "\n")
        else:
            return
        self._step = step
        self._shown = True
        self.stream.flush()

    def close(self) -> None:
        """End the status line (on a terminal)."""
        if self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
