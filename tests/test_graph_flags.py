"""Issue 37, item 3: the runs table's CUDA graph settings are also plan/simulate/search flags,
in the engines' spellings (vLLM --enforce-eager, SGLang --disable-cuda-graph and
--cuda-graph-max-bs, vLLM's max_cudagraph_capture_size)."""

from __future__ import annotations

import json

import pytest

from bstar.cli import main
from bstar.deployment import NO_GRAPHS
from bstar.engines import get_engine
from bstar.specs.presets import get_model


def _plan(capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    assert main(["plan", "--model", "opt-1.3b", "--gpu", "h100-sxm", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("flag", ["--enforce-eager", "--disable-cuda-graph"])
def test_no_graphs_puts_a_small_models_decode_step_on_the_launch_floor(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """OPT-1.3B's batch-1 decode step on an H100 is shorter than its layers' eager launches
    (the vllm profile's eager_layer_s a layer): with graphs it is priced below that floor,
    without graphs at least on it."""
    floor_ms = get_model("opt-1.3b").num_layers \
        * get_engine("vllm").efficiency().eager_layer_s * 1e3
    graphed = _plan(capsys)
    eager = _plan(capsys, flag)
    assert eager["efficiency"]["graph_max_tokens"] == NO_GRAPHS
    step = [c["curve"][0]["step_ms"] for c in (graphed["contexts"][0], eager["contexts"][0])]
    assert step[0] < floor_ms <= step[1]


def test_a_capture_limit_is_the_flag_given(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--cuda-graph-max-bs", "--max-cudagraph-capture-size"):
        assert _plan(capsys, flag, "64")["efficiency"]["graph_max_tokens"] == 64


def test_no_graphs_with_a_capture_limit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--enforce-eager", "--cuda-graph-max-bs", "8", "--rate", "1",
                 "--num-requests", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--enforce-eager" in err and "--cuda-graph-max-bs" in err


def test_search_takes_the_graph_flags() -> None:
    from bstar.cli import build_parser
    from bstar.commands.search import spec_from_args

    args = build_parser().parse_args(["search", "--rate", "1", "--slo", "ttft:1000",
                                      "--enforce-eager"])
    assert spec_from_args(args).eff.graph_max_tokens == NO_GRAPHS
