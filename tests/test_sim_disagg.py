"""The two-pool simulation (bstar.sim.disagg): TTFT's parts one request at a time, the decode
side admitting a request only once its KV has arrived, the decode cap, and the command."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bstar import roofline as rl
from bstar.disaggregate import DisaggregatedDeployment, WorkerSpec, plan_disaggregated
from bstar.kv_link import KvLink
from bstar.options import DeploymentOptions
from bstar.sim.disagg import PoolSpec, simulate_disaggregated, simulate_plan

ROOT = Path(__file__).resolve().parents[1]
DSR1 = DeploymentOptions(model="deepseek-r1", gpu="h200", engine="sglang", kv_dtype="fp8")


def _plan(decode_cap: int = 16, decode_workers: int = 1) -> object:
    dd = DisaggregatedDeployment(DSR1, WorkerSpec(1, 8),
                                 WorkerSpec(decode_workers, 8, max_num_seqs=decode_cap))
    return plan_disaggregated(dd, 2048, 16, concurrency=1)


def test_one_user_sees_overhead_prefill_transfer_and_one_decode_step() -> None:
    p = _plan()
    res = simulate_plan(p, num_requests=3, prompt_len=(2048, 2048), output_len=(16, 16),
                        concurrency=1)
    d = p.decode_d  # type: ignore[attr-defined]
    beh = p.prefill_d.behaviour  # type: ignore[attr-defined]
    first_step = float(rl.decode_step(d, [1], 2049).step_s[0])
    want = (beh.request_overhead_s + beh.front_token_s * 2048 + p.prefill.alone_s  # type: ignore
            + p.transfer.transfer_s + first_step)  # type: ignore[attr-defined]
    assert res.ttft_s == pytest.approx(np.full(3, want), rel=1e-9)
    assert np.all(res.prefill_wait_s == pytest.approx(0.0, abs=1e-12))
    # TPOT: the mean of 15 one-sequence steps at contexts 2050..2064
    steps = [float(rl.decode_step(d, [1], c).step_s[0]) for c in range(2050, 2065)]
    assert res.tpot_s == pytest.approx(np.full(3, np.mean(steps)), rel=1e-9)


def test_decode_admits_only_once_the_kv_has_arrived() -> None:
    p = _plan()
    dd = p.deployment  # type: ignore[attr-defined]
    pre = PoolSpec(p.prefill_d, 1, 1_000_000, 8192)  # type: ignore[attr-defined]
    dec = PoolSpec(p.decode_d, 1, 16, 0)  # type: ignore[attr-defined]
    base = p.transfer.link  # type: ignore[attr-defined]
    slow = KvLink("test", "slow", base.bytes_s, 0.5, "test")
    kw = {"num_requests": 4, "prompt_len": (2048, 2048), "output_len": (16, 16),
          "concurrency": 1, "attention_tp": dd.decode.attention_tp}
    fast_r = simulate_disaggregated(pre, dec, replace(base, latency_s=0.0), **kw)
    slow_r = simulate_disaggregated(pre, dec, slow, **kw)
    assert slow_r.ttft_s - fast_r.ttft_s == pytest.approx(np.full(4, 0.5), rel=1e-9)
    # the first token is one decode step after the KV arrived, never before
    assert np.all(slow_r.kv_to_first_token_s > 0)


def test_a_full_decode_worker_keeps_arrivals_waiting() -> None:
    p = _plan(decode_cap=2)
    res = simulate_plan(p, num_requests=16, prompt_len=(2048, 2048), output_len=(16, 16),
                        concurrency=8)
    step2 = float(rl.decode_step(p.decode_d, [2], 2060).step_s[0])  # type: ignore
    # at most 2 run: a step is never priced above 2 sequences' step
    assert res.tpot_s.max() <= step2 * 1.01
    assert res.kv_to_first_token_s.mean() > 5 * step2  # waiting for a slot


def test_seeded_and_deterministic() -> None:
    p = _plan(decode_workers=2)
    kw = {"num_requests": 40, "prompt_len": (1500, 2048), "output_len": (8, 16),
          "concurrency": 8}
    a = simulate_plan(p, seed=1, **kw)
    b = simulate_plan(p, seed=1, **kw)
    c = simulate_plan(p, seed=2, **kw)
    assert np.array_equal(a.ttft_s, b.ttft_s) and not np.array_equal(a.ttft_s, c.ttft_s)
    r = simulate_plan(p, num_requests=40, prompt_len=(2048, 2048), output_len=(16, 16),
                      rate_req_s=2.0, seed=3)
    assert r.requests == 40 and np.all(r.ttft_s > 0)


def test_simulate_disaggregate_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bstar", "simulate", "--model", "deepseek-r1", "--gpu", "h200",
         "--engine", "sglang", "--kv-dtype", "fp8", "--disaggregate", "--prefill-tp", "8",
         "--decode-tp", "8", "--decode-workers", "2", "--decode-max-num-seqs", "8",
         "--prompt-tokens", "1024", "--output-tokens", "8", "--concurrency", "4", "--json"],
        capture_output=True, text=True, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["layout"] == "disaggregated" and d["simulation"]["requests"] == 40
    assert d["simulation"]["ttft"]["mean_ms"] > d["transfer"]["transfer_ms"]
