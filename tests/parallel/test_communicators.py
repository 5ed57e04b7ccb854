"""The CPU communicators: every collective gives every rank the same result; a gone rank raises RankFailed."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from openinfer.parallel import LocalGroup, RankFailed, expert_shard
from openinfer.parallel.pipes import PipeCommunicator
from openinfer.testing.parallel import run_ranks


def pipe_group(n):
    ends = [mp.Pipe() for _ in range(n - 1)]
    return [PipeCommunicator(0, n, [a for a, _ in ends])] + [PipeCommunicator(r, n, [ends[r - 1][1]])
                                                               for r in range(1, n)]


@pytest.mark.parametrize("make", [lambda n: LocalGroup(n).communicators, pipe_group], ids=["local", "pipes"])
@pytest.mark.parametrize("n", [2, 4])
def test_collectives(make, n):
    def body(c):
        x = np.arange(6, dtype=np.float32).reshape(2, 3) * (c.rank + 1)
        c.barrier()
        return c.all_reduce(x.copy()), c.all_gather(x), c.broadcast(x, root=n - 1)
    results = run_ranks(make(n), body)
    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    for summed, gathered, bcast in results:
        np.testing.assert_array_equal(summed, base * sum(range(1, n + 1)))
        np.testing.assert_array_equal(gathered, np.stack([base * (r + 1) for r in range(n)]))
        np.testing.assert_array_equal(bcast, base * n)


def test_local_group_abort_releases_the_waiting_ranks():
    group = LocalGroup(3)

    def body(c):
        if c.rank == 2:
            group.abort()   # a rank that failed instead of joining the collective
            return "aborted"
        with pytest.raises(RankFailed):
            c.all_reduce(np.ones(2, np.float32))
        return "raised"
    assert run_ranks(group.communicators, body) == ["raised", "raised", "aborted"]


def test_a_closed_peer_pipe_raises_rank_failed():
    hub, spoke = pipe_group(2)
    spoke.peers[0].close()   # rank 1's process ended: its end of the pipe is closed
    with pytest.raises(RankFailed, match="rank 1 is gone"):
        hub.all_reduce(np.ones(2, np.float32))


def test_expert_shard():
    assert [expert_shard(64, r, 4) for r in range(4)] == [(0, 16), (16, 16), (32, 16), (48, 16)]
    assert expert_shard(8, 0, 1) == (0, 8)
    with pytest.raises(ValueError, match="do not split evenly"):
        expert_shard(64, 0, 3)
