"""Server-side evidence while a level runs: Prometheus `/metrics` (vLLM, SGLang, llama.cpp),
llama.cpp's `/slots`, and NVML GPU telemetry when the GPU is local.

This is what explains the bend of the curve: preemptions and KV-cache usage say the KV
pool is full (regime 3), running/waiting say the engine's max_num_seqs capped the batch.
The Prometheus text parser is small and pure; the scraper polls while a level runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bstar.loadgen.counters import PrefixCounters
from bstar.loadgen.gpu_telemetry import GpuTelemetry
from bstar.redact import clip

_SAMPLE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ENGINE = re.compile(r"^(vllm:|sglang:|llamacpp:|tgi_)", re.M)
_ENGINES = {"vllm:": "vllm", "sglang:": "sglang", "llamacpp:": "llamacpp", "tgi_": "tgi"}

# The most of /metrics read (vLLM's for one model is ~50 kB, tests/fixtures/metrics): a
# larger one is not parsed (a 20 MB /metrics parsed beside the measured streams wrecked
# their ITL p99), and the scraper reads it off the event loop within METRICS_TIMEOUT_S.
METRICS_MAX_BYTES = 4 * 1024 * 1024
METRICS_TIMEOUT_S = 5.0
# Label values read as integers (block counts, bytes) and counts are exact below 2**53.
_MAX_LABEL_INT = 2**53

# The metrics a snapshot reads, per figure: the first name present wins (counters with or
# without `_total`, renamed gauges across versions and engines).
_NAMES: dict[str, tuple[str, ...]] = {
    "preemptions_total": ("vllm:num_preemptions_total", "vllm:num_preemptions",
                          "sglang:num_retracted_requests_total",
                          "sglang:num_retracted_reqs_total"),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                       "sglang:token_usage"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs",
                "llamacpp:requests_processing", "tgi_batch_current_size"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs",
                "llamacpp:requests_deferred", "tgi_queue_size"),
    "generation_tokens_total": ("vllm:generation_tokens_total",
                                "sglang:generation_tokens_total",
                                "llamacpp:tokens_predicted_total"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits",
                                "llamacpp:prompt_tokens_cached_total"),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total",
                                   "vllm:prefix_cache_queries"),
    "max_total_tokens": ("sglang:max_total_num_tokens",),
    # Engine steps: vLLM's count of its tokens-per-step histogram, llama.cpp's
    # llama_decode calls.
    "steps_total": ("vllm:iteration_tokens_total_count", "llamacpp:n_decode_total"),
    "llamacpp_prompt_tokens_total": ("llamacpp:prompt_tokens_total",),
}
WANTED = frozenset({"vllm:cache_config_info", *(n for v in _NAMES.values() for n in v)})


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str, names: frozenset[str] | None = None,
                     finite_only: bool = True) -> list[Sample]:
    """Samples of a Prometheus text exposition; comments, bad lines and (`finite_only`)
    values that are not finite numbers (NaN, +Inf) are skipped. `names`: only those samples
    (a line's name is checked before its labels and value are parsed: most of vLLM's lines
    are histogram buckets bstar does not read). The sweep's scrapes keep NaN and Inf so that
    `snapshot` can say which counter held one (every figure goes through `_nonneg`)."""
    out: list[Sample] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if names is not None:
            cut = len(line)
            for sep in "{ \t":
                i = line.find(sep, 0, cut)
                if i >= 0:
                    cut = i
            if line[:cut] not in names:
                continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if finite_only and not math.isfinite(value):
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        out.append(Sample(m.group("name"), labels, value))
    return out


def detect_engine(text: str) -> str | None:
    """The engine whose metric names come first in a /metrics text."""
    m = _ENGINE.search(text)
    return _ENGINES[m.group(1)] if m else None


def _sum(samples: Iterable[Sample], *names: str) -> float | None:
    """Sum over label sets of the first of `names` present (counter with or without
    `_total`, renamed gauges across versions)."""
    samples = list(samples)
    for name in names:
        vals = [s.value for s in samples if s.name == name]
        if vals:
            return float(sum(vals))
    return None


def _label_int(labels: dict[str, str], key: str) -> int | None:
    """A label read as a non-negative integer (vLLM writes "1024" or "1024.0"); None when
    absent or not one (NaN, inf, negative, past 2**53, text)."""
    try:
        v = float(labels[key])
    except (KeyError, ValueError):
        return None
    if not (math.isfinite(v) and 0 <= v < _MAX_LABEL_INT):
        return None
    return int(v)


def _nonneg(v: float | None) -> float | None:
    """A count or gauge as bstar reads it: None when negative or past 2**53 (no engine
    counts that far; a float there is no longer an exact count)."""
    return v if v is None or 0 <= v < _MAX_LABEL_INT else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The figures bstar reads from one scrape (None: not exposed by this server)."""

    engine: str | None  # "vllm", "sglang", "llamacpp", "tgi" or None
    preemptions_total: float | None
    kv_cache_usage: float | None  # fraction 0..1
    running: float | None
    waiting: float | None
    num_gpu_blocks: int | None
    block_size: int | None
    generation_tokens_total: float | None
    # Prompt tokens served from the server's prefix cache, and prompt tokens looked up in it
    # (vLLM: vllm:prefix_cache_hits / _queries; llama.cpp: prompt_tokens_cached_total, and
    # its prompt_tokens_total counts only the tokens it processed).
    prefix_cache_hits_total: float | None = None
    prefix_cache_queries_total: float | None = None
    # vLLM's cache_config_info labels: the configured KV bytes (CPU's explicit pool; None on
    # GPU, where the pool is what profiling left) and the pool in tokens (newer versions).
    kv_cache_memory_bytes: int | None = None
    kv_cache_size_tokens: int | None = None
    # The pool's size in tokens where the engine exports it apart from vLLM's blocks
    # (SGLang's max_total_num_tokens, TGI's batch token budget).
    max_total_tokens: int | None = None
    # Engine steps so far (vLLM: iteration_tokens_total's count; llama.cpp: n_decode_total).
    steps_total: float | None = None
    # vLLM's speculative-decoding counters (issue 31): steps that drafted, draft tokens
    # proposed, draft tokens accepted.
    spec_drafts_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None
    # Prefix-cache counters this scrape exposed that are not counts (NaN, Inf, negative,
    # past 2**53), as "name = value": left out above, refused by name in the level.
    refused: tuple[str, ...] = ()


