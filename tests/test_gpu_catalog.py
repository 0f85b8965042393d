"""Issue 37, item 1: the chip as the kernels see it. Every catalog entry states its
architecture, native tensor formats, SMs, clock, power and all-reduce path with a source;
the 2026 parts load; a user GPU file with an unknown name is refused in one line; files
written before these fields still load; `bstar gpus --json` carries them."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from bstar.cli import main
from bstar.errors import BstarError
from bstar.report.text.catalog import print_gpus
from bstar.specs.gpu import (
    ALLREDUCE_LINKS,
    ARCHS,
    TENSOR_ONLY_PRECISIONS,
    GpuSpec,
    get_gpu,
    gpu_catalog,
    load_gpu_file,
)
from bstar.specs.precision import get_precision

NEW_PARTS = ("b300", "gb200", "gb300", "mi355x", "rtx-pro-6000")
NEW_KEYS = ("arch", "native_precisions", "num_sms", "boost_clock_mhz", "tdp_w", "fp4_flops",
            "allreduce_link", "allreduce_latency_us", "chip_source", "allreduce_source")
REPO = Path(__file__).resolve().parents[1]
BASE = ('name = "x"\nmemory_bytes = 85899345920\nhbm_bandwidth_bytes_s = 2e12\n'
        'bf16_flops = 1e15\n')


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    return err


def _known_precision(name: str) -> bool:
    """In the precision vocabulary (bstar.specs.precision, as `plan --dtype` takes it) under
    its own spelling, or one of the tensor-core-only formats gpu.py names."""
    if name in TENSOR_ONLY_PRECISIONS:
        return True
    try:
        return get_precision(name).name == name
    except BstarError:
        return False


@pytest.mark.parametrize("gpu_id", NEW_PARTS)
def test_2026_parts_load_with_every_field(gpu_id: str) -> None:
    g = get_gpu(gpu_id)
    assert g.provenance == "datasheet"
    for k in ("name", "vendor", "source", "memory_source", "chip_source", "allreduce_source"):
        assert getattr(g, k).strip(), k
    assert g.source.startswith("https://")
    for k in ("hbm_bandwidth_bytes_s", "bf16_flops", "fp16_flops", "fp8_flops", "fp4_flops",
              "interconnect_bytes_s", "tdp_w", "allreduce_latency_us"):
        v = getattr(g, k)
        assert math.isfinite(v) and v > 0, k
    assert g.num_sms > 0
    # A clock NVIDIA does not publish is 0, and the source says so.
    assert g.boost_clock_mhz > 0 or "not published" in g.chip_source
    assert g.arch in ARCHS and g.allreduce_link in ALLREDUCE_LINKS
    # Every 2026 part runs a 4-bit float format natively.
    assert {"mxfp4", "nvfp4"} & set(g.native_precisions)


def test_catalog_fields_are_consistent() -> None:
    cat = gpu_catalog()
    assert set(NEW_PARTS) <= set(cat)
    for g in cat.values():
        assert g.arch in ARCHS and g.allreduce_link in ALLREDUCE_LINKS, g.id
        assert g.chip_source and g.allreduce_source, g.id
        assert g.native_precisions and all(map(_known_precision, g.native_precisions)), g.id
        assert len(set(g.native_precisions)) == len(g.native_precisions), g.id
        assert {"fp16", "bf16"} <= set(g.native_precisions), g.id
        # A format listed as native has a tensor rate, and a rate has its format listed.
        assert ("fp8" in g.native_precisions) == (g.fp8_flops > 0), g.id
        fp4 = bool({"mxfp4", "nvfp4"} & set(g.native_precisions))
        assert fp4 == (g.fp4_flops > 0), g.id
        # Dense, not sparse: FP8 at most twice BF16 (datasheets round: L40S 362.05 vs
        # 733); a narrower format never slower than a wider one (Blackwell Ultra's FP4 is
        # three times its FP8).
        assert g.fp8_flops <= 2 * g.bf16_flops * 1.03, g.id
        assert not g.fp8_flops or g.fp8_flops >= g.bf16_flops, g.id
        assert not g.fp4_flops or g.fp4_flops >= max(g.fp8_flops, g.bf16_flops), g.id
        # Memory as the device reports it: whole MiB.
        assert g.memory_bytes % 2**20 == 0, g.id
        assert g.allreduce_latency_us > 0, g.id
        # An estimate says so, and says what would pin it.
        if g.allreduce_source.startswith("estimate"):
            assert "pin" in g.allreduce_source, g.id
        # An architecture that dequantizes MXFP4 does not list it as native.
        if g.arch in ("ampere", "ada", "hopper", "cdna3"):
            assert not fp4, g.id
        if g.allreduce_link in ("nvlink-nvswitch", "nvlink-nvl72", "nvlink-bridge"):
            assert g.vendor == "nvidia", g.id
        if g.allreduce_link == "xgmi":
            assert g.vendor == "amd", g.id


def test_catalog_parses_what_the_file_says() -> None:
    """The new keys are read from gpus.toml, not defaulted: one entry's fields as written."""
    g = get_gpu("mi355x")
    assert g.arch == "cdna4" and g.allreduce_link == "xgmi"
    assert "nvfp4" not in g.native_precisions and "mxfp6" in g.native_precisions
    assert get_gpu("h200").native_precisions == ("fp16", "bf16", "fp8", "int8")


