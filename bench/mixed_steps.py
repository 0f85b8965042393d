"""Measure decode, mixed (decode + one prompt chunk) and prefill steps on a live server.

    python bench/mixed_steps.py --url http://127.0.0.1:8000 [--served-model tiny] \
        [--batches 1,2,4,8] [--chunk-tokens 32,128,384] [--repeats 5] [-o points.csv]

Black-box and engine-agnostic (bstar.loadgen.mixed): B streams decode at steady state;
one request with an n-token prompt is injected; the gap the decoding streams see while it
is prefilled is the mixed step. Keep n + B within the engine's token budget per step
(vLLM: --max-num-batched-tokens) so the prompt runs as one chunk, and the server's
sequence cap above max(batches). Prints the points CSV (and writes it with -o) that
`bstar calibrate POINTS` reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bstar.commands.common import int_list
from bstar.loadgen.mixed import MixedConfig, measure_steps, to_csv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--served-model", default="tiny")
    p.add_argument("--batches", type=int_list, default=[1, 2, 4, 8])
    p.add_argument("--chunk-tokens", type=int_list, default=[32, 128, 384])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--decode-prompt-tokens", type=int, default=16)
    p.add_argument("--decode-steps", type=int, default=24)
    p.add_argument("--no-prefill", action="store_true", help="skip the B = 0 points")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--statistic", choices=("min", "median"), default="min",
                   help="of the repeats: min (default; a shared machine only slows a step "
                        "down) or median")
    p.add_argument("-o", "--output", type=Path, default=None)
    a = p.parse_args(argv)
    cfg = MixedConfig(tuple(a.batches), tuple(a.chunk_tokens), a.decode_prompt_tokens,
                      a.repeats, decode_steps=a.decode_steps, prefill=not a.no_prefill,
                      seed=a.seed, statistic=a.statistic)
    samples = measure_steps(a.url, a.served_model, cfg,
                            say=lambda s: print(s, file=sys.stderr, flush=True))
    text = to_csv(samples)
    if a.output is not None:
        a.output.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
