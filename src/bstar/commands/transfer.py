"""`python -m bstar.commands.transfer WORKDIR [--json]`: the transfer proof of
`bstar.transfer` (probe, sweep, calibrate, predict) on this machine. Not a `bstar`
subcommand: it takes minutes and needs llama.cpp."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    from bstar.transfer import format_result, run_transfer

    p = argparse.ArgumentParser(prog="python -m bstar.commands.transfer",
                                description=__doc__)
    p.add_argument("workdir", type=Path)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run_transfer(args.workdir, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(r.to_dict(), indent=2) if args.json else format_result(r))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
