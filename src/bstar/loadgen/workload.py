"""Requests of fixed input and output lengths, from a seeded random source or a JSONL file.

Input lengths are exact in tokens, not characters: each random prompt is fitted with the
server's own tokenizer, through `/tokenize` when the server has it (vLLM, SGLang and
llama.cpp do), else by calibrating against `usage.prompt_tokens` of a one-token request.
Chat prompts also count the chat template's tokens (the calibration measures them).
Each prompt is different (seeded per index), so prefix caches (llama.cpp caches an
identical prompt) do not turn the sweep into a cache benchmark.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bstar import safeio
from bstar.errors import BstarError
from bstar.loadgen.client import OpenAIClient, RequestSpec
from bstar.loadgen.stream import MAX_TOKEN_COUNT, bad_count
from bstar.redact import clip

_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
_MAX_FIT_STEPS = 12

CountFn = Callable[[str], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """The prompts a sweep sends (fixed input and output lengths, from a seed or a JSONL
    file) and how the request asks for exactly `output_len` tokens. Not the simulator's
    `bstar.sim.traffic.Workload` (a run's requests with their arrivals)."""

    input_len: int
    output_len: int
    seed: int = 0
    endpoint: str = "completions"
    prompts_file: str | None = None
    ignore_eos: bool = True  # also sends min_tokens=output_len

    def extra_body(self) -> dict[str, Any]:
        """Fields that force the output to exactly output_len tokens where supported."""
        if not self.ignore_eos:
            return {}
        return {"ignore_eos": True, "min_tokens": self.output_len}


def random_text(rng: random.Random, num_chars: int) -> str:
    """Random lowercase words separated by spaces; exactly `num_chars` characters."""
    out: list[str] = []
    n = 0
    while n < num_chars:
        word = "".join(rng.choices(_ALPHABET, k=rng.randint(2, 9)))
        out.append(word)
        n += len(word) + 1
    return " ".join(out)[:num_chars]


def load_prompts_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Prompts from JSONL: each line {"prompt": str} or {"messages": [...]}, optionally
    with "output_len". Blank lines are skipped."""
    p = Path(path)
    if not p.is_file():
        raise BstarError(f"prompts file not found: {p}")
    rows: list[dict[str, Any]] = []
    text = safeio.read_text(p, safeio.MAX_TABLE_BYTES, "prompts file (JSON lines)")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = safeio.parse_json(line, f"{p}:{n}")
        if not isinstance(row, dict) or not ("prompt" in row or "messages" in row):
            raise BstarError(f'{p}:{n}: expected an object with "prompt" or "messages"')
        _check_prompt_row(row, f"{p}:{n}")
        rows.append(row)
    if not rows:
        raise BstarError(f"{p}: no prompts")
    return rows


MAX_OUTPUT_LEN = 10_000_000


def _check_prompt_row(row: dict[str, Any], where: str) -> None:
    """A prompts row's types: "prompt" a string; "messages" a list of objects whose
    "content" is a string; "output_len" a whole number >= 1. One line naming the row."""
    if "prompt" in row and not isinstance(row["prompt"], str):
        raise BstarError(f'{where}: "prompt" must be a string, got '
                         f'{type(row["prompt"]).__name__}')
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("content", ""), str)
                and isinstance(m.get("role", "user"), str) for m in msgs):
            raise BstarError(f'{where}: "messages" must be a non-empty list of objects with '
                             'a string "role" and "content"')
    if "output_len" in row:
        v = row["output_len"]
        if isinstance(v, bool) or not isinstance(v, int | float) or not (
                1 <= v <= MAX_OUTPUT_LEN) or v != int(v):
            raise BstarError(f'{where}: "output_len" must be a whole number in '
                             f"1..{MAX_OUTPUT_LEN}, got {v!r}")


class TokenCounter:
    """Counts prompt tokens the way the server will: /tokenize, else usage calibration.

    `method` says which was used ("tokenize", "usage", or "estimate" when the server
    answers neither); it goes into the run record.
    """

    def __init__(self, client: OpenAIClient) -> None:
        self.client = client
        self.method: str | None = None
        self._template_tokens = 0  # chat template overhead, measured once
        self.problem: str | None = None

    async def _tokenize(self, text: str) -> int | None:
        c = self.client
        # vLLM / SGLang shape first, then llama.cpp's (content, add_special).
        status, body = await c.post_json("/tokenize", {"model": c.model, "prompt": text})
        # llama.cpp answers this shape too, with an empty token list (it reads `content`):
        # only vLLM's `count` is trusted here.
        if status == 200 and isinstance(body, dict) and "count" in body \
                and not bad_count(body["count"], MAX_TOKEN_COUNT):
            return int(body["count"])  # else (10**30, "x", 2.5) not a count bstar trusts
        status, body = await c.post_json("/tokenize", {"content": text, "add_special": True})
        if status == 200 and isinstance(body, dict) and isinstance(body.get("tokens"), list):
            return len(body["tokens"])
        return None

    async def _usage(self, text: str, chat: bool) -> int:
        c = self.client
        body: dict[str, Any] = {"model": c.model, "max_tokens": 1, "stream": False}
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = text
            path = "/v1/completions"
        status, resp = await c.post_json(path, body)
        if status != 200 or not isinstance(resp, dict) or not resp.get("usage"):
            raise BstarError(
                f"cannot count prompt tokens: {path} answered HTTP {status} "
                f"without usage ({clip(str(resp), 200)})")
        usage = resp["usage"]
        n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if bad_count(n, MAX_TOKEN_COUNT):
            # 10**30 could not be stored (SQLite's integers are 64-bit), "x" raised ValueError.
            raise BstarError(f"cannot count prompt tokens: {path} answered usage.prompt_tokens "
                             f"= {clip(repr(n), 80)}: not a token count (an integer "
                             f"0..{MAX_TOKEN_COUNT})")
        return int(n)

    async def setup(self, chat: bool) -> None:
        probe = "hello world"
        n = await self._tokenize(probe)
        if n is not None and n < 1:
            n = None  # a tokenizer that counts nothing is not the one the server uses
        self.method = "tokenize" if n is not None else "usage"
        if n is None:
            try:
                await self._usage(probe, chat=False)
            except BstarError as e:
                # Neither way works (the server refuses completions: 401, 404...). The
                # requests will fail and say why; until then prompts are sized by a rough
                # 4 characters per token, and the run records that the counts are estimates.
                self.method = "estimate"
                self.problem = str(e)
                return
        if chat:
            # The template wraps the content in role markers: measure how many tokens.
            content = n if n is not None else await self._usage(probe, chat=False)
            total = await self._usage(probe, chat=True)
            self._template_tokens = max(0, total - content)

    async def count(self, text: str, chat: bool = False) -> int:
        if self.method == "estimate":
            return max(1, round(len(text) / 4))
        if self.method == "tokenize":
            n = await self._tokenize(text)
            if n is not None:
                return n + (self._template_tokens if chat else 0)
            self.method = "usage"
        return await self._usage(text, chat=chat)

    @property
    def template_tokens(self) -> int:
        return self._template_tokens


async def fit_prompt(count: CountFn, rng: random.Random, target: int,
                     chars_per_token: float) -> tuple[str, int]:
    """Random text whose token count is `target` (or the closest reached); returns
    (text, count). Grows or trims characters in proportion to the miss, then by one."""
    text = random_text(rng, max(1, round(target * chars_per_token)))
    best = (text, await count(text))
    for _ in range(_MAX_FIT_STEPS):
        n = best[1]
        if n == target:
            break
        miss = target - n
        step = max(1, round(abs(miss) * chars_per_token * 0.9))
        if miss > 0:
            text = best[0] + random_text(rng, step)
        else:
            text = best[0][: max(1, len(best[0]) - step)]
        m = await count(text)
        if abs(m - target) <= abs(n - target):
            best = (text, m)
        else:
            break
    return best


async def build_requests(client: OpenAIClient, workload: PromptSpec, *, num: int,
                         first_index: int, seed: int, counter: TokenCounter,
                         warmup: bool = False) -> list[RequestSpec]:
    """`num` RequestSpecs with indices first_index..; prompts exact in tokens."""
    chat = workload.endpoint == "chat"
    specs: list[RequestSpec] = []
    if workload.prompts_file:
        rows = load_prompts_jsonl(workload.prompts_file)
        for i in range(num):
            row = rows[(first_index + i) % len(rows)]
            out = int(row.get("output_len", workload.output_len))
            if "messages" in row and chat:
                specs.append(RequestSpec(first_index + i, out, messages=row["messages"],
                                         warmup=warmup))
            else:
                prompt = row.get("prompt") or "\n".join(
                    str(m.get("content", "")) for m in row.get("messages", []))
                specs.append(RequestSpec(first_index + i, out, prompt=prompt, warmup=warmup))
        return specs
    # Learn characters per token from one probe, then fit each prompt.
    probe_rng = random.Random(seed)
    probe = random_text(probe_rng, 200)
    n_probe = await counter.count(probe)
    cpt = 200 / max(1, n_probe)
    target = workload.input_len - (counter.template_tokens if chat else 0)
    if target < 1:
        raise BstarError(f"--input-len {workload.input_len} is shorter than the chat "
                         f"template ({counter.template_tokens} tokens)")

    async def count_fn(t: str) -> int:
        return await counter.count(t, chat=False)

    for i in range(num):
        rng = random.Random(f"{seed}:{first_index + i}")
        text, n = await fit_prompt(count_fn, rng, target, cpt)
        specs.append(RequestSpec(
            first_index + i, workload.output_len, prompt=text,
            expected_prompt_tokens=n + (counter.template_tokens if chat else 0),
            warmup=warmup))
    return specs
