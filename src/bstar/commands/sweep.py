"""`bstar sweep`: load a live OpenAI-compatible server level by level, store every request.

Standard library only at top level (start-up stays light); aiohttp and rich load in run.
"""

from __future__ import annotations

import argparse
import os
import sys

from bstar.commands.common import (
    add_deployment_arguments,
    add_force_argument,
    deployment_options,
    float_list,
    int_list,
    positive_float,
    positive_int,
    warn,
)
from bstar.commands.emit import emit


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--url", help="base URL of the server, e.g. http://127.0.0.1:8000")
    g.add_argument("--served-model", help="model name the server knows (default: the first "
                   "one /v1/models lists)")
    g.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                   help="/v1/completions (default) or /v1/chat/completions")
    g.add_argument("--api-key", default=None,
                   help="bearer token (default: $OPENAI_API_KEY); never stored or logged")
    g.add_argument("--server-cmd", help="start the server for each --max-num-seqs value: a "
                   "command with {max_num_seqs} and {port}, e.g. 'vllm serve M "
                   "--max-num-seqs {max_num_seqs} --port {port}'")
    g.add_argument("--max-num-seqs", type=int_list, help="server batch caps to sweep "
                   "(needs --server-cmd), comma-separated")
    g.add_argument("--health-timeout", type=positive_float, default=600.0, metavar="S",
                   help="seconds to wait for a started server's /health (default 600)")
    g = p.add_argument_group("load")
    g.add_argument("--concurrency", type=int_list, help="closed-loop streams per level, "
                   "e.g. 1,2,4,8")
    g.add_argument("--rate", type=float_list, help="open-loop Poisson arrival rates "
                   "(requests/s) per level")
    g.add_argument("--input-len", type=positive_int, default=128, help="prompt tokens (exact)")
    g.add_argument("--output-len", type=positive_int, default=128, help="output tokens")
    g.add_argument("--num-requests", type=positive_int, default=64,
                   help="measured requests per level (default 64)")
    g.add_argument("--warmup-requests", type=int, default=None,
                   help="unmeasured requests before each level (default: one per stream)")
    g.add_argument("--prompts", help="JSONL of {\"prompt\": ...} or {\"messages\": [...]}")
    g.add_argument("--seed", type=int, default=None,
                   help="prompt seed, to replay a run's exact prompts (default: a fresh "
                        "random seed per run, stored with the run, so a repeated sweep "
                        "does not hit the server's prefix cache)")
    g.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send ignore_eos/min_tokens (for servers that reject them)")
    g.add_argument("--level-time-limit", type=positive_float, default=300.0, metavar="S",
                   help="stop a level after S seconds (default 300)")
    g.add_argument("--request-timeout", type=positive_float, default=600.0, metavar="S")
    g.add_argument("--max-error-rate", type=float, default=0.5,
                   help="stop a level once this fraction of its requests failed (after 8)")
    g.add_argument("--slo", help="per-request SLOs in ms for goodput and the SLA knee, "
                   "e.g. ttft:500,tpot:50,e2e:3000")
    g.add_argument("--workers", type=int, default=0, metavar="N",
                   help="send each level's load from N local processes, its streams split "
                        "between them, each with its own event loop (default 0: this "
                        "process's loop; 1: one process whose loop does nothing but "
                        "measure); one loop follows about 256 streams before it distorts "
                        "the tails it measures")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="place the --workers as Ray actors: on a local cluster started here, "
                        "or on the cluster at ADDRESS, for load from several machines "
                        "(needs bstar[ray])")
    g = p.add_argument_group("results")
    g.add_argument("--db", help="results DB (default ${BSTAR_DATA_DIR:-~/.local/share/bstar}"
                   "/runs.db)")
    g.add_argument("--resume", metavar="RUN", help="finish the levels a stored run is missing")
    g.add_argument("--json", action="store_true", help="print one JSON object (contract)")
    g.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw the measured levels over the prediction (needs bstar[plot])")
    add_force_argument(g)
    g.add_argument("--quiet", action="store_true", help="no progress display")
    add_deployment_arguments(p)


def run_sweep(args: argparse.Namespace) -> int:
    from bstar.loadgen import sweep as sw
    from bstar.slo import parse_slo

    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or None
    options = deployment_options(args)
    if args.resume:
        options = sw.resumed_options(args.db, args.resume, args.model, args.gpu)
        cfg = None
    else:
        cfg = sw.SweepConfig(
            url=args.url, served_model=args.served_model, endpoint=args.endpoint,
            concurrency=args.concurrency, rate=args.rate, max_num_seqs=args.max_num_seqs,
            server_cmd=args.server_cmd, input_len=args.input_len, output_len=args.output_len,
            num_requests=args.num_requests, warmup_requests=args.warmup_requests,
            level_time_limit_s=args.level_time_limit, request_timeout_s=args.request_timeout,
            health_timeout_s=args.health_timeout, seed=args.seed, prompts_file=args.prompts,
            slo=parse_slo(args.slo).by_metric(), max_error_rate=args.max_error_rate,
            ignore_eos=not args.no_ignore_eos, model=options.model, gpu=options.gpu,
            deployment=options.to_dict(), workers=args.workers, ray=args.ray)
        cfg.validate()
    # A cost model to predict each level with, when the run names a model or a GPU.
    deployment = options.build(warn=warn) if (options.model or options.gpu) else None

    from rich.console import Console

    from bstar.report.text import Progress, print_result, wide_console

    err = Console(stderr=True)
    # --server-cmd with --resume: the command again (a stored one has its secrets masked).
    resume_cmd = args.server_cmd if args.resume else None
    try:
        if args.quiet or (args.json and not sys.stderr.isatty()):
            result = sw.run_sweep(cfg, db=args.db, api_key=api_key, resume=args.resume,
                                  deployment=deployment, server_cmd=resume_cmd)
        else:
            with Progress(err) as prog:
                result = sw.run_sweep(cfg, db=args.db, api_key=api_key, resume=args.resume,
                                      on_event=prog, deployment=deployment,
                                      server_cmd=resume_cmd)
    except sw.SweepInterrupted as e:
        print(f"bstar: {e}", file=sys.stderr)  # one unwrapped line: it holds a command
        return 130
    from bstar.report import save_sweep_plot

    emit(args, result.to_dict, lambda: print_result(result, wide_console()),
         lambda path: save_sweep_plot(result.to_dict(), path))
    return 0 if result.status in ("completed", "completed_with_errors") else 1
