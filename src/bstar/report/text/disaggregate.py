"""`bstar plan --disaggregate`: the terminal table over `DisaggPlan.to_dict()`. Plain
print, no computation."""

from __future__ import annotations

from typing import Any


def format_disagg_plan(d: dict[str, Any]) -> str:
    """The plan as lines: each side, the transfer, the P:D ratio, TTFT's parts and TPOT."""
    p, dec, tr, r, a = d["prefill"], d["decode"], d["transfer"], d["ratio"], d["at_load"]
    lines = [
        f"{d['model']} disaggregated: {p['workers']}P{dec['workers']}D on {d['num_gpus']} "
        f"GPUs, {d['prompt_tokens']} tokens in / {d['output_tokens']} out, engine "
        f"{d['engine'] or 'vllm'}, weights {d['weight_dtype']}, KV {d['kv_dtype']}",
        "  side      workers  GPU    TP  EP  DP  priced as  limits",
    ]
    for name, s in (("prefill", p), ("decode", dec)):
        limits = (f"budget {s['budget_tokens']} tokens, {s['prompts_per_step']} prompt(s) a "
                  "step" if name == "prefill" else
                  f"max_num_seqs {s['max_num_seqs']} ({s['max_num_seqs_source']}), "
                  f"B_mem {s['b_mem']}")
        lines.append(f"  {name:8s} {s['workers']:8d}  {s['gpu']:5s} {s['tp']:3d} {s['ep']:3d} "
                     f"{s['dp']:3d}  {s['priced_as']:9s}  {limits}")
    lines += [
        f"  prefill worker: {p['prefill_ms']:.1f} ms a prompt alone, a full step "
        f"{p['step_ms']:.1f} ms -> {p['tok_s_per_worker']:,.0f} prompt tok/s = "
        f"{p['req_s_per_worker']:.3g} requests/s",
        f"  decode worker:  batch {dec['batch']} at {dec['context_tokens']} tokens held, TPOT "
        f"{dec['tpot_ms']:.2f} ms -> {dec['output_tok_s_per_worker']:,.0f} output tok/s = "
        f"{dec['req_s_per_worker']:.3g} requests/s"
        + ("" if not dec.get("speculative") else
           f" (speculative: {dec['speculative']['drafter']}, "
           f"{dec['speculative']['num_speculative_tokens']} draft tokens at acceptance "
           f"{dec['speculative']['acceptance_rate']:g}: "
           f"{dec['speculative']['tokens_per_step']:.2f} tokens a step)"),
        f"  KV transfer:    {tr['kv_bytes'] / 1e6:,.1f} MB a prompt, "
        f"{tr['bytes_per_gpu'] / 1e6:,.1f} MB to each of {tr['receiving_gpus']} GPU(s) over "
        f"{tr['link']['kind']} "
        f"({tr['link']['bytes_s_per_gpu'] / 1e9:g} GB/s, {tr['link']['latency_us']:g} us): "
        f"{tr['transfer_ms']:.2f} ms",
        f"  P:D ratio:      {r['prefill_per_decode']:.3f} prefill workers per decode worker; "
        f"{dec['workers']} decode workers want {r['balanced_prefill_workers']} prefill, "
        f"{p['workers']} prefill feed {r['balanced_decode_workers']} decode; here "
        f"{r['bound']} binds at {r['capacity_req_s']:.3g} requests/s",
    ]
    parts = a["ttft_parts_ms"]
    load = {"concurrency": f"{a['load_value']:g} users (closed loop)",
            "rate": f"{a['load_value']:g} requests/s",
            "unloaded": "one request alone, decode at its batch"}[a["load"]]
    lines += [
        f"  at {load}: {a['throughput_req_s']:.3g} requests/s, decode batch "
        f"{a['decode_batch_per_worker']:.1f} a worker, prefill {a['prefill_utilization']:.0%}"
        f" busy, bound: {a['bound']}",
        f"    TTFT {a['ttft_ms']:.1f} ms = request {parts['request_overhead']:.1f} + prefill "
        f"queue {parts['prefill_queue']:.1f} + prefill {parts['prefill']:.1f} + transfer "
        f"{parts['transfer']:.2f} + first decode step {parts['first_decode_step']:.2f}"
        + (f" + decode wait {parts['decode_wait']:.1f}" if parts["decode_wait"] else ""),
        f"    TPOT {a['tpot_ms']:.2f} ms (decode side); {a['output_tok_s_per_gpu']:,.1f} output "
        "tok/s per GPU",
    ]
    lines += [f"  warning: {w}" for w in d["warnings"]]
    lines.append("MB = 1e6 bytes. docs/disaggregation.md says how each figure is priced.")
    return "\n".join(lines)


def print_disagg_plan(d: dict[str, Any]) -> None:
    print(format_disagg_plan(d))


def print_disagg_simulation(d: dict[str, Any]) -> None:
    """The plan, then the simulation's means beside the plan's figures."""
    print(format_disagg_plan(d))
    s, a = d["simulation"], d["at_load"]
    print(f"simulated ({s['requests']} requests, {s['span_s']:.1f} s): TTFT mean "
          f"{s['ttft']['mean_ms']:.1f} ms (median {s['ttft']['median_ms']:.1f}, p99 "
          f"{s['ttft']['p99_ms']:.1f}; plan {a['ttft_ms']:.1f}), TPOT mean "
          f"{s['tpot']['mean_ms']:.2f} ms (plan {a['tpot_ms']:.2f}), prefill wait mean "
          f"{s['prefill_wait']['mean_ms']:.1f} ms, {s['output_tok_s_per_gpu']:,.1f} output "
          "tok/s per GPU")
