"""The ModelLine contract: everything a plugin provides for one family of checkpoints.

A model line is detected from config.json (`probe`), parses it into a frozen config, names the
checkpoint tensors it needs, declares its per-request state (the KV manager's state groups) and
the ops it calls (its kernel plan), and builds a Model whose `forward` runs on any backend.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping

if TYPE_CHECKING:
    from ..backends.numpy_backend import Backend
    from ..engine.batch import Array, ForwardBatch
    from ..kernels.registry import Ops
    from ..kv.pool import StatePools
    from ..text.parsers import ChatFormat
    from ..text.tokenizer import Tokenizer
    from ..loading.weights import WeightSource


@dataclass(frozen=True)
class StateGroup:
    """One kind of per-request state the KV manager allocates.

    kind "paged": grows with the sequence in fixed-size blocks (attention K/V, MLA latents,
    indexer keys); `parts` maps a part name to its per-token, per-layer element shape.
    kind "slots": bounded state of fixed size per request (Gated DeltaNet conv + recurrent
    state); `parts` gives its per-layer shape. `checkpointable` says a snapshot can be kept at
    block boundaries so prefix reuse restores it together with the paged groups.
    """
    name: str
    kind: Literal["paged", "slots"]
    layers: int
    parts: Mapping[str, tuple[int, ...]]
    dtype: str = "model"               # "model": the compute dtype; or an explicit one ("float32")
    checkpointable: bool = True
    fp8: bool = False                  # the line's kernels also read this group as e4m3 bytes (--kv-cache-dtype fp8)

    def elements_per_unit(self) -> int:
        """Elements per token (paged) or per request (slots), over all layers and parts."""
        total = 0
        for shape in self.parts.values():
            n = 1
            for s in shape:
                n *= s
            total += n
        return total * self.layers


class Model(ABC):
    """A built model on one backend. `forward` writes its state and returns the logits of the
    batch's sample rows as a backend array [S, vocab].

    `pdl_decode_rows`: decode CUDA graphs of up to this many rows capture with programmatic dependent launch (sm_90+;
    kernels/cuda/pdl.py), None for every graph. PDL lets a kernel start while the one before it ends; in larger
    batches that can cost more than it buys, by line: Qwen3-4B's steps of 16 to 128 rows were 1-3 % slower with it,
    Qwen3.5-4B's and DeepSeek-V2-Lite's 1-2 % faster (docs/benchmarks)."""
    pdl_decode_rows: int | None = 8

    @abstractmethod
    def forward(self, batch: ForwardBatch, state: StatePools) -> Array: ...


@dataclass(frozen=True)
class Probe:
    ok: bool
    reason: str = ""


class ModelLine(ABC):
    name: str = ""
    model_types: tuple[str, ...] = ()           # config.json model_type values it knows
    presets: Mapping[str, Mapping[str, Any]] = {}   # preset name -> config.json of a real checkpoint shape

    def probe(self, config: Mapping[str, Any]) -> Probe:
        mt = config.get("model_type")
        if mt in self.model_types:
            return Probe(True)
        return Probe(False, f"model_type {mt!r} is not one of {', '.join(self.model_types)}")

    @abstractmethod
    def parse_config(self, config: Mapping[str, Any]) -> Any:
        """A validated, frozen config object; raise ValueError naming the bad field."""

    @abstractmethod
    def weight_shapes(self, cfg: Any) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensor name -> shape, for every tensor the model loads (dummy weights and
        synth use this too)."""

    def ignored_weights(self, cfg: Any) -> tuple[str, ...]:
        """Name prefixes present in real checkpoints that this line deliberately skips (MTP, vision)."""
        return ()

    @abstractmethod
    def state_spec(self, cfg: Any) -> list[StateGroup]: ...

    @abstractmethod
    def kernel_plan(self, cfg: Any) -> list[str]: ...

    @abstractmethod
    def build(self, cfg: Any, weights: WeightSource, backend: Backend, ops: Ops) -> Model: ...

    @abstractmethod
    def chat_format(self) -> ChatFormat: ...

    def load_tokenizer(self, path: Path) -> Tokenizer:
        """The tokenizer of a checkpoint folder (a line whose checkpoints ship another format than tokenizer.json
        converts it here)."""
        from ..text.tokenizer import Tokenizer
        return Tokenizer.from_dir(path)

    def tokenizer_dir(self) -> Path | None:
        """A folder with this line's genuine tokenizer (tokenizer.json[.gz], tokenizer_config.json),
        which `openinfer synth` copies beside the weights; None if the line ships none."""
        return None

    def demo_checkpoint(self) -> tuple[dict[str, Any], Path] | None:
        """A small config.json and a tokenizer folder that `openinfer serve` without `--model` runs with random
        weights (the built-in demo); None if the line offers none. The first installed line that offers one
        serves the demo."""
        return None

    def max_model_len(self, cfg: Any) -> int:
        return int(getattr(cfg, "max_position_embeddings"))

    def vocab_size(self, cfg: Any) -> int:
        return int(getattr(cfg, "vocab_size"))

    def expert_sharded(self, cfg: Any, name: str) -> bool:
        """True for a checkpoint tensor that expert parallelism splits over the ranks (a routed expert's): the
        DeepSeek layout's `.mlp.experts.` by default, which every MoE line here uses; memory planning counts it
        once over all ranks."""
        return self.num_experts(cfg) > 0 and ".mlp.experts." in name

    def num_experts(self, cfg: Any) -> int:
        """Routed experts per MoE layer, which expert parallelism shards over its ranks (a rank holds
        experts [r*E/N, (r+1)*E/N) and reads its group from `backend.comm` at build); 0: no MoE layers."""
        return 0
