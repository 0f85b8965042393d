"""Which regime each sweep level ran in, from the server's own /metrics, and where the KV
pool runs out (regime 3, seed 000): measured B_mem beside bstar's, the preemption onset.

Per level (the scraper's figures, loadgen/scrape.py):
- regime 3, "memory-exhausted": the engine preempted (vllm:num_preemptions_total rose,
  sglang retracted), or the KV pool sat at >= KV_FULL with requests waiting while fewer
  than max_num_seqs ran (the pool, not the cap, held them back);
- "batch-capped": requests waited while max_num_seqs ran (the cap, not the pool): seen by
  the scrapes (waiting > 0 while running reached the cap) or by the engine's counters,
  which no sampling misses (more streams open than the cap, and its steps carrying at least
  CAP_FULL x the cap's tokens on average);
- otherwise the batch fit: the cost model's regime at that batch names the rest.

The run (`analyze`): the measured B_mem (the server's num_gpu_blocks x block_size over the
blocks a sequence of input + output tokens takes), bstar's B_mem for the run's model and
that pool (bstar.kvcheck), the first level with preemptions, and one verdict sentence.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bstar.fit.points import level_batch
from bstar.roofline import REGIMES

KV_FULL = 0.95  # KV usage at or above this counts as full
CAP_FULL = 0.9  # mean tokens per step at or above this x max_num_seqs: the cap ran full
REGIME3 = REGIMES[3]  # "memory-exhausted"


def classify_level(lv: dict[str, Any], predicted_regime: str | None = None
                   ) -> dict[str, Any]:
    """The regime of one level (a level of the sweep --json contract) and why."""
    pre = lv.get("preemptions")
    kv = lv.get("kv_cache_usage_max")
    run = lv.get("running_max")
    wait = lv.get("waiting_max")
    # The batch cap: vLLM's max_num_seqs, or llama.cpp's slots (/slots).
    cap = lv.get("max_num_seqs") or (lv.get("server") or {}).get("slots")
    kv_s = f"KV max {100 * kv:.0f}%" if kv is not None else "KV usage not exported"
    run_s = f"{run:.0f} running" if run is not None else "running not exported"
    wait_s = f"{wait:.0f} waiting" if wait is not None else "waiting not exported"
    evidence = f"{pre if pre is not None else '?'} preemptions, {kv_s}, {run_s}, {wait_s}"
    if pre:
        return {"regime": REGIME3, "number": 3, "evidence": evidence,
                "reason": "the KV pool ran out: the engine preempted running sequences"}
    if (kv is not None and kv >= KV_FULL and wait and run is not None
            and (cap is None or run < cap)):
        return {"regime": REGIME3, "number": 3, "evidence": evidence,
                "reason": "the KV pool is full and requests wait for blocks below "
                          "max_num_seqs"}
    # The engine's step and token counters read at the level's ends: a loaded machine's
    # scrapes can miss the moments the queue and the cap show, the counters cannot.
    tps = (lv.get("server") or {}).get("tokens_per_step")
    conc = lv.get("concurrency")
    if tps is not None:
        evidence += f", {tps:.2f} tokens per step"
    counted = (cap is not None and tps is not None and conc is not None and conc > cap
               and tps >= CAP_FULL * cap)
    if (wait and cap is not None and run is not None and run >= cap) or counted:
        return {"regime": "batch-capped", "number": None, "evidence": evidence,
                "reason": f"max_num_seqs {cap} caps the batch; the KV pool has room"}
    reason = "the batch fits the KV pool"
    if predicted_regime:
        reason += f"; the cost model calls it {predicted_regime}"
    number = REGIMES.index(predicted_regime) if predicted_regime in REGIMES else None
    return {"regime": predicted_regime or "fits", "number": number, "evidence": evidence,
            "reason": reason}


def _deployment(options: dict[str, Any]) -> Any:
    if not (options.get("model") and options.get("gpu")):
        return None
    from bstar.options import DeploymentOptions

    with contextlib.suppress(Exception):  # a stored model/GPU file may be gone
        return DeploymentOptions.from_sweep_options(options).build()
    return None


def analyze(sweep: dict[str, Any], predicted_regimes: dict[int, str] | None = None,
            deployment: Any = None) -> dict[str, Any] | None:
    """The regime-3 verdict of a sweep (its --json dict): None when no level has server
    metrics. `predicted_regimes`: level idx -> the cost model's regime at its batch."""
    levels = [lv for lv in sweep.get("levels") or [] if lv.get("requests")]
    if not any(lv.get("server") for lv in levels):
        return None
    opts = sweep.get("options") or {}
    tokens = int(opts.get("input_len") or 0) + int(opts.get("output_len") or 0)
    per_level = []
    for i, lv in enumerate(sweep.get("levels") or []):
        c = classify_level(lv, (predicted_regimes or {}).get(i))
        per_level.append({"idx": i, "x": level_batch(lv), **c})
    srv = next((lv["server"] for lv in reversed(levels)
                if (lv.get("server") or {}).get("num_gpu_blocks")
                or (lv.get("server") or {}).get("kv_cache_size_tokens")
                or (lv.get("server") or {}).get("slot_ctx_tokens")), None)
    out: dict[str, Any] = {"tokens_per_seq": tokens, "measured_b_mem": None,
                           "measured_source": None, "computed_b_mem": None,
                           "computed_source": None, "kv_check": None}
    if srv and tokens:
        from bstar.kvcheck import b_mem_blocks

        blocks, bs = srv.get("num_gpu_blocks"), srv.get("block_size")
        if blocks and bs:
            out["measured_b_mem"] = b_mem_blocks(blocks, bs, tokens)
            out["measured_source"] = (f"vllm:cache_config_info: {blocks:,} blocks x {bs} "
                                      f"tokens, {-(-tokens // bs)} blocks a {tokens:,}-token "
                                      "sequence")
        elif srv.get("slots") and srv.get("slot_ctx_tokens"):
            # llama.cpp: each slot owns a fixed share of the context (n_ctx / n_parallel).
            n, ctx = int(srv["slots"]), int(srv["slot_ctx_tokens"])
            out["measured_b_mem"] = n if ctx >= tokens else 0
            out["measured_source"] = (f"llama.cpp /slots: {n} slots of {ctx:,} tokens, one "
                                      f"{tokens:,}-token sequence a slot")
        elif srv.get("kv_cache_size_tokens"):
            kt = int(srv["kv_cache_size_tokens"])
            out["measured_b_mem"] = kt // tokens
            out["measured_source"] = f"KV pool of {kt:,} tokens / {tokens:,} a sequence"
        d = deployment if deployment is not None else _deployment(opts)
        if d is not None and blocks and bs:
            from bstar.kvcheck import ServerPool, check_kv

            pool = ServerPool(srv.get("engine"), blocks, bs, srv.get("kv_cache_memory_bytes"),
                              srv.get("kv_cache_size_tokens"))
            with contextlib.suppress(Exception):
                chk = check_kv(d, pool, tokens)
                out["computed_b_mem"] = chk.computed_b_mem
                out["computed_source"] = (
                    f"{d.model.name}, {chk.kv_bytes_per_token:,} B/token, "
                    + ("the server's explicit pool" if chk.computed_pool_source == "explicit"
                       else "memory x util - weights - reserve")
                    + f" of {chk.computed_pool_bytes:,} B")
                out["kv_check"] = chk.to_dict()
    xs = [p for p in per_level if p["x"] is not None and levels_by_idx(sweep, p["idx"])]
    xs.sort(key=lambda p: p["x"])
    onset = next((p["x"] for p in xs if (sweep["levels"][p["idx"]].get("preemptions") or 0)
                  > 0), None)
    r3 = [p["x"] for p in xs if p["number"] == 3]
    out.update({"preemption_onset": onset, "regime3_levels": r3, "levels": per_level,
                "axis": "max_num_seqs" if any(lv.get("max_num_seqs") is not None
                                              for lv in levels) else "concurrency"})
    out["verdict"] = verdict_text(out, sweep)
    return out


