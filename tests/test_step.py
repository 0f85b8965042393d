"""bstar.step, the one price of a step: what the parts mean, checked against the model's own
byte counts (not against the pricing itself)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bstar import step as st
from bstar.deployment import IDEAL, Deployment
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

H100 = get_gpu("h100-sxm")


def test_a_mixed_checkpoint_streams_each_part_at_its_own_rate() -> None:
    """gpt-oss keeps attention, routers and norms 16-bit beside mxfp4 experts: at batch 1
    the weight read is the 4-bit bytes at the 4-bit stream plus the 16-bit bytes at the
    bandwidth efficiency."""
    m = get_model("gpt-oss-20b")
    d = Deployment(model=m, gpu=H100)
    eff = replace(IDEAL, int4_weight_stream=0.5, grouped=True, roof_sharpness=float("inf"))
    d = replace(d, eff=eff)
    w = st.shape(d).decode([1], 1)
    dense, expert, _embed = m.weight_bytes_parts(d.weight)
    dense16, expert16 = m.weight_bytes_16bit(d.weight)
    assert 0 < dense16 <= dense and expert16 < expert
    frac = 1 - (1 - m.num_experts_per_tok / m.num_experts)
    rows = m.hidden_size * 2  # one looked-up row of the untied input table
    q_bytes = (dense - dense16) + (expert - expert16) * frac
    b16 = dense16 + expert16 * frac + rows
    bw = H100.hbm_bandwidth_bytes_s
    want = q_bytes / (bw * 0.5) + b16 / bw
    parts = st.price_parts(w, d.eff)
    assert float(parts.gemm_s[0]) == pytest.approx(want, rel=1e-9)


def test_a_16bit_checkpoint_has_no_quantized_part() -> None:
    d = Deployment(model=get_model("llama-3-8b"), gpu=H100)
    w = st.shape(d).decode([4], 100)
    assert float(w.weight16_s[0]) == pytest.approx(float(w.weight_s[0]), rel=1e-12)


def test_assume_unmodeled_flag_proceeds_where_the_default_refuses(
        tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from bstar.cli import main
    from bstar.specs.model import ASSUME_ENV

    monkeypatch.setenv(ASSUME_ENV, "0")  # restored (unset) after the test
    cfg = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2,
           "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1024,
           "vocab_size": 1000, "layer_types": ["full_attention", "weird_attention"]}
    path = tmp_path / "config.json"  # type: ignore[operator]
    path.write_text(json.dumps(cfg))
    assert main(["plan", "--model", str(path), "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert "weird_attention" in err and "--assume-unmodeled" in err
    assert main(["plan", "--model", str(path), "--gpu", "h100-sxm", "--assume-unmodeled",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weight_bytes"] > 0


def test_a_chunked_layer_prices_a_prompt_chunk_from_its_own_chunk_start() -> None:
    """Llama-4's chunked attention: a query attends within its 8,192-token chunk. A prompt
    chunk that starts past a boundary was priced as end*held(end) - start*held(start), which
    went negative (a chunk of 500 on top of 8,000 tokens: -0.018 s on 4 x H100)."""
    from bstar.specs.presets import get_model

    groups = {g.kind: g for g in get_model("llama-4-scout").layer_groups()}
    chunked, full = groups["chunked"], groups["full"]
    c = chunked.chunk_tokens
    # Within one chunk it is a full layer's measure; a new chunk starts from zero.
    assert chunked.prefill_pairs(0, 500) == full.prefill_pairs(0, 500) == 500 ** 2
    assert chunked.prefill_pairs(c, c + 500) == 500 ** 2
    # Across a boundary: the first chunk's rest, then the new chunk's start.
    assert chunked.prefill_pairs(c - 192, c + 308) == (c ** 2 - (c - 192) ** 2) + 308 ** 2
    spans = np.array([0.0, 4000, c - 192, c, 3 * c + 17])
    assert np.all(chunked.prefill_pairs(spans, spans + 500) > 0)
