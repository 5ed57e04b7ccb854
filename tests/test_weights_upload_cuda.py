"""The threaded weight upload on a GPU: tensors far bigger than a staging buffer (every thread's two
buffers reused many times), fusion, the F32 -> bf16 cast, and step-stream work on a loaded array
at once (GPU only; skipped elsewhere)."""
from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

from openinfer.testing.cuda import require_gpu
from openinfer.loading.weights import Checkpoint, DummyWeights, save_safetensors

pytestmark = pytest.mark.cuda
cp = require_gpu()

from openinfer.backends.cuda_backend import CudaBackend  # noqa: E402
from openinfer.backends.cuda_weights import CHUNK_BYTES  # noqa: E402
from openinfer.backends.staged_read import copy_threads  # noqa: E402

ROWS = 4 * copy_threads() * CHUNK_BYTES // (2 * 1024)   # bf16 rows of 1024: every thread's 2 buffers, twice


@pytest.fixture(scope="module", params=["BF16", "F32"])
def checkpoint(request, tmp_path_factory):
    shapes = {"big": (ROWS, 1024), "small": (3, 1024), "norm": (1024,)}
    rng = np.random.default_rng(0)
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    d = tmp_path_factory.mktemp(f"upload-{request.param}")
    save_safetensors(d / "model.safetensors", shapes, tensors.__getitem__, request.param)
    return Checkpoint(d)


def test_big_fused_and_cast_tensors_arrive_intact(checkpoint):
    be = CudaBackend(0, "bfloat16")
    bf16 = be._np_dtype(None)
    fused = be.load(checkpoint, "big", "small")
    # step-stream work straight after load() must see the whole tensor (its pieces land on other streams)
    doubled = be.load(checkpoint, "big") * 2
    norm_plus_one = be.load(checkpoint, "norm") + 1.0
    again = be.load(checkpoint, "small")                # may reuse memory a queued kernel still reads
    be.loaded()
    want_doubled = checkpoint.get("big").astype(bf16).astype(np.float32) * 2
    np.testing.assert_array_equal(be.to_host(doubled).astype(np.float32), want_doubled)
    want = np.concatenate([checkpoint.get("big"), checkpoint.get("small")]).astype(bf16)
    np.testing.assert_array_equal(be.to_host(fused).view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(be.to_host(again).view(np.uint16),
                                  checkpoint.get("small").astype(bf16).view(np.uint16))
    want_norm = checkpoint.get("norm").astype(bf16).astype(np.float32) + 1.0
    np.testing.assert_allclose(be.to_host(norm_plus_one).astype(np.float32), want_norm, rtol=8e-3)


def test_staging_buffers_and_threads_are_gone_after_load(checkpoint):
    be = CudaBackend(0, "bfloat16")
    be.load(checkpoint, "big")
    buffer = weakref.ref(be._uploader._buffers[0])
    be.loaded()
    assert buffer() is None   # freed at once (no reference cycle waiting for the GC), so the pool let it go
    assert not [t for t in threading.enumerate() if t.name.startswith("weights")]


def test_dummy_weights_are_drawn_on_the_device_without_staging():
    dummy = DummyWeights({"w": (3000, 512), "v": (5, 512), "norm": (512,)}, seed=3, std=0.02)
    be = CudaBackend(0, "bfloat16")
    fused = be.load(dummy, "w", "v")
    norm = be.load(dummy, "norm")
    assert be._uploader._reader is None and not be._uploader._buffers   # no pinned buffers, no threads
    be.loaded()
    w, n = be.to_host(fused).astype(np.float32), be.to_host(norm).astype(np.float32)
    assert fused.shape == (3005, 512) and fused.dtype == be._np_dtype(None) and n.shape == (512,)
    assert abs(w.mean()) < 1e-3 and abs(w.std() - 0.02) < 1e-3 and np.abs(w).max() < 6 * 0.02
    assert abs(n.mean() - 1) < 0.02 and abs(n.std() - 0.1) < 0.02
    assert not np.array_equal(w[:5], w[3000:])   # each tensor has its own key
    again = CudaBackend(0, "bfloat16")
    np.testing.assert_array_equal(again.to_host(again.load(dummy, "norm")).view(np.uint16),
                                  be.to_host(norm).view(np.uint16))   # same seed and name, same values
