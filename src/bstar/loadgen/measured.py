"""The traffic a stored sweep measured, for the simulator (`bstar simulate --from-run`,
`bstar search --from-run`): the prompt and output lengths its requests had, and the
prefix-cache hit rate the server counted (vllm:prefix_cache_hits / _queries, scraped by the
sweep: loadgen/scrape.py).

The simulator needs prompt identity, not a rate. A measured hit rate h over prompts of mean
length m becomes one shared prefix of round(h x m) tokens at the start of every prompt,
which the simulated cache serves after the first request (`shared_prefix_tokens`). This is
the simplest identity with that hit rate. It cannot say which prompts shared what, so the
report shows the simulated hit rate next to the measured one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bstar.errors import BstarError


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
            prompts: list[int] = []
            outputs: list[int] = []
            hits = queries = 0
            scraped = False
            for lv in store.levels(run["id"]):
                srv = lv.server or {}
                if srv.get("prefix_cache_query_tokens") is not None:
                    scraped = True
                    hits += int(srv.get("prefix_cache_hit_tokens") or 0)
                    queries += int(srv["prefix_cache_query_tokens"])
                for r in store.requests(lv.id):
                    if r.ok and not r.warmup and r.prompt_tokens and r.output_tokens:
                        prompts.append(int(r.prompt_tokens))
                        outputs.append(int(r.output_tokens))
        except DbError as e:
            raise BstarError(f"cannot read the results DB {store.path}: {e}") from None
    if not prompts:
        raise BstarError(f"run {run_id} has no completed request with token counts")
    return MeasuredTraffic(run["id"], tuple(prompts), tuple(outputs),
                           hits if scraped else None, queries if scraped else None)
