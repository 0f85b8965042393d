"""The one reader of measured points: CSV and JSON files, sweep results, rows and aligned
lists, validated into `Points` (a curve, `bstar fit`) or into `Point`s (measured steps,
`bstar calibrate`: points files with a context column, mixed-step files, stored sweeps);
`level_batch` is the batch of a sweep level; `read_table` is the CSV tokenizer that
`bstar validate`'s tables also go through."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bstar import safeio
from bstar.errors import BstarError, closest
from bstar.fit.steps import Point

COLUMNS = ("batch", "throughput_tok_s", "tpot_ms")
MIN_POINTS = 3
# The largest batch a point may name: far past any server's max_num_seqs; a batch of 1e300
# is a typo, not a measurement.
MAX_BATCH = 10_000_000
# Warnings of one kind past this many are one line with a count.
MAX_WARNINGS_PER_KIND = 10
# Given throughput and TPOT must agree on the step time to this fraction, else a warning.
CONFLICT_TOLERANCE = 0.05


# ---- points ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Points:
    """Measured points, sorted by batch. `tpot_ms` is what the fit uses (per-request step
    time); `throughput_tok_s` is as given or derived (= batch / TPOT); `derived[i]` names the
    column computed for point i ("" when both were given)."""

    batch: tuple[int, ...]
    tpot_ms: tuple[float, ...]
    throughput_tok_s: tuple[float, ...]
    derived: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    source: str = ""

    def __len__(self) -> int:
        return len(self.batch)


def _number(raw: object, column: str, where: str) -> float | None:
    """A cell as a positive finite number; None when empty."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, bool):
        raise BstarError(f"{where}: {column} is {raw!r}, not a number")
    if isinstance(raw, int | float):
        v = float(raw)
    elif isinstance(raw, str):
        try:
            v = float(raw.strip().replace("_", ""))
        except ValueError:
            raise BstarError(f"{where}: {column} is {raw.strip()!r}, not a number") from None
    else:
        raise BstarError(f"{where}: {column} is {raw!r}, not a number")
    if not math.isfinite(v):
        raise BstarError(f"{where}: {column} is {raw!r}, not a finite number")
    if v <= 0:
        raise BstarError(f"{where}: {column} must be positive, got {v:g}")
    return v


def points_from_rows(rows: Sequence[Mapping[str, object]], labels: Sequence[str] | None = None,
                     source: str = "", *, repeats: bool = False) -> Points:
    """Validate rows of {column: value} (strings or numbers) into Points. `labels[i]` names
    row i in messages ("line 3", "point 2"). Every error is one line naming the row.
    `repeats=True` keeps repeated measurements of a batch as points of their own (for
    calibration, which fits them all); the fit's curve needs one value per batch."""
    labels = list(labels) if labels is not None else [f"row {i + 1}" for i in range(len(rows))]
    seen_cols: set[str] = set()
    for row, where in zip(rows, labels, strict=True):
        for k in row:
            if k not in COLUMNS:
                raise BstarError(f"{where}: unknown column {k!r} (expected batch, "
                                 f"throughput_tok_s, tpot_ms){closest(str(k), COLUMNS)}")
            seen_cols.add(k)
    if rows and "batch" not in seen_cols:
        raise BstarError(f"{source or 'points'}: no 'batch' column")
    if rows and not seen_cols & {"throughput_tok_s", "tpot_ms"}:
        raise BstarError(f"{source or 'points'}: need a 'throughput_tok_s' or 'tpot_ms' column "
                         "besides 'batch'")
    parsed: list[tuple[int, float | None, float | None, str]] = []
    for row, where in zip(rows, labels, strict=True):
        b = _number(row.get("batch"), "batch", where)
        if b is None:
            raise BstarError(f"{where}: batch is empty")
        if b > MAX_BATCH:
            raise BstarError(f"{where}: batch must be at most {MAX_BATCH:,}, got {b:g}")
        if b != round(b):
            raise BstarError(f"{where}: batch must be a whole number of sequences, got {b:g}")
        t = _number(row.get("throughput_tok_s"), "throughput_tok_s", where)
        p = _number(row.get("tpot_ms"), "tpot_ms", where)
        if t is None and p is None:
            raise BstarError(f"{where}: batch {int(b)} has neither throughput_tok_s nor tpot_ms")
        parsed.append((int(b), t, p, where))
    return _points(parsed, source, repeats)


