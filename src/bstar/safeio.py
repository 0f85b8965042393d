"""The one way bstar reads a file a user names (edge I/O, standard library only).

A file a user passes is untrusted data: it may be a folder, a FIFO that never ends, a
symlink loop, gigabytes, not UTF-8, or JSON/TOML that is 100,000 levels deep or holds a
5,000-digit integer. Each of these is one `BstarError` line that names the file, never a
traceback or a hang (docs/hostile-input.md). Parsing what the bytes mean stays with each
reader; this module only bounds and decodes them. Writing: `check_output` refuses to
overwrite a file bstar did not write (`--force` overrides).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any

from bstar.errors import BstarError
from bstar.units import MiB

# Caps per kind of file, far above any real one: a GPU file or config.json is a few kB, a
# points file of 20,000 rows ~1 MB; published traces (Azure LLM inference 2024, a week of
# requests) run to a few hundred MB.
MAX_SMALL_BYTES = 16 * MiB      # config.json, GPU files, profiles, prices, search specs
MAX_TABLE_BYTES = 256 * MiB     # points, curves and stages tables, metrics files, logs
MAX_TRACE_BYTES = 1024 * MiB    # request traces
# JSON and TOML nest far less than this in any file bstar reads; deeper input is refused
# before the parser recurses (json has no depth limit of its own).
MAX_NESTING = 64


def _describe(e: OSError, what: str = "") -> str:
    if e.errno == errno.ELOOP:
        return "a symlink loop (too many levels of symbolic links)"
    if e.errno == errno.ENOENT:
        return f"no such file; give a {what}" if what else "no such file"
    if e.errno == errno.EISDIR:
        return "is a folder; give a file"
    if e.errno == errno.EACCES:
        return "permission denied"
    return f"cannot read: {e.strerror or e}"


def read_bytes(path: str | Path, max_bytes: int = MAX_SMALL_BYTES, what: str = "file") -> bytes:
    """The bytes of the regular file at `path` (symlinks followed), at most `max_bytes`.
    A folder, FIFO, device or socket, a symlink loop, a missing file or a larger one is a
    one-line BstarError naming the file."""
    p = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of blocking; it
        # is refused below as not a regular file.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise BstarError(f"{p}: {_describe(e, what)}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise BstarError(f"{p}: is a folder; give a file")
        if not stat.S_ISREG(st.st_mode):
            raise BstarError(f"{p}: not a regular file (a FIFO, device or socket); give a "
                             f"{what}")
        if st.st_size > max_bytes:
            raise BstarError(f"{p}: {st.st_size:,} bytes, over the {max_bytes:,}-byte limit "
                             f"for a {what}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise BstarError(f"{p}: {_describe(e)}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew while read
        raise BstarError(f"{p}: over the {max_bytes:,}-byte limit for a {what}")
    return data


def decode(data: bytes, where: str, what: str = "file") -> str:
    """UTF-8 text (a leading byte-order mark dropped: spreadsheets write one)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BstarError(f"{where}: not UTF-8 text (byte {e.start}); save the {what} as "
                         "UTF-8") from None


def read_text(path: str | Path, max_bytes: int = MAX_SMALL_BYTES, what: str = "file") -> str:
    return decode(read_bytes(path, max_bytes, what), str(path), what)


def nesting_depth(text: str) -> int:
    """The deepest nesting of [ ] and { } outside strings (JSON and TOML alike), by a scan
    that recurses nowhere."""
    depth = best = 0
    quote = ""
    escaped = False
    # Only the characters that change the state matter; a regex picks them out in C.
    for ch in "".join(_SPECIALS.findall(text)):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


_SPECIALS = re.compile(r"[\[\]{}\"'\\]")


def _check_depth(text: str, where: str) -> None:
    if nesting_depth(text) > MAX_NESTING:
        raise BstarError(f"{where}: nested more than {MAX_NESTING} levels deep")


