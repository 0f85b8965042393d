"""`bstar kv`: the server's KV pool beside bstar's, the B_mem each gives, and the
difference explained (`kvcheck.KvCheck`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bstar.units import fmt_bytes_binary

if TYPE_CHECKING:
    from bstar.deployment import Deployment
    from bstar.kvcheck import KvCheck


def print_kv_check(d: Deployment, c: KvCheck) -> None:
    """The deployment in one line, then `format_kv_check`."""
    from bstar.report.text._common import clean_text

    print(f"{clean_text(d.model.name)} on {clean_text(d.gpu.name)} (KV {d.kv.name})")
    print(format_kv_check(c))


def format_kv_check(c: KvCheck) -> str:
    """Server and bstar side by side (pool, blocks, tokens, B_mem), the difference and
    the explanation's lines."""
    lines = [f"KV pool check, {c.tokens_per_seq:,}-token sequences, block {c.block_size} "
             "tokens",
             f"  {'':<10}{'pool':>14}{'blocks':>10}{'tokens':>12}{'B_mem':>8}",
             f"  {'server':<10}{fmt_bytes_binary(c.measured_pool_bytes or 0):>14}"
             f"{c.measured_blocks or 0:>10,}{c.measured_tokens or 0:>12,}"
             f"{c.measured_b_mem or 0:>8,}",
             f"  {'bstar':<10}{fmt_bytes_binary(c.computed_pool_bytes):>14}"
             f"{c.computed_blocks:>10,}{c.computed_blocks * c.block_size:>12,}"
             f"{c.computed_b_mem:>8,}"]
    if c.rel_diff is not None:
        lines.append(f"  difference {c.rel_diff:+.1%} "
                     + ("(over 10%: flagged)" if c.flagged else "(within 10%)"))
    lines += [f"  - {n}" for n in c.explanation]
    return "\n".join(lines)
