from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from openinfer.plugin_api import ChatFormat, Model, ModelLine, StateGroup, hookimpl


class BigramModel(Model):
    """logits(next) = table[current token]: no attention, but it runs through the op registry."""

    def __init__(self, weights, backend, ops) -> None:
        self.ops = ops
        self.table = backend.asarray(weights.get("bigram.weight"))
        self.eye = backend.asarray(np.eye(self.table.shape[1], dtype=np.float32))

    def forward(self, batch, state):
        h = self.ops.embedding(self.table, batch.token_ids)
        return self.ops.linear(self.ops.gather_rows(h, batch.sample_rows), self.eye)


class BigramLine(ModelLine):
    name = "bigram"
    model_types = ("openinfer_bigram",)

    def parse_config(self, config: Mapping[str, Any]) -> dict:
        if not isinstance(config.get("vocab_size"), int):
            raise ValueError("config.json field 'vocab_size' must be an integer")
        return {"vocab_size": config["vocab_size"], "max_position_embeddings": config.get("max_position_embeddings", 512)}

    def weight_shapes(self, cfg: dict) -> dict[str, tuple[int, ...]]:
        return {"bigram.weight": (cfg["vocab_size"], cfg["vocab_size"])}

    def state_spec(self, cfg: dict) -> list[StateGroup]:
        return [StateGroup("unused", "paged", 1, {"x": (1,)})]

    def kernel_plan(self, cfg: dict) -> list[str]:
        return ["embedding", "linear", "gather_rows"]

    def build(self, cfg, weights, backend, ops) -> Model:
        return BigramModel(weights, backend, ops)

    def chat_format(self) -> ChatFormat:
        return ChatFormat(None, None)

    def max_model_len(self, cfg: dict) -> int:
        return cfg["max_position_embeddings"]

    def vocab_size(self, cfg: dict) -> int:
        return cfg["vocab_size"]


@hookimpl
def register_model_lines(register) -> None:
    register(BigramLine)
