"""The traffic a stored sweep measured, for the simulator (`bstar simulate --from-run`,
`bstar search --from-run`): the prompt and output lengths its requests had, and the
prefix-cache hit rate the server counted (vllm:prefix_cache_hits / _queries, scraped by the
sweep: loadgen/scrape.py).

The simulator needs prompt identity, not a rate. A measured hit rate h over prompts of mean
length m becomes one shared prefix of round(h x m) tokens at the start of every prompt,
which the simulated cache serves after the first request (`shared_prefix_tokens`). This is
the simplest identity with that hit rate. It cannot say which prompts shared what, so the
report shows the simulated hit rate next to the measured one.

`bstar calibrate RUN -o PROFILE` records the same traffic in the profile's [workload] table
(`workload_toml`); `bstar simulate --profile PROFILE` and `bstar search --profile PROFILE`
read it back (`traffic_from_profile`) and use it as --from-run would, when the user gives no
workload of their own (docs/calibrate.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bstar.errors import BstarError


class NoTraffic(BstarError):
    """A stored run whose requests carry no token counts (nothing to simulate from)."""


@dataclass(frozen=True, slots=True)
class MeasuredTraffic:
    run_id: str
    prompt_tokens: tuple[int, ...]  # per request that completed (warm-up left out)
    output_tokens: tuple[int, ...]
    hit_tokens: int | None  # the server's counters over the levels; None: not scraped
    query_tokens: int | None

    @property
    def hit_rate(self) -> float | None:
        if not self.query_tokens or self.hit_tokens is None:
            return None
        return self.hit_tokens / self.query_tokens

    @property
    def shared_prefix_tokens(self) -> int:
        """The shared prefix that gives the measured hit rate (module docstring)."""
        h = self.hit_rate
        if not h:
            return 0
        return round(h * float(np.mean(self.prompt_tokens)))

    def lengths(self, shared: bool = True) -> tuple[str, str]:
        """(--input-len, --output-len) as empirical distributions. With `shared`, the
        prompt's own part after the shared prefix (`prompt_shape` adds the prefix back);
        without, the whole prompt."""
        n = self.shared_prefix_tokens if shared else 0
        own = [max(1, p - n) for p in self.prompt_tokens]
        return (f"empirical:{','.join(map(str, own))}",
                f"empirical:{','.join(map(str, self.output_tokens))}")

    def prompt_shape(self) -> Any:
        from bstar.sim.prefix import PromptShape

        n = self.shared_prefix_tokens
        return PromptShape(shared_prefix_tokens=n) if n else None

    def describe(self) -> str:
        h = self.hit_rate
        hit = "not measured" if h is None else (
            f"{h:.1%} ({self.hit_tokens:,} of {self.query_tokens:,} prompt tokens)")
        return (f"run {self.run_id}: {len(self.prompt_tokens)} requests, prompt mean "
                f"{np.mean(self.prompt_tokens):.0f} tokens, output mean "
                f"{np.mean(self.output_tokens):.0f}; measured prefix-cache hit rate {hit}"
                + (f", simulated as a {self.shared_prefix_tokens}-token shared prefix"
                   if self.shared_prefix_tokens else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "requests": len(self.prompt_tokens),
                "prefix_cache_hit_rate": self.hit_rate, "prefix_cache_hit_tokens":
                self.hit_tokens, "prefix_cache_query_tokens": self.query_tokens,
                "shared_prefix_tokens": self.shared_prefix_tokens}


def measured_traffic(db: str | Path | None, run_id: str) -> MeasuredTraffic:
    """Read a stored sweep run (read-only; `db` None: the sweep's default store)."""
    from bstar.db import DbError
    from bstar.loadgen.store import Store

    with Store(db, readonly=True) as store:
        try:
            run = store.get_run(run_id)
            if run is None:
                raise BstarError(f"no run {run_id!r} in {store.path}")
            prompts: list[Any] = []
            outputs: list[Any] = []
            hits = queries = 0
            scraped = False
            for lv in store.levels(run["id"]):
                srv = lv.server or {}
                if srv.get("prefix_cache_query_tokens") is not None:
                    # Each level's counters checked where they enter, by the rule a
                    # profile's [workload] is read with (_counters).
                    h, q = _counters(f"run {run['id']} level {lv.idx}", {
                        "prefix_cache_hit_tokens": srv.get("prefix_cache_hit_tokens") or 0,
                        "prefix_cache_query_tokens": srv["prefix_cache_query_tokens"]})
                    scraped = True
                    hits += h or 0
                    queries += q or 0
                for r in store.requests(lv.id):
                    if r.ok and not r.warmup and r.prompt_tokens and r.output_tokens:
                        prompts.append(r.prompt_tokens)
                        outputs.append(r.output_tokens)
        except DbError as e:
            raise BstarError(f"cannot read the results DB {store.path}: {e}") from None
    if not prompts:
        raise NoTraffic(f"run {run_id} has no completed request with token counts")
    tab: dict[str, Any] = {"run": run["id"], "prompt_tokens": prompts,
                           "output_tokens": outputs}
    if scraped:
        tab |= {"prefix_cache_hit_tokens": hits, "prefix_cache_query_tokens": queries}
    # Read back by the reader a profile's [workload] goes through: what --from-run simulates
    # is what `calibrate -o` would write and `--profile` accept.
    return traffic_from_table(f"run {run['id']}", tab)


MAX_PROFILE_LENGTHS = 2000  # lengths a profile's [workload] keeps per list


def _kept_lengths(x: tuple[int, ...]) -> list[int]:
    """All of them, or MAX_PROFILE_LENGTHS evenly spaced order statistics (the same
    empirical distribution, to 1/MAX_PROFILE_LENGTHS in quantile)."""
    if len(x) <= MAX_PROFILE_LENGTHS:
        return list(x)
    s = np.sort(np.asarray(x))
    idx = np.rint(np.linspace(0, len(s) - 1, MAX_PROFILE_LENGTHS)).astype(np.int64)
    return [int(v) for v in s[idx]]


def workload_toml(m: MeasuredTraffic) -> str:
    """The [workload] table of a calibration profile: the sweep's traffic (module
    docstring). Counters absent when the sweep did not scrape them."""
    import json

    lines = ["\n[workload]  # the traffic the sweep measured; `--profile` simulates it when "
             "no workload is given", f"run = {json.dumps(m.run_id)}",
             f"requests = {len(m.prompt_tokens)}"]
    if m.hit_tokens is not None and m.query_tokens is not None:
        lines += [f"prefix_cache_hit_tokens = {m.hit_tokens}",
                  f"prefix_cache_query_tokens = {m.query_tokens}",
                  f"prefix_cache_hit_rate = {m.hit_rate!r}" if m.hit_rate is not None
                  else "", f"shared_prefix_tokens = {m.shared_prefix_tokens}"]
    lines += [f"prompt_tokens = {json.dumps(_kept_lengths(m.prompt_tokens))}",
              f"output_tokens = {json.dumps(_kept_lengths(m.output_tokens))}"]
    return "\n".join(ln for ln in lines if ln) + "\n"


def _lengths(where: str, tab: dict[str, Any], key: str) -> tuple[int, ...]:
    x = tab.get(key)
    if not isinstance(x, list) or not x or not all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 10_000_000
            for v in x):
        raise BstarError(f"{where}: workload.{key} must be a list of token counts in "
                         "1..10,000,000")
    return tuple(x)


