"""Speculative decoding's section of `bstar plan` as plain text: the speedup over plain
decode at each batch, the best K, the break-even batch and what to set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bstar.report.text._common import Styler, plain_columns
from bstar.units import fmt_ms

if TYPE_CHECKING:
    from bstar.specdec import SpecPlan


def speculative_lines(sp: SpecPlan, st: Styler) -> list[str]:
    c = sp.config
    dr = sp.drafter
    where = "CPU, no GPU time" if not dr.on_gpu else (
        f"{dr.kind}, {dr.resident_bytes_per_gpu / 1e9:.3f} GB per GPU")
    out = [st("  speculative decoding", "bold") + f": K = {c.num_speculative_tokens}, "
           f"acceptance {c.acceptance_rate:g}, drafter {dr.name} ({where}); "
           f"{c.expected_tokens:.3f} tokens per step = (1 - a^(K+1)) / (1 - a); "
           f"B_mem {sp.b_mem} with the drafter and K lookahead slots"]
    rows = []
    for i in range(sp.batch.size):
        s = float(sp.speedup[i])
        rows.append([(str(int(sp.batch[i])), ""), (f"{s:.2f}x", "green" if s > 1 else "red"),
                     (fmt_ms(float(sp.tpot_s[i]) * 1e3), ""),
                     (fmt_ms(float(sp.plain_tpot_s[i]) * 1e3), ""),
                     (str(int(sp.best_k[i])) if sp.best_k[i] else "off", ""),
                     (f"{float(sp.best_speedup[i]):.2f}x", "")])
    table = plain_columns([("batch", ""), ("speedup", "(tok/s)"), ("TPOT ms", "spec"),
                           ("TPOT ms", "plain"), ("best K", ""), ("at best K", "")],
                          rows, [True, True, True, True, True, True])
    for k, row in enumerate(table):
        if k >= 2:
            label, name = rows[k - 2][1]
            at = row.find(label)
            row = row[:at] + st(label, name) + row[at + len(label):]
        out.append("  " + row)
    be = sp.break_even_batch
    out.append("    break-even batch: " + (str(be) if be is not None
                                            else f"none up to B_mem with the drafter "
                                            f"({sp.b_mem}: it pays at every batch)"))
    out.append("    " + st(sp.advice(), "bold green"))
    out += [f"    {engine:<13} {flags}" for engine, flags in sp.flags().items()]
    return out
