"""What a sweep is asked to run: `SweepConfig` (every option, stored with the run) and the
`LevelPlan`s it expands to. The sweep (`sweep.py`) and the level runner (`runner.py`) both
read these; neither owns them."""

from __future__ import annotations

import urllib.parse
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from bstar.errors import BstarError
from bstar.fit.points import level_batch


@dataclass
class SweepConfig:
    """Everything a sweep needs except the API key (passed apart, never stored)."""

    url: str | None = None
    served_model: str | None = None  # None: the first model /v1/models lists
    endpoint: str = "completions"  # or "chat"
    concurrency: list[int] | None = None
    rate: list[float] | None = None
    max_num_seqs: list[int] | None = None
    server_cmd: str | None = None
    input_len: int = 128
    output_len: int = 128
    num_requests: int = 64  # measured requests per level
    warmup_requests: int | None = None  # None: one per stream
    level_time_limit_s: float = 300.0
    request_timeout_s: float = 600.0
    health_timeout_s: float = 600.0
    # Prompt seed. None: a fresh random one per run (recorded here before the run starts),
    # so a repeated sweep never finds its prompts in the server's prefix cache; give the
    # recorded value to replay a run's exact prompts.
    seed: int | None = None
    prompts_file: str | None = None
    slo: dict[str, float] = field(default_factory=dict)
    max_error_rate: float = 0.5
    min_requests_for_error_rule: int = 8
    ignore_eos: bool = True
    scrape_interval_s: float = 0.5
    model: str | None = None  # cost-model preset/config (for predictions)
    gpu: str | None = None
    # `DeploymentOptions.to_dict()` of the cost model's deployment (with model and gpu).
    deployment: dict[str, Any] = field(default_factory=dict)
    # Load from N worker processes (each its own event loop, bstar.loadgen.workers; 0: this
    # process's loop), or from N (at least 1) Ray actors with `ray` ("local": a cluster
    # started here, else its address).
    workers: int = 0
    ray: str | None = None

    def validate(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise BstarError(f"--endpoint must be completions or chat, got {self.endpoint}")
        if self.concurrency and self.rate:
            raise BstarError("give --concurrency or --rate, not both")
        if not (self.concurrency or self.rate or self.max_num_seqs):
            raise BstarError("give --concurrency, --rate or --max-num-seqs")
        if self.max_num_seqs and not self.server_cmd:
            raise BstarError("--max-num-seqs needs --server-cmd (bstar restarts the server "
                             "for each value)")
        if self.server_cmd and "{max_num_seqs}" not in self.server_cmd and self.max_num_seqs:
            raise BstarError("--server-cmd must contain {max_num_seqs}")
        if not self.url and not self.server_cmd:
            raise BstarError("give --url (or --server-cmd to let bstar start the server)")
        if self.input_len < 1 or self.output_len < 1 or self.num_requests < 1:
            raise BstarError("--input-len, --output-len and --num-requests must be >= 1")
        import math

        if self.concurrency and any(
                isinstance(c, bool) or not isinstance(c, int) or c < 1
                for c in self.concurrency):
            raise BstarError(f"--concurrency values must be integers >= 1, got "
                             f"{','.join(map(str, self.concurrency))}")
        if self.rate and any(not (isinstance(r, int | float) and math.isfinite(r) and r > 0)
                             for r in self.rate):
            raise BstarError(f"--rate values must be finite and > 0 requests/s, got "
                             f"{','.join(map(str, self.rate))}")
        if self.max_num_seqs and any(not isinstance(v, int) or v < 1
                                     for v in self.max_num_seqs):
            raise BstarError("--max-num-seqs values must be integers >= 1")
        if self.warmup_requests is not None and self.warmup_requests < 0:
            raise BstarError(f"--warmup-requests must be >= 0, got {self.warmup_requests}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or (
                self.workers < 0):
            raise BstarError(f"--workers must be an integer >= 0, got {self.workers}")
        if not 0 <= self.max_error_rate <= 1:
            raise BstarError("--max-error-rate must be in [0, 1]")
        if self.url:
            try:
                parts = urllib.parse.urlsplit(self.url)
                host, _ = parts.hostname, parts.port
            except ValueError as e:  # 'http://[::1', a port out of range
                raise BstarError(f"--url {self.url!r} is not a URL ({e})") from None
            if not host:
                raise BstarError(f"--url {self.url!r} is not a URL (http://host:port)")

    def levels(self) -> list[LevelPlan]:
        loads: list[tuple[int | None, float | None]]
        if self.rate:
            loads = [(None, r) for r in self.rate]
        elif self.concurrency:
            loads = [(c, None) for c in self.concurrency]
        else:
            loads = [(None, None)]
        out: list[LevelPlan] = []
        for mns in self.max_num_seqs or [None]:
            for conc, rate in loads:
                if conc is None and rate is None:
                    conc = mns  # fill exactly the server's batch cap
                out.append(LevelPlan(len(out), conc, rate, mns))
        return out

    def to_options(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> SweepConfig:
        known = {f.name for f in fields(cls)}
        out = {k: v for k, v in options.items() if k in known}
        if "deployment_args" in options and "deployment" not in options:
            from bstar.options import DeploymentOptions

            # A run stored before `deployment`: its flags by their argparse names.
            out["deployment"] = DeploymentOptions.from_sweep_options(options).to_dict()
        return cls(**out)


@dataclass(frozen=True)
class LevelPlan:
    idx: int
    concurrency: int | None
    rate: float | None
    max_num_seqs: int | None

    @property
    def batch(self) -> int | None:
        """The batch the server can run at this level (for the knee and the cost model)."""
        return level_batch(self)

    def label(self) -> str:
        parts = []
        if self.max_num_seqs is not None:
            parts.append(f"max_num_seqs={self.max_num_seqs}")
        if self.concurrency is not None:
            parts.append(f"concurrency={self.concurrency}")
        if self.rate is not None:
            parts.append(f"rate={self.rate:g}/s")
        return " ".join(parts)