def snapshot(samples: list[Sample], engine: str | None = None) -> Snapshot:
    """The figures of one scrape. Values a server cannot mean (a negative gauge or counter,
    a KV usage past 100%, a block count that is not an integer) are left out (None)."""
    if engine is None:
        names = {s.name for s in samples}
        for prefix, name in _ENGINES.items():
            if any(n.startswith(prefix) for n in names):
                engine = name
                break
    blocks = block_size = kv_mem = kv_tokens = None
    for s in samples:
        if s.name == "vllm:cache_config_info":
            blocks = _label_int(s.labels, "num_gpu_blocks")
            block_size = _label_int(s.labels, "block_size") or None
            kv_mem = _label_int(s.labels, "kv_cache_memory_bytes")
            kv_tokens = _label_int(s.labels, "kv_cache_size_tokens")
    raw = {k: _sum(samples, *names) for k, names in _NAMES.items()}
    fig = {k: _nonneg(v) for k, v in raw.items()}
    refused = tuple(f"{_NAMES[k][0]} = {raw[k]!r}" for k in
                    ("prefix_cache_hits_total", "prefix_cache_queries_total")
                    if raw[k] is not None and fig[k] is None)
    kv = fig["kv_cache_usage"]
    if kv is not None and kv > 1.0 + 1e-9:
        kv = kv / 100.0  # some versions export percent, not a fraction
    if kv is not None and kv > 1.0 + 1e-9:
        kv = None  # neither a fraction nor a percent
    hits, queries = fig["prefix_cache_hits_total"], fig["prefix_cache_queries_total"]
    if engine == "llamacpp":
        processed = fig["llamacpp_prompt_tokens_total"]
        if queries is None and hits is not None and processed is not None:
            queries = processed + hits
    max_tokens = fig["max_total_tokens"]
    return Snapshot(
        engine=engine,
        preemptions_total=fig["preemptions_total"],
        kv_cache_usage=kv,
        running=fig["running"],
        waiting=fig["waiting"],
        num_gpu_blocks=blocks,
        block_size=block_size,
        generation_tokens_total=fig["generation_tokens_total"],
        prefix_cache_hits_total=hits,
        prefix_cache_queries_total=queries,
        kv_cache_memory_bytes=kv_mem,
        kv_cache_size_tokens=kv_tokens,
        max_total_tokens=(int(max_tokens) if max_tokens is not None
                          and max_tokens < _MAX_LABEL_INT else None),
        steps_total=fig["steps_total"],
        spec_drafts_total=_nonneg(_sum(samples, "vllm:spec_decode_num_drafts_total",
                               "vllm:spec_decode_num_drafts")),
        spec_draft_tokens_total=_nonneg(_sum(samples, "vllm:spec_decode_num_draft_tokens_total",
                                     "vllm:spec_decode_num_draft_tokens")),
        spec_accepted_tokens_total=_nonneg(_sum(
            samples, "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_accepted_tokens")),
        refused=refused,
    )