def make_points(batch: Sequence[float], throughput_tok_s: Sequence[float | None] | None = None,
                tpot_ms: Sequence[float | None] | None = None, source: str = "") -> Points:
    """Points from aligned sequences (a sweep's levels, a simulation): batch and at least one
    of throughput_tok_s, tpot_ms (None entries allowed where the other is given)."""
    n = len(batch)
    if throughput_tok_s is None and tpot_ms is None:
        raise BstarError("need throughput_tok_s or tpot_ms besides batch")
    for name, col in (("throughput_tok_s", throughput_tok_s), ("tpot_ms", tpot_ms)):
        if col is not None and len(col) != n:
            raise BstarError(f"{name} has {len(col)} values for {n} batches")
    rows: list[dict[str, object]] = []
    for i in range(n):
        row: dict[str, object] = {"batch": batch[i]}
        if throughput_tok_s is not None:
            row["throughput_tok_s"] = throughput_tok_s[i]
        if tpot_ms is not None:
            row["tpot_ms"] = tpot_ms[i]
        rows.append(row)
    return points_from_rows(rows, [f"point {i + 1}" for i in range(n)], source)


def _aggregate(kind: list[str], what: str) -> list[str]:
    """Warnings of one kind: each, up to MAX_WARNINGS_PER_KIND; past that the first and one
    line with the count (200k repeated rows make one line, not 200k)."""
    if len(kind) <= MAX_WARNINGS_PER_KIND:
        return kind
    return [kind[0], f"... and {len(kind) - 1:,} more {what} (the first is above)"]


def _points(parsed: list[tuple[int, float | None, float | None, str]], source: str,
            repeats: bool = False) -> Points:
    warnings: list[str] = []
    conflicts: list[str] = []
    by_batch: dict[int, tuple[float | None, float | None, str]] = {}
    extra: list[tuple[int, float | None, float | None, str]] = []  # repeats, when kept
    for b, t, p, where in parsed:
        if b in by_batch and repeats:
            extra.append((b, t, p, where))
            continue
        if b in by_batch:
            t0, p0, where0 = by_batch[b]
            if t0 == t and p0 == p:
                warnings.append(f"{where}: batch {b} repeats {where0} with the same values; "
                                "used once")
                continue
            raise BstarError(f"{where}: batch {b} is listed twice with different values "
                             f"(also at {where0}); average the repeats or drop one")
        by_batch[b] = (t, p, where)
    if len(by_batch) < MIN_POINTS:
        raise BstarError(f"{source or 'points'}: need at least {MIN_POINTS} distinct batch sizes "
                         f"to fit a, b (and c), got {len(by_batch)}")
    rows = sorted([(b, *v) for b, v in by_batch.items()] + extra, key=lambda r: r[0])
    batches = [r[0] for r in rows]
    tpot: list[float] = []
    tput: list[float] = []
    derived: list[str] = []
    for b, t, p, where in rows:
        if p is None:
            assert t is not None
            tpot.append(1e3 * b / t)
            tput.append(t)
            derived.append("tpot_ms")
        elif t is None:
            tpot.append(p)
            tput.append(1e3 * b / p)
            derived.append("throughput_tok_s")
        else:
            implied_ms = 1e3 * b / t
            if abs(implied_ms / p - 1) > CONFLICT_TOLERANCE:
                conflicts.append(
                    f"{where}: batch {b}: throughput {t:,.4g} tok/s implies a step of "
                    f"{implied_ms:.4g} ms but tpot_ms is {p:.4g} ({(implied_ms / p - 1) * 100:+.0f}"
                    f"%, over {CONFLICT_TOLERANCE * 100:g}%); the fit uses tpot_ms (throughput "
                    "over a run also counts prefill and ramp-up)")
            tpot.append(p)
            tput.append(t)
            derived.append("")
    warnings = (_aggregate(warnings, "rows repeat an earlier row with the same values")
                + _aggregate(conflicts, "rows whose throughput and tpot_ms disagree"))
    return Points(tuple(batches), tuple(tpot), tuple(tput), tuple(derived), tuple(warnings),
                  source)


@dataclass(frozen=True, slots=True)
class Table:
    """A CSV table: its header (names stripped), the header's line number and the data lines
    (number, text); lines starting with # and blank lines are left out."""

    source: str
    header: list[str]
    header_line: int
    lines: list[tuple[int, str]]

    def rows(self) -> list[tuple[dict[str, str], str]]:
        """Each data line as {column: cell} with its label "SOURCE: line N"; a line with
        another number of cells than the header is a BstarError naming it."""
        out = []
        for lineno, line in self.lines:
            cells = _cells(line, self.source, lineno)
            if len(cells) != len(self.header):
                raise BstarError(f"{self.source}: line {lineno}: {len(cells)} cells for "
                                 f"{len(self.header)} columns")
            out.append((dict(zip(self.header, cells, strict=True)),
                        f"{self.source}: line {lineno}"))
        return out


