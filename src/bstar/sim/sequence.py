"""Per-request state as a struct of arrays (one row per request), so a step updates the
whole running batch with a few numpy operations instead of one Python object per token.

A request holds `num_tokens = prompt + generated` tokens; `num_computed` of them have their
KV in the cache (vLLM V1's num_computed_tokens). The scheduler gives each running request
`num_tokens - num_computed` new tokens to compute (the whole prompt, a chunk of it, or the one
token sampled last step); when `num_computed` catches up with `num_tokens` the step samples
one more token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# The simulator's per-step reductions over a batch, called as the ufuncs' own reduce:
# ndarray.sum(), .any(), .all(), .min() and np.cumsum go through a Python wrapper first,
# about a sixth of a call on a batch of 100 (`python -m timeit` here: a.sum() 0.91 us,
# np.add.reduce(a) 0.77 us); the same result: sum() is add.reduce.
sum_of = np.add.reduce
any_of = np.logical_or.reduce
all_of = np.logical_and.reduce
min_of = np.minimum.reduce
running_sum = np.add.accumulate


@dataclass(slots=True)
class Requests:
    prompt_tokens: IntArray
    output_tokens: IntArray  # tokens to generate (the request stops after exactly these)
    arrival_s: FloatArray  # nan until issued (closed loop)
    num_computed: IntArray
    num_generated: IntArray
    num_blocks: IntArray  # KV blocks held on the GPU
    first_token_s: FloatArray
    last_token_s: FloatArray
    finish_s: FloatArray
    num_preemptions: IntArray
    swapped: BoolArray  # KV parked in host memory (swap preemption)
    done: BoolArray

    @classmethod
    def new(cls, prompt_tokens: IntArray, output_tokens: IntArray) -> Requests:
        n = int(prompt_tokens.size)

        def nan() -> FloatArray:
            return np.full(n, np.nan)

        def zeros() -> IntArray:
            return np.zeros(n, dtype=np.int64)

        return cls(np.asarray(prompt_tokens, dtype=np.int64),
                   np.asarray(output_tokens, dtype=np.int64), nan(), zeros(), zeros(),
                   zeros(), nan(), nan(), nan(), zeros(), np.zeros(n, dtype=bool),
                   np.zeros(n, dtype=bool))

    def __len__(self) -> int:
        return int(self.prompt_tokens.size)

    def num_tokens(self, ids: IntArray) -> IntArray:
        return self.prompt_tokens[ids] + self.num_generated[ids]
