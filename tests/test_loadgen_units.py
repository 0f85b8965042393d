"""Pure parts of the load generator: metrics, SLOs, Prometheus parsing, the store, prompts."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import statistics
from pathlib import Path

import pytest

from bstar.errors import BstarError
from bstar.loadgen.client import RequestRecord
from bstar.loadgen.metrics import summarize
from bstar.loadgen.scrape import kv_capacity_seqs, parse_prometheus, snapshot
from bstar.loadgen.store import Store, default_db_path, scrub
from bstar.loadgen.sweep import LevelPlan, SweepConfig
from bstar.loadgen.workload import fit_prompt, load_prompts_jsonl, random_text
from bstar.slo import Slo, parse_slo
from bstar.stats import percentile, percentiles_ms

np = pytest.importorskip("numpy")


def rec(i: int, ttft: float, e2e: float, out: int, ok: bool = True, **kw: object) -> RequestRecord:
    gaps = [(e2e - ttft) / (out - 1)] * (out - 1) if ok and out > 1 else []
    return RequestRecord(index=i, ok=ok, start_s=0.0, ttft_s=ttft if ok else None,
                         e2e_s=e2e, itl_s=gaps, prompt_tokens=10, output_tokens=out,
                         token_source="usage", **kw)  # type: ignore[arg-type]


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(1)
    for n in (1, 2, 5, 100):
        v = sorted(rng.random() for _ in range(n))
        for q in (0, 50, 90, 99, 100):
            assert percentile(v, q) == pytest.approx(float(np.percentile(v, q)))


def test_summarize_follows_vllm_definitions() -> None:
    recs = [rec(0, 0.1, 1.1, 11), rec(1, 0.2, 2.2, 21), rec(2, 0.3, 0.3, 1),
            rec(3, 0.0, 0.5, 0, ok=False, error_kind="http_5xx"),
            rec(4, 9.0, 9.0, 5, warmup=True)]
    s = summarize(recs, duration_s=4.0)
    assert s.requests == 4 and s.completed == 3 and s.errors == 1
    assert s.error_kinds == {"http_5xx": 1}
    assert s.output_tokens == 11 + 21 + 1
    assert s.throughput_tok_s == pytest.approx(33 / 4.0)
    assert s.total_tok_s == pytest.approx((33 + 30) / 4.0)
    # TPOT = (E2E - TTFT) / (out - 1): 0.1 s for both multi-token requests; none for 1 token.
    assert s.tpot_ms["mean"] == pytest.approx(100.0)
    assert s.ttft_ms["p50"] == pytest.approx(200.0)
    assert s.e2e_ms["mean"] == pytest.approx(1e3 * statistics.mean([1.1, 2.2, 0.3]))
    assert s.itl_ms["p99"] == pytest.approx(100.0)
    assert s.token_source == "usage"
    assert s.goodput_req_s is None


def test_goodput_counts_requests_meeting_every_slo() -> None:
    recs = [rec(0, 0.1, 1.1, 11), rec(1, 0.6, 1.6, 11), rec(2, 0.1, 3.1, 11)]
    s = summarize(recs, 2.0, parse_slo("ttft:500,tpot:150"))
    # 1: TTFT 600 ms fails; 2: TPOT 300 ms fails; only 0 meets both.
    assert s.goodput_req_s == pytest.approx(0.5)


def test_parse_slo_rejects_bad_input() -> None:
    assert parse_slo("ttft:500, tpot_ms:50,e2e:3000").by_metric() == {
        "ttft": 500, "tpot": 50, "e2e": 3000}
    assert parse_slo("ttft:500, tpot_ms:50,e2e:3000") == Slo(500, 50, 3000)
    for bad in ("ttft", "itl:5", "tpot:x", "tpot:-1"):
        with pytest.raises(BstarError):
            parse_slo(bad)


def test_dist_of_nothing_is_none() -> None:
    assert percentiles_ms([]) == {"p50": None, "p90": None, "p99": None, "mean": None}


VLLM_METRICS = """
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 7.0
vllm:num_requests_running{engine="0",model_name="tiny"} 4.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 12.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.93
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="4096",\
prefix_caching_hash_algo="builtin"} 1.0
vllm:generation_tokens_total{engine="0",model_name="tiny"} 1234.0
"""


def test_snapshot_reads_vllm_metrics_old_and_new_names() -> None:
    s = snapshot(parse_prometheus(VLLM_METRICS))
    assert s.engine == "vllm"
    assert s.preemptions_total == 7 and s.running == 4 and s.waiting == 12
    assert s.kv_cache_usage == pytest.approx(0.93)
    assert (s.num_gpu_blocks, s.block_size) == (4096, 16)
    old = VLLM_METRICS.replace("num_preemptions_total", "num_preemptions").replace(
        "kv_cache_usage_perc", "gpu_cache_usage_perc")
    s2 = snapshot(parse_prometheus(old))
    assert s2.preemptions_total == 7 and s2.kv_cache_usage == pytest.approx(0.93)


def test_snapshot_reads_llamacpp_metrics() -> None:
    text = ("llamacpp:requests_processing 2\nllamacpp:requests_deferred 3\n"
            "llamacpp:tokens_predicted_total 99\n")
    s = snapshot(parse_prometheus(text))
    assert (s.engine, s.running, s.waiting, s.generation_tokens_total) == ("llamacpp", 2, 3, 99)
    assert s.preemptions_total is None and s.kv_cache_usage is None


def test_kv_capacity_in_sequences() -> None:
    # 4096 blocks of 16 tokens; a 100-token sequence takes ceil(100/16) = 7 blocks.
    assert kv_capacity_seqs(4096, 16, 100) == 4096 // 7
    assert kv_capacity_seqs(None, 16, 100) is None


def test_store_round_trip_and_wal(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as st:
        rid = st.create_run(url="http://127.0.0.1:1", served_model="m", model=None, gpu=None,
                            options={"input_len": 3, "api_key": "sk-secret"},
                            bstar_version="0")
        lid, attempt = st.start_level(rid, 0, concurrency=2, rate=None, max_num_seqs=None)
        assert attempt == 1
        st.add_request(lid, rec(0, 0.1, 1.1, 11))
        # Visible to another connection at once: committed per request.
        other = sqlite3.connect(db)
        assert other.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 1
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        other.close()
        back = st.requests(lid)[0]
        assert back.output_tokens == 11 and back.itl_s == pytest.approx([0.1] * 10)
        run = st.get_run(rid[:12])
        assert run is not None and "api_key" not in run["options"]
        assert st.start_level(rid, 0, concurrency=2, rate=None, max_num_seqs=None)[1] == 2
    assert "sk-secret" not in db.read_bytes().decode("latin-1")
    assert scrub({"API_KEY": 1, "x": 2}) == {"x": 2}


def test_default_db_path_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BSTAR_DATA_DIR", str(tmp_path))
    assert default_db_path() == tmp_path / "runs.db"


def test_levels_plan() -> None:
    cfg = SweepConfig(url="http://127.0.0.1:1", max_num_seqs=[1, 4], server_cmd="x {max_num_seqs}")
    assert [(lv.concurrency, lv.max_num_seqs) for lv in cfg.levels()] == [(1, 1), (4, 4)]
    cfg = SweepConfig(url="http://127.0.0.1:1", concurrency=[1, 8], max_num_seqs=[4],
                      server_cmd="x {max_num_seqs}")
    assert [lv.batch for lv in cfg.levels()] == [1, 4]
    assert LevelPlan(0, None, 2.0, None).batch is None
    with pytest.raises(BstarError):
        SweepConfig(url="http://127.0.0.1:1", concurrency=[1], rate=[1.0]).validate()
    with pytest.raises(BstarError):
        SweepConfig(url="http://127.0.0.1:1", max_num_seqs=[1]).validate()
    assert SweepConfig.from_options(cfg.to_options()) == cfg


def test_one_level_batch_for_the_sweep_the_fit_and_the_report() -> None:
    """A level's batch is defined once (bstar.fit.points.level_batch): the smaller of the
    client's streams and the server's cap, for a planned level, a stored one, its JSON and
    the report's x axis alike."""
    from bstar.fit.points import level_batch, points_from_sweep
    from bstar.loadgen.sweep import LevelResult
    from bstar.report.views import level_x

    cfg = SweepConfig(url="http://127.0.0.1:1", concurrency=[2, 16], max_num_seqs=[4, 8],
                      server_cmd="x {max_num_seqs}")
    plans = cfg.levels()
    assert [lv.batch for lv in plans] == [2, 4, 2, 8]
    stored = [LevelResult(lv.idx, lv.concurrency, lv.rate, lv.max_num_seqs, "completed",
                          None, 1, None, None, None, None) for lv in plans]
    as_json = [lv.to_dict() for lv in stored]
    assert ([lv.batch for lv in stored] == [level_batch(lv) for lv in as_json]
            == [level_x(lv) for lv in as_json] == [2, 4, 2, 8])
    assert level_batch({"rate": 2.0}) is None and level_batch({"concurrency": 3}) == 3
    # The fit reads the same batches from a sweep's JSON (one per batch: 2, 4 and 8).
    levels = [{**lv, "throughput_tok_s": 100.0 * lv["concurrency"], "tpot_ms": {"mean": 10.0}}
              for lv in as_json if lv["concurrency"] != 2 or lv["max_num_seqs"] == 4]
    assert points_from_sweep(levels).batch == (2, 4, 8)


