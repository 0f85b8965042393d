"""ModelSpec: the architecture facts a decode cost model needs, read from a HF `config.json`.

Parameter counts are computed tensor by tensor from the config, never typed in, so that
the weight bytes (and hence B*) are exact for the precision chosen. The tensor list follows
the Hugging Face modeling code of each family (Llama/Mistral/Qwen2, Mixtral, Qwen3-MoE,
DeepSeek-V2/V3/V3.2 with MLA, Gemma-2/3, OPT, gpt-oss, Llama-4, Qwen3-Next, Nemotron-H,
Granite-4 and Jamba); unknown families that use Llama-style keys work too.

Each layer has a kind (docs/models.md): full attention, a sliding window, Llama-4's chunked
local attention, DeepSeek's sparse attention (MLA plus its indexer's keys), or a fixed state
(gated delta nets, Mamba). A checkpoint's `quantization_config` decides each tensor's bytes.
A layer kind, quantization method or memory-relevant key bstar does not model is refused
with a one-line error naming it, unless `assume_unmodeled` (BSTAR_ASSUME_UNMODELED=1) says
to proceed on the stated assumption.

One module per concern: `spec` (the ModelSpec type and its figures), `tensors` (the tensor
list), `weights` (bytes under a precision and the quantization_config), `layers` (kinds
and LayerGroups: what a layer holds and costs), and the reading of a config: `config`
(`from_hf_config`, `load_config_file`, `fetch_hub_config`), `keys` (integer keys in range),
`layout` (each layer's kind under each family's keys), `quant` (quantization_config).
"""

from bstar.specs.model.config import fetch_hub_config, from_hf_config, load_config_file
from bstar.specs.model.keys import ASSUME_ENV
from bstar.specs.model.layers import LayerGroup
from bstar.specs.model.spec import ModelSpec
from bstar.specs.model.tensors import Tensor

__all__ = ["ASSUME_ENV", "LayerGroup", "ModelSpec", "Tensor", "fetch_hub_config",
           "from_hf_config", "load_config_file"]