def _cells(line: str, source: str, lineno: int) -> list[str]:
    """One CSV line's cells; what the csv module refuses (a cell past its 131,072-character
    field limit) is a one-line BstarError naming the line."""
    try:
        return next(csv.reader([line]), [])
    except csv.Error as e:
        raise BstarError(f"{source}: line {lineno}: not CSV ({e})") from None


def read_table(text: str, source: str) -> Table | None:
    """The CSV table in `text` (None when it has no line besides comments and blanks)."""
    numbered = [(i + 1, ln) for i, ln in enumerate(text.splitlines())
                if ln.strip() and not ln.lstrip().startswith("#")]
    if not numbered:
        return None
    header = [h.strip() for h in _cells(numbered[0][1], source, numbered[0][0])]
    twice = duplicate(header)
    if twice is not None:  # a row's dict would silently keep the last one's cell
        raise BstarError(f"{source}: line {numbered[0][0]}: column {twice!r} is named twice")
    return Table(source, header, numbered[0][0], numbered[1:])


def duplicate(header: Sequence[str]) -> str | None:
    """The first column a CSV header names twice, or None (every reader of headers
    refuses one: a row as a dict keeps only the last cell)."""
    seen: set[str] = set()
    for h in header:
        if h in seen and h:
            return h
        seen.add(h)
    return None


def read_columns(text: str, where: str, required: Sequence[str],
                 known: Sequence[str]) -> Table:
    """`read_table` for a table whose columns are fixed: empty, a required column missing or
    an unknown one present is a one-line BstarError naming them."""
    table = read_table(text, where)
    if table is None:
        raise BstarError(f"{where}: empty table")
    missing = [c for c in required if c not in table.header]
    if missing:
        raise BstarError(f"{where}: missing column(s) {', '.join(missing)}")
    unknown = [h for h in table.header if h not in known]
    if unknown:
        raise BstarError(f"{where}: unknown column(s) {', '.join(unknown)} (known: "
                         f"{', '.join(known)})")
    return table


def read_text(path: str | Path) -> str:
    """A points file's text; a missing, unreadable, oversized or non-UTF-8 file (a folder,
    a FIFO) is a one-line BstarError (bstar.safeio)."""
    return safeio.read_text(path, safeio.MAX_TABLE_BYTES, "points file (UTF-8 CSV or JSON)")


def is_json(path: str | Path, text: str) -> bool:
    return Path(path).suffix.lower() == ".json" or text.lstrip().startswith(("[", "{"))


def load_points(path: str | Path, *, repeats: bool = False) -> Points:
    """Read POINTS: CSV with a header (`batch` and at least one of `throughput_tok_s`,
    `tpot_ms`; lines starting with # are comments), or JSON: a list of such objects,
    {"points": [...]}, or a sweep result {"levels": [{"concurrency" or "max_num_seqs",
    "throughput_tok_s", "tpot_ms": number or {"mean": ...}}]}."""
    text = read_text(path)
    source = str(Path(path))
    if is_json(path, text):
        return _points_from_json(text, source, repeats)
    return _points_from_csv(text, source, repeats)


def _points_from_csv(text: str, source: str, repeats: bool = False) -> Points:
    table = read_table(text, source)
    if table is None:
        raise BstarError(f"{source}: no header and no points")
    header, header_line = table.header, table.header_line
    for h in header:
        if not h:
            raise BstarError(f"{source}: line {header_line}: empty column name in the header")
        if h not in COLUMNS:
            raise BstarError(f"{source}: line {header_line}: unknown column {h!r} (expected "
                             f"batch, throughput_tok_s, tpot_ms){closest(h, COLUMNS)}")
    rows = table.rows()
    if "batch" not in header:
        raise BstarError(f"{source}: line {header_line}: no 'batch' column")
    return points_from_rows([r for r, _ in rows], [w for _, w in rows], source,
                            repeats=repeats)


