"""`python -m bstar.commands.host llamacpp ...`: the child process that hosts llama.cpp's
server (`bstar.servers.run_llamacpp`) for `LlamaCppServer`. Not a `bstar` subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from bstar.servers import run_llamacpp

    ap = argparse.ArgumentParser(prog="python -m bstar.commands.host")
    sub = ap.add_subparsers(dest="kind", required=True)
    lc = sub.add_parser("llamacpp", help="host llama.cpp's server (xllamacpp) on 127.0.0.1")
    lc.add_argument("--model", required=True, help="GGUF file")
    lc.add_argument("--port", type=int, required=True)
    lc.add_argument("--n-parallel", type=int, default=16)
    lc.add_argument("--ctx-per-slot", type=int, default=2048)
    lc.add_argument("--threads", type=int, default=2)
    lc.add_argument("--alias", default="tiny")
    lc.add_argument("--poll", type=int, default=0,
                    help="llama.cpp thread polling level 0-100 (default 0: sleep, not spin)")
    args = ap.parse_args(argv)
    if args.kind == "llamacpp":
        return run_llamacpp(args.model, args.port, n_parallel=args.n_parallel,
                            ctx_per_slot=args.ctx_per_slot, threads=args.threads,
                            alias=args.alias, poll=args.poll)
    return 2  # pragma: no cover - argparse rejects other kinds


if __name__ == "__main__":
    sys.exit(main())