def test_old_gpu_files_still_load(tmp_path: Path) -> None:
    # A file `bstar probe` wrote before these fields existed.
    probed = load_gpu_file(REPO / "data" / "h200" / "probe.toml")
    assert probed.provenance == "measured"
    assert (probed.arch, probed.native_precisions, probed.allreduce_link) == ("", (), "")
    assert probed.boost_clock_mhz == probed.tdp_w == probed.allreduce_latency_us == 0
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"name": "x", "memory_bytes": 85899345920,
                             "hbm_bandwidth_bytes_s": 2e12, "bf16_flops": 1e15}))
    assert load_gpu_file(p).arch == ""


def test_user_file_with_the_new_fields(tmp_path: Path) -> None:
    p = tmp_path / "mine.toml"
    p.write_text(BASE + 'arch = "Hopper"\nnative_precisions = ["BF16", "fp8_e4m3", "mxfp8"]\n'
                 'boost_clock_mhz = 1980\ntdp_w = 700\nallreduce_link = "nvlink-nvswitch"\n'
                 'allreduce_latency_us = 4.5\n')
    g = load_gpu_file(p)
    # Names are stored as the precision vocabulary spells them.
    assert g.arch == "hopper" and g.native_precisions == ("bf16", "fp8", "mxfp8")
    assert (g.boost_clock_mhz, g.tdp_w, g.allreduce_latency_us) == (1980, 700, 4.5)


@pytest.mark.parametrize(("extra", "needle"), [
    ('arch = "hoper"\n', "hopper"),
    ('arch = "b200"\n', "arch"),
    ('native_precisions = ["fp8", "fp5"]\n', "fp5"),
    ('native_precisions = ["fp8-block"]\n', "native_precisions"),
    ('native_precisions = "fp8"\n', "native_precisions"),
    ('native_precisions = [8]\n', "native_precisions"),
    ('allreduce_link = "infiniband"\n', "allreduce_link"),
    ("allreduce_latency_us = nan\n", "allreduce_latency_us"),
    ("allreduce_latency_us = -3\n", "allreduce_latency_us"),
    ("tdp_w = inf\n", "tdp_w"),
    ("tdp_w = true\n", "tdp_w"),
    ("boost_clock_mhz = 1e9\n", "boost_clock_mhz"),
    ("fp4_flops = 1e30\n", "fp4_flops"),
    ('chip_source = 3\n', "chip_source"),
])
def test_bad_new_fields_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     extra: str, needle: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(BASE + extra)
    assert main(["plan", "--gpu", str(p)]) == 2
    err = _err(capsys)
    assert str(p) in err and needle in err, err


def test_unknown_arch_names_the_choices(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"name": "x", "memory_bytes": 85899345920,
                             "hbm_bandwidth_bytes_s": 2e12, "bf16_flops": 1e15,
                             "arch": "blackwel"}))
    with pytest.raises(BstarError, match=r"arch 'blackwel'.*did you mean: blackwell"):
        load_gpu_file(p)
    with pytest.raises(BstarError, match="native_precisions"):
        GpuSpec(id="x", name="x", memory_bytes=1, hbm_bandwidth_bytes_s=1e12, bf16_flops=1e12,
                native_precisions=("fp3",))


def test_gpus_json_carries_the_new_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    ids = {r["id"] for r in rows}
    assert set(NEW_PARTS) <= ids
    for r in rows:
        for k in NEW_KEYS:
            assert k in r, (r["id"], k)
        assert isinstance(r["native_precisions"], list)
        # The old keys stay (docs/contracts.md: add keys only).
        for k in ("memory_bytes", "hbm_bandwidth_bytes_s", "bf16_flops", "fp8_flops",
                  "interconnect_bytes_s", "source", "memory_source"):
            assert k in r, (r["id"], k)


def test_gpus_table_shows_the_chip() -> None:
    rows = [json.loads(json.dumps(r)) for r in _rows()]
    for width in (200, 80):
        buf = io.StringIO()
        print_gpus(rows, Console(file=buf, width=width, color_system=None))
        out = buf.getvalue()
        for word in ("blackwell-rtx", "cdna4", "nvfp4", "nvlink-nvl72", "xgmi", "rtx-pro-6000"):
            assert word in out, (width, word)
        assert max(len(line) for line in out.splitlines()) <= width


def _rows() -> list[dict[str, object]]:
    from dataclasses import asdict

    return [asdict(g) for g in gpu_catalog().values()]
