"""The link a finished prefill's KV crosses to its decode worker, and the price of the
crossing. Pure, no I/O.

A disaggregated deployment (bstar.disaggregate) prefills a prompt on one worker and decodes
it on another: the prompt's KV moves between them once, after the prefill (NIXL over UCX in
Dynamo, SGLang and TensorRT-LLM; Mooncake's transfer engine is the same kind). Each
receiving GPU gets the KV its attention shard holds, over its own link, and the GPUs of a
worker receive side by side:

    kv_bytes          = the model's exact KV bytes of the prompt, in the KV dtype
                        (ModelSpec.kv_bytes_per_seq: every layer, windows capped)
    bytes_per_gpu     = the same at the decode side's attention tensor-parallel size
                        (MLA's latent is not split by TP: every rank holds all of it)
    transfer_s        = link latency + bytes_per_gpu / link bandwidth per GPU, one way

The links (`LINKS`): NVLink inside one node and inside an NVL72 domain (bandwidth from the
GPU catalog: `interconnect_bytes_s` is both directions, so half of it one way), InfiniBand
NDR and RoCE at 400 Gb/s per GPU across nodes (one ConnectX-7 NIC per GPU, as in DGX/HGX
H100 and H200 systems). The latencies are estimates, stated as such: a transfer is a batch
of RDMA writes plus a completion notice, a few microseconds on the wire; the software around
it (NIXL's descriptor lists, the engine's bootstrap handshake) is not in them
(docs/disaggregation.md, "What bstar does not model").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bstar.errors import BstarError

if TYPE_CHECKING:
    from bstar.specs.gpu import GpuSpec
    from bstar.specs.model import ModelSpec
    from bstar.specs.precision import Precision

GBIT_S = 1e9 / 8  # bytes per second in one Gb/s

# kind: (name, bytes/s per GPU one way or None = from the GPU catalog, latency s, source)
LINKS: dict[str, tuple[str, float | None, float, str]] = {
    "nvlink": ("NVLink inside one node (NVSwitch)", None, 5e-6,
               "bandwidth: the GPU catalog's interconnect_bytes_s / 2 (one direction); "
               "latency: estimate, one NVSwitch hop plus a copy engine's start"),
    "nvl72": ("NVLink inside one NVL72 domain (multi-node NVLink)", None, 5e-6,
              "bandwidth: the GPU catalog's interconnect_bytes_s / 2 (NVL72: every GPU one "
              "NVSwitch hop from every other); latency: estimate, as inside a node"),
    "ib-ndr": ("InfiniBand NDR, 400 Gb/s per GPU (NIXL/UCX, GPUDirect RDMA)", 400 * GBIT_S,
               10e-6,
               "NVIDIA DGX H200 datasheet, networking: 8 single-port ConnectX-7 VPI, "
               "400 Gb/s InfiniBand/Ethernet, one per GPU for the compute fabric; "
               "latency: estimate, RDMA writes through two switch hops and a completion"),
    "roce": ("RoCE v2 Ethernet, 400 Gb/s per GPU (NIXL/UCX)", 400 * GBIT_S, 15e-6,
             "400 GbE per GPU (ConnectX-7 or BlueField-3 SuperNIC, NVIDIA Spectrum-X "
             "reference architecture); latency: estimate, as "
             "InfiniBand plus Ethernet switching"),
}
LINK_KINDS = tuple(LINKS)


@dataclass(frozen=True, slots=True)
class KvLink:
    """One link kind as a receiving GPU sees it: bandwidth one way and latency."""

    kind: str
    name: str
    bytes_s: float  # per GPU, one direction
    latency_s: float
    source: str

    def __post_init__(self) -> None:
        if not self.bytes_s > 0:
            raise BstarError(f"KV link {self.kind}: bandwidth must be positive, got "
                             f"{self.bytes_s!r}")
        if not 0 <= self.latency_s <= 1.0:
            raise BstarError(f"KV link {self.kind}: latency must be in [0, 1] s, got "
                             f"{self.latency_s!r}")

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "bytes_s_per_gpu": self.bytes_s,
                "latency_us": self.latency_s * 1e6, "source": self.source}


def kv_link(kind: str, gpu: GpuSpec) -> KvLink:
    """The link `kind` (one of LINK_KINDS) from `gpu` (NVLink's bandwidth is the GPU's)."""
    if kind not in LINKS:
        raise BstarError(f"unknown KV link {kind!r}; one of {', '.join(LINK_KINDS)}")
    name, bw, latency, source = LINKS[kind]
    if bw is None:
        if kind == "nvl72" and gpu.allreduce_link != "nvlink-nvl72":
            raise BstarError(f"KV link nvl72: {gpu.id} is not in an NVL72 domain "
                             f"(its link is {gpu.allreduce_link or 'unknown'}); give nvlink "
                             "inside a node, or ib-ndr / roce across nodes")
        if kind == "nvlink" and not gpu.allreduce_link.startswith("nvlink"):
            raise BstarError(f"KV link nvlink: {gpu.id} has no NVLink "
                             f"({gpu.allreduce_link or 'unknown'}); give ib-ndr or roce")
        bw = gpu.interconnect_bytes_s / 2
    return KvLink(kind, name, bw, latency, source)


def default_link_kind(gpu: GpuSpec, total_gpus: int, gpus_per_node: int = 8) -> str:
    """The link a deployment of `total_gpus` (prefill + decode) takes unless told: NVLink
    when both sides fit in one node, NVL72 inside one NVL72 domain, else InfiniBand."""
    if total_gpus <= gpus_per_node and gpu.allreduce_link.startswith("nvlink"):
        return "nvlink"
    if gpu.allreduce_link == "nvlink-nvl72" and total_gpus <= 72:
        return "nvl72"
    return "ib-ndr"


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """The price of moving one prompt's KV from its prefill worker to its decode worker."""

    link: KvLink
    prompt_tokens: int
    kv_bytes: int  # the whole prompt's KV, every layer, exact
    bytes_per_gpu: int  # what each receiving GPU gets (its attention shard)
    receiving_gpus: int  # GPUs of the decode worker's attention group that receive
    transfer_s: float

    def to_dict(self) -> dict[str, object]:
        return {"link": self.link.to_dict(), "prompt_tokens": self.prompt_tokens,
                "kv_bytes": self.kv_bytes, "bytes_per_gpu": self.bytes_per_gpu,
                "receiving_gpus": self.receiving_gpus,
                "transfer_ms": self.transfer_s * 1e3}


def kv_transfer(model: ModelSpec, kv: Precision, prompt_tokens: int,
                attention_tp: int, link: KvLink) -> KvTransfer:
    """One prompt's KV over `link` to a decode worker whose attention is sharded
    `attention_tp` ways (its TP size / its attention-DP size): each of those GPUs receives
    its shard at once, so the time is one GPU's bytes over one GPU's link, plus latency."""
    if prompt_tokens < 1:
        raise BstarError(f"prompt length must be at least 1 token, got {prompt_tokens}")
    if attention_tp < 1:
        raise BstarError(f"attention TP size must be at least 1, got {attention_tp}")
    total = model.kv_bytes_per_seq(prompt_tokens, kv)
    per_gpu = model.kv_bytes_per_seq(prompt_tokens, kv, num_gpus=attention_tp)
    return KvTransfer(link, prompt_tokens, total, per_gpu, attention_tp,
                      link.latency_s + per_gpu / link.bytes_s)
