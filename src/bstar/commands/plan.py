"""`bstar plan`, `bstar compare`, `bstar models`, `bstar gpus`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bstar.commands.common import add_deployment_arguments, int_list, positive_float


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    add_deployment_arguments(p)
    p.add_argument("--context", type=int_list, default=None,
                   help="context lengths in tokens each sequence holds, comma-separated "
                        "(default 512,2048,8192)")
    p.add_argument("--batch", type=int_list, default=None,
                   help="batch sizes of the curve (default: powers of two past B_mem)")
    p.add_argument("--max-tpot-ms", type=positive_float, default=None,
                   help="per-request TPOT SLA in ms: cap the recommendation to meet it")
    p.add_argument("--json", action="store_true", help="print one JSON object (contract)")
    p.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw the curves, regimes and roofline (needs bstar[plot])")


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    add_deployment_arguments(p, many=True)
    p.add_argument("--context", type=int_list, default=None,
                   help="context lengths, comma-separated (default 512,2048,8192)")
    p.add_argument("--max-tpot-ms", type=positive_float, default=None,
                   help="per-request TPOT SLA in ms")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw B* and B_mem per model and context (needs bstar[plot])")


def add_models_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def add_gpus_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def deployment_from_args(args: argparse.Namespace, model: str | None = None,
                         gpu: str | None = None) -> Any:
    from dataclasses import replace

    from bstar import plan as plan_mod
    from bstar import roofline as rl
    from bstar.specs.gpu import get_gpu
    from bstar.specs.presets import get_model

    eff = rl.IDEAL if args.ideal else rl.Efficiency()
    reserve_gib = args.reserve_gib
    profile_path = getattr(args, "profile", None)
    if profile_path:
        from bstar.calibrate import load_profile
        from bstar.errors import BstarError

        if args.ideal:
            raise BstarError("--ideal and --profile contradict each other; give one")
        prof = load_profile(profile_path)
        eff = prof.eff
        # The profile's reserve (from an engine log) applies unless --reserve-gib is set
        # to something other than its default.
        if prof.reserve_bytes is not None and reserve_gib == 2.0:
            reserve_gib = prof.reserve_bytes / 2**30
    over: dict[str, float] = {}
    if args.bw_eff is not None:
        over["bandwidth"] = args.bw_eff
    if args.flops_eff is not None:
        over["compute"] = args.flops_eff
    if args.overhead_ms is not None:
        over["overhead_s"] = args.overhead_ms / 1e3
    if args.overhead_per_seq_us is not None:
        over["overhead_per_seq_s"] = args.overhead_per_seq_us / 1e6
    if over:
        eff = replace(eff, **over)
    d = rl.Deployment(
        model=get_model(model or args.model or plan_mod.DEFAULT_MODEL),
        gpu=get_gpu(gpu or args.gpu or plan_mod.DEFAULT_GPU), num_gpus=args.num_gpus,
        weight_dtype=args.dtype, kv_dtype=args.kv_dtype, gpu_util=args.gpu_util,
        reserve_bytes=round(reserve_gib * 2**30), block_tokens=args.block_size, eff=eff)
    if profile_path:
        d = replace(d, gpu=prof.apply(d).gpu)  # an engine faster than a probed figure
    if profile_path and prof.gpu and prof.gpu != d.gpu.id:
        import sys

        # Efficiencies belong to one GPU x engine; on another GPU they are a guess.
        print(f"bstar: warning: profile {profile_path} was calibrated on {prof.gpu}, "
              f"applied to {d.gpu.id}", file=sys.stderr)
    return d


def run_plan(args: argparse.Namespace) -> int:
    from bstar.plan import DEFAULT_CONTEXTS, make_plan

    d = deployment_from_args(args)
    plan = make_plan(d, tuple(args.context or DEFAULT_CONTEXTS), args.batch, args.max_tpot_ms)
    if args.plot:
        from bstar.report import save_plan_plot

        _wrote(save_plan_plot(plan, args.plot, args.max_tpot_ms))
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    from bstar.console import print_plan

    print_plan(plan)
    return 0


def _wrote(path: Any) -> None:
    import sys

    # stderr: --json keeps stdout to the one JSON object.
    print(f"plot written to {path}", file=sys.stderr)


def run_compare(args: argparse.Namespace) -> int:
    rows = compare_rows(args)
    if args.plot:
        from bstar.report import save_compare_plot

        _wrote(save_compare_plot(rows, args.plot))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from bstar.console import print_compare

    print_compare(rows)
    return 0


def compare_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per model x GPU x context (`bstar compare --json`)."""
    from bstar import plan as plan_mod
    from bstar.plan import make_plan

    models = args.model or [plan_mod.DEFAULT_MODEL]
    gpus = args.gpu or [plan_mod.DEFAULT_GPU]
    contexts = tuple(args.context or plan_mod.DEFAULT_CONTEXTS)
    from bstar import roofline as rl
    from bstar.errors import BstarError

    rows = []
    for m in models:
        for g in gpus:
            d = deployment_from_args(args, m, g)
            for ctx in contexts:
                try:
                    p = make_plan(d, (ctx,), [1], args.max_tpot_ms)
                except BstarError as e:
                    if rl.b_mem(d, ctx) >= 1:
                        raise
                    # One model that does not fit must not hide the rest of the table.
                    rows.append(no_fit_row(d, ctx, rl.min_gpus_that_fit(d, ctx), str(e)))
                    continue
                rows.append(compare_row(p, p.contexts[0]))
    return rows


