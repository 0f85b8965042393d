"""Which prompts share which tokens: a request's prompt identity, as the workload gives it.

A prompt is a list of segments `(content_id, tokens)`: two prompts hold the same first t
tokens exactly when their segment lists agree up to t (equal ids, and the segment that t falls
in started at the same place). A request's answer is one more segment, `output_id`; a later
prompt that quotes it (the next turn of a chat) names the same id. The prefix cache
(`bstar.sim.prefix_cache`) keys each full KV block by the prefix that ends with it
(`block_keys`), the identity vLLM's hash chain gives a block (vllm/v1/core/kv_cache_utils.py,
hash_block_tokens: parent hash, the block's tokens); the cache, not the workload, decides hits.

Generators (`PromptShape`, `shape_workload`) give the identity a trace does not:
- `shared_prefix_tokens` N with `prefix_groups` G: each prompt starts with its group's N-token
  system prompt (request i in group i mod G);
- `distinct_prompts` K: the workload sends K prompts in turn (request i repeats prompt i mod K,
  lengths and all), as inference-perf's shared_prefix generator does;
- `multi_turn` T: conversations of T turns; turn t's prompt is turn t-1's prompt, its answer and
  a new question (of --input-len tokens). Every conversation's turn t is sent before any turn
  t+1 (the conversations interleave), so prompts grow by an answer and a question a turn.

Pure: lengths and ids in, ids out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from bstar.errors import BstarError

# A workload (`bstar.sim.traffic.Workload`, which holds a PromptIds: typed by a variable so
# the two modules do not import each other).
W = TypeVar("W", bound=Any)

IntArray = npt.NDArray[np.int64]
Segments = tuple[tuple[int, int], ...]

# Content ids the generators hand out live in disjoint ranges of the int64 line.
_GROUP_BASE = 1 << 40
_PROMPT_BASE = 2 << 40
_QUESTION_BASE = 3 << 40
_OUTPUT_BASE = 4 << 40


@dataclass(frozen=True, slots=True)
class PromptIds:
    """Per request: its prompt's segments and its answer's content id."""

    segments: tuple[Segments, ...]
    output_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.segments) != len(self.output_ids):
            raise BstarError("prompt identity: one output id per request")

    def __len__(self) -> int:
        return len(self.segments)

    @staticmethod
    def distinct(prompt_tokens: IntArray) -> PromptIds:
        """Every prompt its own: no two share a token."""
        n = int(prompt_tokens.size)
        return PromptIds(tuple(((_PROMPT_BASE + i, int(p)),) for i, p in
                               enumerate(prompt_tokens.tolist())),
                         tuple(range(_OUTPUT_BASE, _OUTPUT_BASE + n)))

    def check(self, prompt_tokens: IntArray) -> None:
        lens = [sum(n for _, n in s) for s in self.segments]
        if lens != prompt_tokens.tolist():
            bad = next(i for i, (a, b) in enumerate(zip(lens, prompt_tokens.tolist(),
                                                        strict=True)) if a != b)
            raise BstarError(f"request {bad + 1}: its prompt segments hold {lens[bad]} tokens, "
                             f"its prompt {int(prompt_tokens[bad])}")

    def take(self, idx: IntArray) -> PromptIds:
        return PromptIds(tuple(self.segments[i] for i in idx.tolist()),
                         tuple(self.output_ids[i] for i in idx.tolist()))

    def cycle(self, n: int) -> PromptIds:
        """`n` requests cycling these (request i is request i mod len): a copy shares what
        the originals share (a segment two prompts hold), while content one request alone
        holds (its own question, its answer) is new in each copy, so a replay longer than
        the trace does not hit on the trace's own repeats."""
        m = len(self)
        if n <= m:
            return self.take(np.arange(n, dtype=np.int64))
        users: dict[int, int] = {}
        for segs in self.segments:
            for sid in {s for s, _ in segs}:
                users[sid] = users.get(sid, 0) + 1
        outs = set(self.output_ids)
        own = {s for s, u in users.items() if u == 1} | outs
        segments: list[Segments] = []
        output_ids: list[int] = []
        for i in range(n):
            c, j = divmod(i, m)

            def key(sid: int, c: int = c) -> int:
                return sid if c == 0 or sid not in own else hash((sid, c))

            segments.append(tuple((key(s), t) for s, t in self.segments[j]))
            output_ids.append(key(self.output_ids[j]))
        return PromptIds(tuple(segments), tuple(output_ids))


