"""The batch a windowed model runs, on a real engine (issue 28, item 4): vLLM-on-CPU serving a
tiny random-weight model with three sliding-window layers and one full one runs B_mem
requests at once, past its own start-up "Maximum concurrency", without preempting one,
because it frees the blocks behind each window as the requests decode; a burst past what
the pool holds in steady decode is preempted. The simulator, freeing the same blocks,
predicts both. Asserted on the engine's counters (`vllm:num_requests_running`,
`vllm:num_preemptions_total`), never on its speed. About a minute and a half on 2 cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.kv_pool import kv_layout
from bstar.loadgen.scrape import parse_prometheus
from bstar.servers import vllm_cpu_command, vllm_cpu_env
from bstar.sim import SchedulerConfig, SimConfig, simulate
from bstar.sim.traffic import Workload
from bstar.specs.gpu import load_gpu_file
from bstar.specs.model import from_hf_config, load_config_file
from test_model_zoo_vllm import _tiny_sliding

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

BLOCK = 32  # the CPU backend takes multiples of 32
PROMPT, OUTPUT = 64, 448
MAX_LEN = PROMPT + OUTPUT  # each request runs to max_model_len
BATCHED = 2048  # vLLM's CPU default max_num_batched_tokens, given explicitly


def _deployment(tmp_path: Path, model_dir: Path, pool_blocks: int) -> Deployment:
    """bstar's view of the server: float32, 32-token blocks, a KV pool of exactly
    `pool_blocks` of vLLM's blocks (a GPU file whose memory is the weights plus that pool)."""
    spec = from_hf_config(load_config_file(model_dir), name=model_dir.name)

    def dep(memory_bytes: int) -> Deployment:
        gpu = tmp_path / "cpu.toml"
        gpu.write_text(f'[cpu]\nname = "this CPU"\nmemory_bytes = {memory_bytes}\n'
                       'hbm_bandwidth_bytes_s = 10e9\nbf16_flops = 50e9\n'
                       'provenance = "measured"\n')
        return Deployment(model=spec, gpu=load_gpu_file(gpu), weight_dtype="fp32",
                          kv_dtype="fp32", block_size=BLOCK, reserve_bytes=0, gpu_util=1.0)

    d = dep(10**12)
    pool = pool_blocks * kv_layout(d, MAX_LEN, BATCHED).bytes_per_block
    d = dep(rl.weight_bytes_per_gpu(d) + pool)
    assert rl.kv_pool_bytes(d) == pool
    return d


class _Server:
    def __init__(self, python: str, model_dir: Path, pool_bytes: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = vllm_cpu_command(python, model_dir, port=self.port, max_num_seqs=64,
                               max_model_len=MAX_LEN, kv_cache_memory_bytes=pool_bytes)
        cmd += ["--max-num-batched-tokens", str(BATCHED), "--block-size", str(BLOCK)]
        env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
        env |= vllm_cpu_env(kv_cache_gib=None)
        self.log_path = model_dir / "vllm.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url("/metrics"), timeout=5) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for s in parse_prometheus(text):
            out[s.name] = out.get(s.name, 0.0) + s.value
            if s.name == "vllm:cache_config_info":
                out["kv_cache_max_concurrency"] = float(s.labels["kv_cache_max_concurrency"])
                out["num_gpu_blocks"] = float(s.labels["num_gpu_blocks"])
        return out

    def wait_ready(self, timeout_s: float = 480) -> dict[str, float]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"vLLM exited {self.proc.returncode}:\n"
                            + self.log_path.read_text()[-3000:])
            try:
                m = self.metrics()
                if "num_gpu_blocks" in m:
                    return m
            except OSError:
                pass
            time.sleep(2)
        pytest.fail(f"vLLM did not answer within {timeout_s:.0f} s")

    def complete(self, i: int) -> int:
        body = json.dumps({"model": "tiny", "prompt": [3 + (i * 7 + k) % 250
                                                       for k in range(PROMPT)],
                           "max_tokens": OUTPUT, "min_tokens": OUTPUT, "ignore_eos": True,
                           "temperature": 0}).encode()
        req = urllib.request.Request(self.url("/v1/completions"), data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return int(json.load(r)["usage"]["completion_tokens"])

    def burst(self, n: int) -> tuple[int, float, list[int]]:
        """`n` requests at once; (most running seen, preemptions during the burst, tokens)."""
        before = self.metrics().get("vllm:num_preemptions_total", 0.0)
        most, done = 0, threading.Event()

        def watch() -> None:
            nonlocal most
            while not done.is_set():
                most = max(most, int(self.metrics().get("vllm:num_requests_running", 0)))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with ThreadPoolExecutor(n) as ex:
                tokens = list(ex.map(self.complete, range(n)))
        finally:
            done.set()
            watcher.join()
        return most, self.metrics().get("vllm:num_preemptions_total", 0.0) - before, tokens

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _simulate(d: Deployment, n: int) -> tuple[int, int]:
    """The simulator's most running and preemptions for `n` requests arriving at once."""
    w = Workload(np.full(n, PROMPT), np.full(n, OUTPUT), np.zeros(n))
    run = simulate(d, SimConfig(SchedulerConfig(64, BATCHED)), w)
    assert run.requests.done.all()
    return max(run.timeline.num_running), run.num_preemptions


def test_vllm_runs_b_mem_of_a_windowed_model(vllm_python: str, tmp_path: Path) -> None:
    model_dir = _tiny_sliding(tmp_path)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["layer_types"] = ["sliding_attention"] * 3 + ["full_attention"]
    (model_dir / "config.json").write_text(json.dumps(cfg))
    probe = _deployment(tmp_path, model_dir, 1)
    lay = kv_layout(probe, MAX_LEN, BATCHED)
    pool_blocks = 4 * lay.blocks_per_seq  # vLLM's start-up figure: exactly 4
    d = _deployment(tmp_path, model_dir, pool_blocks)
    start_up = rl.vllm_max_concurrency(d, MAX_LEN, BATCHED)
    b_mem = rl.b_mem(d, MAX_LEN, BATCHED)
    steady = pool_blocks // lay.steady_blocks_per_seq  # decoding only, no prefill
    assert start_up == 4 and b_mem >= start_up + 2, (start_up, b_mem, lay)
    sim_ok, sim_over = _simulate(d, b_mem), _simulate(d, steady + 2)
    assert sim_ok == (b_mem, 0)  # all at once, none preempted
    assert sim_over[0] == steady + 2 and sim_over[1] > 0

    server = _Server(vllm_python, model_dir, pool_blocks * lay.bytes_per_block)
    try:
        info = server.wait_ready()
        assert int(info["num_gpu_blocks"]) == pool_blocks
        assert int(info["kv_cache_max_concurrency"] + 1e-9) == start_up
        most, preempted, tokens = server.burst(b_mem)
        print(f"B_mem {b_mem} (start-up figure {start_up}): vLLM ran {most} at once, "
              f"{preempted:g} preempted; the simulator {sim_ok}")
        assert tokens == [OUTPUT] * b_mem
        assert (most, int(preempted)) == sim_ok
        most, preempted, tokens = server.burst(steady + 2)
        print(f"{steady + 2} at once: vLLM ran {most}, {preempted:g} preempted; "
              f"the simulator {sim_over}")
        assert tokens == [OUTPUT] * (steady + 2)
        assert most == sim_over[0] and preempted > 0
    finally:
        server.stop()