def compare_row(plan: Any, c: Any) -> dict[str, Any]:
    d = plan.deployment
    return {"model": d.model.name, "gpu": d.gpu.id, "num_gpus": d.num_gpus,
            "attention": d.model.attention_kind, "weight_bytes": plan.weight_bytes,
            "kv_bytes_per_token": plan.kv_bytes_per_token,
            "context_tokens": c.context_tokens, "kv_bytes_per_seq": c.kv_bytes_per_seq,
            "b_star": c.b_star, "b_mem": c.b_mem,
            "compute_crossover_batch": c.compute_crossover_batch,
            "tpot_floor_ms": c.tpot_floor_s * 1e3,
            "tpot_batch1_ms": float(c.curve.tpot_s[0] * 1e3),
            "warnings": list(c.warnings),
            "recommendation": {"max_num_seqs": c.recommendation.max_num_seqs,
                               "reason": c.recommendation.reason,
                               "bound": c.recommendation.bound},
            "fits": True}


def no_fit_row(d: Any, ctx: int, min_gpus: int | None, message: str) -> dict[str, Any]:
    from bstar import roofline as rl

    return {"model": d.model.name, "gpu": d.gpu.id, "num_gpus": d.num_gpus,
            "attention": d.model.attention_kind, "weight_bytes": rl.weight_bytes(d),
            "kv_bytes_per_token": rl.kv_bytes_per_token(d), "context_tokens": ctx,
            "kv_bytes_per_seq": rl.kv_bytes_per_seq(d, ctx), "b_star": rl.b_star(d, ctx),
            "b_mem": 0, "compute_crossover_batch": None, "tpot_floor_ms": None,
            "tpot_batch1_ms": None, "recommendation": None, "fits": False,
            "min_num_gpus": min_gpus, "error": message}


def run_models(args: argparse.Namespace) -> int:
    from bstar.specs.presets import get_model, model_index

    rows = []
    for pid, info in model_index().items():
        m = get_model(pid)
        rows.append({"id": pid, "hf_repo": info.hf_repo, "params": m.num_params,
                     "active_params": m.num_active_params,
                     "published_params": info.published_params,
                     "attention": m.attention_kind, "layers": m.num_layers,
                     "dtype": m.default_dtype, "moe": m.is_moe, "source": info.source})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from bstar.console import print_models

    print_models(rows)
    return 0


def run_gpus(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from bstar.specs.gpu import gpu_catalog

    rows = [asdict(g) for g in gpu_catalog().values()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from bstar.console import print_gpus

    print_gpus(rows)
    return 0
