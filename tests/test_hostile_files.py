"""Issue 30, items 3, 4, 5 and 7: hostile files, flags and names, each through the CLI.

Every file a user names goes through one bounded reader (bstar.safeio): a 5,000-digit
integer, 100,000-deep nesting, a folder, a FIFO, a symlink loop, an oversized or non-UTF-8
file are one line naming the file (exit 2), never a traceback or a hang. Numeric flags stay
finite after their arithmetic. Foreign files are never changed (--db, -o, --plot). Names from
servers and files print and draw as literal text, bounded; long tables are bounded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from bounded import run_bstar

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "src" / "bstar" / "presets" / "models"
DEMO_DB = ROOT / "tests" / "fixtures" / "demo-run" / "bstar-demo" / "bstar.db"
GPU = ('name = "x"\nmemory_bytes = 85899345920\nhbm_bandwidth_bytes_s = 2e12\n'
       'bf16_flops = 1e15\n')
BOUND_S = 20  # far above any case here; a hang fails instead of blocking the suite


def run(argv: list[str]) -> tuple[int, str, str]:
    """`bstar ARGV` in-process: (status, stdout, stderr), bounded in time."""
    return run_bstar(argv, BOUND_S)


def one_line_error(argv: list[str], *words: str) -> str:
    status, _, err = run(argv)
    lines = err.strip().splitlines()
    assert status == 2, (argv[:6], status, err[-800:])
    assert "Traceback" not in err and len(lines) == 1, err[-800:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# ---- item 4: one safe loader --------------------------------------------------------------
BIG_INT = "1" * 5000
DEEP_JSON = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(("name", "text", "words"), ids=lambda v: v[:20] if isinstance(v, str)
                         else None, argvalues=[
    ("points.json", '[{"batch": ' + BIG_INT + ', "tpot_ms": 10}]', ["4,300 digits"]),
    ("points-deep.json", DEEP_JSON, ["nested"]),
    ("gpu.json", json.dumps({"name": "x"})[:-1] + ', "memory_bytes": ' + BIG_INT + "}",
     ["4,300 digits"]),
    ("gpu.toml", GPU.replace("85899345920", BIG_INT), ["4,300 digits"]),
    ("gpu-deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n", ["nested"]),
    ("gpu-deep.json", DEEP_JSON, ["nested"]),
])
def test_big_ints_and_deep_nesting_are_one_line(tmp_path: Path, name: str, text: str,
                                                words: list[str]) -> None:
    p = tmp_path / name
    p.write_text(text)
    argv = ["fit", str(p)] if name.startswith("points") else ["plan", "--gpu", str(p)]
    one_line_error(argv, str(p), *words)


@pytest.mark.parametrize("flag", ["--profile", "--price"])
def test_toml_inputs_with_big_ints(tmp_path: Path, flag: str) -> None:
    p = tmp_path / "x.toml"
    p.write_text(f"as_of = \"2026-01-01\"\n[gpus.h100-sxm]\nper_gpu_hour = {BIG_INT}\n")
    if flag == "--profile":
        one_line_error(["plan", "--profile", str(p)], str(p), "4,300 digits")
    else:
        one_line_error(["search", "--rate", "1", "--slo", "ttft:1000", "--price", str(p),
                        "--db", str(tmp_path / "s.db")], str(p), "4,300 digits")


def test_config_json_that_is_a_folder_or_a_symlink_loop(tmp_path: Path) -> None:
    folder = tmp_path / "m1"
    (folder / "config.json").mkdir(parents=True)
    one_line_error(["plan", "--model", str(folder)], "config.json", "folder")
    loop = tmp_path / "m2"
    loop.mkdir()
    (loop / "config.json").symlink_to("config.json")
    one_line_error(["plan", "--model", str(loop)], "config.json", "symlink loop")
    latin = tmp_path / "m3"
    latin.mkdir()
    (latin / "config.json").write_bytes(b'{"model_type": "caf\xe9"}')
    one_line_error(["plan", "--model", str(latin)], "config.json", "UTF-8")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("argv", [
    ["fit", "{p}"], ["simulate", "--trace", "{p}", "--max-num-seqs", "8"],
    ["plan", "--gpu", "{p}.toml"], ["plan", "--profile", "{p}"], ["kv", "--metrics-file", "{p}"],
    ["validate", "{p}"],
])
def test_fifos_are_refused_not_read_forever(tmp_path: Path, argv: list[str]) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    os.mkfifo(tmp_path / "pipe.toml")
    one_line_error([a.replace("{p}", str(fifo)) for a in argv], "not a regular file")


def test_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bstar import safeio

    monkeypatch.setattr(safeio, "MAX_TABLE_BYTES", 1000)
    p = tmp_path / "big.csv"
    p.write_text("batch,tpot_ms\n" + "".join(f"{b},{10 + b / 100}\n" for b in range(1, 200)))
    one_line_error(["fit", str(p)], str(p), "1,000-byte limit")


def _llama4(tmp_path: Path, **vision: object) -> Path:
    cfg = json.loads((PRESETS / "llama-4-scout.json").read_text())
    cfg["vision_config"].update(vision)
    folder = tmp_path / "l4"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("ratio", [0, "half", 1e-300])
def test_llama4_pixel_shuffle_ratio(tmp_path: Path, ratio: object) -> None:
    one_line_error(["plan", "--model", str(_llama4(tmp_path, pixel_shuffle_ratio=ratio)),
                    "--gpu", "h100-sxm", "--num-gpus", "8"], "pixel_shuffle_ratio")


def test_catastrophic_ignore_regex_is_refused(tmp_path: Path) -> None:
    """`re:([a-z_.0-9]+)+#` took `plan` past 40 s (exponential backtracking)."""
    cfg = json.loads((PRESETS / "llama-3-8b.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "ignore": ["re:([a-z_.0-9]+)+#"]}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    one_line_error(["plan", "--model", str(p)], "regex", "repeat inside a repeat")
    # The patterns checkpoints ship still plan.
    cfg["quantization_config"]["ignore"] = ["re:.*lm_head", r"re:model.layers.\d+.mlp.gate$"]
    p.write_text(json.dumps(cfg))
    assert run(["plan", "--model", str(p), "--json"])[0] == 0


@pytest.mark.parametrize(("argv", "words"), [
    (["plan", "--reserve-gib", "1e308"], ["--reserve-gib"]),
    (["simulate", "--rate", "1", "--reserve-gib", "1e308"], ["--reserve-gib"]),
    (["simulate", "--rate", "1", "--swap-space-gib", "1e308"], ["--swap-space-gib"]),
    (["search", "--rate", "1", "--slo", "ttft:1000", "--reserve-gib", "1e308"],
     ["--reserve-gib"]),
    (["plan", "--overhead-ms", "1e308"], ["--overhead-ms"]),
    (["plan", "--overhead-per-seq-us", "1e308"], ["--overhead-per-seq-us"]),
    (["search", "--rate", "1", "--slo", "ttft:1000", "--ray", "not a host"], ["--ray"]),
    (["kv", "--url", "http://[::1"], ["--url"]),
    (["probe", "--gemm-n", "1000000", "-o", "{tmp}/p.toml"], ["--gemm-n", "memory"]),
    (["fit", "{tmp}/pts.csv", "--bootstrap", "1000000000"], ["--bootstrap", "10,000"]),
    (["simulate", "--rate", "1", "--num-requests", "1000000"], ["100,000"]),
    (["demo", "-o", "{tmp}/pts.csv"], ["is a file"]),
])
def test_numeric_and_address_flags(tmp_path: Path, argv: list[str], words: list[str]) -> None:
    (tmp_path / "pts.csv").write_text("batch,tpot_ms\n1,10\n2,10.4\n4,11\n8,12.5\n")
    one_line_error([a.replace("{tmp}", str(tmp_path)) for a in argv], *words)


def test_subnormal_interconnect_with_tensor_parallel(tmp_path: Path) -> None:
    """5e-324 B/s halved to 0.0 in the all-reduce price: ZeroDivisionError in step.py."""
    p = tmp_path / "gpu.toml"
    p.write_text(GPU + "interconnect_bytes_s = 5e-324\n")
    one_line_error(["plan", "--gpu", str(p), "--num-gpus", "2"], "interconnect_bytes_s")


# ---- item 5: nothing bstar did not create is changed --------------------------------------
def _sqlite(path: Path, sql: str) -> None:
    con = sqlite3.connect(path)
    con.executescript(sql)
    con.commit()
    con.close()


@pytest.mark.parametrize("sql", [
    # A foreign app's DB with a `meta` table (bstar's name, bstar's columns even).
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "INSERT INTO meta VALUES ('owner', 'someone');",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); CREATE TABLE users (x);",
    # A foreign `runs` table: a traceback after the file was changed.
    "CREATE TABLE runs (id INTEGER, name TEXT); INSERT INTO runs VALUES (1, 'x');",
])
def test_foreign_sqlite_is_refused_before_any_write(tmp_path: Path, sql: str) -> None:
    db = tmp_path / "app.sqlite"
    _sqlite(db, sql)
    before = _sha(db)
    for argv in (["sweep", "--db", str(db), "--url", "http://127.0.0.1:9", "--concurrency",
                  "1", "--num-requests", "1", "--served-model", "m"],
                 ["search", "--db", str(db), "--rate", "1", "--slo", "ttft:1000"],
                 ["runs", "--db", str(db), "list"], ["runs", "--db", str(db), "show", "1"]):
        one_line_error(argv, str(db))
        assert _sha(db) == before, argv
        assert sorted(x.name for x in tmp_path.iterdir()) == ["app.sqlite"], argv


@pytest.mark.slow  # ~2.5 s: draws four pictures and two reports
def test_outputs_refuse_foreign_files_through_symlinks_unless_forced(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    link_html, link_png = tmp_path / "r.html", tmp_path / "p.png"
    link_html.symlink_to(notes)
    link_png.symlink_to(notes)
    pts = tmp_path / "pts.csv"
    pts.write_text("batch,tpot_ms\n1,10\n2,10.4\n4,11\n8,12.5\n")
    shutil.copy(notes, notes.with_suffix(".html"))
    for argv in (["report", "plan", "-o", str(notes.with_suffix(".html"))],
                 ["report", "plan", "-o", str(link_html)],
                 ["plan", "--plot", str(link_png)],
                 ["calibrate", str(pts), "--model", "llama-3-8b", "--gpu", "h100-sxm",
                  "--context", "1024", "-o", str(notes)],
                 ["probe", "-o", str(notes), "--copy-mib", "1", "--gemm-n", "64"]):
        one_line_error(argv, "--force")
        assert notes.read_text() == "mine\n"
        assert notes.with_suffix(".html").read_text() == "mine\n"
    # bstar's own earlier output is replaced without --force; a foreign file with it.
    own = tmp_path / "own.html"
    assert run(["report", "plan", "--context", "512", "-o", str(own)])[0] == 0
    assert run(["report", "plan", "--context", "512", "-o", str(own)])[0] == 0
    for suffix in (".png", ".svg"):
        pic = tmp_path / f"own{suffix}"
        assert run(["plan", "--context", "512", "--plot", str(pic)])[0] == 0
        assert run(["plan", "--context", "512", "--plot", str(pic)])[0] == 0, suffix
    assert run(["plan", "--context", "512", "--plot", str(link_png), "--force"])[0] == 0
    assert notes.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(("target", "words"), [
    ("/dev/full", ["not a regular file"]), ("{tmp}/d.png", ["is a folder"]),
    ("{tmp}/" + "a" * 300 + ".png", ["255"]),
])
def test_plot_to_devices_folders_and_long_names(tmp_path: Path, target: str,
                                                words: list[str]) -> None:
    (tmp_path / "d.png").mkdir()
    one_line_error(["plan", "--plot", target.replace("{tmp}", str(tmp_path))], *words)


@pytest.mark.slow  # ~2 s: draws the picture before the write fails
def test_plot_to_a_full_disk_is_one_line(tmp_path: Path) -> None:
    link = tmp_path / "full.png"
    link.symlink_to("/dev/full")
    if not Path("/dev/full").exists():  # pragma: no cover
        pytest.skip("no /dev/full")
    one_line_error(["plan", "--plot", str(link), "--force"], "cannot write", "--plot")


# ---- item 3: untrusted names are text -----------------------------------------------------
HOSTILE_ID = ("\x1b]8;;http://evil\x1b\\[link=http://evil]click[/link] [/] \x1b[31mRED"
              + "x" * 100_000)


@pytest.fixture
def hostile_db(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "runs.db"
    shutil.copy(DEMO_DB, db)
    con = sqlite3.connect(db)
    run_id = con.execute("SELECT id FROM runs").fetchone()[0]
    con.execute("UPDATE runs SET served_model = ?, server_version = ?",
                (HOSTILE_ID, "[bold]v\x07"))
    con.commit()
    con.close()
    return db, run_id


@pytest.mark.parametrize("action", [["list"], ["show", "{run}"]])
def test_server_names_never_drive_the_terminal(hostile_db: tuple[Path, str],
                                               action: list[str]) -> None:
    db, run_id = hostile_db
    status, out, err = run(["runs", "--db", str(db),
                            *(a.replace("{run}", run_id) for a in action)])
    assert status == 0, err[-800:]
    assert "\x1b" not in out and "\x07" not in out
    assert "[link=http://evil]" in out and "\\x1b" in out  # shown, not obeyed
    assert "(+99," in out  # the 100 kB id cut, and counted
    assert len(out) < 20_000


@pytest.mark.slow  # ~2 s each: matplotlib draws
@pytest.mark.parametrize("command", ["plan", "compare", "simulate"])
def test_names_are_literal_in_plots_and_text(tmp_path: Path, command: str) -> None:
    pytest.importorskip("matplotlib")
    folder = tmp_path / "m" / "$\\bogus$ [/] [link=http://x]y\x1b]0;T\x07"
    folder.mkdir(parents=True)
    shutil.copy(PRESETS / "llama-3-8b.json", folder / "config.json")
    extra = ["--rate", "1", "--num-requests", "10", "--max-num-seqs", "8"] \
        if command == "simulate" else []
    status, out, err = run([command, "--model", str(folder), "--plot",
                            str(tmp_path / "x.png"), *extra])
    assert status == 0, err[-800:]
    assert "\x1b" not in out and "\x07" not in out and "Glyph" not in err
    assert (tmp_path / "x.png").stat().st_size > 0


# ---- item 7: bounded terminal tables ------------------------------------------------------
@pytest.mark.slow  # ~2.5 s: two fits of 20,000 points
def test_long_tables_show_head_tail_and_count(tmp_path: Path) -> None:
    p = tmp_path / "pts.csv"
    p.write_text("batch,tpot_ms\n" + "".join(
        f"{b},{10 + 0.0005 * b + (b % 7) * 0.01:.4f}\n" for b in range(1, 20_001)))
    status, out, err = run(["fit", str(p), "--bootstrap", "0"])
    assert status == 0, err
    assert len(out.splitlines()) < 120
    assert re.search(r"19,970 more rows \(--json has all 20,000\)", out)
    status, out, _ = run(["fit", str(p), "--bootstrap", "0", "--json"])
    assert status == 0 and len(json.loads(out)["points"]) == 20_000


@pytest.mark.slow  # ~1.5 s: a leave-one-out calibration
def test_validate_prints_file_names_as_data(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A model folder named with an OSC sequence in a validation table reached the
    terminal raw (the rows table prints each row's model)."""
    folder = tmp_path / "m\x1b]0;T\x07"
    folder.mkdir()
    shutil.copy(PRESETS / "llama-3-8b.json", folder / "config.json")
    table = tmp_path / "rows.csv"
    head = "model,gpu,num_gpus,engine,input_len,output_len,batch,metric,value,source\n"
    table.write_text(head + "".join(
        f"{m},h100-sxm,1,vllm,512,128,{b},throughput_tok_s,{v},x\n"
        for m, b, v in (("llama-3-8b", 8, 900), (folder.name, 8, 900),
                        ("llama-3-8b", 16, 1500))))
    monkeypatch.chdir(tmp_path)  # a short relative name: its ESC within the printed 12
    status, out, err = run(["validate", str(table)])
    assert status == 0, err[-800:]
    assert "\x1b" not in out and "\\x1b" in out