def _points_from_json(text: str, source: str, repeats: bool = False) -> Points:
    data = safeio.parse_json(text, source)
    if isinstance(data, dict) and "levels" in data:
        return points_from_sweep(data["levels"], source, repeats=repeats)
    if isinstance(data, dict) and "points" in data:
        data = data["points"]
    if not isinstance(data, list):
        raise BstarError(f"{source}: expected a list of points, {{\"points\": [...]}} or a "
                         "sweep result with \"levels\"")
    labels = [f"{source}: point {i + 1}" for i in range(len(data))]
    for item, where in zip(data, labels, strict=True):
        if not isinstance(item, dict):
            raise BstarError(f"{where}: expected an object with batch and throughput_tok_s "
                             "and/or tpot_ms")
    return points_from_rows(data, labels, source, repeats=repeats)


def points_from_sweep(levels: object, source: str = "sweep", *,
                      repeats: bool = False) -> Points:
    """A sweep result's levels (`bstar sweep --json`'s "levels"): batch = `level_batch`,
    throughput_tok_s, and the mean of tpot_ms (vLLM's mean_tpot_ms)."""
    if not isinstance(levels, list):
        raise BstarError(f"{source}: \"levels\" must be a list")
    rows: list[dict[str, object]] = []
    labels: list[str] = []
    for i, lv in enumerate(levels):
        where = f"{source}: level {i + 1}"
        if not isinstance(lv, dict):
            raise BstarError(f"{where}: expected an object")
        b = level_batch({k: _number(lv.get(k), k, where)
                         for k in ("concurrency", "max_num_seqs")})
        tp = lv.get("tpot_ms")
        if isinstance(tp, dict):
            tp = tp.get("mean")  # vLLM's mean_tpot_ms
        rows.append({"batch": b, "throughput_tok_s": lv.get("throughput_tok_s"), "tpot_ms": tp})
        labels.append(where)
    return points_from_rows(rows, labels, source, repeats=repeats)


def level_batch(level: Any) -> int | None:
    """The batch a sweep level ran at: the smaller of the client's concurrency and the
    server's max_num_seqs cap, of those given (a cap above the streams does not fill, and
    streams past the cap queue); None for a level with neither (a rate alone). `level`: a
    level as `bstar sweep --json` writes it (a mapping) or as the sweep holds it
    (`LevelPlan`, `LevelResult`: attributes)."""
    if isinstance(level, Mapping):
        given = (level.get("concurrency"), level.get("max_num_seqs"))
    else:
        given = (getattr(level, "concurrency", None), getattr(level, "max_num_seqs", None))
    vals = [v for v in given if v]
    return min(vals) if vals else None


# ---- measured steps: calibration's points ---------------------------------------------------
def points_from_fit(points: Points, context_tokens: int) -> list[Point]:
    """Steps from validated `Points` measured at one context length. Their tpot_ms is the
    per-request step time (batch / throughput when only throughput was given)."""
    if context_tokens < 1:
        raise BstarError("context_tokens must be at least 1")
    return [Point(int(b), context_tokens, float(t) / 1e3, f"{points.source} batch {b}")
            for b, t in zip(points.batch, points.tpot_ms, strict=True)]


