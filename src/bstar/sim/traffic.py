"""Traffic: length distributions and arrival strategies (open-loop Poisson, closed-loop users,
a trace). Small strategy objects; the random generator is passed in, never global, so a seed
reproduces a run. Pure: a trace is parsed from text, reading the file is the caller's job.

Every request's lengths are drawn up front, in request order, so the same seed gives the same
requests whatever the scheduler does with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bstar.errors import BstarError
from bstar.sim.prefix import PromptIds

# The longest prompt or output a length or a trace may name: far past any model's context,
# small enough that token arithmetic (KV blocks, FLOPs) stays exact and finite.
MAX_TOKENS = 100_000_000
MAX_ARRIVAL_S = 1e11  # seconds: past any epoch timestamp; finite is what matters

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


# ---- lengths ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Lengths:
    """A token-length distribution: fixed, uniform, normal, lognormal or empirical.

    normal and lognormal take the mean and standard deviation of the lengths themselves (not
    of their logarithm); draws are rounded and clipped to at least 1 token.
    """

    kind: str
    mean: float = 0.0
    std: float = 0.0
    low: int = 0
    high: int = 0
    values: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind == "fixed" and self.low < 1:
            raise BstarError(f"a fixed length must be at least 1 token, got {self.low}")
        if self.kind == "uniform" and not 1 <= self.low <= self.high:
            raise BstarError(f"uniform lengths need 1 <= low <= high, got {self.low}..{self.high}")
        if self.kind in ("normal", "lognormal") and not (
                1 <= self.mean <= MAX_TOKENS and 0 <= self.std <= MAX_TOKENS):
            raise BstarError(f"{self.kind} lengths need 1 <= mean <= {MAX_TOKENS} and "
                             f"0 <= std <= {MAX_TOKENS} (finite), got {self.mean:g}:"
                             f"{self.std:g}")
        if max(self.low, self.high, *self.values, 0) > MAX_TOKENS:
            raise BstarError(f"lengths must be at most {MAX_TOKENS} tokens")
        if self.kind == "empirical" and (not self.values or min(self.values) < 1):
            raise BstarError("an empirical length list needs positive integers")
        if self.kind not in ("fixed", "uniform", "normal", "lognormal", "empirical"):
            raise BstarError(f"unknown length distribution {self.kind!r}")

    @staticmethod
    def fixed(n: int) -> Lengths:
        return Lengths("fixed", low=n, high=n)

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        if self.kind == "fixed":
            return np.full(n, self.low, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)
        if self.kind == "empirical":
            return rng.choice(np.asarray(self.values, dtype=np.int64), size=n)
        if self.kind == "normal":
            x = rng.normal(self.mean, self.std, size=n)
        else:
            # Lognormal with the given mean m and std s of the lengths:
            # sigma^2 = ln(1 + s^2/m^2), mu = ln m - sigma^2/2.
            sigma2 = math.log1p((self.std / self.mean) ** 2)
            x = rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), size=n)
        return np.clip(np.rint(x), 1, MAX_TOKENS).astype(np.int64)

    @property
    def max_tokens(self) -> int | None:
        """The largest length this can draw (None: unbounded above)."""
        if self.kind in ("fixed", "uniform"):
            return self.high
        if self.kind == "empirical":
            return max(self.values)
        return None

    def describe(self) -> str:
        return {"fixed": f"{self.low}", "uniform": f"uniform {self.low}..{self.high}",
                "normal": f"normal mean {self.mean:g} std {self.std:g}",
                "lognormal": f"lognormal mean {self.mean:g} std {self.std:g}",
                "empirical": f"empirical ({len(self.values)} values)"}[self.kind]


def parse_lengths(text: str, flag: str = "") -> Lengths:
    """'512', 'uniform:256:768', 'normal:512:128', 'lognormal:512:256',
    'empirical:100,220,512'. `flag` ('--input-len') names the source in errors."""
    try:
        return _parse_lengths(text)
    except BstarError as e:
        raise BstarError(f"{flag} {text!r}: {e}" if flag else str(e)) from None


def _parse_lengths(text: str) -> Lengths:
    t = text.strip().lower()
    try:
        if ":" not in t:
            return Lengths.fixed(int(t))
        kind, _, rest = t.partition(":")
        if kind == "fixed":
            return Lengths.fixed(int(rest))
        if kind == "uniform":
            lo, hi = rest.split(":")
            return Lengths("uniform", low=int(lo), high=int(hi))
        if kind in ("normal", "lognormal"):
            mean, std = rest.split(":")
            return Lengths(kind, mean=float(mean), std=float(std))
        if kind == "empirical":
            return Lengths("empirical", values=tuple(int(v) for v in rest.split(",") if v))
    except BstarError:
        raise
    except ValueError:
        pass
    raise BstarError(f"cannot read length {text!r}: use N, uniform:LO:HI, normal:MEAN:STD, "
                     "lognormal:MEAN:STD or empirical:N1,N2,...")


# ---- arrivals --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Workload:
    """The requests of one run: lengths per request, and either arrival times (open loop) or
    a closed loop of `num_users` that each send the next request `think_s` after the last one
    finished."""

    prompt_tokens: IntArray
    output_tokens: IntArray
    arrival_s: FloatArray | None = None  # open loop; None for closed loop
    num_users: int = 0
    think_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    # Prompt tokens whose KV a prefix cache already holds (vLLM's automatic prefix caching:
    # whole blocks of a shared prefix); None = no hits. Prefill computes only the rest.
    cached_tokens: IntArray | None = None
    # Which prompts share which tokens (`bstar.sim.prefix`): the prefix cache finds the hits.
    # None: every prompt distinct.
    prompt_ids: PromptIds | None = None

    @property
    def num_requests(self) -> int:
        return int(self.prompt_tokens.size)

    @property
    def closed_loop(self) -> bool:
        return self.arrival_s is None


@dataclass(frozen=True, slots=True)
class Poisson:
    """Open loop: exponential gaps at `rate_per_s` (vLLM's benchmark with --request-rate)."""

    rate_per_s: float

    def __post_init__(self) -> None:
        if not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise BstarError(f"--rate must be a positive number of requests/s, got "
                             f"{self.rate_per_s}")

    def arrivals(self, rng: np.random.Generator, n: int) -> FloatArray:
        from bstar.stats import poisson_gaps_s

        return np.cumsum(poisson_gaps_s(self.rate_per_s, rng, n))

    def describe(self) -> str:
        return f"Poisson {self.rate_per_s:g} req/s"


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """`num_users` users, each with one request in flight, waiting `think_s` (exponential
    with that mean when `random_think`) between a response and the next request.
    With think 0 this is the load generator's fixed concurrency."""

    num_users: int
    think_s: float = 0.0
    random_think: bool = False

    def __post_init__(self) -> None:
        if self.num_users < 1:
            raise BstarError(f"--concurrency must be at least 1, got {self.num_users}")
        if not (self.think_s >= 0 and math.isfinite(self.think_s)):
            raise BstarError(f"think time must not be negative, got {self.think_s}")

    def think(self, rng: np.random.Generator, n: int) -> FloatArray:
        if self.random_think and self.think_s > 0:
            return rng.exponential(self.think_s, size=n)
        return np.full(n, self.think_s)

    def describe(self) -> str:
        return f"{self.num_users} users" + (f", think {self.think_s:g} s" if self.think_s else "")


@dataclass(frozen=True, slots=True)
class Trace:
    """Arrival times and lengths replayed as given (open loop)."""

    arrival_s: tuple[float, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    prompt_ids: PromptIds | None = None  # which prompts share which tokens, if it says
    format: str = "bstar"  # bstar, mooncake, azure, burstgpt (bstar.sim.trace_formats)
    dropped: int = 0  # rows left out: no prompt or no output tokens (failed requests)

    def describe(self) -> str:
        extra = f", {self.dropped} without tokens left out" if self.dropped else ""
        return f"{self.format} trace of {len(self.arrival_s)} requests{extra}"


Arrivals = Poisson | ClosedLoop | Trace


def make_workload(arrivals: Arrivals, input_len: Lengths, output_len: Lengths,
                  num_requests: int, rng: np.random.Generator) -> Workload:
    if num_requests < 1:
        raise BstarError(f"--num-requests must be at least 1, got {num_requests}")
    if isinstance(arrivals, Trace):
        # The earliest `num_requests` arrivals, in time order.
        order = np.argsort(np.asarray(arrivals.arrival_s), kind="stable")[:num_requests]
        ids = arrivals.prompt_ids
        return Workload(np.asarray(arrivals.prompt_tokens, dtype=np.int64)[order],
                        np.asarray(arrivals.output_tokens, dtype=np.int64)[order],
                        np.asarray(arrivals.arrival_s, dtype=np.float64)[order],
                        prompt_ids=None if ids is None else ids.take(order))
    inp = input_len.sample(rng, num_requests)
    out = output_len.sample(rng, num_requests)
    if isinstance(arrivals, Poisson):
        return Workload(inp, out, arrivals.arrivals(rng, num_requests))
    return Workload(inp, out, None, arrivals.num_users, arrivals.think(rng, num_requests))


def read_trace_file(path: str) -> Trace:
    """The trace file at `path` (a user's file: read through `safeio`, bounded), parsed by
    `parse_trace`; an error names the file."""
    from bstar import safeio

    data = safeio.read_bytes(path, safeio.MAX_TRACE_BYTES, "trace")
    try:
        return parse_trace(data)
    except BstarError as e:
        raise BstarError(f"--trace {path}: {e}") from None


def parse_trace(text: str | bytes) -> Trace:
    """A trace in any format `bstar.sim.trace_formats` reads (bstar's own CSV or JSON lines
    with arrival_s, prompt_tokens, output_tokens; Mooncake; Azure; BurstGPT), told by its
    header. Bytes are read as UTF-8 (a byte-order mark is allowed); every arrival must be
    finite, every length in range."""
    from bstar.sim.trace_formats import identity, read_trace

    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise BstarError(f"the trace is not UTF-8 text (byte {e.start})") from None
    text = text.removeprefix("\ufeff")
    try:
        fmt, rows, dropped = read_trace(text)
    except BstarError as e:
        raise BstarError(f"cannot read the trace: {e}") from None
    if not rows:
        raise BstarError("the trace has no requests")
    for n, (t, i_, o_, _) in enumerate(rows, 1):
        # NaN and infinities would stall the simulator's clock (issue 19): refuse them here.
        if not (math.isfinite(t) and 0 <= t <= MAX_ARRIVAL_S):
            raise BstarError(f"the trace's request {n}: arrival_s must be a finite number "
                             f"of seconds in 0..{MAX_ARRIVAL_S:g}, got {t!r}")
        if not (1 <= i_ <= MAX_TOKENS and 1 <= o_ <= MAX_TOKENS):
            raise BstarError(f"the trace's request {n}: prompt_tokens and output_tokens must "
                             f"be in 1..{MAX_TOKENS}, got {i_}, {o_}")
    return Trace(tuple(r[0] for r in rows), tuple(r[1] for r in rows),
                 tuple(r[2] for r in rows), identity(rows), fmt, dropped)
