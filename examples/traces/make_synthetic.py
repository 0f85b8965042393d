"""Writes the two SYNTHETIC sample traces of this folder (README.md says why they are not
real rows): python examples/traces/make_synthetic.py

- burstgpt-synthetic-sample.csv: BurstGPT_1.csv's six published columns; Gamma-distributed
  gaps (bursty), lognormal lengths, a few failed requests logged with 0 response tokens;
- bstar-prefix-sample.csv: bstar's own columns plus prefix_id/prefix_tokens: four system
  prompts of 600 tokens shared by the requests of each group.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
N = 300


def burstgpt(rng: np.random.Generator) -> str:
    t = np.cumsum(rng.gamma(0.5, 2.0, size=N))
    req = np.maximum(1, rng.lognormal(6.0, 1.0, size=N).astype(int))
    resp = np.maximum(1, rng.lognormal(5.0, 0.8, size=N).astype(int))
    resp[rng.random(N) < 0.02] = 0  # failures, as BurstGPT_1 logs them
    model = np.where(rng.random(N) < 0.8, "ChatGPT", "GPT-4")
    log = np.where(rng.random(N) < 0.7, "Conversation log", "API log")
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    rows += [f"{int(a)},{m},{i},{o},{i + o},{lt}"
             for a, m, i, o, lt in zip(t, model, req, resp, log, strict=True)]
    return "\n".join(rows) + "\n"


def bstar_prefix(rng: np.random.Generator) -> str:
    t = np.cumsum(rng.exponential(0.25, size=N))
    group = rng.integers(0, 4, size=N)
    prompt = 600 + rng.integers(50, 400, size=N)
    out = rng.integers(50, 300, size=N)
    rows = ["arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens"]
    rows += [f"{a:.3f},{p},{o},system-{g},600"
             for a, p, o, g in zip(t, prompt, out, group, strict=True)]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    (HERE / "burstgpt-synthetic-sample.csv").write_text(burstgpt(np.random.default_rng(29)))
    (HERE / "bstar-prefix-sample.csv").write_text(bstar_prefix(np.random.default_rng(29)))
