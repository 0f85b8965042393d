"""The traffic flags `bstar simulate` and `bstar search` share: lengths, prompt sharing,
--from-run and a profile's recorded workload, onto the library's types. A helper, not a
command (tests/test_architecture.py's COMMAND_HELPERS). No rules here beyond which flag was
given."""

from __future__ import annotations

import argparse
from typing import Any

from bstar.commands.common import positive_int

DEFAULT_LENGTHS = ("512", "256")  # --input-len, --output-len  (simulate, search)


def add_prompt_sharing_arguments(t: Any) -> None:
    """Which prompts share which tokens (bstar.sim.prefix), and the engine's cache switch."""
    t.add_argument("--shared-prefix-tokens", type=int, default=0, metavar="N",
                   help="every prompt starts with its group's N-token system prompt, on top "
                        "of its --input-len draw; the prefix cache finds the hits (default 0)")
    t.add_argument("--prefix-groups", type=positive_int, default=1, metavar="G",
                   help="G distinct system prompts, request i in group i mod G (default 1)")
    t.add_argument("--distinct-prompts", type=int, default=0, metavar="K",
                   help="send K prompts in turn: request i repeats prompt i mod K, lengths "
                        "and all (default 0: every prompt its own)")
    t.add_argument("--multi-turn", type=int, default=0, metavar="T",
                   help="T-turn conversations: each turn's prompt is the previous prompt, its "
                        "answer and a new --input-len question (default 0: single turn)")
    t.add_argument("--no-prefix-caching", action="store_true",
                   help="simulate the engine with prefix caching off (vLLM's flag)")


def add_from_run_arguments(t: Any) -> None:
    t.add_argument("--from-run", default=None, metavar="RUN",
                   help="the traffic a stored sweep measured: its prompt and output lengths "
                        "and its prefix-cache hit rate (docs/simulate.md)")
    t.add_argument("--runs-db", default=None, metavar="FILE",
                   help="the sweep results DB --from-run reads (default: bstar sweep's)")


def prompt_shape(args: argparse.Namespace) -> Any:
    """The prompt-sharing flags as `bstar.sim.prefix.PromptShape` (None: none given)."""
    from bstar.sim.prefix import PromptShape

    shape = PromptShape(*(getattr(args, k, d) for k, d in (
        ("shared_prefix_tokens", 0), ("prefix_groups", 1), ("distinct_prompts", 0),
        ("multi_turn", 0))))
    return shape if shape.active else None


def given_lengths(args: argparse.Namespace) -> tuple[str, str]:
    """(--input-len, --output-len) as given, else their defaults. With --trace a given one
    is refused, not ignored: the trace says each request's lengths, and a flag that changes
    nothing would let the user believe the run used it (issue 40). Refused rather than a
    note, because a note scrolls past in a script and the run would still not be what was
    asked for."""
    from bstar.errors import BstarError

    given = [flag for flag, v in (("--input-len", args.input_len),
                                  ("--output-len", args.output_len)) if v is not None]
    if getattr(args, "trace", None) and given:
        raise BstarError(f"{' and '.join(given)} with --trace: the trace gives every "
                         f"request's lengths; drop {' and '.join(given)} or --trace")
    return (args.input_len if args.input_len is not None else DEFAULT_LENGTHS[0],
            args.output_len if args.output_len is not None else DEFAULT_LENGTHS[1])


def profile_traffic(args: argparse.Namespace, profile: str | None) -> Any:
    """The [workload] table of calibration profile `profile` (the sweep `bstar calibrate`
    read), when the flags give no workload: no --trace, --prefix-cached-tokens or
    prompt-sharing flag, and neither --input-len nor --output-len given (an explicit
    `--input-len 512` counts, though it is the default's value). None otherwise."""
    if not profile or getattr(args, "trace", None) or args.prefix_cached_tokens \
            or prompt_shape(args) is not None \
            or args.input_len is not None or args.output_len is not None:
        return None
    from bstar.loadgen.measured import traffic_from_profile

    return traffic_from_profile(profile)


def measured_from_args(args: argparse.Namespace, profile: str | None) -> Any:
    """The stored sweep --from-run names (`bstar.loadgen.measured`), else the traffic
    calibration profile `profile` recorded when no workload is given (`profile_traffic`),
    or None."""
    if not getattr(args, "from_run", None):
        return profile_traffic(args, profile)
    if getattr(args, "trace", None):
        from bstar.errors import BstarError

        raise BstarError("--from-run with --trace: both say what the requests are (the "
                         "run's measured lengths and sharing, or the trace's); drop one")
    from bstar.loadgen.measured import measured_traffic

    return measured_traffic(getattr(args, "runs_db", None), args.from_run)


def traffic_from_args(args: argparse.Namespace, profile: str | None
                      ) -> tuple[str, str, Any, Any]:
    """(input lengths, output lengths, PromptShape or None, MeasuredTraffic or None): the
    lengths and prompt sharing the flags give, replaced by the measured traffic's
    (`measured_from_args`) when there is one; its prompt shape only with prefix caching on."""
    shape = prompt_shape(args)
    caching = not getattr(args, "no_prefix_caching", False)
    input_len, output_len = given_lengths(args)
    measured = measured_from_args(args, profile)
    if measured is not None:
        input_len, output_len = measured.lengths(shared=caching and shape is None)
        shape = shape or (measured.prompt_shape() if caching else None)
    return input_len, output_len, shape, measured
