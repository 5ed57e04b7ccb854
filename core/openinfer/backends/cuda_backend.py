"""The CUDA backend: CuPy arrays on one GPU, one non-default stream, pinned host staging.

cupy is imported when a CudaBackend is built, never at module import, so CPU-only installs and
CI can import the package. Every failure to start says what is missing and what to install.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from ..kernels.cuda import lanes
from ..sampling.sampler import SampleResult
from ..sampling.batch import LOGPROBS, NUM_FIELDS, SamplingBatch, to_results
from .block_copy import BlockCopier
from .numpy_backend import Backend

if TYPE_CHECKING:
    from ..loading.weights import WeightSource

INSTALL_HINT = ("install the cuda13 extra (CUDA 13 driver, >= 580; pip install -e '.[cuda13]' in an openinfer checkout) "
                "or the cuda12 one (CUDA 12 driver)")
PINNED_BYTES = 4 << 20    # transfers up to this size go through pinned buffers; bigger ones copy directly
DTYPES = ("bfloat16", "float32")


@dataclass(frozen=True)
class MemoryInfo:
    free: int          # bytes the driver reports free
    total: int         # the card's memory
    pool_used: int     # bytes held by live CuPy arrays
    pool_cached: int   # bytes CuPy's pool keeps for reuse (free to us, used to the driver)


def _import_cupy() -> tuple[Any, Any]:
    try:
        import cupy
        import ml_dtypes
    except ImportError as e:
        raise RuntimeError(f"the CUDA backend needs cupy and ml_dtypes ({e}); {INSTALL_HINT}") from e
    return cupy, ml_dtypes


class CudaBackend(Backend):
    name = "cuda"
    samples_on_device = True

    def __init__(self, index: int = 0, dtype: str = "bfloat16", gpu_memory_utilization: float = 0.90) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"the CUDA backend stores {' or '.join(DTYPES)}; --dtype {dtype} is not supported")
        cp, ml_dtypes = _import_cupy()
        try:
            count = cp.cuda.runtime.getDeviceCount()
        except Exception as e:  # no driver, or one too old for this cupy build
            raise RuntimeError(f"no usable NVIDIA GPU: {e}; check the driver (nvidia-smi), or {INSTALL_HINT}") from e
        if not 0 <= index < count:
            raise RuntimeError(f"cuda:{index} requested but {count} GPU(s) are visible")
        self.xp, self.index, self.dtype = cp, index, dtype
        self.utilization = gpu_memory_utilization
        self._dtypes = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float32": np.dtype(np.float32)}
        self.device = cp.cuda.Device(index)
        self.lane = lanes.new(f"cuda:{index}")
        weakref.finalize(self, lanes.release, self.lane)   # its cuBLAS handles, workspaces and counters go with it
        with self.device:
            # blocking (synchronizes with the legacy default stream), so work launched by a thread
            # that never called activate() still orders correctly against our copies
            self.stream = cp.cuda.Stream(non_blocking=False)
            self._pinned = {d: cp.cuda.alloc_pinned_memory(PINNED_BYTES) for d in ("h2d", "d2h")}
            self._h2d_done = cp.cuda.Event()
            self._h2d_done.record(self.stream)
        self._uploader: Any = None
        self.activate()
        # a first start compiles every kernel: on background threads while the weights load (warm: a hash each)
        from ..kernels.cuda.compile import arch_for, precompile
        cc = self.device.compute_capability
        self.compute_capability = int(cc)
        precompile(arch_for(int(cc[:-1]), int(cc[-1])))

    def activate(self) -> None:
        """Make this GPU, the step stream and this backend's kernel lane (kernels/cuda/lanes.py) current for the
        calling thread (CuPy keeps the first two per thread): call it at the start of the thread that runs forward
        passes or captures graphs."""
        self.device.use()
        self.stream.use()
        lanes.use(self.lane)

    @contextmanager
    def current(self) -> Iterator[None]:
        """This GPU and the step stream current for the block (what activate() does, undone after it). A step's
        kernels launch on the thread's current stream while its uploads and downloads go on the step stream, so the
        step must run here: in a thread where another backend was activated last (two engines in one process, as
        tests build them) its kernels would otherwise queue on that backend's stream, unordered with its own
        uploads (buffers reused while the kernels still read them) and token downloads (read before written). The
        kernels run in this backend's lane: another model's engine on the same GPU steps at the same time."""
        with self.device, self.stream, lanes.lane(self.lane):
            yield

    def _np_dtype(self, dtype: str | None) -> np.dtype:
        return self._dtypes.get(dtype or self.dtype) or np.dtype(dtype)

    def asarray(self, host: np.ndarray, dtype: str | None = None) -> Any:
        """Host -> device on the step stream; floats become the model dtype unless `dtype` says."""
        host = np.asarray(host)
        target = self._np_dtype(dtype) if host.dtype.kind == "f" or dtype else host.dtype
        host = np.ascontiguousarray(host.astype(target, copy=False))  # convert on the host: halves the copy
        with self.device, self.stream:
            out = self.xp.empty(host.shape, dtype=target)
            if host.nbytes > PINNED_BYTES:
                out.set(host, self.stream)
                return out
            self._h2d_done.synchronize()  # the previous upload has left the staging buffer
            staged = np.frombuffer(self._pinned["h2d"], dtype=target, count=host.size).reshape(host.shape)
            staged[...] = host
            out.set(staged, self.stream)
            self._h2d_done.record(self.stream)
        return out

    def load(self, weights: WeightSource, *names: str) -> Any:
        if self._uploader is None:
            from .cuda_weights import WeightUploader
            self._uploader = WeightUploader(self.xp, self.device, self.stream, self._dtypes)
        with self.device:
            return self._uploader.load(weights, names, self._np_dtype(None))

    def loaded(self) -> None:
        self.stream.synchronize()
        if self._uploader is not None:
            self._uploader.close()
        self._uploader = None
        self.xp.get_default_pinned_memory_pool().free_all_blocks()  # its staging buffers leave host RSS

    def to_host(self, x: Any) -> np.ndarray:
        """Device -> host after everything queued on the step stream (a fresh array the caller owns)."""
        with self.device, self.stream:
            x = self.xp.ascontiguousarray(x)
            if x.nbytes > PINNED_BYTES:
                return x.get(self.stream)
            staged = np.frombuffer(self._pinned["d2h"], dtype=x.dtype, count=x.size).reshape(x.shape)
            x.get(self.stream, out=staged)
            return staged.copy()

    def empty(self, shape: tuple[int, ...], dtype: str | None = None) -> Any:
        with self.device:
            return self.xp.empty(shape, dtype=self._np_dtype(dtype))

    def zeros(self, shape: tuple[int, ...], dtype: str | None = None) -> Any:
        with self.device, self.stream:
            return self.xp.zeros(shape, dtype=self._np_dtype(dtype))

    def synchronize(self) -> None:
        self.stream.synchronize()

    def block_copier(self, device_arrays: Sequence[Any], num_host_blocks: int) -> BlockCopier:
        from .cuda_block_copy import CudaBlockCopier
        return CudaBlockCopier(self, device_arrays, num_host_blocks)

    def argmax(self, logits: Any) -> Any:
        from ..kernels.cuda.ops import argmax
        return argmax(logits)

    def sample(self, logits: Any, batch: SamplingBatch) -> list[SampleResult]:
        """Sample the batch's rows of `logits` on the device (kernels/cuda/sampler.py): one upload of
        the packed parameters and edits, then token ids and asked-for logprobs come back."""
        from ..kernels.cuda.sampler import sample
        S = len(batch)
        edits = batch.edits if len(batch.edits) else np.zeros((1, 4), np.int32)  # never read; no 0-size upload
        packed = self.asarray(np.concatenate([batch.params.ravel(), edits.ravel()]))
        k = batch.top_k
        top_rows = np.flatnonzero(batch.params[:, LOGPROBS] > 0)
        with self.device, self.stream:
            out, values, ids = sample(logits, packed[: S * NUM_FIELDS].reshape(S, NUM_FIELDS),
                                      packed[S * NUM_FIELDS:].reshape(-1, 4), k, top_rows)
        host = self.to_host(out)
        top_v = top_i = None
        if k:
            top_v, top_i = np.zeros((S, k), np.float32), np.zeros((S, k), np.int32)
            top_v[top_rows], top_i[top_rows] = self.to_host(values), self.to_host(ids)
        return to_results(batch, host[0], host[1].view(np.float32), top_v, top_i)

    def score_rows(self, logits: Any, targets: np.ndarray, k: int) -> tuple[Any, Any, Any, Any]:
        from ..kernels.cuda.ops import score_rows
        with self.device, self.stream:
            return score_rows(logits, self.asarray(targets), k)

    def decode_graphs(self, forward: Any, max_num_seqs: int, max_model_len: int, block_size: int,
                      state_slots: bool = False, pdl_rows: int | None = None) -> Any:
        from ..kernels.cuda import pdl
        from .cuda_graphs import DecodeGraphs

        def capture_forward(batch: Any) -> Any:   # PDL in graphs of up to pdl_rows rows
            with pdl.suspended(pdl_rows is not None and batch.num_seqs > pdl_rows):
                return forward(batch)
        with self.device:
            graphs = DecodeGraphs(self.xp, self.stream, capture_forward, max_num_seqs, max_model_len, block_size,
                                  state_slots, lane=lanes.graphs_of(self.lane))
            graphs.capture()
        return graphs

    @contextmanager
    def linear_shapes(self) -> Iterator[set[tuple[int, int]]]:
        """The bf16 weight shapes (N, K) `linear` is called with inside the block, for tune_gemms."""
        from ..kernels.cuda import lt
        with lt.recording() as shapes:
            yield shapes

    def tune_gemms(self, shapes: set[tuple[int, int]], max_num_seqs: int) -> str:
        """For the decode GEMMs of these weight shapes, before graph capture and for eager engines too (so eager
        and graph steps compute the same bits): cuBLASLt algorithms at each decode-graph bucket size above the
        GEMV's rows (kernels/cuda/lt_tune.py), and the GEMV's split-K factors (gemv_tune.py). Returns what the
        start-up log says about it."""
        from ..kernels.cuda import gemv_tune, lt_tune
        from .cuda_graphs import buckets
        with self.device, lanes.lane(self.lane):
            tuned = lt_tune.tune(buckets(max_num_seqs), shapes)
            splits = gemv_tune.tune(shapes)
        self.release_cached()   # the timing scratch, held by CuPy's pool on the tuning streams
        lt_part = (f"{tuned.lt} decode GEMM shapes on cuBLASLt ({tuned.cached} from the cache, {tuned.timed} timed)"
                   if tuned.lt + tuned.timed else
                   "cuBLASLt: none (no decode batch above the GEMV's rows, or no bf16 weights)")
        gemv_part = (f"GEMV split-K for {splits.cached + splits.timed} ({splits.cached} from the cache, {splits.timed} "
                     f"timed; off the rule: {', '.join(splits.changes) or 'none'})" if splits.cached + splits.timed else
                     "GEMV split-K: the rule (no bf16 weights)")
        return f"{lt_part}; {gemv_part}; of {len(shapes)} weight shapes"

    def memory_info(self) -> MemoryInfo:
        with self.device:
            free, total = self.xp.cuda.runtime.memGetInfo()
        pool = self.xp.get_default_memory_pool()
        return MemoryInfo(free, total, pool.used_bytes(), pool.free_bytes())

    def pool_bytes(self) -> int:
        return self.xp.get_default_memory_pool().total_bytes()

    def release_cached(self) -> None:
        self.xp.get_default_memory_pool().free_all_blocks()

    def kv_budget_bytes(self, requested: int | None, reserve: int = 0) -> int:
        """`requested`, or what --gpu-memory-utilization leaves once weights and buffers are in and
        `reserve` bytes are kept for step activations: utilization * total - in use - reserve
        (the pool's reusable cache counted as free)."""
        m = self.memory_info()
        available = m.free + m.pool_cached
        budget = (requested if requested is not None else
                  int(self.utilization * m.total) - (m.total - available) - reserve)
        if budget <= 0 or budget > available:
            raise RuntimeError(f"KV budget {budget / 2**30:.2f} GiB does not fit cuda:{self.index}: "
                               f"{available / 2**30:.2f} GiB of {m.total / 2**30:.2f} GiB free "
                               f"(utilization {self.utilization}); lower the model size or raise the limits")
        return budget
