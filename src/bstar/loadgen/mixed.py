"""Mixed prefill + decode steps, measured black-box on a live OpenAI-compatible server.

A chunked-prefill engine runs a prompt's chunk in the same step as the sequences already
decoding. From outside, that step is the gap the decoding streams see while the prompt is
prefilled. The recipe, engine-agnostic (no step log, no metrics endpoint):

- decode: B streams with long outputs (ignore_eos) run at steady state; the median gap
  between their tokens over a window is the decode step at B;
- mixed: while they decode, one request with a prompt of n tokens and max_tokens 1 is
  sent; its first token leaves the engine with the decoding streams' tokens of the step
  that ran its chunk, so in each decoding stream the gap ending at the token nearest that
  first token is the step "B decode + one chunk of n" (one chunk when n + B fits the
  engine's token budget, `--max-num-batched-tokens` on vLLM); the median over the streams
  is the sample;
- prefill (B = 0): the TTFT of a lone request with a prompt of n tokens, minus the
  network and API time, estimated as the TTFT of a lone one-token prompt minus the decode
  step at B = 1 (that step does the same engine work as a one-token prefill).

Each (B, n) is repeated and the median kept, with the spread. `StepSample.point()` turns a
sample into a `bstar.fit.steps.Point`; `to_csv` writes the points file that `bstar calibrate`
reads (columns batch, context_tokens, chunk_tokens, chunk_start, step_ms) through
`bstar.fit.points.load_steps`, the one point reader.

The decoding streams' context at a step is exact: a stream that received its m-th token
from the step holds prompt + m - 1 tokens of KV after it.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bstar.errors import BstarError
from bstar.fit.steps import Point
from bstar.loadgen.client import OpenAIClient, RequestSpec
from bstar.loadgen.worker import run_loop
from bstar.redact import clip

CSV_COLUMNS = ("kind", "batch", "context_tokens", "chunk_tokens", "chunk_start", "step_ms",
               "samples", "min_ms", "median_ms", "max_ms")
STATISTICS = ("min", "median")


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured step kind: `batch` sequences decoding at about `context_tokens` (after
    the step) plus, when `chunk_tokens` > 0, one prompt chunk of that many tokens on top of
    `chunk_start` cached ones; `step_s` is the min (or the median, MixedConfig.statistic)
    of `samples_s`."""

    kind: str  # "decode", "mixed" or "prefill"
    batch: int
    context_tokens: int
    chunk_tokens: int
    chunk_start: int
    step_s: float
    samples_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeats."""
        return (max(self.samples_s) - min(self.samples_s)) / self.median_s

    def point(self) -> Point:
        label = f"{self.kind} B={self.batch}" + (f" n={self.chunk_tokens}"
                                                  if self.chunk_tokens else "")
        return Point(self.batch, max(1, self.context_tokens), self.step_s, label,
                     self.chunk_tokens, self.chunk_start)


@dataclass(frozen=True, slots=True)
class MixedConfig:
    batches: tuple[int, ...] = (1, 2, 4, 8)
    chunk_tokens: tuple[int, ...] = (32, 128, 384)
    decode_prompt_tokens: int = 16
    repeats: int = 5
    warm_steps: int = 8  # tokens each stream receives before anything is measured
    decode_steps: int = 24  # the decode window, in steps
    window_steps: int = 4  # the decode window's samples: mean gaps over this many steps
    settle_steps: int = 3  # plain decode steps between two injections
    max_tokens: int = 1500  # decoding streams' output cap (they are stopped before)
    prefill: bool = True  # also the B = 0 points (lone prompts)
    seed: int = 0
    # A shared machine only ever slows a step down: "min" (the default) keeps the fastest
    # repeat, the step undisturbed; "median" the typical one.
    statistic: str = "min"

    def __post_init__(self) -> None:
        if not self.batches or min(self.batches) < 1:
            raise BstarError("batches must be at least 1")
        if not self.chunk_tokens or min(self.chunk_tokens) < 2:
            raise BstarError("chunk tokens must be at least 2 (one token is a decode)")
        if self.repeats < 1 or self.decode_steps < 2 or self.warm_steps < 1:
            raise BstarError("repeats, decode_steps and warm_steps must be positive")
        if not 1 <= self.window_steps <= self.decode_steps:
            raise BstarError("window_steps must be in 1..decode_steps")
        if self.statistic not in STATISTICS:
            raise BstarError(f"statistic must be one of {', '.join(STATISTICS)}")
        needed = self.warm_steps + self.decode_steps + len(self.chunk_tokens) * self.repeats * (
            self.settle_steps + 2) + 8
        if self.max_tokens < needed:
            raise BstarError(f"max_tokens {self.max_tokens} is too short for the schedule "
                             f"(needs about {needed} steps per batch)")


# ---- the pure part: which gap is the mixed step -----------------------------------------
def gap_at(times: Sequence[float], t: float) -> tuple[int, float] | None:
    """In one stream's token arrival times, the token nearest `t` (0-based index) and the
    gap that ends at it; None when that token is the stream's first (no gap)."""
    if len(times) < 2:
        return None
    i = min(range(len(times)), key=lambda k: abs(times[k] - t))
    if i < 1:
        return None
    return i, times[i] - times[i - 1]


