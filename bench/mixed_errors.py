"""The cost model on measured mixed steps: calibrated on the decode points only, then on all.

    python bench/mixed_errors.py data/cpu/vllm-mixed-20261130.csv \
        --model data/cpu/tiny-config.json --gpu data/cpu/probe.toml --dtype fp32 --kv-dtype fp32

Reads a points file (bench/mixed_steps.py) and prints, for every point with a prompt
chunk (mixed steps, and prefills at batch 0), the measured step, the prediction of a
calibration on the file's decode points alone and of one on all its points, with their
relative errors, then the median and max |error| of each.
"""

from __future__ import annotations

import argparse
import sys

from bstar.commands.common import add_deployment_arguments, build_deployment
from bstar.fit.points import load_steps
from bstar.loadgen.mixed import decode_vs_joint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("points", help="points CSV (bench/mixed_steps.py)")
    add_deployment_arguments(p)
    args = p.parse_args(argv)
    d = build_deployment(args)
    e = decode_vs_joint(d, load_steps(args.points, None)[0])
    print(f"{'batch':>6}{'context':>9}{'chunk':>7}{'measured ms':>13}{'decode-only':>13}"
          f"{'error':>8}{'joint':>10}{'error':>8}")
    for pt, a, b in zip(e.points, e.decode_only, e.joint, strict=True):
        ms = pt.step_s * 1e3
        print(f"{pt.batch:>6}{pt.context_tokens:>9}{pt.chunk_tokens:>7}{ms:>13.2f}"
              f"{ms * (1 + a):>13.2f}{a:>+8.1%}{ms * (1 + b):>10.2f}{b:>+8.1%}")
    print(f"mixed-step |error|, calibrated on decode points only: median "
          f"{e.decode_only_median:.1%}, max {e.decode_only_max:.1%}")
    print(f"mixed-step |error|, calibrated on decode + mixed points: median "
          f"{e.joint_median:.1%}, max {e.joint_max:.1%}")
    for name, c in (("decode-only", e.decode_cal), ("joint", e.joint_cal)):
        fitted = ", ".join(f"{k} {v.value:.4g} ({v.status})" for k, v in c.params.items()
                           if v.fitted)
        print(f"{name} fit: {fitted}; GPU scales bandwidth {c.bandwidth_scale:.3g}, "
              f"compute {c.compute_scale:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
