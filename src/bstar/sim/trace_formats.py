"""Request traces read as they are published, the format told by its header (or its first
JSON object's keys); anything else is refused in one line that names the columns expected.

- bstar's own CSV or JSON lines: arrival_s (s), prompt_tokens, output_tokens; optional
  prefix_id and prefix_tokens, or hash_ids;
- Mooncake JSON lines (kvcache-ai, FAST'25): timestamp (ms), input_length, output_length,
  hash_ids (one id per 512-token block);
- Azure LLM inference CSV (2023, 2024): TIMESTAMP (date-time), ContextTokens,
  GeneratedTokens; no prompt identity;
- BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, Total tokens,
  Log Type (BurstGPT_3 adds Session ID, Elapsed time); no prompt identity.

Prompt identity (`bstar.sim.prefix`): `hash_ids` name a prompt's blocks of HASH_BLOCK_TOKENS
tokens in order, as Mooncake's do: two prompts share the tokens of their common leading
ids. bstar's `prefix_id` names a prompt's leading `prefix_tokens` tokens (without that column:
the whole prompt); prompts with one id share as many of those tokens as the shorter holds.
Rows of a published trace with no prompt or no output tokens (BurstGPT logs a failed request
with 0 response tokens) are left out and counted (`Trace.dropped`). Arrival times start at 0.
Pure: text in, a `Trace` out.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from bstar.errors import BstarError
from bstar.sim.prefix import PromptIds, Segments

HASH_BLOCK_TOKENS = 512  # Mooncake's hash_ids block (FAST25-release/README.md)
_UNIQUE_BASE = 5 << 40  # ids of the unshared rest of a prompt (one per request)
_HASH_BASE = 6 << 40  # hash_ids, kept apart from the generators' ids
_PREFIX_BASE = 7 << 40  # prefix_id values

Row = tuple[float, int, int, Segments | None]

BSTAR_KEYS = ("arrival_s", "prompt_tokens", "output_tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
AZURE_KEYS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_KEYS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                 "Log Type")
EXPECTED = ("expected a header naming bstar's arrival_s, prompt_tokens, output_tokens "
            "(CSV or JSON lines; optional prefix_id, prefix_tokens, hash_ids), Mooncake's "
            "JSON lines timestamp, input_length, output_length, hash_ids, Azure's CSV "
            "TIMESTAMP, ContextTokens, GeneratedTokens, or BurstGPT's CSV Timestamp, Model, "
            "Request tokens, Response tokens, Total tokens, Log Type")


def read_trace(text: str) -> tuple[str, list[Row], int]:
    """(format name, rows in file order, rows dropped) for a trace's text."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise BstarError("the trace is empty")
    name, rows, dropped = _json_lines(lines) if lines[0].lstrip().startswith("{") \
        else _csv(lines)
    if name != "bstar" and rows:  # published traces: arrivals from 0
        t0 = min(r[0] for r in rows)
        rows = [(t - t0, p, o, segs) for t, p, o, segs in rows]
    return name, rows, dropped


def _json_lines(lines: list[str]) -> tuple[str, list[Row], int]:
    objs = []
    for n, ln in enumerate(lines, 1):
        try:
            obj = json.loads(ln)
        except ValueError as e:
            raise BstarError(f"line {n} is not JSON: {e}") from None
        except RecursionError:
            # json's C scanner recurses per level and stops cleanly at Python's limit: a
            # line nested 100,000 deep. Caught here rather than by safeio's depth scan, which
            # would cost a Python loop over every line of a 1 GiB trace.
            raise BstarError(f"line {n} is nested too deep to be a trace record") from None
        if not isinstance(obj, dict):
            raise BstarError(f"line {n} is not a JSON object")
        objs.append(obj)
    keys = set(objs[0])
    if all(k in keys for k in MOONCAKE_KEYS[:3]):
        return "mooncake", _rows(objs, _mooncake_row, lambda o: o.get("output_length") == 0), 0
    if {"arrival_s", "output_tokens"} <= keys and keys & {"prompt_tokens", "input_tokens"}:
        return "bstar", _rows(objs, _bstar_row), 0
    raise BstarError(f"JSON lines with keys {', '.join(sorted(keys))}: {EXPECTED}")


def _csv(lines: list[str]) -> tuple[str, list[Row], int]:
    try:
        table = list(csv.reader(io.StringIO("\n".join(lines))))
    except csv.Error as e:  # e.g. a cell past the csv module's field limit
        raise BstarError(f"not a readable CSV table ({e})") from None
    header = [h.strip() for h in table[0]]
    seen: set[str] = set()
    for h in header:
        if h in seen:  # a row's dict would silently keep the last one's cell
            raise BstarError(f"CSV header names column {h!r} twice")
        seen.add(h)
    recs = [dict(zip(header, (c.strip() for c in cells), strict=False)) for cells in table[1:]]
    cols = set(header)
    if set(AZURE_KEYS) <= cols:
        # Whole seconds apart from the fraction: epoch seconds in a float keep ~0.2 us.
        try:
            t0 = min((_datetime_s(r["TIMESTAMP"])[0] for r in recs), default=0)
        except (KeyError, ValueError) as e:
            raise BstarError(f"a TIMESTAMP: {e}") from None

        def azure(r: dict[str, Any]) -> Row:
            whole, frac = _datetime_s(r["TIMESTAMP"])
            return (whole - t0 + frac, int(r["ContextTokens"]), int(r["GeneratedTokens"]),
                    None)

        return _kept("azure", recs, azure, ("ContextTokens", "GeneratedTokens"))
    if {"Timestamp", "Request tokens", "Response tokens"} <= cols:
        return _kept("burstgpt", recs, lambda r: (float(r["Timestamp"]), int(r["Request tokens"]),
                                                  int(r["Response tokens"]), None),
                     ("Request tokens", "Response tokens"))
    if "input_tokens" in cols and "prompt_tokens" not in cols:
        for r in recs:
            r["prompt_tokens"] = r.pop("input_tokens", "")
        cols.add("prompt_tokens")
    if set(BSTAR_KEYS) <= cols:
        return "bstar", _rows(recs, _bstar_row), 0
    raise BstarError(f"CSV header {', '.join(header)}: {EXPECTED}")