# Issue 40, item 4: every profile field against one schema (deployment.FIELD_RANGES), the
# error naming the file and the field. `inf` ran a simulation to its 86,400 s cap and blamed
# the KV pool; `nan` named neither file nor field; 1e308 was simulated without a word.
@pytest.mark.parametrize(("table", "field", "value"), [
    ("behaviour", "request_overhead_s", "inf"), ("behaviour", "front_token_s", "inf"),
    ("behaviour", "request_overhead_s", "nan"), ("behaviour", "front_token_s", "1e308"),
    ("efficiency", "overhead_s", "1e308"), ("efficiency", "overhead_s", "nan"),
    ("efficiency", "moe_layer_s", "1e308"), ("efficiency", "eager_layer_s", "inf"),
    ("efficiency", "score_bytes", "nan"), ("efficiency", "graph_max_tokens", "1e308"),
    ("efficiency", "moe_compute", "inf"), ("efficiency", "roof_sharpness", "nan"),
    ("efficiency", "bandwidth", "'fast'"),
])
def test_profile_fields_are_finite_and_in_range(tmp_path: Path, table: str, field: str,
                                                value: str) -> None:
    prof = tmp_path / "p.toml"
    prof.write_text(f"[efficiency]\nbandwidth = 0.8\n[{table}]\n{field} = {value}\n"
                    .replace("bandwidth = 0.8\n[efficiency]\n", ""))
    one_line_error(["simulate", "--profile", str(prof), "--rate", "1", "--num-requests", "5",
                    "--max-num-seqs", "4"], str(prof), field)


