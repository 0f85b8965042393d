"""A disaggregated deployment at one load: throughput, decode batch, TTFT's parts and TPOT
(bstar.disaggregate's plan calls it). Pure, no I/O.

For a throughput X: the decode batch b(X) solves D b = X x output x TPOT(b); the prefill
queue is an M/D/1 queue at utilization rho = X / (P mu_p) with service 1 / mu_p; a prompt's
prefill is its own time alone, then the KV transfer, then the first decode step at b(X).
The engine's front-end work per request comes first. A closed loop holds
N = X (TTFT + (output - 1) TPOT) requests (Little's law): X is the root of that below the
deployment's capacity; where even capacity holds fewer than N, the rest wait in front of
the side that binds (docs/disaggregation.md, "At a load").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bstar.errors import BstarError

BUSY = 0.95  # a side past this fraction of its capacity is the one that binds


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """The deployment at one load: throughput, decode batch, TTFT's parts and TPOT."""

    load: str  # "concurrency", "rate" or "unloaded"
    load_value: float
    throughput_req_s: float
    request_overhead_s: float  # the front end's work per request (EngineBehaviour)
    decode_batch: float  # sequences per decode worker (mean)
    prefill_utilization: float
    prefill_queue_s: float
    prefill_s: float
    transfer_s: float
    first_decode_step_s: float
    decode_wait_s: float
    tpot_s: float
    bound: str  # "prefill", "decode" or "none" (neither side full)
    output_tokens: int
    num_gpus: int

    @property
    def ttft_s(self) -> float:
        return (self.request_overhead_s + self.prefill_queue_s + self.prefill_s
                + self.transfer_s + self.first_decode_step_s + self.decode_wait_s)

    def to_dict(self) -> dict[str, Any]:
        return {"load": self.load, "load_value": self.load_value,
                "throughput_req_s": self.throughput_req_s,
                "output_tok_s_per_gpu": self.throughput_req_s * self.output_tokens
                / self.num_gpus,
                "decode_batch_per_worker": self.decode_batch,
                "prefill_utilization": self.prefill_utilization, "bound": self.bound,
                "ttft_ms": self.ttft_s * 1e3,
                "ttft_parts_ms": {"request_overhead": self.request_overhead_s * 1e3,
                                  "prefill_queue": self.prefill_queue_s * 1e3,
                                  "prefill": self.prefill_s * 1e3,
                                  "transfer": self.transfer_s * 1e3,
                                  "first_decode_step": self.first_decode_step_s * 1e3,
                                  "decode_wait": self.decode_wait_s * 1e3},
                "tpot_ms": self.tpot_s * 1e3}


def md1_wait_s(utilization: float, service_s: float) -> float:
    """Mean wait in an M/D/1 queue: rho / (2 (1 - rho)) x service (Pollaczek-Khinchine
    with deterministic service); inf at rho >= 1."""
    if utilization >= 1.0:
        return math.inf
    return utilization / (2.0 * (1.0 - utilization)) * service_s