def read_snapshot(text: str) -> Snapshot:
    """One /metrics text to its snapshot, reading only the lines bstar uses."""
    return snapshot(parse_prometheus(text, WANTED, finite_only=False), detect_engine(text))


def kv_capacity_seqs(num_gpu_blocks: int | None, block_size: int | None,
                     tokens_per_seq: int) -> int | None:
    """Sequences of `tokens_per_seq` tokens the server's KV pool holds (paged blocks)."""
    if not num_gpu_blocks or not block_size or tokens_per_seq <= 0:
        return None
    from bstar.kvcheck import b_mem_blocks

    return b_mem_blocks(num_gpu_blocks, block_size, tokens_per_seq)


@dataclass
class LevelServerStats:
    """Aggregated over one level: the counters' increase, the gauges' maxima."""

    engine: str | None = None
    scrapes: int = 0
    preemptions: int | None = None
    kv_cache_usage_max: float | None = None
    running_max: float | None = None
    waiting_max: float | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_capacity_seqs: int | None = None
    slots: int | None = None  # llama.cpp /slots: number of parallel slots
    # The level's prompt tokens served from the prefix cache, of those looked up (None: the
    # server's /metrics does not say). Repeated prompts show here as a high hit rate.
    prefix_cache_hit_tokens: int | None = None
    prefix_cache_query_tokens: int | None = None
    prefix_cache_hit_rate: float | None = None
    # Counter segments over the level: 1, or more when a counter fell between two scrapes (a
    # restarted server counts from 0 again; each segment's increase is summed). None: not
    # scraped. `prefix_cache_refused` says why the counters were not kept (hits above
    # queries: a server that counts what it cannot mean).
    prefix_cache_segments: int | None = None
    prefix_cache_refused: str | None = None
    kv_cache_memory_bytes: int | None = None  # vLLM's configured KV bytes (CPU pools)
    kv_cache_size_tokens: int | None = None  # the pool in tokens, where exported
    slot_ctx_tokens: int | None = None  # llama.cpp /slots: context tokens of one slot
    # The level's engine steps and the tokens they generated, per step: the decode batch
    # the engine ran, on average, by its own counters (vLLM: iteration_tokens_total's count,
    # llama.cpp: n_decode_total; None: not exported). At most one token per running
    # sequence a step (no speculative decoding), and unlike a throughput, a busy CPU does
    # not change what a step holds.
    engine_steps: int | None = None
    tokens_per_step: float | None = None
    # Speculative decoding over the level (vLLM's spec_decode counters; None: not exposed):
    # drafts, draft tokens, accepted tokens, and the tokens each step yielded, generated /
    # (generated - accepted), the quantity `bstar plan --acceptance-rate` is solved from
    # (docs/cost-model.md, "Speculative decoding").
    spec_num_drafts: int | None = None
    spec_num_draft_tokens: int | None = None
    spec_num_accepted_tokens: int | None = None
    spec_tokens_per_step: float | None = None
    gpu: dict[str, Any] = field(default_factory=dict)  # NVML / AMD SMI maxima, means, power
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _max(a: float | None, b: float | None) -> float | None:
    if b is None:
        return a
    return b if a is None else max(a, b)