def test_profile_strings_never_drive_the_terminal(tmp_path: Path) -> None:
    """Issue 40, item 5: `[profile] gpu` and `[workload] run` reached the terminal with their
    escape sequences (a window title, a clipboard write)."""
    prof = tmp_path / "p.toml"
    prof.write_text('[profile]\ngpu = "\\u001b]0;PWNED\\u0007h100"\n[efficiency]\n'
                    'bandwidth = 0.5\n[workload]\nrun = "\\u001b]52;c;aGk=\\u0007r"\n'
                    "prompt_tokens = [100, 200]\noutput_tokens = [10, 20]\n")
    status, out, err = run(["simulate", "--profile", str(prof), "--rate", "2",
                            "--num-requests", "6", "--max-num-seqs", "4"])
    assert status == 0, err[-800:]
    for text in (out, err):
        assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;PWNED" in err and "\\x1b]52;c;" in out  # shown, not obeyed


# Issue 40, item 3: `--acceptance-rate from:FILE` read the file outside the bounded reader.
# A badly shaped `levels` or a string counter gave AttributeError or TypeError, deep nesting
# RecursionError, and NaN or Infinity counters an acceptance rate of 4e-19.
_SRV = '{"spec_num_accepted_tokens": %s, "spec_tokens_per_step": %s}'


