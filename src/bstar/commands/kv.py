"""`bstar kv`: a running server's KV pool (vLLM's cache_config_info) beside bstar's B_mem.

Standard library only at top level; the library part is bstar.kvcheck, fed
by bstar.loadgen.kvserver.
"""

from __future__ import annotations

import argparse
import os
import sys

from bstar.commands.common import add_deployment_arguments, build_deployment, positive_int
from bstar.commands.emit import emit


def add_kv_arguments(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("server")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="base URL of the running server, e.g. http://127.0.0.1:8000")
    src.add_argument("--metrics-file", help="a saved /metrics text instead of --url")
    s.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    s.add_argument("--vllm-log", default=None, metavar="FILE",
                   help="vLLM's start-up log: its 'KV cache size: N tokens' when /metrics "
                        "has no cache_config_info")
    s.add_argument("--kv-pool-bytes", type=positive_int, default=None,
                   help="an explicit KV pool (vLLM on CPU: VLLM_CPU_KVCACHE_SPACE GiB x 2**30 "
                        "or --kv-cache-memory-bytes); default: the server's configured "
                        "kv_cache_memory_bytes when exported, else bstar's GPU pool")
    w = p.add_argument_group("sequences")
    w.add_argument("--input-len", type=positive_int, default=512, help="prompt tokens")
    w.add_argument("--output-len", type=positive_int, default=256, help="output tokens")
    s.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="the server's token budget per step (vLLM's flag; default its "
                        "default): sizes what a sliding-window layer holds in flight")
    add_deployment_arguments(p)
    p.add_argument("--json", action="store_true", help="print the check as one JSON object")


def run_kv(args: argparse.Namespace) -> int:
    from bstar import kvcheck, safeio
    from bstar.loadgen.kvserver import fetch_metrics, server_pool_text
    from bstar.report.text import print_kv_check

    if args.url:
        text = fetch_metrics(args.url, api_key=args.api_key
                             or os.environ.get("OPENAI_API_KEY") or None)
    else:
        text = safeio.read_text(args.metrics_file, safeio.MAX_TABLE_BYTES, "metrics file")
    log_tokens = None
    if args.vllm_log:
        from bstar.calibrate import parse_vllm_log

        log = safeio.read_bytes(args.vllm_log, safeio.MAX_TABLE_BYTES, "vLLM log")
        log_tokens = parse_vllm_log(log.decode("utf-8", "replace")).kv_cache_tokens
    d = build_deployment(args)
    c = kvcheck.check_kv(d, server_pool_text(text), args.input_len + args.output_len,
                         pool_bytes=args.kv_pool_bytes, log_tokens=log_tokens,
                         max_num_batched_tokens=args.max_num_batched_tokens)
    emit(args, lambda: {"model": d.model.name, "gpu": d.gpu.name, "kv_dtype": d.kv.name,
                        **c.to_dict()},
         lambda: print_kv_check(d, c))
    if c.flagged:
        print("bstar: warning: bstar's B_mem and the server's differ by more than 10%",
              file=sys.stderr)
    return 1 if c.flagged else 0
