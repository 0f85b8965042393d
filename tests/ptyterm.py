"""Run the `bstar` CLI in a pseudo-terminal of a given width, as a user's terminal would
(rich sizes its output from the terminal, not from COLUMNS alone). Returns the exit code and
the text shown, ANSI escapes removed."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def run_in_pty(argv: list[str], columns: int = 80, timeout_s: float = 120.0,
               env: dict[str, str] | None = None) -> tuple[int, str]:
    import pty

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    full_env = {**os.environ, "PYTHONPATH": path, "TERM": "xterm-256color",
                "COLUMNS": str(columns), **(env or {})}
    full_env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "bstar.cli", *argv], stdin=slave,
                            stdout=slave, stderr=slave, env=full_env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        rc = proc.wait(timeout=timeout_s)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    return rc, _ANSI.sub("", text)
