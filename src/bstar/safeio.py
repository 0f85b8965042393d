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
    if e.errno == errno.ENAMETOOLONG:
        return "a file or folder name in the path is too long for the file system"
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


# What marks a file as one bstar wrote: a header bstar owns, at the start of the file, in
# each format it writes. A marker quoted further down (a user's notes, a page that cites a
# report) is not one: only a file that begins as bstar begins it may be replaced. Each kind
# is recognised by where its writer puts the header:
_OWN_HEADERS: dict[str, re.Pattern[bytes]] = {
    # report.html.j2: the doctype, <html>, <head>, then only <meta> tags up to bstar's own.
    "html": re.compile(rb'\A(?:\xef\xbb\xbf)?<!DOCTYPE html>\s*<html\b[^>]*>\s*<head>\s*'
                       rb'(?:<meta\b[^>]*>\s*){0,8}<meta name="generator" content="bstar[ "]',
                       re.IGNORECASE),
    # matplotlib's SVG (charts/base.py): <svg>, whose first child is the metadata that names
    # bstar its creator.
    "svg": re.compile(rb"\A(?:<\?xml[^>]*\?>\s*)?(?:<!DOCTYPE svg[^>]*>\s*)?<svg\b[^>]*>\s*"
                      rb"<metadata>(?:(?!</metadata>).){0,4000}?<dc:creator>\s*<[\w:]*Agent>"
                      rb"\s*<dc:title>bstar</dc:title>", re.DOTALL),
    # calibrate -o and demo's calibration.toml (calibrate/profiles.py): its first line.
    "profile": re.compile(rb"\A# bstar calibration profile \("),
    # probe -o and demo's this-cpu.toml (probe.py): its first line.
    "probe": re.compile(rb"\A# Measured by `bstar probe`"),
    # demo's sweep.json: its first key.
    "json": re.compile(rb'\A\{\s*"generator": "bstar[ "]'),
}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
OWN_KINDS = (*_OWN_HEADERS, "png")
_KIND_WORDS = {"html": "a report", "svg": "an SVG chart", "png": "a PNG chart",
               "profile": "a calibration profile", "probe": "a probe's GPU file",
               "json": "a sweep JSON"}
_HEAD_BYTES = 8192


def _png_is_bstars(head: bytes) -> bool:
    """A PNG whose header chunks (those before the image data) hold the text chunk
    `Software` = `bstar` (charts/base.py writes it through matplotlib)."""
    if not head.startswith(_PNG_SIGNATURE):
        return False
    i = len(_PNG_SIGNATURE)
    while i + 8 <= len(head):
        size = int.from_bytes(head[i:i + 4], "big")
        kind = head[i + 4:i + 8]
        if kind in (b"IDAT", b"IEND"):
            return False
        if kind == b"tEXt" and head[i + 8:i + 8 + size] == b"Software\x00bstar":
            return True
        i += 12 + size  # length, type, data, CRC
    return False


def starts_as_bstars(head: bytes, kinds: tuple[str, ...] = OWN_KINDS) -> bool:
    """Whether `head` (a file's first bytes) begins with the header bstar writes for one of
    `kinds` (default: any)."""
    for kind in kinds:
        if kind == "png":
            if _png_is_bstars(head):
                return True
        elif _OWN_HEADERS[kind].match(head):
            return True
    return False


def written_by_bstar(path: str | Path, kinds: tuple[str, ...] = OWN_KINDS) -> bool:
    """Whether the file at `path` starts as a file bstar writes of one of `kinds` (or is
    empty: there is nothing to lose)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError:
        return False
    return not head or starts_as_bstars(head, kinds)


# The longest file or folder name (one path component) that Linux's, macOS's and Windows'
# file systems hold, and the longest path Linux's system calls take (PATH_MAX, with its NUL).
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4095


def check_path_names(path: str | Path, flag: str) -> None:
    """A path that no file system can hold (a file or folder name over 255 bytes, the whole
    over 4,095) as one line naming `flag` and the name, before any system call says `OSError:
    File name too long` from deep inside a command."""
    p = Path(path)
    for part in p.parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX_BYTES:
            what = "the file name" if part == p.name else "a folder name in the path"
            raise BstarError(f"{flag} {part[:40]}...: {what} is {size} bytes, over the "
                             f"{NAME_MAX_BYTES} a file system allows")
    size = len(os.fsencode(str(p)))
    if size > PATH_MAX_BYTES:
        raise BstarError(f"{flag} {str(p)[:40]}...: the path is {size} bytes, over the "
                         f"{PATH_MAX_BYTES} the system allows")


def check_output(path: str | Path, flag: str, force: bool = False,
                 kinds: tuple[str, ...] = OWN_KINDS) -> None:
    """Refuse to write `flag` PATH where that would change a file bstar did not write: an
    existing file that does not start with bstar's header for one of `kinds` (what this
    output is: a profile never replaces a report), through a symlink too; a dangling
    symlink, a folder, a FIFO or device, a name the file system refuses. `force` allows
    replacing an existing regular file (or a symlink's target); never a folder."""
    p = Path(path)
    check_path_names(p, flag)
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
    if not force and not written_by_bstar(p, kinds):
        what = "bstar did not write it" if kinds == OWN_KINDS else \
            f"is not {' or '.join(_KIND_WORDS[k] for k in kinds)} that bstar wrote"
        raise BstarError(f"{flag} {p} exists and {what}; give --force to overwrite it, or "
                         "another file")


def write_output(path: str | Path, data: bytes, flag: str) -> Path:
    """Write `data` to `path`; an OS error (disk full, permission) is one line."""
    p = Path(path)
    try:
        with open(p, "wb") as f:
            f.write(data)
    except OSError as e:
        raise BstarError(f"cannot write {flag} {p}: {e.strerror or e}") from None
    return p