def test_the_runner_imports_the_sweep_types_not_the_sweep() -> None:
    # loadgen/config.py holds SweepConfig and LevelPlan: the runner no longer reaches back
    # into sweep.py (which imports the runner), not even for annotations.
    import ast

    import bstar.loadgen.runner as runner

    tree = ast.parse(Path(runner.__file__).read_text(encoding="utf-8"))
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "bstar.loadgen.config" in modules and "bstar.loadgen.sweep" not in modules


def test_fit_prompt_hits_exact_token_count() -> None:
    # A tokenizer of ~3.3 characters per token (words of up to 4 chars are one token).
    async def count(text: str) -> int:
        return sum(max(1, -(-len(w) // 4)) for w in text.split(" ") if w) + text.count("  ")

    async def go() -> None:
        for target in (1, 7, 64, 500):
            text, n = await fit_prompt(count, random.Random(target), target, 3.3)
            assert n == target == await count(text)

    asyncio.run(go())


def test_random_text_is_seeded_and_exact() -> None:
    a = random_text(random.Random(5), 123)
    assert len(a) == 123 and a == random_text(random.Random(5), 123)
    assert a != random_text(random.Random(6), 123)


def test_prompts_jsonl(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": "hi"}) + "\n\n" + json.dumps(
        {"messages": [{"role": "user", "content": "yo"}], "output_len": 3}) + "\n")
    rows = load_prompts_jsonl(p)
    assert len(rows) == 2 and rows[1]["output_len"] == 3
    p.write_text("{bad\n")
    with pytest.raises(BstarError, match=r"not (valid )?JSON"):
        load_prompts_jsonl(p)


def test_gpu_telemetry_skips_cleanly_and_samples_a_fake_nvml(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from bstar.loadgen.scrape import GpuTelemetry

    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert GpuTelemetry.create() is None

    class Util:
        gpu, memory = 80.0, 60.0

    class Mem:
        used = 5e9

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: "h",
        nvmlDeviceGetUtilizationRates=lambda h: Util(),
        nvmlDeviceGetMemoryInfo=lambda h: Mem())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    t = GpuTelemetry.create()
    assert t is not None
    t.sample()
    t.sample()
    assert t.summary() == {"sm_util_mean_pct": 80.0, "sm_util_max_pct": 80.0,
                           "mem_bw_util_mean_pct": 60.0, "mem_bw_util_max_pct": 60.0,
                           "mem_used_max_bytes": 5e9}

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_driver))
    assert GpuTelemetry.create() is None


def test_steady_gc_freezes_for_the_outermost_level_only() -> None:
    import gc

    from bstar.loadgen.worker import steady_gc

    keep = [object() for _ in range(10)]  # something to freeze
    assert gc.get_freeze_count() == 0
    with steady_gc():
        frozen = gc.get_freeze_count()
        assert frozen >= len(keep)
        with steady_gc():  # a nested drive (warm-up inside a level) does not re-freeze
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen  # the inner exit does not unfreeze
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()


def test_ray_workers_refuse_an_address_nobody_listens_at() -> None:
    """Ray alone retries such an address for a minute or more; the pool says so at once."""
    pytest.importorskip("ray")
    from bstar.errors import BstarError
    from bstar.loadgen.workers import LoadPool
    from bstar.servers import free_port

    pool = LoadPool(2, f"127.0.0.1:{free_port()}")
    with pytest.raises(BstarError, match=r"cannot reach the Ray cluster at 127\.0\.0\.1:"):
        pool.start()
    pool.close()
