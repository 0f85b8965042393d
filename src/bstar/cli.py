"""The `bstar` command: a thin argparse layer over the library.

Start-up stays light (`bstar --help` imports no numpy, plotting or HTTP stack): each command
module registers its arguments with the standard library only and imports the heavy parts
inside its `run`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from bstar import __version__
from bstar.errors import BstarError

# (command, module under bstar.commands, one-line help). Order is the order of `--help`.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("plan", "plan", "cost model for one model x GPU x context(s), with a recommendation"),
    ("compare", "plan", "B*, B_mem and the recommendation for several models/GPUs/contexts"),
    ("models", "plan", "list the bundled model presets"),
    ("gpus", "plan", "list the bundled GPU catalog"),
    ("sweep", "sweep", "load a live server level by level, store every request, find the knee"),
    ("runs", "runs", "list, show, export and compare stored sweep runs"),
    ("kv", "kv", "a running server's KV pool (cache_config_info) beside bstar's B_mem, "
                 "the difference explained"),
    ("fit", "fit", "fit measured points, extrapolate past the compute roof, find the knee"),
    ("simulate", "simulate", "continuous batching with paged KV and preemption, by the cost "
                             "model; a sweep over --max-num-seqs finds the knee"),
    ("search", "search", "the cheapest deployment that meets the SLO: GPUs x TP x engine limits, "
                         "simulated in parallel (processes or Ray), resumable"),
    ("probe", "probe", "measure this machine's bandwidth and matmul rate; write a GPU file"),
    ("report", "report", "a self-contained HTML report of a plan, comparison, fit, sweep run "
                         "or simulation"),
    ("demo", "demo", "the whole story offline: tiny model, llama.cpp, sweep, fit, report"),
    ("calibrate", "calibrate",
     "fit efficiencies and overheads to measured points; write a calibration profile"),
    ("validate", "validate",
     "the planner vs measurements: rows, whole curves, or load stages (simulated)"),
)


# `bstar report SOURCE` for a source that reruns a command: (source, module under
# bstar.commands, one-line help). The source takes that module's add_SOURCE_arguments and its
# report_SOURCE writes the page; `report` itself imports no other command.
REPORT_SOURCES: tuple[tuple[str, str, str], ...] = (
    ("plan", "plan", "the cost model's plan (takes `bstar plan`'s flags)"),
    ("compare", "plan", "B* and B_mem across models/GPUs/contexts (takes `bstar compare`'s "
                        "flags)"),
    ("fit", "fit", "a fit of measured points (takes `bstar fit`'s POINTS and flags)"),
    ("simulate", "simulate", "a simulated sweep over max_num_seqs (takes `bstar simulate`'s "
                             "flags)"),
    ("search", "search", "the cheapest deployment that meets the SLO (takes `bstar search`'s "
                         "flags)"),
)


class _Parser(argparse.ArgumentParser):
    """argparse with bstar's one-line errors: a bad flag is one line on stderr naming the
    flag and pointing at --help, exit 2 (argparse's default prints the whole usage)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)",
              file=sys.stderr)
        sys.exit(2)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole `bstar` parser; with `only`, every command is listed (for `--help`) but
    only that command's module is imported and its flags registered (start-up)."""
    parser = _Parser(
        prog="bstar",
        description="How many sequences should your LLM server batch at once? Roofline cost "
                    "model, fits of measured points, live sweeps and simulation.")
    parser.add_argument("--version", action="version", version=f"bstar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module, help_ in COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        if only is None or name == only:
            mod = importlib.import_module(f"bstar.commands.{module}")
            add = getattr(mod, f"add_{name}_arguments")
            if name == "report":
                add(p, [(src, h, getattr(importlib.import_module(f"bstar.commands.{m}"),
                                         f"add_{src}_arguments"), f"{m}:report_{src}")
                        for src, m, h in REPORT_SOURCES])
            else:
                add(p)
        p.set_defaults(_run=f"{module}:run_{name}")
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    # The top level's own options (--help, --version) take no value, so the first word that
    # is not an option is the command.
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in {name for name, _, _ in COMMANDS} else None


ERROR_CHARS = 2000  # the most of one error line that is printed


class OutputError(Exception):
    """Standard output could not take what a command printed (a full disk, a closed
    stream): one line and exit 1, never the OSError's traceback."""


class _Std:
    """A standard stream that may be closed (None, `>&-`): it is a tty only when open, and
    everything else is the stream's own."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def isatty(self) -> bool:
        return self.stream is not None and bool(self.stream.isatty())

    def __getattr__(self, name: str) -> Any:
        if self.stream is None:
            raise AttributeError(name)
        return getattr(self.stream, name)


class _Stdout(_Std):
    """`sys.stdout` while a command runs: a write or flush that fails raises OutputError,
    a closed stdout (`>&-`: Python's `sys.stdout` is None) too, at the first write (a
    command that prints nothing to stdout still runs). A broken pipe stays
    BrokenPipeError (`| head`: quiet)."""

    def _call(self, name: str, *a: Any) -> Any:
        if self.stream is None:
            raise OutputError("standard output is closed")
        try:
            return getattr(self.stream, name)(*a)
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:  # ValueError: "I/O operation on closed file"
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise OutputError(f"cannot write to standard output: {why}") from None

    def write(self, text: str) -> int:
        return int(self._call("write", text))

    def flush(self) -> None:
        if self.stream is not None:
            self._call("flush")


class _Stderr(_Std):
    """`sys.stderr` while a command runs: a closed one (None) or one whose writes fail
    takes the text and drops it (there is nowhere left to say anything)."""

    def write(self, text: str) -> int:
        if self.stream is not None:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write(text)
        return len(text)

    def flush(self) -> None:
        if self.stream is not None:
            with contextlib.suppress(OSError, ValueError):
                self.stream.flush()


def _hold_closed_std_fds() -> None:
    """A closed fd 0, 1 or 2 (`bstar ... >&-`) gets /dev/null, so that no file bstar opens
    later (a DB, a report) takes that number and receives what a child server or a stray
    write sends to standard output. What bstar itself prints still fails (_Stdout)."""
    import os

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            with contextlib.suppress(OSError):
                got = os.open(os.devnull, os.O_RDWR)
                if got != fd:  # a lower one was closed too, and took it; this one stays
                    os.close(got)


def _print_error(message: str) -> None:
    if sys.stderr is not None:  # print(file=None) would write to stdout
        with contextlib.suppress(OSError, ValueError):
            print(f"bstar: error: {message}", file=sys.stderr)


def _drop_stdout() -> None:
    """After a broken pipe: what is still buffered for stdout goes to /dev/null, so that
    Python's flush at exit does not raise again ("Exception ignored ... BrokenPipeError")."""
    import os

    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `bstar` command; its exit status. Output that cannot be written (a full
    disk, a closed stdout) is one line and 1; a closed pipe (`bstar ... | head`) ends
    quietly with 1, as a Unix tool ends on SIGPIPE (no message: the reader chose to stop)
    and as rich's consoles end on it (`Console.on_broken_pipe`)."""
    _hold_closed_std_fds()
    err_was = sys.stderr
    # A closed stderr (`2>&-`: None, where print(file=None) would write into stdout's --json
    # document), or one that refuses writes: what bstar says there goes nowhere.
    sys.stderr = _Stderr(err_was)  # type: ignore[assignment]
    out = _Stdout(sys.stdout)
    sys.stdout = out  # type: ignore[assignment]
    try:
        try:
            status = _main(argv)
        finally:
            if sys.stdout is out:
                out.flush()
        return status
    except OutputError as e:
        _print_error(str(e))
        return 1
    except BrokenPipeError:
        sys.stdout = out.stream
        _drop_stdout()
        return 1
    finally:
        if sys.stdout is out:
            sys.stdout = out.stream
        if isinstance(sys.stderr, _Stderr):
            sys.stderr = err_was


def _main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command_in(argv)
    # `bstar --help` and a typo need every command's one-line help only; a command needs
    # its own flags only (`bench/startup.py` measures what this saves).
    parser = build_parser(only=command or "")
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    from bstar.redact import redact, register_command, register_secret, register_url

    # The key in use is masked wherever it shows up: stored, printed, in --json; so are a
    # URL's password and the keys a --server-cmd passes its server.
    register_secret(getattr(args, "api_key", None))
    register_url(getattr(args, "url", None))
    register_command(getattr(args, "server_cmd", None))
    module, func = args._run.split(":")
    run = getattr(importlib.import_module(f"bstar.commands.{module}"), func)
    try:
        from bstar.commands.common import guard_outputs

        guard_outputs(args)
        return int(run(args) or 0)
    except BstarError as e:
        # One line, credentials masked (a message may quote a URL or a server's reply).
        msg = " ".join(redact(str(e)).split())
        # A message may quote a file's or a server's text: no control characters, bounded.
        from bstar.report.text._common import clean_text

        msg = clean_text(msg, ERROR_CHARS)
        print(f"bstar: error: {msg}", file=sys.stderr)
        return 2
    except ImportError as e:
        # A missing optional part: one line naming the extra and the pip command.
        from bstar.errors import missing_module_message

        msg = missing_module_message(e.name, f"bstar {args.command}")
        if msg is None and "pip install 'bstar[" in str(e):
            msg = str(e)  # a message that already names the extra (bstar.tinymodel)
        if msg is None:
            raise
        print(f"bstar: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bstar: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