class Scraper:
    """Polls `/metrics` every `interval_s` while running; `stats()` aggregates.

    `client` is an OpenAIClient (its session, headers and base URL are reused).
    """

    def __init__(self, client: Any, *, interval_s: float = 0.5,
                 tokens_per_seq: int = 0) -> None:
        self.client = client
        self.interval_s = interval_s
        self.tokens_per_seq = tokens_per_seq
        self._first: Snapshot | None = None
        self._last: Snapshot | None = None
        self._stats = LevelServerStats()
        self._task: asyncio.Task[None] | None = None
        self._absent = False
        self._gpu = GpuTelemetry.create()
        self._prefix = PrefixCounters()  # loadgen/counters.py: resets and lies

    async def _read(self) -> tuple[Snapshot | None, str | None]:
        """One scrape, fetched and parsed off the event loop (a thread: the measured
        streams' bytes are stamped on the loop) within METRICS_MAX_BYTES and
        METRICS_TIMEOUT_S: (snapshot, None) or (None, why not)."""
        c = self.client
        if getattr(c, "injected", False):  # a test's in-process fake: its session
            status, text = await c.get_text("/metrics", timeout_s=METRICS_TIMEOUT_S)
            if status == 200 and len(text) > METRICS_MAX_BYTES:
                self._absent = True
                return None, f"/metrics over {METRICS_MAX_BYTES} bytes: not read"
        else:
            from bstar.safehttp import FetchError, TooLarge, fetch

            def get() -> tuple[int, str]:
                got = fetch(c.base_url + "/metrics", headers=c.auth_headers(),
                            max_bytes=METRICS_MAX_BYTES, timeout_s=METRICS_TIMEOUT_S)
                return got.status, got.body.decode("utf-8", "replace")

            try:
                status, text = await asyncio.to_thread(get)
            except FetchError as e:
                # Too large: read once, not every interval (a slow one is tried again).
                self._absent = isinstance(e, TooLarge)
                return None, f"/metrics: {e}"
        if status != 200:
            if status == 404:
                self._absent = True
            return None, f"/metrics: HTTP {status}" if status else clip(str(text), 200)
        return await asyncio.to_thread(read_snapshot, text), None

    async def _scrape_once(self) -> None:
        if self._gpu is not None:  # the GPU is read whether or not /metrics answers
            self._gpu.sample()
        if self._absent:
            return
        snap, error = await self._read()
        if snap is None:
            self._stats.error = clip(error or "", 300)
            return
        st = self._stats
        st.scrapes += 1
        st.engine = snap.engine
        if self._first is None:
            self._first = snap
        self._last = snap
        self._prefix.add(snap.prefix_cache_hits_total, snap.prefix_cache_queries_total)
        if snap.refused:
            st.prefix_cache_refused = clip(f"{', '.join(snap.refused)}: not a count, not "
                                           "kept", 300)
        st.kv_cache_usage_max = _max(st.kv_cache_usage_max, snap.kv_cache_usage)
        st.running_max = _max(st.running_max, snap.running)
        st.waiting_max = _max(st.waiting_max, snap.waiting)
        if snap.num_gpu_blocks is not None:
            st.num_gpu_blocks, st.block_size = snap.num_gpu_blocks, snap.block_size
        if snap.kv_cache_memory_bytes is not None:
            st.kv_cache_memory_bytes = snap.kv_cache_memory_bytes
        tokens = snap.kv_cache_size_tokens or snap.max_total_tokens
        if tokens is not None:
            st.kv_cache_size_tokens = tokens

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self._scrape_once()
            await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        status, body = await self.client.get_json("/slots", timeout_s=5.0)
        if status == 200 and isinstance(body, list):
            self._stats.slots = len(body)
            with contextlib.suppress(Exception):
                n_ctx = body[0]["n_ctx"]
                if type(n_ctx) is int and 0 < n_ctx < 2**31:  # else not a context size
                    self._stats.slot_ctx_tokens = n_ctx
        await self._scrape_once()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> LevelServerStats:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            await self._scrape_once()  # the final counters
        return self.stats()

    def stats(self) -> LevelServerStats:
        st = self._stats
        if self._first is not None and self._last is not None:
            a, b = self._first.preemptions_total, self._last.preemptions_total
            if a is not None and b is not None and b >= a:
                st.preemptions = round(b - a)
            self._prefix.into(st)
            s0, s1 = self._first.steps_total, self._last.steps_total
            k0, k1 = (self._first.generation_tokens_total,
                      self._last.generation_tokens_total)
            if s0 is not None and s1 is not None and s1 >= s0:
                st.engine_steps = round(s1 - s0)
                if st.engine_steps > 0 and k0 is not None and k1 is not None and k1 >= k0:
                    st.tokens_per_step = (k1 - k0) / st.engine_steps
            spec_counters(st, self._first, self._last)
        st.kv_capacity_seqs = kv_capacity_seqs(st.num_gpu_blocks, st.block_size,
                                               self.tokens_per_seq)
        if self._gpu is not None:
            st.gpu = self._gpu.summary()
            self._gpu.close()
        return st


def spec_counters(st: LevelServerStats, first: Snapshot, last: Snapshot) -> None:
    """The level's speculative-decoding counters (their increase) into `st`."""
    pairs = ((first.spec_drafts_total, last.spec_drafts_total),
             (first.spec_draft_tokens_total, last.spec_draft_tokens_total),
             (first.spec_accepted_tokens_total, last.spec_accepted_tokens_total))
    if any(a is None or b is None for a, b in pairs):
        return
    drafts, drafted, accepted = (round(b - a) for a, b in pairs)  # type: ignore[operator]
    st.spec_num_drafts, st.spec_num_draft_tokens = drafts, drafted
    st.spec_num_accepted_tokens = accepted
    g0, g1 = first.generation_tokens_total, last.generation_tokens_total
    if g0 is not None and g1 is not None and g1 - g0 > accepted:
        st.spec_tokens_per_step = (g1 - g0) / (g1 - g0 - accepted)