def mixed_gap(streams: Sequence[Sequence[float]], t_first: float,
              prompt_tokens: Sequence[int]) -> tuple[float, int] | None:
    """The step that ran a chunk whose request's first token came at `t_first`: the median
    over the decoding streams of the gap ending at each one's token nearest `t_first`, and
    their mean context after that step (prompt + m - 1 for the m-th token)."""
    gaps, ctx = [], []
    for times, p in zip(streams, prompt_tokens, strict=True):
        g = gap_at(times, t_first)
        if g is None:
            return None
        gaps.append(g[1])
        ctx.append(p + (g[0] + 1) - 1)
    return statistics.median(gaps), round(statistics.fmean(ctx))


def window_means(streams: Sequence[Sequence[float]], first: int, last: int, window: int,
                 prompt_tokens: Sequence[int]) -> tuple[list[float], int]:
    """The decode step over tokens first..last (0-based) of every stream, as consecutive
    windows of `window` steps: per window the mean gap (its duration / window: a token the
    client read late shortens the next gap as much as it lengthened its own, so only the
    window's ends carry client jitter), the median over the streams (in lockstep: the
    same steps). Also the streams' mean context over those steps."""
    n = min(len(t) for t in streams)
    last = min(last, n - 1)
    samples = []
    a = max(1, first) - 1
    while a + window <= last:
        samples.append(statistics.median((t[a + window] - t[a]) / window for t in streams))
        a += window
    if not samples:
        raise BstarError("no decode window (streams ended early?)")
    ctx = statistics.fmean(p + i for p in prompt_tokens for i in range(max(1, first), a + 1))
    return samples, round(ctx)


def pick(samples: Sequence[float], statistic: str) -> float:
    return min(samples) if statistic == "min" else statistics.median(samples)


# ---- the live part ----------------------------------------------------------------------
@dataclass(slots=True)
class _Stream:
    """One long decoding stream: arrival times (perf_counter) of its token events."""

    prompt_tokens: int
    times: list[float] = field(default_factory=list)
    error: str | None = None
    done: bool = False


async def _decode_stream(client: OpenAIClient, spec: RequestSpec, st: _Stream,
                         stop: asyncio.Event) -> None:
    """Stream `spec` until `stop` is set (closing the connection aborts the request)."""
    import aiohttp

    # The client's session and headers: one connection pool for the whole measurement.
    session, headers = client._session, client._headers
    body = json.dumps(client.body_for(spec))
    try:
        async with session.post(client.base_url + client.path, data=body,
                                headers=headers) as resp:
            if resp.status != 200:
                st.error = clip(f"HTTP {resp.status}: {await resp.text()}", 200)
                return
            async for raw in resp.content:
                if stop.is_set():
                    return
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    return
                try:
                    event = json.loads(data)
                except ValueError:
                    continue
                for choice in event.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if choice.get("text") or delta.get("content"):
                        st.times.append(time.perf_counter())
                        break
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        st.error = f"{type(e).__name__}: {e}"
    finally:
        st.done = True


async def _wait_tokens(streams: Sequence[_Stream], count: int, timeout_s: float) -> None:
    """Until every stream has `count` tokens; raises if one ended or it takes too long."""
    t_end = time.monotonic() + timeout_s
    while True:
        if all(len(s.times) >= count for s in streams):
            return
        for s in streams:
            if s.done and len(s.times) < count:
                raise BstarError(f"a decoding stream ended after {len(s.times)} tokens"
                                 + (f": {s.error}" if s.error else ""))
        if time.monotonic() > t_end:
            raise BstarError(f"decoding streams did not reach {count} tokens in "
                             f"{timeout_s:g} s")
        await asyncio.sleep(0.002)