def levels_by_idx(sweep: dict[str, Any], idx: int) -> bool:
    lv = (sweep.get("levels") or [])[idx]
    return bool(lv.get("requests"))


def verdict_text(a: dict[str, Any], sweep: dict[str, Any]) -> str:
    axis = a.get("axis", "max_num_seqs")
    lines = []
    for p in a["levels"]:
        if p["x"] is None or not levels_by_idx(sweep, p["idx"]):
            continue
        tag = "regime 3 (memory-exhausted)" if p["number"] == 3 else p["regime"]
        lines.append(f"{axis} {p['x']}: {tag}: {p['reason']} ({p['evidence']})")
    m, c = a.get("measured_b_mem"), a.get("computed_b_mem")
    if m is not None:
        s = f"measured B_mem {m} ({a['measured_source']})"
        if c is not None:
            s += f"; bstar's B_mem {c} ({a['computed_source']})"
        lines.append(s)
    onset = a.get("preemption_onset")
    if onset is not None:
        lines.append(f"preemptions start at {axis} {onset}"
                     + (f", past the measured B_mem {m}" if m is not None and onset > m
                        else ""))
    elif a["levels"]:
        lines.append("no preemptions in this sweep")
    return "\n".join(lines)


def compare_simulation(sweep: dict[str, Any], sim: list[dict[str, Any]]) -> dict[str, Any]:
    """The simulator (`bstar simulate --json` objects over the same --max-num-seqs grid)
    against a measured sweep: preemption onsets and their distance in grid steps, and the
    growth of p99 TPOT past the onset (each level's p99 over the last level before the
    measured onset), measured vs simulated, with the relative error of the growth."""
    meas = {int(lv["max_num_seqs"]): lv for lv in sweep.get("levels") or []
            if lv.get("max_num_seqs") is not None and lv.get("requests")}
    simd = {int(o["max_num_seqs"]): o for o in sim}
    grid = sorted(set(meas) & set(simd))
    if not grid:
        return {"grid": [], "note": "no common max_num_seqs level"}
    m_on = next((x for x in grid if (meas[x].get("preemptions") or 0) > 0), None)
    s_on = next((x for x in grid if (simd[x].get("preemptions") or 0) > 0), None)
    steps = (abs(grid.index(m_on) - grid.index(s_on))
             if m_on is not None and s_on is not None else None)
    base = None
    if m_on is not None and grid.index(m_on) > 0:
        base = grid[grid.index(m_on) - 1]
    rows = []
    for x in grid:
        mp = (meas[x].get("tpot_ms") or {}).get("p99")
        sp = (simd[x].get("tpot_ms") or {}).get("p99")
        row: dict[str, Any] = {"max_num_seqs": x, "preemptions": meas[x].get("preemptions"),
                               "sim_preemptions": simd[x].get("preemptions"),
                               "tpot_p99_ms": mp, "sim_tpot_p99_ms": sp}
        if base is not None and x > base:
            bm = (meas[base].get("tpot_ms") or {}).get("p99")
            bs = (simd[base].get("tpot_ms") or {}).get("p99")
            if mp and sp and bm and bs:
                row["growth"] = mp / bm
                row["sim_growth"] = sp / bs
                row["growth_error"] = row["sim_growth"] / row["growth"] - 1.0
        rows.append(row)
    errs = [abs(r["growth_error"]) for r in rows if "growth_error" in r]
    return {"grid": grid, "onset": m_on, "sim_onset": s_on, "onset_steps_apart": steps,
            "base": base, "levels": rows,
            "max_abs_growth_error": max(errs) if errs else None}
