"""bench/transfer.py's slices (issue 37, item 0): each left-out slice is fitted on none of
its own rows, and every fit starts from the generic terms."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from bstar.runs_table import runs_from_csv
from test_validate_logo import PICKS, _table

ROOT = Path(__file__).resolve().parents[1]


def _transfer():
    spec = importlib.util.spec_from_file_location("bench_transfer_matrix",
                                                  ROOT / "bench" / "transfer.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_transfer_slices_leave_their_rows_out_and_kernel_terms_where_unseen() -> None:
    t = _transfer()
    rows = runs_from_csv(_table([*PICKS, ("sglang", "b200", "deepseek-v3"),
                                 ("trt-llm", "h200", "gpt-oss-120b")]))
    got = {(s.kind, s.engine, s.left_out): s for s in t.slices(rows)}
    assert set(got) == {("gpu", "vllm", "h200"), ("gpu", "vllm", "b200"),
                        ("gpu", "sglang", "h200"), ("gpu", "sglang", "b200"),
                        ("engine", "vllm", "vllm"), ("engine", "sglang", "sglang"),
                        ("engine", "trt-llm", "trt-llm")}
    for s in got.values():
        assert s.test and not set(map(id, s.test)) & set(map(id, s.train))
        attr = {"gpu": "gpu", "engine": "engine"}[s.kind]
        assert {getattr(r, attr) for r in s.test} == {s.left_out}
        assert s.left_out not in {getattr(r, attr) for r in s.train}
    # every fit starts generic, the kernel terms too (fit_stages_by_path then fits them
    # per kernel path of the training rows: tests/test_fit_by_path.py)
    e, _ = t.start_terms("vllm", t.FIT["vllm"])
    assert (e.moe_compute, e.moe_layer_s) == (1.0, 0.0)


def test_the_median_ttft_error_skips_rows_without_a_measured_median() -> None:
    """bench/transfer.py scores the median TTFT beside the means: over the rows that state
    one, |predicted / measured - 1|, their median."""
    from types import SimpleNamespace as NS

    t = _transfer()

    def score(pred: float | None, meas: float | None) -> NS:
        return NS(prediction=NS(ttft_p50_ms=pred), stage=NS(ttft_p50_ms=meas))

    got = t.ttft_p50_error([score(110.0, 100.0), score(50.0, 100.0), score(300.0, 200.0),
                            score(80.0, None), score(None, 100.0)])
    assert abs(got - 0.5) < 1e-12  # the median of 0.1, 0.5 and 0.5
    assert t.ttft_p50_error([score(80.0, None)]) is None


def test_a_regenerated_page_keeps_the_sections_written_after_its_matrix() -> None:
    t = _transfer()
    old = "# T\n\n## The matrix\n\n| a |\n\n## Reading this run\n\nBy hand.\n"
    new = t.page([], False, 1.0, (0.0, 0.0, 0.0)) + t.hand_written(old)
    assert new.endswith("\n## Reading this run\n\nBy hand.\n")
    assert new.count("## The matrix") == 1
    assert t.hand_written("# T\n\n## The matrix\n\n| a |\n") == ""


def test_the_page_says_which_numerical_libraries_printed_it() -> None:
    import numpy
    import scipy

    text = _transfer().page([], False, 1.0, (0.0, 0.0, 0.0))
    assert f"numpy {numpy.__version__}" in text and f"scipy {scipy.__version__}" in text