class _Prompts:
    """Prompts of exact token counts (the server's tokenizer, as the sweep's workload)."""

    def __init__(self, client: OpenAIClient, seed: int) -> None:
        from bstar.loadgen.workload import TokenCounter

        self.counter = TokenCounter(client)
        self.seed = seed
        self.cpt = 1.0
        self.n = 0

    async def setup(self) -> None:
        from bstar.loadgen.workload import random_text

        await self.counter.setup(chat=False)
        probe = random_text(random.Random(self.seed), 200)
        self.cpt = 200 / max(1, await self.counter.count(probe))

    async def make(self, tokens: int) -> tuple[str, int]:
        from bstar.loadgen.workload import fit_prompt

        self.n += 1
        rng = random.Random(f"mixed:{self.seed}:{self.n}")

        async def count(t: str) -> int:
            return await self.counter.count(t)

        return await fit_prompt(count, rng, tokens, self.cpt)


async def _lone_ttft(client: OpenAIClient, prompt: str) -> float:
    rec = await client.send(RequestSpec(0, 1, prompt=prompt))
    if not rec.ok or rec.ttft_s is None:
        raise BstarError(f"a lone request failed: {rec.error_kind}: {rec.error}")
    return rec.ttft_s


async def _with_streams(client: OpenAIClient, prompts: _Prompts, cfg: MixedConfig, b: int,
                        say: Callable[[str], None]) -> list[StepSample]:
    """B decoding streams: their decode step, then one mixed step per chunk x repeat."""
    specs, lens = [], []
    for _ in range(b):
        text, n = await prompts.make(cfg.decode_prompt_tokens)
        specs.append(RequestSpec(0, cfg.max_tokens, prompt=text))
        lens.append(n)
    streams = [_Stream(n) for n in lens]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_decode_stream(client, s, st, stop))
             for s, st in zip(specs, streams, strict=True)]
    out: list[StepSample] = []
    try:
        first = cfg.warm_steps
        await _wait_tokens(streams, first + cfg.decode_steps + 1, 600.0)
        means, ctx = window_means([s.times for s in streams], first + 1,
                                  first + cfg.decode_steps, cfg.window_steps, lens)
        out.append(StepSample("decode", b, ctx, 0, 0, pick(means, cfg.statistic),
                              tuple(means)))
        say(f"  decode B={b}: {out[-1].step_s * 1e3:.2f} ms at context {ctx}")
        # Prompts first (tokenizing costs the server CPU), then the injections.
        inject = [(n, await prompts.make(n)) for n in cfg.chunk_tokens
                  for _ in range(cfg.repeats)]
        samples: dict[int, list[tuple[float, int]]] = {}
        chunk_len: dict[int, int] = {}
        for n, (text, got) in inject:
            base = min(len(s.times) for s in streams)
            await _wait_tokens(streams, base + cfg.settle_steps, 600.0)
            t0 = time.perf_counter()
            ttft = await _lone_ttft(client, text)
            t_first = t0 + ttft
            await _wait_tokens(streams, max(len(s.times) for s in streams) + 1, 600.0)
            g = mixed_gap([s.times for s in streams], t_first, lens)
            if g is not None:
                samples.setdefault(n, []).append(g)
                chunk_len[n] = got
        for n, gs in samples.items():
            steps = tuple(x for x, _ in gs)
            ctx = round(statistics.fmean(c for _, c in gs))
            out.append(StepSample("mixed", b, ctx, chunk_len[n], 0,
                                  pick(steps, cfg.statistic), steps))
            say(f"  mixed B={b} n={chunk_len[n]}: {out[-1].step_s * 1e3:.2f} ms "
                f"({len(steps)} repeats, spread {out[-1].spread:.0%})")
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return out