def _kept(name: str, recs: list[dict[str, Any]], row: Callable[[dict[str, Any]], Row],
          counts: tuple[str, str]) -> tuple[str, list[Row], int]:
    def empty(r: dict[str, Any]) -> bool:
        return any(r.get(k) in ("0", "0.0") for k in counts)

    rows = _rows(recs, row, empty)
    return name, rows, len(recs) - len(rows)


def _rows(objs: Iterable[dict[str, Any]], row: Callable[[dict[str, Any]], Row],
          skip: Callable[[dict[str, Any]], bool] | None = None) -> list[Row]:
    out = []
    for n, o in enumerate(objs, 1):
        if skip is not None and skip(o):
            continue
        try:
            out.append(row(o))
        except KeyError as e:
            raise BstarError(f"request {n} has no {e.args[0]}") from None
        except (ValueError, TypeError, OverflowError) as e:
            raise BstarError(f"request {n}: {e}") from None
    return out


def _mooncake_row(o: dict[str, Any]) -> Row:
    p = int(o["input_length"])
    return (float(o["timestamp"]) / 1e3, p, int(o["output_length"]),
            hash_segments([int(h) for h in o.get("hash_ids") or []], p))


def _bstar_row(o: dict[str, Any]) -> Row:
    p = int(o["prompt_tokens"] if "prompt_tokens" in o else o["input_tokens"])
    segs = None
    hashes = o.get("hash_ids")
    if hashes not in (None, ""):
        if isinstance(hashes, str):
            hashes = [int(h) for h in re.split(r"[\s;|\[\],]+", hashes) if h]
        segs = hash_segments([int(h) for h in hashes], p)
    elif o.get("prefix_id") not in (None, ""):
        k = p if o.get("prefix_tokens") in (None, "") else min(int(o["prefix_tokens"]), p)
        if k < 0:
            raise ValueError(f"prefix_tokens must not be negative, got {k}")
        digest = hashlib.blake2b(str(o["prefix_id"]).encode(), digest_size=5).digest()
        segs = ((_PREFIX_BASE + int.from_bytes(digest, "big"), k),) if k else ()
        segs = (*segs, (0, p - k)) if k < p else segs  # the rest: made unique later
    return (float(o["arrival_s"]), p, int(o["output_tokens"]), segs)


def hash_segments(hash_ids: list[int], prompt_tokens: int) -> Segments:
    """A prompt's segments from its block hash ids (HASH_BLOCK_TOKENS each, the last one
    partial); tokens past the ids are the prompt's own (id 0, made unique by `identity`)."""
    segs: list[tuple[int, int]] = []
    pos = 0
    for h in hash_ids:
        if pos >= prompt_tokens:
            break
        n = min(HASH_BLOCK_TOKENS, prompt_tokens - pos)
        segs.append((_HASH_BASE + h, n))
        pos += n
    if pos < prompt_tokens:
        segs.append((0, prompt_tokens - pos))
    return tuple(segs)


def identity(rows: list[Row]) -> PromptIds | None:
    """The trace's prompt identity, or None when no row names one; a row without one (or
    the unnamed rest of a prompt) is its own."""
    if all(r[3] is None for r in rows):
        return None
    segments: list[Segments] = []
    for i, (_, p, _, segs) in enumerate(rows):
        if segs is None:
            segs = ((0, p),)
        segments.append(tuple((_UNIQUE_BASE + i if s == 0 else s, n) for s, n in segs))
    return PromptIds(tuple(segments), tuple(_UNIQUE_BASE + (1 << 39) + i
                                            for i in range(len(rows))))


_DATETIME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(\.\d+)?"
                       r"(Z|[+-]\d{2}:?\d{2})?$")


def _datetime_s(text: str) -> tuple[int, float]:
    """(whole seconds since the epoch, fraction) of an ISO date-time as Azure writes it
    (seven fractional digits, an optional UTC offset)."""
    import datetime as dt

    m = _DATETIME.match(text.strip())
    if m is None:
        raise ValueError(f"TIMESTAMP {text!r} is not a date-time like 2023-11-16 18:15:46.68")
    y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
    frac = float(m.group(7) or 0.0)
    tz = m.group(8)
    off = 0
    if tz and tz != "Z":
        tz = tz.replace(":", "")
        oh, om = int(tz[1:3]), int(tz[3:5])
        if oh > 14 or om > 59:  # UTC offsets run from -12:00 to +14:00
            raise ValueError(f"TIMESTAMP {text!r}: {tz[0]}{oh:02d}:{om:02d} is not a UTC offset")
        off = (oh * 3600 + om * 60) * (1 if tz[0] == "+" else -1)
    try:
        base = dt.datetime(y, mo, d, h, mi, s, tzinfo=dt.UTC)
    except ValueError as e:
        raise ValueError(f"TIMESTAMP {text!r}: {e}") from None
    return int(base.timestamp()) - off, frac
