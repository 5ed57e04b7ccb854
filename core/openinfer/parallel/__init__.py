"""Expert parallelism: communicators and the worker processes of an expert-parallel engine.

Attention and the dense layers are replicated on every rank; rank r holds the routed experts
[r*E/N, (r+1)*E/N) (`expert_shard`); every rank runs the same batch, and a MoE layer sums its
local experts' output over the ranks with `all_reduce`. Implementations: `LocalGroup` (threads of
one process, for tests), `PipeCommunicator` (CPU processes), `NcclCommunicator` (one GPU a process).
"""
from __future__ import annotations

from .communicator import Communicator, RankFailed, expert_shard
from .local import LocalGroup

__all__ = ["Communicator", "LocalGroup", "RankFailed", "expert_shard"]
