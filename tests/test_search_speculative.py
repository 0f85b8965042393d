"""`bstar search --num-speculative-tokens`: each replica with and without speculation, and
whether speculation changes the cheapest deployment (issue 31)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bstar.cli import main
from bstar.search import SearchSpec, Traffic, plan_candidates
from bstar.search.candidates import slo_lower_bounds_ms
from bstar.sim import parse_lengths, parse_slo

EXAMPLE_PRICES = Path(__file__).resolve().parents[1] / "examples" / "gpu-prices-example.toml"


def _spec(**kw: object) -> SearchSpec:
    traffic = Traffic(20.0, parse_lengths("256"), parse_lengths("256"), num_requests=40)
    return SearchSpec(models=("llama-3.1-8b",), gpus=("h200",), traffic=traffic,
                      slo=parse_slo("ttft:2000,tpot:15"), num_gpus=(1,), max_num_seqs=(64,),
                      **kw)  # type: ignore[arg-type]


def test_plain_search_keeps_its_name_and_replicas() -> None:
    plain = _spec()
    assert "num_speculative_tokens" not in plain.to_dict()
    assert plain.search_id() == _spec(num_speculative_tokens=()).search_id()
    assert plain.search_id() != _spec(num_speculative_tokens=(0, 3)).search_id()
    cands, _, _, _ = plan_candidates(plain)
    assert [c.replica.key for c in cands] == ["llama-3.1-8b|h200|tp1|seqs64|tok8192"]


def test_each_replica_with_each_k() -> None:
    cands, _, _, unit = plan_candidates(_spec(num_speculative_tokens=(0, 2, 4)))
    keys = [c.replica.key for c in cands]
    assert keys == ["llama-3.1-8b|h200|tp1|seqs64|tok8192",
                    "llama-3.1-8b|h200|tp1|seqs64|tok8192|spec2",
                    "llama-3.1-8b|h200|tp1|seqs64|tok8192|spec4"]
    plain, k4 = cands[0].replica, cands[2].replica
    assert k4.speculative is not None and k4.speculative.drafter.kind == "eagle"
    # Speculation lowers the TPOT floor the pruning uses (at most K + 1 tokens a step).
    lb_plain = slo_lower_bounds_ms(plain.deployment, unit)["tpot_ms"]
    lb_spec = slo_lower_bounds_ms(k4.deployment, unit, k4.speculative)["tpot_ms"]
    assert lb_plain / 5 < lb_spec < lb_plain


@pytest.mark.slow  # two small searches' worth of simulations, ~20 s
def test_search_says_when_speculation_changes_the_cheapest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A TPOT target of 15 ms that an L40S misses at any batch without speculation (its
    one-token step is slower) but meets with an EAGLE head: the cheapest deployment moves
    from an H200 to L40S with K = 3."""
    argv = ["search", "--model", "llama-3.1-8b", "--gpu", "h200,l40s", "--num-gpus", "1",
            "--rate", "20", "--input-len", "256", "--output-len", "256", "--num-requests",
            "60", "--slo", "ttft:2000,tpot:15", "--max-num-seqs", "64",
            "--num-speculative-tokens", "0,3", "--draws", "1", "--price", str(EXAMPLE_PRICES),
            "--db", str(tmp_path / "s.db"), "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    e = out["speculative"]["llama-3.1-8b"]
    assert e["changes_cheapest"] is True
    assert e["cheapest"]["num_speculative_tokens"] == 3 and e["cheapest"]["gpu"] == "l40s"
    assert e["cheapest_plain"]["num_speculative_tokens"] == 0
    assert e["cheapest"]["cost_per_mtok"] < e["cheapest_plain"]["cost_per_mtok"]
    l40s_plain = [r for r in out["candidates"]
                  if r["gpu"] == "l40s" and r["num_speculative_tokens"] == 0]
    assert l40s_plain and all(r["status"] == "pruned" and r["limit"] == "SLO"
                              for r in l40s_plain)
    w = out["winners"]["llama-3.1-8b"]
    assert '"num_speculative_tokens": 3' in w["flags"]["vllm"]
    assert "--speculative-num-steps 3" in w["flags"]["sglang"]
