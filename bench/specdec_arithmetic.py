"""The arithmetic behind speculative decoding's speedup, step by step (docs/cost-model.md,
"Speculative decoding"): each term of a plain decode step and of a speculative step of K
draft tokens at acceptance A, at a few batches and contexts, from bstar.specdec and
bstar.step (the one price of a step).

    python bench/specdec_arithmetic.py                       # llama-3.1-8b on h200, K 3, A 0.7
    python bench/specdec_arithmetic.py --model M --gpu G --k 3 --acceptance 0.7 --drafter eagle
"""

from __future__ import annotations

import argparse

import numpy as np

from bstar import roofline as rl
from bstar import specdec as sd
from bstar import step as st
from bstar.options import DeploymentOptions

BREAK_EVEN_KS = (1, 2, 3, 4, 6, 8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--acceptance", type=float, default=0.7)
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--context", default="512,32768")
    args = ap.parse_args()
    d = DeploymentOptions(model=args.model, gpu=args.gpu).build()
    dr = sd.make_drafter(d, args.drafter)
    k, a = args.k, args.acceptance
    e = sd.expected_tokens(a, k)
    print(f"{d.model.name} on {d.gpu.id}, K = {k}, a = {a}, drafter {dr.name}: "
          f"E = (1 - a^(K+1)) / (1 - a) = {e:.4f} tokens per step")
    print("\nbreak-even batch (None: pays up to B_mem) by context and K:")
    print("| context | " + " | ".join(f"K={x}" for x in BREAK_EVEN_KS) + " |")
    print("|---|" + "---|" * len(BREAK_EVEN_KS))
    for ctx in (128, 512, 2048, 8192):
        print(f"| {ctx} | " + " | ".join(str(sd.break_even_batch(d, dr, ctx, x, a))
                                         for x in BREAK_EVEN_KS) + " |")
    sh = st.shape(d)
    for ctx in (int(c) for c in args.context.split(",")):
        bm = rl.b_mem(d, ctx)
        top = min(bm, sd.b_mem(d, dr, ctx, k))
        print(f"\ncontext {ctx}: B_mem {bm} plain, {sd.b_mem(d, dr, ctx, k)} with the "
              f"drafter; break-even batch {sd.break_even_batch(d, dr, ctx, k, a)}")
        print(f"{'batch':>6} {'plain ms':>9} {'= gemm':>8} {'+ attn':>8} {'+ fixed':>8} | "
              f"{'verify':>8} {'= gemm':>8} {'+ attn':>8} {'+ fixed':>8} {'+ reject':>9} "
              f"{'+ draft':>8} | {'speedup = E x plain / spec':>28}")
        for b in sorted({x for x in (1, 16, 64, 256, 1024) if x < top} | {top}):
            p = st.price_parts(sh.decode([b], ctx), d.eff)
            v = st.price_parts(sh.verify([b], ctx + k, k + 1), d.eff)
            plain = float(p.step_s[0])
            verify = float(sd.verify_s(d, [b], ctx, k)[0])
            reject = verify - float(v.step_s[0])
            draft = float(sd.draft_s(dr, [b], ctx, k)[0])
            spec = verify + draft
            s = float(sd.speedup(d, dr, [b], ctx, k, a)[0][0])
            assert np.isclose(s, e * plain / spec), (s, e * plain / spec)

            def ms(x: float) -> str:
                return f"{x * 1e3:8.3f}"

            fixed_p = plain - float(p.gemm_s[0] + p.decode_attention_s[0])
            fixed_v = float(v.step_s[0] - v.gemm_s[0] - v.decode_attention_s[0])
            print(f"{b:>6} {ms(plain)} {ms(float(p.gemm_s[0]))} "
                  f"{ms(float(p.decode_attention_s[0]))} {ms(fixed_p)} | {ms(verify)} "
                  f"{ms(float(v.gemm_s[0]))} {ms(float(v.decode_attention_s[0]))} "
                  f"{ms(fixed_v)} {reject * 1e3:9.3f} {ms(draft)} | "
                  f"{e:.3f} x {plain * 1e3:.3f} / {spec * 1e3:.3f} = {s:.3f}")


if __name__ == "__main__":
    main()