@pytest.mark.parametrize(("text", "words"), [
    ('{"levels": {"a": 1}}', ["levels must be a list"]),
    ('{"levels": [1, 2]}', ["levels[0] must be an object"]),
    ('[1, 2]', ["levels must be a list"]),
    ('{"levels": [{"server": "x"}]}', ["levels[0].server must be an object"]),
    ('{"levels": [{"server": %s}]}' % (_SRV % ('"552"', "1.9")),
     ["levels[0].server.spec_num_accepted_tokens"]),
    ('{"levels": [{"server": %s}]}' % (_SRV % ("NaN", "1.9")),
     ["levels[0].server.spec_num_accepted_tokens"]),
    ('{"levels": [{"server": %s}]}' % (_SRV % ("552", "Infinity")),
     ["levels[0].server.spec_tokens_per_step"]),
    ('{"levels": [{"server": %s}]}' % (_SRV % ("552", "-Infinity")),
     ["levels[0].server.spec_tokens_per_step"]),
    ("[" * 100_000 + "]" * 100_000, ["nested more than"]),
], ids=["levels-object", "level-int", "top-list", "server-str", "string-counter", "nan",
        "infinity", "minus-infinity", "100k-deep"])
def test_acceptance_rate_from_a_hostile_file(tmp_path: Path, text: str,
                                             words: list[str]) -> None:
    f = tmp_path / "sweep.json"
    f.write_text(text)
    one_line_error(["plan", "--num-speculative-tokens", "3", "--acceptance-rate",
                    f"from:{f}"], str(f), *words)