async def measure_steps_async(client: OpenAIClient, cfg: MixedConfig,
                              say: Callable[[str], None] = lambda s: None) -> list[StepSample]:
    """Decode, mixed and (cfg.prefill) prefill samples from the server behind `client`
    (entered: `async with client`). The server must run at least max(batches) + 1
    sequences at once."""
    prompts = _Prompts(client, cfg.seed)
    await prompts.setup()
    # Warm the server up (first requests pay one-off costs).
    for _ in range(2):
        await _lone_ttft(client, (await prompts.make(cfg.decode_prompt_tokens))[0])
    out: list[StepSample] = []
    for b in cfg.batches:
        out += await _with_streams(client, prompts, cfg, b, say)
    if cfg.prefill:
        decode1 = [s for s in out if s.kind == "decode" and s.batch == 1]
        if decode1:
            step1 = decode1[0].step_s
        else:
            one_batch = replace(cfg, batches=(1,), chunk_tokens=cfg.chunk_tokens[:1], repeats=1,
                                prefill=False)
            step1 = next(s for s in await _with_streams(client, prompts, one_batch, 1, say)
                         if s.kind == "decode").step_s
        one = [await _lone_ttft(client, (await prompts.make(1))[0])
               for _ in range(cfg.repeats)]
        network_s = max(0.0, pick(one, cfg.statistic) - step1)
        say(f"  network + API per request: {network_s * 1e3:.2f} ms (TTFT of a one-token "
            f"prompt {pick(one, cfg.statistic) * 1e3:.2f} ms - decode step at B=1)")
        for n in cfg.chunk_tokens:
            ttfts, got = [], n
            for _ in range(cfg.repeats):
                text, got = await prompts.make(n)
                ttfts.append(await _lone_ttft(client, text) - network_s)
            steps = tuple(ttfts)
            out.append(StepSample("prefill", 0, got, got, 0, pick(steps, cfg.statistic),
                                  steps))
            say(f"  prefill n={got}: {out[-1].step_s * 1e3:.2f} ms")
    return out


def measure_steps(url: str, model: str, cfg: MixedConfig | None = None, *,
                  endpoint: str = "completions", api_key: str | None = None,
                  say: Callable[[str], None] = lambda s: None) -> list[StepSample]:
    """Blocking wrapper: connect to `url` (served model `model`) and measure."""
    cfg = cfg or MixedConfig()

    async def run() -> list[StepSample]:
        async with OpenAIClient(url, model, endpoint="completions" if endpoint != "chat"
                                else "chat", api_key=api_key,
                                extra_body={"ignore_eos": True}) as client:
            return await measure_steps_async(client, cfg, say)

    return run_loop(run())


# ---- the points file ---------------------------------------------------------------------
def to_csv(samples: Sequence[StepSample]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for s in samples:
        w.writerow([s.kind, s.batch, s.context_tokens, s.chunk_tokens, s.chunk_start,
                    f"{s.step_s * 1e3:.4f}", len(s.samples_s), f"{min(s.samples_s) * 1e3:.4f}",
                    f"{s.median_s * 1e3:.4f}", f"{max(s.samples_s) * 1e3:.4f}"])
    return buf.getvalue()


# ---- how well the cost model predicts them ------------------------------------------------
@dataclass(frozen=True, slots=True)
class MixedErrors:
    points: tuple[Any, ...]  # the chunked ones (mixed and prefill), in order
    decode_only: tuple[float, ...]  # relative errors, calibrated on the decode points
    joint: tuple[float, ...]  # calibrated on every point
    decode_cal: Any  # bstar.calibrate.Calibration
    joint_cal: Any

    @staticmethod
    def _median(x: Sequence[float]) -> float:
        return statistics.median(abs(v) for v in x)

    @property
    def decode_only_median(self) -> float:
        return self._median(self.decode_only)

    @property
    def joint_median(self) -> float:
        return self._median(self.joint)

    @property
    def decode_only_max(self) -> float:
        return max(abs(v) for v in self.decode_only)

    @property
    def joint_max(self) -> float:
        return max(abs(v) for v in self.joint)


def decode_vs_joint(d: Any, points: Sequence[Any]) -> MixedErrors:
    """Errors on the points with a prompt chunk, calibrated on the decode points alone and
    on all points (calibrate's default parameters in both: the chunk terms join the
    joint fit). `d`: the deployment (bstar.deployment.Deployment); `points`: calibrate
    Points."""
    from bstar import calibrate as cal

    decode = [p for p in points if not p.mixed]
    chunked = [p for p in points if p.mixed]
    dec = cal.calibrate(d, decode)
    dec_err = tuple(p.rel_error for p in cal.check(d, dec.eff, chunked, dec.bandwidth_scale,
                                                   dec.compute_scale))
    joint = cal.calibrate(d, points)
    joint_err = tuple(p.rel_error for p in cal.check(d, joint.eff, chunked,
                                                     joint.bandwidth_scale,
                                                     joint.compute_scale))
    return MixedErrors(tuple(chunked), dec_err, joint_err, dec, joint)