def parse_json(text: str, where: str) -> Any:
    """`json.loads(text)` with every way it can fail as one line naming `where`."""
    _check_depth(text, where)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BstarError(f"{where}: not valid JSON: {e.msg} at line {e.lineno}") from None
    except (ValueError, RecursionError) as e:  # a number past the int-digit limit
        raise BstarError(f"{where}: not valid JSON: {_short(e)}") from None


def parse_toml(text: str, where: str) -> dict[str, Any]:
    _check_depth(text, where)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BstarError(f"{where}: not valid TOML ({e})") from None
    except (ValueError, RecursionError) as e:
        raise BstarError(f"{where}: not valid TOML: {_short(e)}") from None


def _short(e: BaseException) -> str:
    text = str(e).split(";")[0]
    if "integer string conversion" in text:
        return f"an integer of more than {sys.get_int_max_str_digits():,} digits"
    return text[:200]


def load_json(path: str | Path, max_bytes: int = MAX_SMALL_BYTES, what: str = "file") -> Any:
    return parse_json(read_text(path, max_bytes, what), str(path))


def load_toml(path: str | Path, max_bytes: int = MAX_SMALL_BYTES,
              what: str = "file") -> dict[str, Any]:
    return parse_toml(read_text(path, max_bytes, what), str(path))


# What marks a file as one bstar wrote (read from its first bytes): an earlier output of the
# same kind may be overwritten; anything else needs --force.
OWN_MARKS = (
    b'<meta name="generator" content="bstar',        # HTML report (report.html.j2)
    b"tEXtSoftware\x00bstar",                        # PNG (charts/base.py metadata)
    b"<dc:title>bstar</dc:title>",                   # SVG (charts/base.py metadata)
    b"# bstar calibration profile",                  # calibrate -o (profiles.py)
    b"# Measured by `bstar probe`",                  # probe -o (probe.py)
)
_HEAD_BYTES = 8192


def written_by_bstar(path: str | Path) -> bool:
    """Whether the file at `path` starts like a file bstar writes (or is empty)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError:
        return False
    return not head or any(m in head for m in OWN_MARKS)


def check_output(path: str | Path, flag: str, force: bool = False) -> None:
    """Refuse to write `flag` PATH where that would change a file bstar did not write: an
    existing file without bstar's mark (through a symlink too), a dangling symlink, a
    folder, a FIFO or device, a name the file system refuses. `force` allows replacing an
    existing regular file (or a symlink's target); never a folder."""
    p = Path(path)
    if len(p.name.encode()) > 255:
        raise BstarError(f"{flag} {p.name[:40]}...: the file name is {len(p.name.encode())} "
                         "bytes, over the 255 a file system allows")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if p.is_symlink() and not force:
            raise BstarError(f"{flag} {p}: a symlink to a missing file; bstar does not write "
                             "through it (give --force, or another file)") from None
        if not p.parent.is_dir():
            raise BstarError(f"{flag} {p}: folder {str(p.parent)!r} does not exist") from None
        return
    except OSError as e:
        raise BstarError(f"{flag} {p}: {_describe(e)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise BstarError(f"{flag} {p}: is a folder; give a file name")
    if not stat.S_ISREG(st.st_mode):
        if force:
            return
        raise BstarError(f"{flag} {p}: not a regular file (a FIFO or device); give --force "
                         "to write to it anyway, or another file")
    if not force and not written_by_bstar(p):
        raise BstarError(f"{flag} {p} exists and bstar did not write it; give --force to "
                         "overwrite it, or another file")


def write_output(path: str | Path, data: bytes, flag: str) -> Path:
    """Write `data` to `path`; an OS error (disk full, permission) is one line."""
    p = Path(path)
    try:
        with open(p, "wb") as f:
            f.write(data)
    except OSError as e:
        raise BstarError(f"cannot write {flag} {p}: {e.strerror or e}") from None
    return p