def _counters(where: str, tab: dict[str, Any]) -> tuple[int | None, int | None]:
    """The prefix-cache counters of a [workload] table or a stored level, checked: each a
    finite count (a negative one is a counter that fell, a restarted server the sweep did not
    see), both or neither, and hits at most queries. Errors name the counter."""
    counts: list[int | None] = []
    for k in ("prefix_cache_hit_tokens", "prefix_cache_query_tokens"):
        v = tab.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                              or not math.isfinite(v) or v < 0 or v != int(v)
                              or v >= 2**53):
            raise BstarError(f"{where}: {k} is {repr(v)[:40]}, not a count of "
                             "tokens (a counter that fell, or not a finite number)")
        counts.append(None if v is None else int(v))
    hits, queries = counts
    if (hits is None) != (queries is None):
        missing = "prefix_cache_hit_tokens" if hits is None else "prefix_cache_query_tokens"
        raise BstarError(f"{where}: {missing} is missing (the prefix-cache counters come "
                         "as a pair)")
    if hits is not None and queries is not None and hits > queries:
        raise BstarError(f"{where}: prefix_cache_hit_tokens ({hits:,}) above "
                         f"prefix_cache_query_tokens ({queries:,}): not a hit rate")
    return hits, queries


def traffic_from_table(where: str, tab: dict[str, Any]) -> MeasuredTraffic:
    """A [workload] table (a profile's, or a stored run's traffic put in that shape) as
    MeasuredTraffic: the one reader both go through."""
    hits, queries = _counters(where, tab)
    return MeasuredTraffic(str(tab.get("run", "")), _lengths(where, tab, "prompt_tokens"),
                           _lengths(where, tab, "output_tokens"), hits, queries)


def traffic_from_profile(path: str | Path) -> MeasuredTraffic | None:
    """The [workload] table of a calibration profile, or None when it has none."""
    from bstar import safeio

    return traffic_from_data(path, safeio.load_toml(Path(path), what="profile (TOML)"))


def traffic_from_data(path: str | Path, data: dict[str, Any]) -> MeasuredTraffic | None:
    """A parsed profile's [workload] (`traffic_from_profile` without the read)."""
    tab = data.get("workload")
    if tab is None:
        return None
    if not isinstance(tab, dict):
        raise BstarError(f"{path}: [workload] must be a table")
    return traffic_from_table(str(path), tab)


