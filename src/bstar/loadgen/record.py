"""What happened to one request (`RequestRecord`): the client fills it (loadgen/client.py),
the stream parser writes into it (loadgen/stream.py), the store keeps it. Its own module so
that the stream and the client need not import each other."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times in seconds; `start_s` is wall-clock epoch."""

    index: int
    ok: bool
    start_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    token_source: str = "counted"  # "usage" when the server's usage block gave the count
    chunks: int = 0
    http_status: int | None = None
    error_kind: str | None = None
    error: str | None = None
    warmup: bool = False
    expected_prompt_tokens: int | None = None
    expected_output_tokens: int | None = None
    # Prompt tokens the server served from its prefix cache (usage.prompt_tokens_details.
    # cached_tokens: vLLM with --enable-prompt-tokens-details, llama.cpp); None: not said.
    cached_prompt_tokens: int | None = None

    @property
    def tpot_s(self) -> float | None:
        """vLLM's per-request TPOT: (E2E - TTFT) / (output_tokens - 1)."""
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