def block_keys(segments: Segments, output_id: int, output_tokens: int, block_size: int,
               limit_tokens: int) -> list[int]:
    """The key of every full block among the first `limit_tokens` tokens of prompt + answer:
    the identity of the whole prefix that ends with the block (a hash chain over segments).
    Kept for the next simulation of the same requests (a capacity search runs many)."""
    return list(_block_keys(segments, output_id, output_tokens, block_size, limit_tokens))


@lru_cache(maxsize=8192)
def _block_keys(segments: Segments, output_id: int, output_tokens: int, block_size: int,
                limit_tokens: int) -> tuple[int, ...]:
    keys: list[int] = []
    chain = 0
    pos = 0
    end = block_size
    for sid, n in (*segments, (output_id, output_tokens)):
        seg_end = pos + n
        while end <= seg_end and end <= limit_tokens:
            keys.append(hash((chain, sid, end - pos)))
            end += block_size
        if end > limit_tokens:
            break
        chain = hash((chain, sid, n))
        pos = seg_end
    return tuple(keys)


@dataclass(frozen=True, slots=True)
class PromptShape:
    """The prompt-sharing generators (module docstring); all zero: none."""

    shared_prefix_tokens: int = 0
    prefix_groups: int = 1
    distinct_prompts: int = 0
    multi_turn: int = 0

    def __post_init__(self) -> None:
        for name in ("shared_prefix_tokens", "distinct_prompts", "multi_turn"):
            if getattr(self, name) < 0:
                raise BstarError(f"--{name.replace('_', '-')} must not be negative")
        if self.prefix_groups < 1:
            raise BstarError(f"--prefix-groups must be at least 1, got {self.prefix_groups}")

    @property
    def active(self) -> bool:
        return bool(self.shared_prefix_tokens or self.distinct_prompts or self.multi_turn)

    def describe(self) -> str:
        parts = []
        if self.shared_prefix_tokens:
            parts.append(f"{self.shared_prefix_tokens}-token shared prefix in "
                         f"{self.prefix_groups} group(s)")
        if self.distinct_prompts:
            parts.append(f"{self.distinct_prompts} distinct prompts in turn")
        if self.multi_turn:
            parts.append(f"{self.multi_turn}-turn conversations")
        return ", ".join(parts) or "distinct prompts"


def shape_workload(w: W, shape: PromptShape) -> W:
    """`w` with the prompt identity `shape` asks for. The shared prefix comes on top of each
    drawn prompt (a prompt of L tokens becomes N + L); K distinct prompts repeat the first K
    draws; multi-turn prompts grow as the module docstring says. Arrival times are kept."""
    if not shape.active:
        return w
    n = w.num_requests
    inp = w.prompt_tokens.copy()
    out = w.output_tokens.copy()
    k = shape.distinct_prompts
    if k:
        inp = np.resize(inp[:k], n)
        out = np.resize(out[:k], n)
    src = np.arange(n) % k if k else np.arange(n)
    body: list[Segments] = [((_PROMPT_BASE + int(s), int(t)),) for s, t in zip(src, inp,
                                                                               strict=True)]
    output_ids = [_OUTPUT_BASE + i for i in range(n)]
    if shape.multi_turn > 1:
        body, inp = _multi_turn(body, inp, out, output_ids, shape.multi_turn)
    if shape.shared_prefix_tokens:
        g = np.arange(n) % shape.prefix_groups
        if k:  # a repeated prompt keeps its group
            g = src % shape.prefix_groups
        body = [((_GROUP_BASE + int(gi), shape.shared_prefix_tokens), *b)
                for gi, b in zip(g, body, strict=True)]
        inp = inp + shape.shared_prefix_tokens
    ids = PromptIds(tuple(body), tuple(output_ids))
    return replace(w, prompt_tokens=inp, output_tokens=out, prompt_ids=ids,
                   cached_tokens=None)


def _multi_turn(body: list[Segments], inp: IntArray, out: IntArray, output_ids: list[int],
                turns: int) -> tuple[list[Segments], IntArray]:
    """Request i is turn i // C of conversation i mod C (C = ceil(n / turns)); its prompt is
    the previous turn's prompt + answer + its own draw as the new question."""
    n = len(body)
    convs = -(-n // turns)
    segs = list(body)
    lens = inp.copy()
    for i in range(convs, n):
        prev = i - convs
        question = (_QUESTION_BASE + i, int(inp[i]))
        segs[i] = (*segs[prev], (output_ids[prev], int(out[prev])), question)
        lens[i] = lens[prev] + out[prev] + inp[i]
    return segs, lens