def decode_batch_for(dec: Any, workers: int, req_s: float) -> float:
    """The per-worker batch b in [0, S] at which `workers` decode workers (`dec`: a
    bstar.disaggregate.DecodeSide) pass `req_s` requests/s: D b / (output x TPOT(b)) =
    req_s (b / TPOT(b) grows with b: bisection)."""
    if req_s <= 0:
        return 0.0
    lo, hi = 0.0, float(dec.batch)
    if workers * dec.req_s_at(hi) <= req_s:
        return hi
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if workers * dec.req_s_at(mid) < req_s:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True, slots=True)
class _Loop:
    """The two sides and the transfer between them, priced at any throughput."""

    pre: Any  # bstar.disaggregate.PrefillSide
    dec: Any  # bstar.disaggregate.DecodeSide
    transfer_s: float
    prefill_workers: int
    decode_workers: int
    num_gpus: int
    request_overhead_s: float

    @property
    def cap_prefill(self) -> float:
        return self.prefill_workers * self.pre.req_s

    @property
    def cap_decode(self) -> float:
        return self.decode_workers * self.dec.req_s

    def cycle_s(self, x: float) -> float:
        """A request's time in the system at throughput x: TTFT and output - 1 more steps
        (output x TPOT: the first decode step is TTFT's last part)."""
        b = decode_batch_for(self.dec, self.decode_workers, x)
        q = md1_wait_s(x / self.cap_prefill, 1.0 / self.pre.req_s)
        return (self.request_overhead_s + q + self.pre.alone_s + self.transfer_s
                + self.dec.output_tokens * self.dec.tpot_at(b))

    def point(self, x: float, load: str, value: float, wait_p: float = 0.0,
              wait_d: float = 0.0, bound: str = "") -> OperatingPoint:
        b = decode_batch_for(self.dec, self.decode_workers, x)
        tpot = self.dec.tpot_at(b)
        rho = x / self.cap_prefill
        q = md1_wait_s(rho, 1.0 / self.pre.req_s)
        if not bound:
            bound = "prefill" if rho >= BUSY else "decode" if b >= BUSY * self.dec.batch \
                else "none"
        return OperatingPoint(load, value, x, self.request_overhead_s, b, min(rho, 1.0),
                              q + wait_p, self.pre.alone_s, self.transfer_s, tpot, wait_d,
                              tpot, bound, self.dec.output_tokens, self.num_gpus)


def operating_point(pre: Any, dec: Any, transfer: Any, prefill_workers: int,
                    decode_workers: int, num_gpus: int, *, request_overhead_s: float = 0.0,
                    concurrency: int | None = None,
                    rate_req_s: float | None = None) -> OperatingPoint:
    """The deployment at a closed loop of `concurrency` users or an open `rate_req_s`
    (neither: unloaded, one request alone through decode batches at their cap); the module
    docstring says how. `pre`, `dec`: bstar.disaggregate's PrefillSide and DecodeSide;
    `transfer`: a bstar.kv_link.KvTransfer."""
    loop = _Loop(pre, dec, transfer.transfer_s, prefill_workers, decode_workers, num_gpus,
                 request_overhead_s)
    capacity = min(loop.cap_prefill, loop.cap_decode)
    bound_side = "prefill" if loop.cap_prefill < loop.cap_decode else "decode"
    if rate_req_s is not None:
        if not rate_req_s > 0:
            raise BstarError(f"--rate must be positive, got {rate_req_s}")
        if rate_req_s >= capacity:
            raise BstarError(
                f"--rate {rate_req_s:g} requests/s is at or past the deployment's capacity "
                f"{capacity:.3g} requests/s ({bound_side} binds: prefill "
                f"{loop.cap_prefill:.3g}, decode {loop.cap_decode:.3g}); add {bound_side} "
                "workers")
        return loop.point(rate_req_s, "rate", rate_req_s)
    if concurrency is None:
        return OperatingPoint("unloaded", 0.0, 0.0, request_overhead_s, float(dec.batch), 0.0,
                              0.0, pre.alone_s, transfer.transfer_s, dec.tpot_s, 0.0,
                              dec.tpot_s, "none", dec.output_tokens, num_gpus)
    if concurrency < 1:
        raise BstarError(f"--concurrency must be at least 1, got {concurrency}")
    top = capacity * (1.0 - 1e-9)
    if top * loop.cycle_s(top) <= concurrency:  # the binding side full: the rest wait
        extra = max(concurrency / top - loop.cycle_s(top), 0.0)
        if bound_side == "prefill":
            return loop.point(top, "concurrency", concurrency, wait_p=extra, bound="prefill")
        return loop.point(top, "concurrency", concurrency, wait_d=extra, bound="decode")
    lo, hi = 0.0, top
    for _ in range(100):  # Little's law: x x cycle(x) grows with x
        mid = 0.5 * (lo + hi)
        if mid * loop.cycle_s(mid) < concurrency:
            lo = mid
        else:
            hi = mid
    return loop.point(hi, "concurrency", concurrency)
