"""`bstar simulate` on the command line: the JSON contract and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bstar.cli import main


@pytest.mark.parametrize("argv,msg", [
    (["--max-num-seqs", "8"], "give the load"),
    (["--rate", "-3"], "--rate"),
    (["--rate", "1", "--max-num-batched-tokens", "4"], "below one"),
    (["--rate", "1", "--gpu-util", "0.2"], "no blocks"),
    (["--rate", "1", "--input-len", "900000"], "could never run"),
    (["--rate", "1", "--num-requests", "0"], "--num-requests"),
])
def test_cli_bad_input_is_one_line_exit_2(argv: list[str], msg: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bstar: error:") and msg in err and "\n" not in err



@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_cli_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--max-num-seqs", "64,16,32", "--rate", "10", "--num-requests",
                 "100", "--output-len", "64", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and [r["max_num_seqs"] for r in rows] == [16, 32, 64]
    for r in rows:
        assert {"max_num_seqs", "requests", "throughput_tok_s", "ttft_ms", "tpot_ms", "e2e_ms",
                "preemptions"} <= set(r)
        assert set(r["ttft_ms"]) >= {"p50", "p90", "p99"}
        assert r["requests"] == 100
    assert sum(r["recommended"] for r in rows) == 1
    assert rows[0]["sweep"]["max_num_seqs"] in (16, 32, 64)
    assert main(["simulate", "--max-num-seqs", "16", "--concurrency", "4", "--num-requests",
                 "20", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert isinstance(one, dict) and one["max_num_seqs"] == 16


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_trace_runs_whole_by_default(tmp_path: object, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    from pathlib import Path

    trace = Path(str(tmp_path)) / "t.csv"
    rows = "\n".join(f"{i * 0.05:.2f},{32 + i},{8 + i % 5}" for i in range(1200))
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows + "\n")
    assert main(["simulate", "--trace", str(trace), "--max-num-seqs", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 1200  # not cut to the 1000 of generated traffic
    assert main(["simulate", "--trace", str(trace), "--num-requests", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 10


@pytest.mark.parametrize("how", ["flag", "trace"])
def test_one_token_outputs_print_the_capacity_line(
        how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40, item 2: every output one token has no TPOT; the capacity line said so with
    a TypeError after the whole simulation had run."""
    if how == "flag":
        load = ["--rate", "5", "--output-len", "1", "--num-requests", "12"]
    else:
        trace = tmp_path / "t.csv"
        trace.write_text("arrival_s,prompt_tokens,output_tokens\n"
                         + "".join(f"{i / 10},{100 + i},1\n" for i in range(12)))
        load = ["--trace", str(trace)]
    assert main(["simulate", "--max-num-seqs", "8", *load]) == 0
    out = capsys.readouterr().out
    assert "capacity at max_num_seqs 8" in out and "TPOT p50/p99 n/a" in out
    # No request is ever running after its prompt's step: not "the KV pool holds 0".
    assert "holds 0" not in out and "prompt steps only" in out


@pytest.mark.parametrize("command", ["simulate", "search"])
@pytest.mark.parametrize("flags", [["--input-len", "2000"], ["--output-len", "512"],
                                   ["--input-len", "512", "--output-len", "256"]])
def test_length_flags_with_a_trace_are_refused_not_ignored(
        command: str, flags: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40: with --trace, --input-len and --output-len were silently ignored (the trace
    says every request's lengths). Refused, naming the flags; even one given at its
    default value is one the user believed in."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,5\n0.5,120,6\n1,90,7\n")
    extra = ["--slo", "ttft:1000,tpot:50", "--db", str(tmp_path / "s.db")] \
        if command == "search" else ["--max-num-seqs", "4"]
    assert main([command, "--trace", str(trace), *flags, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bstar: error:") and "\n" not in err and "--trace" in err
    for f in flags[::2]:
        assert f in err


@pytest.mark.parametrize("flags", [["--think-time-s", "2"], ["--from-run", "1"],
                                   ["--shared-prefix-tokens", "100"],
                                   ["--distinct-prompts", "3"], ["--multi-turn", "2"]])
def test_flags_a_trace_replay_would_not_use_are_refused(
        flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40: with --trace, --think-time-s (a closed loop's pause) was silently ignored,
    --from-run's measured lengths were dropped while its sharing was applied to the trace,
    and the prompt-sharing flags replaced the prefix and hash ids a Mooncake trace states.
    Each is refused in one line naming the flag, before anything runs."""
    trace = Path(__file__).parent.parent / "examples" / "traces" / "mooncake-sample.jsonl"
    assert main(["simulate", "--trace", str(trace), "--num-requests", "20",
                 "--max-num-seqs", "4", "--runs-db", str(tmp_path / "none.db"),
                 *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bstar: error:") and "\n" not in err and "--trace" in err
    assert flags[0] in err or "prompt-sharing" in err


def test_prefix_flags_still_shape_a_trace_without_its_own_sharing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The refusal above is for traces that say their own sharing: a plain CSV trace with
    --shared-prefix-tokens still gets the system prompt on top of each trace prompt."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n"
                     + "".join(f"{i / 10},{100 + i},5\n" for i in range(12)))
    assert main(["simulate", "--trace", str(trace), "--max-num-seqs", "4", "--json",
                 "--shared-prefix-tokens", "256"]) == 0
