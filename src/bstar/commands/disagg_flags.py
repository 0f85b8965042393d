"""The --disaggregate flags `bstar plan` and `bstar simulate` share: each side's workers,
layout and limits, the KV link, or a deployment file, as a
`bstar.disaggregate.DisaggregatedDeployment`. A helper, not a command (like common.py and
emit.py: tests/test_architecture.py's COMMAND_HELPERS). No rules here."""

from __future__ import annotations

import argparse
from typing import Any

from bstar.commands.common import (
    deployment_options,
    positive_float,
    positive_int,
    spec_config_from_args,
)
from bstar.errors import BstarError

SIDE_FLAGS = (("workers", "workers of this side"),
              ("tp", "tensor-parallel size of each worker (its GPUs)"),
              ("ep", "expert-parallel size of each worker"),
              ("dp", "attention data-parallel size of each worker"),
              ("max-num-seqs", "the engine's sequence cap per worker"),
              ("max-num-batched-tokens", "the engine's step token budget per worker"))


def add_disagg_arguments(p: argparse.ArgumentParser, load: bool = True) -> None:
    """The flags of a disaggregated deployment; `load` adds --concurrency and --rate (bstar
    simulate has its own) and bstar simulate's --range-ratio otherwise."""
    from bstar.kv_link import LINK_KINDS

    g = p.add_argument_group("disaggregated prefill/decode (--disaggregate; "
                             "docs/disaggregation.md)")
    g.add_argument("--disaggregate", action="store_true",
                   help="plan P prefill and D decode workers (xPyD) instead of one server")
    g.add_argument("--deployment", default=None, metavar="FILE.toml",
                   help="a disaggregated deployment file ([prefill], [decode], link); "
                        "implies --disaggregate, flags of a side override it")
    for side in ("prefill", "decode"):
        for name, what in SIDE_FLAGS:
            g.add_argument(f"--{side}-{name}", dest=f"{side}_{name.replace('-', '_')}",
                           type=positive_int, default=None, help=f"{side}: {what}")
        g.add_argument(f"--{side}-gpu", dest=f"{side}_gpu", default=None,
                       help=f"{side}: GPU preset (default --gpu)")
    g.add_argument("--kv-link", choices=LINK_KINDS, default=None,
                   help="the link the KV crosses (default: nvlink inside one node, nvl72 "
                        "inside an NVL72 domain, else ib-ndr)")
    g.add_argument("--prompt-tokens", type=positive_int, default=None,
                   help="prompt length of the mix (default 1024)")
    g.add_argument("--output-tokens", type=positive_int, default=None,
                   help="output length of the mix (default 1024)")
    if not load:
        g.add_argument("--range-ratio", type=positive_float, default=1.0,
                       help="lengths uniform in [ratio x L, L] (bench_serving's "
                            "--random-range-ratio; default 1: fixed lengths)")
        return
    loads = g.add_mutually_exclusive_group()
    loads.add_argument("--concurrency", type=positive_int, default=None,
                       help="closed-loop users the deployment serves")
    loads.add_argument("--rate", type=positive_float, default=None,
                       help="open-loop requests/s the deployment serves")


def disagg_from_args(args: argparse.Namespace) -> Any:
    """The DisaggregatedDeployment the flags (over a --deployment file) name."""
    from bstar.disaggregate import DisaggregatedDeployment

    options = deployment_options(args)
    data: dict[str, Any] = {"prefill": {}, "decode": {}}
    where = "flags"
    if args.deployment:
        from bstar.safeio import load_toml

        data = load_toml(args.deployment, what="disaggregated deployment file")
        where = args.deployment
    for side in ("prefill", "decode"):
        if not isinstance(data.get(side), dict):
            continue  # DisaggregatedDeployment.from_mapping says which table is missing
        table = dict(data[side])
        for name, _ in SIDE_FLAGS:
            key = name.replace("-", "_")
            v = getattr(args, f"{side}_{key}")
            if v is not None:
                table[key] = v
        if getattr(args, f"{side}_gpu"):
            table["gpu"] = getattr(args, f"{side}_gpu")
        table.setdefault("tp", options.num_gpus)
        data[side] = table
    if args.kv_link:
        data["link"] = args.kv_link
    return DisaggregatedDeployment.from_mapping(data, options, where)


def disagg_speculative(args: argparse.Namespace) -> Any:
    """The decode side's SpecConfig from the speculative flags (`spec_config_from_args`;
    None without --num-speculative-tokens). A disaggregated decode side prices the drafters
    that ride on the target (eagle, mtp, ngram, auto), not a separate draft model."""
    from bstar.specdec import AUTO_DRAFTER, DRAFTER_KINDS

    if (getattr(args, "num_speculative_tokens", None) is not None
            and args.drafter not in (*DRAFTER_KINDS, AUTO_DRAFTER)):
        raise BstarError(f"--disaggregate prices --drafter eagle, mtp, ngram or auto on the "
                         f"decode side; a separate draft model ({args.drafter}) is not priced "
                         "there")
    return spec_config_from_args(args)
