"""Local server processes: free loopback ports and process-group shutdown."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def stop_process_group(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Stop a process started with `start_new_session=True`, and its children.

    SIGTERM to the group, then SIGKILL if the leader has not exited after `grace`
    seconds; children that outlived the leader (server workers) go with the group.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