# ---- the acceptance rate a sweep measured (`--acceptance-rate from:RUN`) ---------------------
def measured_acceptance(source: str, num_speculative_tokens: int) -> float:
    """The acceptance rate of a sweep run (`bstar.specdec.acceptance_from_levels`): `source`
    a `bstar sweep --json` file (read by bstar.safeio: bounded, its depth and integers
    checked), else a run id in the default results DB. Either's levels are checked by
    `spec_levels` first."""
    from bstar import safeio
    from bstar.specdec import acceptance_from_levels

    path = Path(source)
    if path.exists() or path.is_symlink():
        where = f"--acceptance-rate from:{source}"
        levels = spec_levels(where, safeio.load_json(path, safeio.MAX_TABLE_BYTES,
                                                     "sweep --json file"))
    else:
        from bstar.loadgen.store import Store

        where = f"--acceptance-rate from:{source} (run)"
        with Store(None, readonly=True) as store:
            levels = spec_levels(where, {"levels": [{"server": r.server}
                                                    for r in store.levels(source) if r.server]})
        if not levels:
            raise BstarError(f"--acceptance-rate from:{source}: no such file or sweep run")
    return acceptance_from_levels(levels, num_speculative_tokens)


SPEC_COUNTERS = ("spec_num_accepted_tokens", "spec_tokens_per_step")


def spec_levels(where: str, data: Any) -> list[dict[str, Any]]:
    """A sweep --json object's levels as `acceptance_from_levels` reads them, each counter
    checked: `levels` a list of objects, a level's `server` an object, each counter a finite
    number in [0, 2**53] (a string, NaN or Infinity is one line naming the file and the
    field: NaN became an acceptance rate of 4e-19)."""

    levels = data.get("levels") if isinstance(data, dict) else None
    if not isinstance(levels, list):
        raise BstarError(f"{where}: not a sweep --json file (levels must be a list)")
    out = []
    for i, lv in enumerate(levels):
        if not isinstance(lv, dict):
            raise BstarError(f"{where}: levels[{i}] must be an object")
        srv, name = (lv["server"], f"levels[{i}].server") if lv.get("server") is not None \
            else (lv, f"levels[{i}]")
        if not isinstance(srv, dict):
            raise BstarError(f"{where}: {name} must be an object")
        row: dict[str, float] = {}
        for k in SPEC_COUNTERS:
            v = srv.get(k)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                    or not 0 <= v <= 2**53:
                raise BstarError(f"{where}: {name}.{k} must be a finite number in "
                                 f"[0, 2**53], got {repr(v)[:40]}")
            row[k] = float(v)
        out.append({"server": row})
    return out


# ---- the steps a stored sweep measured (`bstar calibrate RUN`) --------------------------------
def steps_from_run(db: str | None, run_id: str, metric: str,
                   context: int | None) -> tuple[list[Any], str, dict[str, Any], Any]:
    """Decode-step points from a stored sweep run (bstar sweep's store, `db` None: its
    default), read by bstar.fit.points.steps_from_sweep, with where they came from, the
    run's record and the whole stored result (its levels' GPU power: `bstar calibrate RUN`,
    `--check RUN`)."""
    from bstar.db import DbError
    from bstar.errors import BstarError
    from bstar.fit.points import steps_from_sweep
    from bstar.loadgen.store import Store
    from bstar.loadgen.sweep import load_result

    # db None: the sweep's default store. Read-only: never creates a file.
    with Store(db, readonly=True) as store:
        try:
            result = load_result(store, run_id)
        except DbError as e:
            raise BstarError(f"cannot read the results DB {store.path}: {e}") from None
    points = steps_from_sweep(result, metric, context)
    return points, f"sweep run {result.run_id} ({result.db}), {metric}", result.run, result


# ---- a calibration profile as `bstar calibrate -o` writes it ----------------------------------
def profile_text(path: str | Path, calibration: Any, workload: MeasuredTraffic | None,
                 extra: str = "") -> str:
    """The profile's TOML: the calibration (`bstar.calibrate.profile_toml`), the traffic
    the sweep measured as its [workload] (`workload_toml`) and `extra` tables (the fitted
    [power], bstar.calibrate.power), read back by the readers `--profile` uses before it is
    returned: a profile bstar writes is one bstar reads, or nothing is written."""
    import tomllib

    from bstar import calibrate as cal

    text = cal.profile_toml(calibration) + ("" if workload is None
                                            else workload_toml(workload)) + extra
    try:
        cal.profile_from_text(path, text)
        traffic_from_data(path, tomllib.loads(text))
    except BstarError as e:
        raise BstarError(f"not written: the profile would not load with --profile ({e})") \
            from None
    return text
