"""bstar probe: the measurement arithmetic, and a written file every command can load."""

from __future__ import annotations

import itertools
import json
import re
import time
import tomllib
from pathlib import Path

import pytest

from bstar import probe as pr
from bstar.cli import main
from bstar.specs.gpu import get_gpu


def test_copy_counts_read_and_write_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # A clock that advances 0.25 s per call: each timed copy then takes exactly 0.25 s,
    # so the rate must be (bytes read + bytes written) / 0.25.
    ticks = itertools.count(0.0, 0.25)
    monkeypatch.setattr(pr.time, "perf_counter", lambda: next(ticks))
    copy_bytes = 4 << 20
    m = pr.cpu_bandwidth(copy_bytes, repeats=3, threads=2)
    assert len(m.runs) == 3
    assert m.median == pytest.approx(2 * copy_bytes / 0.25)


def test_gemm_counts_two_n_cubed(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = itertools.count(0.0, 0.5)
    monkeypatch.setattr(pr.time, "perf_counter", lambda: next(ticks))
    m = pr.cpu_matmul(64, repeats=2)
    assert m.median == pytest.approx(2 * 64**3 / 0.5)


def test_read_stream_counts_the_matrix_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = itertools.count(0.0, 0.5)
    monkeypatch.setattr(pr.time, "perf_counter", lambda: next(ticks))
    m = pr.cpu_read_bandwidth(4 << 20, repeats=2)
    assert m.median == pytest.approx((4 << 20) / 0.5)


def test_median_resists_one_slow_run() -> None:
    m = pr.Measurement("bw", "bytes/s", (10.0, 11.0, 1.0, 10.5, 9.5), "test")
    assert m.median == 10.0
    assert m.spread == pytest.approx((11.0 - 1.0) / 10.0)


def test_probe_writes_a_gpu_file_every_command_loads(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "here.toml"
    rc = main(["probe", "-o", str(out), "--device", "cpu", "--copy-mib", "8", "--gemm-n",
               "128", "--repeats", "3", "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    gpu = get_gpu(str(out))
    assert gpu.provenance == "measured"
    assert "bstar probe" in gpu.source
    assert gpu.hbm_bandwidth_bytes_s == pytest.approx(printed["hbm_bandwidth_bytes_s"])
    # The filed figure: the larger of the copy's and the read stream's median of 3 runs.
    assert gpu.hbm_bandwidth_bytes_s == pytest.approx(
        max(sorted(printed["bandwidth_runs_bytes_s"])[1],
            sorted(printed["read_bandwidth_runs_bytes_s"])[1]))
    assert gpu.memory_bytes == pr.cpu_memory_bytes()[0]
    assert gpu.bf16_flops > 0
    # Only catalog fields: the file is also a valid catalog table.
    assert set(tomllib.loads(out.read_text())) <= {
        "id", "name", "vendor", "memory_bytes", "memory_source", "hbm_bandwidth_bytes_s",
        "bf16_flops", "fp16_flops", "provenance", "source"}
    # The planner uses it like any GPU.
    assert main(["plan", "--gpu", str(out), "--model", "llama-3-8b", "--context", "512",
                 "--batch", "1,4", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["gpu"] == gpu.id


def test_probe_refuses_cuda_without_torch(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    if pr.cuda_available():
        pytest.skip("a CUDA device is present")
    assert main(["probe", "-o", str(tmp_path / "x.toml"), "--device", "cuda"]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_probe_refuses_non_toml_output(tmp_path: Path) -> None:
    assert main(["probe", "-o", str(tmp_path / "x.json")]) == 2


class _FakeTensor:
    """Each kernel takes at least 0.1 ms: an instant one measured a bandwidth past the GPU
    file's 1e16 B/s bound on a fast host (the test failed on the timer, not the probe)."""

    def copy_(self, other: object) -> _FakeTensor:
        time.sleep(1e-4)
        return self

    def __matmul__(self, other: object) -> _FakeTensor:
        time.sleep(1e-4)
        return self


def _fake_torch(hip: str | None, name: str) -> object:
    """Just enough of torch for probe_cuda: a device, tensors that copy and multiply."""
    import types

    t = types.ModuleType("torch")
    t.__version__ = "9.9.9"
    t.bfloat16, t.float16 = "bf16", "fp16"
    t.version = types.SimpleNamespace(cuda=None if hip else "12.8", hip=hip)
    t.device = lambda kind, idx: (kind, idx)
    t.ones = lambda n, dtype, device: _FakeTensor()
    t.randn = lambda *shape, dtype, device: _FakeTensor()
    t.empty_like = lambda x: _FakeTensor()
    t.cuda = types.SimpleNamespace(
        is_available=lambda: True, synchronize=lambda dev: None, empty_cache=lambda: None,
        get_device_properties=lambda dev: types.SimpleNamespace(
            name=name, total_memory=141 * 2**30))
    return t


@pytest.mark.parametrize(("hip", "name", "vendor", "runtime"), [
    (None, "NVIDIA H200", "nvidia", {"cuda": "12.8"}),
    ("6.4.43482", "AMD Instinct MI300X", "amd", {"hip": "6.4.43482"}),
])
def test_cuda_probe_writes_the_real_vendor(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str], hip: str | None,
                                           name: str, vendor: str,
                                           runtime: dict[str, str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", _fake_torch(hip, name))
    out = tmp_path / "gpu.toml"
    assert main(["probe", "--device", "cuda", "-o", str(out), "--repeats", "2",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    written = tomllib.loads(out.read_text())
    assert written["vendor"] == d["vendor"] == vendor
    assert written["name"] == name
    for k, v in runtime.items():
        assert f"{k} {v}" in written["source"]
    assert get_gpu(str(out)).vendor == vendor


def test_probe_at_an_engines_thread_count_runs_blas_at_it(tmp_path: Path) -> None:
    """`bstar demo` compares llama.cpp at N threads with a probe at N threads: BLAS picks its
    thread count when numpy loads, so the probe runs in a fresh interpreter with it set."""
    from bstar.probe import probe_cpu_toml
    from bstar.specs.gpu import load_gpu_file

    text = probe_cpu_toml(1, copy_bytes=8 << 20, gemm_n=128, repeats=1)
    assert "(1 threads)" in text and "1-thread copy" in text
    f = tmp_path / "cpu.toml"
    f.write_text(text)
    g = load_gpu_file(f)
    # The GPU file carries the runs it states: bandwidth the larger of the copy and the read
    # medians (one run each here), the matmul rate the GEMM's, memory /proc/meminfo's.
    def runs(what: str) -> float:
        m = re.search(rf"# {what} runs \((GB|GFLOP)/s\): ([\d.]+)\n", text)
        assert m is not None, what
        return float(m.group(2)) * 1e9

    bw = max(runs("copy bandwidth"), runs("read bandwidth"))
    assert g.hbm_bandwidth_bytes_s == pytest.approx(bw, abs=0.0501e9)  # printed to 0.1 GB/s
    assert g.bf16_flops == pytest.approx(runs("fp32 GEMM"), abs=0.0501e9)
    mem_kib = int(re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())[1])
    assert g.memory_bytes == mem_kib * 1024


def test_check_sizes_refuses_arrays_over_half_the_memory() -> None:
    # `--gemm-n 1000000` asks for 12 TB: refused before anything is allocated.
    from bstar.errors import BstarError
    from bstar.probe import check_sizes

    check_sizes({"copy_bytes": 2 << 20, "gemm_n": 64}, 1 << 30)
    with pytest.raises(BstarError, match="over half of this machine's memory"):
        check_sizes({"gemm_n": 1_000_000}, 64 << 30)
    with pytest.raises(BstarError, match="copy-mib"):
        check_sizes({"copy_bytes": 1 << 30}, 1 << 30)
