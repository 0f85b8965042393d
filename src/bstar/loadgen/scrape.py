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

_SAMPLE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition; comments and bad lines are skipped."""
    out: list[Sample] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        out.append(Sample(m.group("name"), labels, value))
    return out


def _sum(samples: Iterable[Sample], *names: str) -> float | None:
    """Sum over label sets of the first of `names` present (counter with or without
    `_total`, renamed gauges across versions)."""
    samples = list(samples)
    for name in names:
        vals = [s.value for s in samples if s.name == name]
        if vals:
            return float(sum(vals))
    return None


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
    # vLLM's speculative-decoding counters (issue 31): steps that drafted, draft tokens
    # proposed, draft tokens accepted.
    spec_drafts_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None


def snapshot(samples: list[Sample]) -> Snapshot:
    names = {s.name for s in samples}
    engine = None
    if any(n.startswith("vllm:") for n in names):
        engine = "vllm"
    elif any(n.startswith("sglang:") for n in names):
        engine = "sglang"
    elif any(n.startswith("llamacpp:") for n in names):
        engine = "llamacpp"
    elif any(n.startswith("tgi_") for n in names):
        engine = "tgi"
    blocks = block_size = kv_mem = kv_tokens = None
    for s in samples:
        if s.name == "vllm:cache_config_info":
            with contextlib.suppress(KeyError, ValueError):
                blocks = int(float(s.labels["num_gpu_blocks"]))
            with contextlib.suppress(KeyError, ValueError):
                block_size = int(float(s.labels["block_size"]))
            with contextlib.suppress(KeyError, ValueError):
                kv_mem = int(float(s.labels["kv_cache_memory_bytes"]))
            with contextlib.suppress(KeyError, ValueError):
                kv_tokens = int(float(s.labels["kv_cache_size_tokens"]))
    max_tokens = _sum(samples, "sglang:max_total_num_tokens")
    kv = _sum(samples, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
              "sglang:token_usage")
    if kv is not None and kv > 1.0 + 1e-9:
        kv = kv / 100.0  # some versions export percent, not a fraction
    hits = _sum(samples, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits",
                "llamacpp:prompt_tokens_cached_total")
    queries = _sum(samples, "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")
    if queries is None and engine == "llamacpp" and hits is not None:
        processed = _sum(samples, "llamacpp:prompt_tokens_total")
        queries = None if processed is None else processed + hits
    return Snapshot(
        engine=engine,
        preemptions_total=_sum(samples, "vllm:num_preemptions_total", "vllm:num_preemptions",
                               "sglang:num_retracted_requests_total",
                               "sglang:num_retracted_reqs_total"),
        kv_cache_usage=kv,
        running=_sum(samples, "vllm:num_requests_running", "sglang:num_running_reqs",
                     "llamacpp:requests_processing", "tgi_batch_current_size"),
        waiting=_sum(samples, "vllm:num_requests_waiting", "sglang:num_queue_reqs",
                     "llamacpp:requests_deferred", "tgi_queue_size"),
        num_gpu_blocks=blocks,
        block_size=block_size,
        generation_tokens_total=_sum(samples, "vllm:generation_tokens_total",
                                     "sglang:generation_tokens_total",
                                     "llamacpp:tokens_predicted_total"),
        prefix_cache_hits_total=hits,
        prefix_cache_queries_total=queries,
        kv_cache_memory_bytes=kv_mem,
        kv_cache_size_tokens=kv_tokens,
        max_total_tokens=int(max_tokens) if max_tokens is not None else None,
        spec_drafts_total=_sum(samples, "vllm:spec_decode_num_drafts_total",
                               "vllm:spec_decode_num_drafts"),
        spec_draft_tokens_total=_sum(samples, "vllm:spec_decode_num_draft_tokens_total",
                                     "vllm:spec_decode_num_draft_tokens"),
        spec_accepted_tokens_total=_sum(samples, "vllm:spec_decode_num_accepted_tokens_total",
                                        "vllm:spec_decode_num_accepted_tokens"),
    )


def kv_capacity_seqs(num_gpu_blocks: int | None, block_size: int | None,
                     tokens_per_seq: int) -> int | None:
    """Sequences of `tokens_per_seq` tokens the server's KV pool holds (paged blocks)."""
    if not num_gpu_blocks or not block_size or tokens_per_seq <= 0:
        return None
    return num_gpu_blocks // math.ceil(tokens_per_seq / block_size)


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
    kv_cache_memory_bytes: int | None = None  # vLLM's configured KV bytes (CPU pools)
    kv_cache_size_tokens: int | None = None  # the pool in tokens, where exported
    slot_ctx_tokens: int | None = None  # llama.cpp /slots: context tokens of one slot
    # Speculative decoding over the level (vLLM's spec_decode counters; None: not exposed):
    # drafts, draft tokens, accepted tokens, and the tokens each step yielded, generated /
    # (generated - accepted), the quantity `bstar plan --acceptance-rate` is solved from
    # (docs/cost-model.md, "Speculative decoding").
    spec_num_drafts: int | None = None
    spec_num_draft_tokens: int | None = None
    spec_num_accepted_tokens: int | None = None
    spec_tokens_per_step: float | None = None
    gpu: dict[str, float] = field(default_factory=dict)  # NVML maxima/means
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

    async def _scrape_once(self) -> None:
        if self._absent:
            return
        status, text = await self.client.get_text("/metrics", timeout_s=5.0)
        if status != 200:
            if status == 404:
                self._absent = True
            self._stats.error = f"/metrics: HTTP {status}" if status else str(text)[:200]
            return
        snap = snapshot(parse_prometheus(text))
        st = self._stats
        st.scrapes += 1
        st.engine = snap.engine
        if self._first is None:
            self._first = snap
        self._last = snap
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
        if self._gpu is not None:
            self._gpu.sample()

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
                self._stats.slot_ctx_tokens = int(body[0]["n_ctx"])
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
            if a is not None and b is not None:
                st.preemptions = round(b - a)
            h0, h1 = self._first.prefix_cache_hits_total, self._last.prefix_cache_hits_total
            q0, q1 = (self._first.prefix_cache_queries_total,
                      self._last.prefix_cache_queries_total)
            if h0 is not None and h1 is not None:
                st.prefix_cache_hit_tokens = round(h1 - h0)
            if q0 is not None and q1 is not None:
                st.prefix_cache_query_tokens = round(q1 - q0)
                if st.prefix_cache_query_tokens > 0 and st.prefix_cache_hit_tokens is not None:
                    st.prefix_cache_hit_rate = (st.prefix_cache_hit_tokens
                                                / st.prefix_cache_query_tokens)
        if self._first is not None and self._last is not None:
            spec_counters(st, self._first, self._last)
        st.kv_capacity_seqs = kv_capacity_seqs(st.num_gpu_blocks, st.block_size,
                                               self.tokens_per_seq)
        if self._gpu is not None:
            st.gpu = self._gpu.summary()
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


class GpuTelemetry:
    """NVML utilization sampling (SM and memory-bandwidth utilization) of GPU 0.

    Only when `nvidia-ml-py` is installed and a local NVIDIA GPU answers; otherwise
    `create()` returns None and nothing else is attempted.
    """

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._sm: list[float] = []
        self._mem_bw: list[float] = []
        self._mem_used: list[float] = []

    @classmethod
    def create(cls) -> GpuTelemetry | None:
        try:
            import pynvml  # provided by the nvidia-ml-py package
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() < 1:
                return None
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
        except Exception:  # no driver, no device: telemetry is optional
            return None

    def sample(self) -> None:
        try:
            u = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            m = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception:
            return
        self._sm.append(float(u.gpu))
        self._mem_bw.append(float(u.memory))
        self._mem_used.append(float(m.used))

    def summary(self) -> dict[str, float]:
        if not self._sm:
            return {}
        return {
            "sm_util_mean_pct": sum(self._sm) / len(self._sm),
            "sm_util_max_pct": max(self._sm),
            "mem_bw_util_mean_pct": sum(self._mem_bw) / len(self._mem_bw),
            "mem_bw_util_max_pct": max(self._mem_bw),
            "mem_used_max_bytes": max(self._mem_used),
        }