def test_acceptance_rate_from_a_folder_or_fifo(tmp_path: Path) -> None:
    one_line_error(["plan", "--num-speculative-tokens", "3", "--acceptance-rate",
                    f"from:{tmp_path}"], str(tmp_path), "folder")


@pytest.mark.parametrize(("argv", "name", "text"), [
    (["fit"], "points.csv", "batch,tpot_ms,tpot_ms\n1,10,99\n2,11,99\n4,12,99\n8,14,99\n"),
    (["calibrate", "--context", "1024"], "points.csv",
     "batch,tpot_ms,batch\n1,10,64\n2,11,64\n4,12,64\n8,14,64\n"),
    (["calibrate"], "steps.csv", "batch,context_tokens,step_ms,chunk_tokens,step_ms\n"
     "1,1024,10,0,99\n"),
])
def test_a_csv_column_named_twice_is_refused(tmp_path: Path, argv: list[str], name: str,
                                             text: str) -> None:
    """Issue 40: duplicate CSV columns silently kept the last one (the reader of CSV headers,
    fit.points.read_table, refuses them for every table it reads)."""
    f = tmp_path / name
    f.write_text(text)
    twice = text.split("\n", 1)[0].rsplit(",", 1)[1]
    one_line_error([argv[0], str(f), *argv[1:]], str(f), f"column '{twice}' is named twice")