def steps_from_rows(rows: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> list[Point]:
    """Steps from rows with batch, context_tokens, step_ms (or tpot_ms) and optional
    chunk_tokens, chunk_start (empty = 0), as `bstar.loadgen.mixed.to_csv` writes them; each
    row one Point, labelled by its kind when it has one. Other columns are ignored."""
    def num(row: Mapping[str, Any], key: str, w: str, default: float | None = None) -> float:
        raw = row.get(key)
        if raw in (None, ""):
            if default is None:
                raise BstarError(f"{w}: no {key}")
            return default
        try:
            x = float(str(raw))
        except ValueError:
            x = math.nan
        if not math.isfinite(x):
            # A 5,000-digit integer reads as inf and int(inf) raised OverflowError; nan
            # raised ValueError.
            raise BstarError(f"{w}: {key} {str(raw)[:40]!r} is not a finite number")
        return x

    out = []
    for row, w in zip(rows, labels, strict=True):
        ms_key = "step_ms" if row.get("step_ms") not in (None, "") else "tpot_ms"
        label = str(row.get("kind") or "") or w
        out.append(Point(int(num(row, "batch", w)), int(num(row, "context_tokens", w)),
                         num(row, ms_key, w) / 1e3, label,
                         int(num(row, "chunk_tokens", w, 0.0)),
                         int(num(row, "chunk_start", w, 0.0))))
    if not out:
        raise BstarError("no points")
    return out


def load_steps(path: str | Path, context: int | None) -> tuple[list[Point], list[str]]:
    """POINTS for `bstar calibrate`, and the warnings of reading them: a file of steps
    (with chunk_tokens: `steps_from_rows`); else points as `load_points` reads them (with
    their repeats), at `context` or, with a context_tokens column, grouped by context, each
    group read as a curve (so each needs MIN_POINTS distinct batch sizes)."""
    rows = _rows_with_context(path)
    if rows is not None and any("chunk_tokens" in r for r, _ in rows):
        return steps_from_rows([r for r, _ in rows], [w for _, w in rows]), []
    if rows is None:  # no context column: the curve reader as is (CSV, JSON, a sweep)
        if context is None:
            raise BstarError(f"{path}: no context_tokens column; give --context N (the "
                             "tokens each sequence holds while decoding, e.g. input + "
                             "output/2)")
        pts = load_points(path, repeats=True)
        return points_from_fit(pts, context), list(pts.warnings)
    groups: dict[int, list[tuple[dict[str, object], str]]] = {}
    for row, where in rows:
        raw = row.pop("context_tokens", None)
        if raw in (None, ""):
            if context is None:
                raise BstarError(f"{where}: empty context_tokens and no --context")
            ctx = context
        else:
            try:
                ctx = int(float(str(raw)))
            except (ValueError, OverflowError):  # OverflowError: inf
                raise BstarError(f"{where}: context_tokens {raw!r} is not a number") from None
            if ctx < 1:
                raise BstarError(f"{where}: context_tokens must be at least 1")
        groups.setdefault(ctx, []).append((row, where))
    out: list[Point] = []
    warnings: list[str] = []
    for ctx, items in sorted(groups.items()):
        pts = points_from_rows([r for r, _ in items], [w for _, w in items],
                               f"{path} (context {ctx})", repeats=True)
        out += points_from_fit(pts, ctx)
        warnings += pts.warnings
    return out, warnings


def _rows_with_context(path: str | Path) -> list[tuple[dict[str, object], str]] | None:
    """The file's rows with labels when it has a context_tokens column, else None."""
    text = read_text(path)
    if is_json(path, text):
        try:
            data = safeio.parse_json(text, str(path))
        except BstarError:
            return None  # load_points reports it
        items = data.get("points") if isinstance(data, dict) else data
        if not (isinstance(items, list) and items and all(isinstance(r, dict) for r in items)
                and any("context_tokens" in r for r in items)):
            return None
        return [(dict(r), f"{path}: point {i + 1}") for i, r in enumerate(items)]
    table = read_table(text, str(path))
    if table is None or "context_tokens" not in table.header:
        return None
    return [(dict(r), where) for r, where in table.rows()]


STEP_METRICS = ("itl_p50", "tpot_mean", "tpot_p50")


def steps_from_sweep(result: Any, metric: str = "itl_p50", context_tokens: int | None = None,
                     *, drop_preempted: bool = True) -> list[Point]:
    """Decode steps from a sweep result (bstar.loadgen.sweep.SweepResult): one per
    completed level with a batch (concurrency or max_num_seqs), at the context a request
    holds on average while decoding, input_len + output_len // 2 (as the sweep's own
    prediction). `metric`: itl_p50 (the median gap between streamed tokens: one decode
    step), tpot_mean or tpot_p50 (these also carry stalls behind other requests' prefills).
    `drop_preempted`: leave out levels whose server preempted (regime 3): their batch is
    not what ran."""
    if metric not in STEP_METRICS:
        raise BstarError(f"metric must be itl_p50, tpot_mean or tpot_p50, got {metric!r}")
    opts = result.run.get("options") or {}
    ctx = context_tokens or int(opts.get("input_len") or 0) + int(opts.get("output_len") or 0) // 2
    if ctx < 1:
        raise BstarError(f"run {result.run_id}: no input/output lengths stored; give --context")
    key, stat = metric.split("_", 1)
    points = []
    for lv in result.levels:
        st = lv.stats or {}
        value = (st.get(f"{key}_ms") or {}).get(stat)
        if not lv.batch or not st.get("completed") or not value:
            continue
        if drop_preempted and (getattr(lv, "server", None) or {}).get("preemptions"):
            continue  # regime 3: fewer than `batch` ran, and recomputes stalled the rest
        points.append(Point(int(lv.batch), ctx, float(value) / 1e3,
                            f"run {result.run_id} level {lv.idx}"))
    if not points:
        raise BstarError(f"run {result.run_id}: no completed level with a batch and "
                         f"{key}_ms {stat}")
    return points
