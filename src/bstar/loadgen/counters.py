"""The prefix-cache counters of one sweep level, checked where they enter (issue 40): a
server that restarts mid-level resets them, and one that counts what it cannot mean reports
more hits than queries. `Scraper` (loadgen/scrape.py) feeds every scrape here."""

from __future__ import annotations

from typing import Any


class PrefixCounters:
    """The prefix-cache counters' increase over a level, scrape by scrape. A counter that
    falls between two scrapes is a restarted server: it starts a new segment, whose
    increase counts from 0 (Prometheus's `increase()` reads a reset the same way), and the
    level records how many segments it had. Hits above queries are refused, by name: no
    cache serves more tokens than it was asked for."""

    def __init__(self) -> None:
        self.prev: tuple[float, float] | None = None
        self.hits = self.queries = 0.0
        self.segments = 0

    def add(self, hits: float | None, queries: float | None) -> None:
        if hits is None or queries is None:
            return  # not exposed in this scrape (or not a count: snapshot's _nonneg)
        if self.prev is None:
            self.segments = 1
        elif hits < self.prev[0] or queries < self.prev[1]:
            self.segments += 1  # a restart: the new counts are this segment's increase
            self.hits += hits
            self.queries += queries
        else:
            self.hits += hits - self.prev[0]
            self.queries += queries - self.prev[1]
        self.prev = (hits, queries)

    def into(self, st: Any) -> None:
        """The level's counts into `st` (a scrape.LevelServerStats)."""
        if not self.segments:
            return
        st.prefix_cache_segments = self.segments
        hits, queries = round(self.hits), round(self.queries)
        if hits > queries:
            st.prefix_cache_refused = (f"prefix_cache_hits rose by {hits:,}, above "
                                       f"prefix_cache_queries' {queries:,}: not kept")
            return
        st.prefix_cache_hit_tokens, st.prefix_cache_query_tokens = hits, queries
        if queries > 0:
            st.prefix_cache_hit_rate = hits / queries
