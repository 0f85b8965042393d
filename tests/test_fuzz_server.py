"""Issue 30's fuzz of what a server sends, beside the CLI fuzz of files and flags
(tests/test_cli_fuzz.py): Hypothesis scripts a server on 127.0.0.1 (tests/hostile_fake.py)
whose SSE events, usage counts, /metrics and JSON answers are hostile, and drives
`bstar sweep --url` and `bstar kv --url` in-process against it. Every case must end with
an exit status in {0, 1, 2}, never a traceback, within a bound; a sweep must store every
request it sent (a bad value is that request's error kind, never a dropped stream).

Derandomized (the same cases every run); the defects this pass found are `@example`s, so
they run first, every time.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bounded import Hang, bounded
from bstar.cli import main
from bstar.loadgen.client import ERROR_KINDS
from hostile_fake import Handler, HostileServer, token_events

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs signal.alarm")]

CASE_TIMEOUT_S = 60  # a bound against a hang, far above a case's run time (~0.5 s)
NUM = 4


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        with bounded(CASE_TIMEOUT_S), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            status = main(argv)
    except Hang:
        pytest.fail(f"bstar {' '.join(argv[:3])} ran past {CASE_TIMEOUT_S} s")
    assert status in (0, 1, 2), err.getvalue()
    return status, out.getvalue(), err.getvalue()


def _settings(n: int) -> settings:
    return settings(max_examples=n, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- what a server may send ------------------------------------------------------------

# Numbers where a count goes: the edge cases first (the defects), then anything JSON holds.
hostile_number = st.one_of(
    st.sampled_from([2.5, "4", {}, [], -5, -1, 2**63, 2**64, True, None, 0, 10**30,
                     "=HYPERLINK(\"http://x\")", {"n": 4}]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8))
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)
raw_line = st.one_of(
    st.binary(max_size=40).map(lambda b: b"data: " + b + b"\n\n"),
    st.sampled_from([b"data: " + b"[" * 5000 + b"\n\n",  # nested past the stack
                     b"data: " + b"9" * 5000 + b"\n\n",  # past the int-digit limit
                     b"data: \xff\xfe{}\n\n",  # not UTF-8
                     b": keep-alive\n\n", b"event: x\n", b"data:\n\n"]))
event = st.one_of(
    st.builds(lambda t: {"choices": [{"index": 0, "text": t}]}, st.text(max_size=3)),
    st.builds(lambda c, p: {"choices": [], "usage": {"completion_tokens": c,
                                                     "prompt_tokens": p}},
              hostile_number, hostile_number),
    st.builds(lambda u: {"choices": [], "usage": u}, json_value),
    st.builds(lambda e: {"error": e}, json_value),
    st.builds(lambda c: {"choices": c}, json_value),
    json_value, raw_line)

metric_name = st.sampled_from(["vllm:num_requests_running", "vllm:num_requests_waiting",
                               "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                               "vllm:generation_tokens_total",
                               "vllm:iteration_tokens_total_count",
                               "llamacpp:n_decode_total", "vllm:prefix_cache_hits_total",
                               "sglang:max_total_num_tokens", "tgi_queue_size"])
metric_value = st.one_of(
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "-3", "18446744073709551617", "0x10",
                     "", "1_000", "9" * 400]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=6))
label_value = st.one_of(st.sampled_from(["inf", "nan", "-1", "1e400", "9" * 400, "1.5",
                                         "16"]), st.text(max_size=6))
metric_line = st.one_of(
    st.builds(lambda n, v: f"{n} {v}", metric_name, metric_value),
    st.builds(lambda b, s, v: (f'vllm:cache_config_info{{num_gpu_blocks="{b}",'
                               f'block_size="{s}"}} {v}'), label_value, label_value,
              metric_value),
    st.text(max_size=30))
metrics_body = st.one_of(
    st.lists(metric_line, max_size=8).map(lambda ls: "\n".join(ls).encode("utf-8",
                                                                          "surrogatepass")),
    st.binary(max_size=200))
models_body = st.one_of(
    st.just({"data": [{"id": "tiny"}]}),
    json_value.map(lambda v: {"data": v}),
    st.builds(lambda i: {"data": [{"id": i}, {"id": "tiny"}]}, json_value))


def _routes(events: list[Any], metrics: bytes, models: Any) -> dict[str, Any]:
    def completions(h: Handler, body: dict[str, Any], n: int) -> None:
        h.send_events(events)

    def metrics_route(h: Handler, body: dict[str, Any], n: int) -> None:
        h.send_raw(metrics)

    def models_route(h: Handler, body: dict[str, Any], n: int) -> None:
        h.send_json(200, models)

    return {"/v1/completions": completions, "/metrics": metrics_route,
            "/v1/models": models_route}


@given(events=st.lists(event, max_size=8), metrics=metrics_body, models=models_body)
@example(events=token_events(4, {"prompt_tokens": 8, "completion_tokens": 2.5}),
         metrics=b"vllm:num_requests_running +Inf\n", models={"data": [{"id": "tiny"}]})
@example(events=token_events(4, {"prompt_tokens": 8, "completion_tokens": -136}),
         metrics=b'vllm:cache_config_info{num_gpu_blocks="inf"} 1\n',
         models={"data": [{"id": "tiny"}]})
@example(events=token_events(4, {"prompt_tokens": "=HYPERLINK(\"x\")",
                                 "completion_tokens": 2**64}),
         metrics=b"\xff\xfe", models={"data": [{"id": {"x": 1}}, {"id": "tiny"}]})
@_settings(60)
def test_sweep_against_a_hostile_server(events: list[Any], metrics: bytes,
                                        models: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp, \
            HostileServer(_routes(events, metrics, models)) as s:
        db = Path(tmp) / "r.db"
        rc, out, err = run_cli([
            "sweep", "--url", s.url, "--served-model", "tiny", "--concurrency", "2",
            "--input-len", "8", "--output-len", "4", "--num-requests", str(NUM),
            "--warmup-requests", "0", "--max-error-rate", "1", "--request-timeout", "20",
            "--level-time-limit", "40", "--db", str(db), "--json", "--quiet"])
        sent = s.counts.get("/v1/completions", 0)
    if rc == 2:  # refused before any load (e.g. /v1/models lists no "tiny")
        assert sent == 0 and err.startswith("bstar: error:"), err
        return
    d = json.loads(out)
    for lv in d["levels"]:
        if lv["status"] == "server_failed":
            assert sent == 0
            continue
        # Every request sent is stored, each failure with a kind bstar knows.
        assert lv["requests"] == NUM == sent, (lv, err)
        assert lv["status"] in ("completed", "failed"), lv
        assert set(lv["error_kinds"]) <= set(ERROR_KINDS), lv["error_kinds"]
        tput = lv["throughput_tok_s"]
        assert tput is None or tput >= 0
        srv = lv["server"] or {}
        for key in ("running_max", "waiting_max", "kv_cache_usage_max", "tokens_per_step"):
            v = srv.get(key)
            assert v is None or 0 <= v < 2**53, (key, v)


@given(metrics=metrics_body, status=st.sampled_from([200, 200, 200, 302, 500]))
@example(metrics=b"vllm:num_requests_running NaN\n" + b"x" * 100, status=200)
@_settings(80)
def test_kv_url_against_hostile_metrics(metrics: bytes, status: int) -> None:
    def route(h: Handler, body: dict[str, Any], n: int) -> None:
        if status == 302:
            h.redirect("/metrics")  # a loop: bounded by the redirect limit
        else:
            h.send_raw(metrics, status)

    with HostileServer({"/metrics": route}) as s:
        rc, out, err = run_cli(["kv", "--url", s.url, "--model", "llama-3-8b",
                                "--gpu", "h100-sxm", "--json"])
    if rc == 2:
        assert err.startswith("bstar: error:") and len(err.splitlines()) == 1, err
    else:
        json.loads(out)
