"""Traces read as published: each format told by its header, its rows as its schema says, its
prompt identity where it has one; anything else refused in one line naming the formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bstar.cli import main
from bstar.errors import BstarError
from bstar.sim.prefix import block_keys
from bstar.sim.trace_formats import HASH_BLOCK_TOKENS
from bstar.sim.traffic import parse_trace

SAMPLES = Path(__file__).parent.parent / "examples" / "traces"


def keys(tr, i: int, bs: int = 16) -> list[int]:  # type: ignore[no-untyped-def]
    ids = tr.prompt_ids
    return block_keys(ids.segments[i], ids.output_ids[i], tr.output_tokens[i], bs,
                      tr.prompt_tokens[i])


def test_mooncake_hash_ids_share_their_leading_blocks() -> None:
    text = ('{"timestamp": 27482, "input_length": 1100, "output_length": 52, '
            '"hash_ids": [46, 47, 9]}\n'
            '{"timestamp": 30535, "input_length": 1090, "output_length": 26, '
            '"hash_ids": [46, 47, 10]}\n'
            '{"timestamp": 31000, "input_length": 600, "output_length": 5, "hash_ids": [7, 47]}\n')
    tr = parse_trace(text)
    assert tr.format == "mooncake"
    assert tr.arrival_s == pytest.approx((0.0, 3.053, 3.518))  # ms, from the first
    assert tr.prompt_tokens == (1100, 1090, 600)
    a, b, c = keys(tr, 0), keys(tr, 1), keys(tr, 2)
    shared = 2 * HASH_BLOCK_TOKENS // 16  # two 512-token ids: 64 blocks of 16
    assert a[:shared] == b[:shared] and a[shared] != b[shared]
    assert a[0] != c[0]  # another first id: nothing shared, whatever follows


def test_azure_and_burstgpt_read_their_published_columns() -> None:
    az = parse_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,374,44\n"
                     "2023-11-16 18:15:50.9951690,396,109\n"
                     "2023-11-16 18:15:51.0000000,0,7\n")
    assert az.format == "azure" and az.prompt_ids is None
    assert az.prompt_tokens == (374, 396) and az.dropped == 1
    assert az.arrival_s[1] == pytest.approx(4.314579, abs=1e-9)
    bg = parse_trace("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,ChatGPT,472,18,490,Conversation log\n"
                     "45,GPT-4,1087,0,1087,API log\n"
                     "118,GPT-4,417,276,693,Conversation log\n")
    assert bg.format == "burstgpt" and bg.dropped == 1  # the failure: 0 response tokens
    assert bg.arrival_s == (0.0, 113.0) and bg.output_tokens == (18, 276)
    # BurstGPT_3's eight columns.
    bg3 = parse_trace("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
                      "Total tokens,Log Type\n1,abc,2.5,ChatGPT,10,20,30,Conversation log\n")
    assert bg3.prompt_tokens == (10,)


def test_bstar_csv_prefix_id_and_hash_ids() -> None:
    tr = parse_trace("arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
                     "0,100,5,sys-a,64\n1,90,5,sys-a,64\n2,100,5,sys-b,64\n3,50,5,,\n")
    a, b, c, d = (keys(tr, i) for i in range(4))
    assert a[:4] == b[:4] and a[4] != b[4]  # 64 shared tokens: 4 blocks of 16
    assert a[0] != c[0] and d[0] not in (a[0], c[0])
    h = parse_trace('{"arrival_s": 0, "prompt_tokens": 600, "output_tokens": 2, '
                    '"hash_ids": [1, 2]}\n'
                    '{"arrival_s": 1, "prompt_tokens": 700, "output_tokens": 2, '
                    '"hash_ids": [1, 3]}\n')
    assert keys(h, 0)[:32] == keys(h, 1)[:32] and keys(h, 0)[32] != keys(h, 1)[32]
    # The plain form has no identity, as before.
    assert parse_trace("arrival_s,prompt_tokens,output_tokens\n0,10,5\n").prompt_ids is None


@pytest.mark.parametrize("text, names", [
    ('{"ts": 0, "input_tokens": 5}\n', "input_tokens, ts"),
    ("a,b\n1,2\n", "a, b"),
    ('{"timestamp": 0, "input_length": 5}\n', "input_length, timestamp"),
])
def test_anything_else_is_one_line_naming_the_formats(text: str, names: str) -> None:
    with pytest.raises(BstarError) as e:
        parse_trace(text)
    msg = str(e.value)
    assert "\n" not in msg and names in msg
    for expected in ("arrival_s", "input_length", "ContextTokens", "Request tokens"):
        assert expected in msg
    assert "KeyError" not in msg


@pytest.mark.parametrize("name", ["mooncake-sample.jsonl", "azure-conv-2023-sample.csv",
                                  "burstgpt-synthetic-sample.csv", "bstar-prefix-sample.csv"])
def test_each_bundled_sample_parses(name: str) -> None:
    tr = parse_trace((SAMPLES / name).read_bytes())
    assert len(tr.arrival_s) + tr.dropped == 300
    assert min(tr.arrival_s) == 0.0 or tr.format == "bstar"
    assert (tr.prompt_ids is not None) == (tr.format in ("mooncake", "bstar"))


@pytest.mark.slow
def test_the_mooncake_sample_simulates_with_its_own_hits(
        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    args = ["simulate", "--trace", str(SAMPLES / "mooncake-sample.jsonl"), "--num-requests",
            "60", "--json"]
    assert main(args) == 0
    on = json.loads(capsys.readouterr().out)
    assert main([*args, "--no-prefix-caching"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert on["prefix_cache_hit_tokens"] > 0 and off["prefix_cache_hit_rate"] is None
    assert 0 < on["prefix_cache_hit_rate"] < 1
    assert np.isclose(on["prefix_cache_hit_rate"],
                      on["prefix_cache_hit_tokens"] / on["prefix_cache_query_tokens"])


@pytest.mark.parametrize("offset", ["+99:99", "-15:00", "+05:60", "+9999"])
def test_an_azure_offset_that_is_no_utc_offset_is_refused(offset: str) -> None:
    """Issue 40: `+99:99` was read as 100 h 39 min east of UTC."""
    with pytest.raises(BstarError, match="not a UTC offset"):
        parse_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    f"2023-11-16 18:15:46.6805900{offset},374,44\n")
    ok = parse_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46+14:00,374,44\n2023-11-16 18:15:47-12:00,10,5\n")
    assert ok.arrival_s[1] == pytest.approx(26 * 3600 + 1)


@pytest.mark.parametrize("header", ["arrival_s,prompt_tokens,output_tokens,prompt_tokens",
                                    "TIMESTAMP,ContextTokens,GeneratedTokens,GeneratedTokens"])
def test_a_trace_column_named_twice_is_refused(header: str) -> None:
    """Issue 40: duplicate CSV columns silently kept the last one."""
    twice = header.rsplit(",", 1)[1]
    with pytest.raises(BstarError, match=f"'{twice}' twice"):
        parse_trace(f"{header}\n0,10,5,900\n")
