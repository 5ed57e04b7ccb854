"""From a checkpoint folder (or the demo model) to a ready Engine."""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..backends import Backend, get_backend
from ..backends.cuda_graphs import buckets
from .config import ConfigError, read_generation_config, read_model_config, with_num_layers, with_overrides
from ..contract.detect import detect_line, install_hint
from ..engine.engine import Engine
from ..engine.engine_args import GPU_MAX_NUM_SEQS, EngineArgs
from ..engine.executor import Executor
from ..kernels.registry import KernelRegistry
from ..kv.block_manager import BlockManager
from ..kv.host_tier import HostTier, offloadable_arrays
from ..kv.hybrid import HybridBlockManager, num_state_rows
from ..kv.pool import StatePools, bytes_per_block, bytes_per_state_row, group_itemsize, with_kv_cache_dtype
from .memory_plan import check_fits, memory_need
from ..contract.model_line import ModelLine, StateGroup
from ..engine.model_runner import ModelRunner, ReadBytes
from ..parallel.communicator import Communicator
from .phases import in_background, phase, release_free_heap
from ..contract.plugins import Plugins, get_plugins
from ..sampling.sampler import defaults_from_generation_config
from .weights import Checkpoint, DummyWeights, WeightSource

log = logging.getLogger("openinfer.loading.loader")
DEMO_NAME = "openinfer-demo"


class LoadError(RuntimeError):
    pass


@dataclass
class Source:
    """What a checkpoint folder, a preset or the demo says before anything loads."""
    line: ModelLine
    config: dict[str, Any]
    cfg: Any
    shapes: dict[str, tuple[int, ...]]
    weights: WeightSource | None   # None once a rank's model is built from it
    kernels: KernelRegistry
    tok_dir: Path | None
    gen_config: dict[str, Any]
    name: str


@dataclass
class RankModel:
    """One rank's model on its device: its runner (weights, KV pools, graphs) and the pool's shape."""
    runner: ModelRunner
    groups: list[StateGroup]
    num_blocks: int
    per_block: int
    rows: int
    checkpoints: int
    max_len: int
    weight_seconds: float
    max_num_seqs: int


def load_engine(model: str | None, args: EngineArgs, plugins: Plugins | None = None) -> Engine:
    t0 = time.perf_counter()
    with phase("plugins"):
        plugins = plugins or get_plugins()
    src = read_source(model, args, plugins)
    # the tokenizer parses on a thread while the device comes up: the Rust parse releases the GIL (a
    # busy Python loop on the main thread kept running, with gaps under 0.15 s, through a 1.6 s parse)
    tokenizer_loaded = in_background("tokenizer", src.line.load_tokenizer, src.tok_dir)
    workers = None
    if args.ep > 1:
        from ..parallel.workers import Workers
        with phase("expert-parallel workers") as p:
            workers = Workers(model, args, plugins)
            p.detail = f"{args.ep - 1} worker process(es) started"
    try:
        ranked = load_rank(src, args, 0, None if workers is None else workers.connect)
        if workers is not None:
            with phase("wait for the expert-parallel workers"):
                workers.wait_ready()
    except BaseException as e:
        if workers is not None:
            reason = workers.load_error()
            workers.shutdown()
            if reason is not None:
                raise LoadError(reason) from e
        raise
    name, config, gen_config, line, cfg = src.name, src.config, src.gen_config, src.line, src.cfg
    args = replace(args, max_num_seqs=ranked.max_num_seqs)   # the loader's choice, when none was given
    blocks, host_tier = _block_manager(ranked, args)
    with phase("wait for the tokenizer"):
        tokenizer = tokenizer_loaded.result()
    with phase("return freed host heap") as p:   # after the tokenizer: its parse peaks ~95 MB above what it keeps
        p.detail = f"{release_free_heap()} MB of freed heap back to the OS"
    vocab_size = line.vocab_size(cfg)
    eos = end_ids(tokenizer.eos_token_ids, gen_config.get("eos_token_id", config.get("eos_token_id")), vocab_size)
    sampling_defaults: dict[str, float | int] = {}
    if args.generation_config == "auto":
        sampling_defaults, skipped = defaults_from_generation_config(gen_config)
        for why in skipped:
            log.warning("generation_config.json: %s; not a sampling default", why)
        if sampling_defaults:
            log.info("sampling defaults from generation_config.json (a request's own values win; "
                     "--generation-config none drops them): %s",
                     ", ".join(f"{k}={v}" for k, v in sampling_defaults.items()))
    log.info("loaded %s (%s line) on %s%s in %.2fs (weights %.2fs): %d KV blocks of %d tokens (%.1f MiB%s), "
             "max_model_len %d", name, line.name, args.device, f" with {args.ep} expert-parallel ranks" * (args.ep > 1),
             time.perf_counter() - t0, ranked.weight_seconds, ranked.num_blocks, args.block_size,
             ranked.num_blocks * ranked.per_block / 2**20, ", fp8 keys and values" * (args.kv_cache_dtype == "fp8"),
             ranked.max_len)
    return Engine(name, Executor(ranked.runner, workers), blocks, args,
                  tokenizer=tokenizer, chat_format=line.chat_format(), max_model_len=ranked.max_len,
                  vocab_size=vocab_size, eos_token_ids=eos, host_tier=host_tier,
                  sampling_defaults=sampling_defaults)


def end_ids(tokenizer_eos: Iterable[int], config_eos: int | list[int] | None, vocab_size: int) -> frozenset[int]:
    """The ids that end a sequence: the tokenizer's and the checkpoint's (generation_config.json, else config.json)
    that the model can emit. An id past the model's vocabulary (a tokenizer borrowed from another model with
    --tokenizer) is dropped with a warning: no logit is ever sampled there, and the grammar engine refuses it."""
    listed = [*tokenizer_eos, *(config_eos if isinstance(config_eos, list) else () if config_eos is None
                                else (config_eos,))]
    if bad := [i for i in listed if isinstance(i, bool) or not isinstance(i, int)]:
        raise ConfigError(f"end-of-sequence ids {bad!r} are not token ids: check eos_token_id in config.json, "
                          "generation_config.json and the tokenizer's files")
    ids = set(listed)
    outside = sorted(i for i in ids if not 0 <= i < vocab_size)
    if outside:
        log.warning("end-of-sequence ids %s are outside the model's %d-token vocabulary (a tokenizer from another "
                    "model?): the model cannot emit them, so they do not end a sequence%s", outside, vocab_size,
                    "" if len(outside) < len(ids) else "; none is left, so sequences end at their length limit and "
                    "structured outputs are refused")
    return frozenset(ids.difference(outside))


def read_source(model: str | None, args: EngineArgs, plugins: Plugins) -> Source:
    """The model line, config and weight source of `model` (None: the demo); an expert-parallel size the
    model or the machine cannot take is refused here, before anything loads."""
    with phase("config and checkpoint index"):
        if model is None:
            line, config, tok_dir = _demo(plugins)
            config = with_overrides(config, args.hf_overrides)
            name, gen_config = args.served_model_name or DEMO_NAME, {}
            log.info("no --model given: serving the built-in demo model %r (tiny random weights, %s tokenizer); "
                     "its output is noise — pass --model PATH to serve a real checkpoint", name, line.name)
        elif not Path(model).is_dir() and plugins.preset(model) is not None:
            # a preset name: the real shapes with random weights, no checkpoint on disk (benchmarks)
            line, config = plugins.preset(model)
            config = with_overrides(config, args.hf_overrides)
            if args.load_format != "dummy":
                raise LoadError(f"{model!r} is a preset, not a checkpoint folder: add --load-format dummy (random "
                                f"weights of its real shapes) or write one with `openinfer synth --preset {model} --out DIR`")
            tok_dir, gen_config, name = line.tokenizer_dir(), {}, args.served_model_name or model
            if tok_dir is None and args.tokenizer is None:
                raise LoadError(f"the {line.name} line ships no tokenizer, so preset {model!r} cannot be served "
                                "without one: add --tokenizer DIR (a folder with tokenizer.json)")
        else:
            # overridden before detection: an override may name the architecture
            config = with_overrides(read_model_config(model), args.hf_overrides)
            line = detect_line(config, plugins, f"{model}/config.json")
            tok_dir, gen_config = Path(model), read_generation_config(model)
            name = args.served_model_name or Path(model).name
        if args.hf_overrides:
            log.info("config.json fields set by --hf-overrides: %s",
                     ", ".join(f"{k}={v!r}" for k, v in args.hf_overrides.items()))
        if args.num_layers is not None:
            config = with_num_layers(config, args.num_layers)
        if args.tokenizer is not None:
            tok_dir = Path(args.tokenizer)
            if not tok_dir.is_dir():
                raise LoadError(f"--tokenizer {args.tokenizer}: no such folder")
        cfg = line.parse_config(config)
        check_expert_parallel(args, line.name, line.num_experts(cfg))
        shapes = line.weight_shapes(cfg)
        weights: WeightSource
        if model is None or args.load_format == "dummy":
            weights = DummyWeights(shapes, seed=args.seed)
        else:
            weights = Checkpoint(model)
            _check_weights(line, cfg, weights, shapes, model)
        if args.device != "cpu":
            _check_memory(line, cfg, shapes, weights, args, name)
    return Source(line, config, cfg, shapes, weights, plugins.kernels, tok_dir, gen_config, name)


def load_rank(src: Source, args: EngineArgs, rank: int,
              connect: Callable[[Backend], Communicator] | None = None) -> RankModel:
    """Rank `rank`'s model on its device: weights (its shard of the experts), KV pools and graphs. Every
    rank of an expert-parallel engine runs this with the same flags, so the load-time forwards (profile,
    capture) meet in the same collectives; `connect` joins the rank's group once its device is up."""
    line, cfg, shapes = src.line, src.cfg, src.shapes
    auto_seqs = args.max_num_seqs is None   # CUDA: chosen from the KV budget (loader.auto_max_num_seqs)
    if auto_seqs:
        args = replace(args, max_num_seqs=GPU_MAX_NUM_SEQS)
    with phase("backend (device context)") as p:
        backend = get_backend(rank_device(args.device, rank), args.dtype, args.gpu_memory_utilization)
        if connect is not None:
            backend.comm = connect(backend)
        ops = src.kernels.resolve(line.kernel_plan(cfg), backend.name, backend.dtype, backend.compute_capability,
                                  args.kernels)
        overrides = "".join(f", --kernel {op}={name}" for op, name in args.kernels.items())
        p.detail = f"{backend.name} {backend.dtype}{overrides}"
        check_kv_cache_dtype(line, cfg, backend, args.kv_cache_dtype)
    with phase("weights") as p:
        t_weights = time.perf_counter()
        built = line.build(cfg, src.weights, backend, ops)
        backend.loaded()
        t_weights = time.perf_counter() - t_weights
        nbytes = sum(math.prod(s) for s in shapes.values()) * _itemsize(backend.dtype)
        p.detail = f"{nbytes / 1e9:.2f} GB at {nbytes / 1e9 / max(t_weights, 1e-9):.1f} GB/s"
    src.weights = None  # a checkpoint's file maps close with it: nothing of it stays in host memory
    groups = with_kv_cache_dtype(line.state_spec(cfg), args.kv_cache_dtype)
    max_len = min(args.max_model_len or line.max_model_len(cfg), line.max_model_len(cfg))
    itemsize = {g.name: group_itemsize(g, _itemsize(backend.dtype)) for g in groups}
    per_block = bytes_per_block(groups, args.block_size, itemsize)
    state_row = bytes_per_state_row(groups, itemsize)
    if auto_seqs:   # the most the budget could seat before the activations are measured (the profile needs a count)
        args = replace(args, max_num_seqs=_seats(backend, args, groups, per_block, state_row, 0))
    reserve = 0
    if backend.name == "cuda":
        with phase("activation profile") as p, backend.linear_shapes() as linear_shapes:
            reserve = _activation_bytes(built, backend, groups, args, max_len)
            p.detail = f"step activations need {reserve / 2**20:.1f} MiB of device memory (measured)"
        with phase("GEMM tuning") as p:   # before the KV cache: its scratch is back in the pool by then
            p.detail = backend.tune_gemms(linear_shapes, args.max_num_seqs)
    if backend.samples_on_device:   # the sampler's float32 copy of every sampled row (sample_rows.cu)
        reserve += args.max_num_seqs * line.vocab_size(cfg) * 4
    with phase("KV cache") as p:
        if auto_seqs:
            args = replace(args, max_num_seqs=_seats(backend, args, groups, per_block, state_row, reserve))
            log.info("max_num_seqs %d (from the KV budget; --max-num-seqs sets it)", args.max_num_seqs)
        rows, checkpoints = _state_rows(groups, args)
        state_bytes = rows * state_row
        if rows:
            log.info("bounded state: %d rows (%d running sequences, %d prefix checkpoints, 1 padding), %.1f MiB",
                     rows, args.max_num_seqs, checkpoints, state_bytes / 2**20)
        num_blocks = _num_blocks(backend, args, per_block, state_bytes, reserve, max_len, checkpoints)
        if backend.comm is not None:   # every rank holds the same pool: the smallest any rank can
            num_blocks = _fewest(backend, num_blocks)
        pools = StatePools(backend, groups, num_blocks, args.block_size, rows)
        p.detail = f"{num_blocks} blocks of {args.block_size} tokens, {num_blocks * per_block / 2**30:.2f} GiB"
    runner = ModelRunner(built, backend, pools, args.block_size, ReadBytes(nbytes, per_block // args.block_size,
                                                                           state_row))
    if backend.name == "cuda" and not args.enforce_eager:
        with phase("graph capture"):
            runner.capture_graphs(args.max_num_seqs, max_len)
    return RankModel(runner, groups, num_blocks, per_block, rows, checkpoints, max_len, t_weights, args.max_num_seqs)


def check_kv_cache_dtype(line: ModelLine, cfg: Any, backend: Backend, kv_cache_dtype: str) -> None:
    """Refuse an fp8 KV cache the line or the device cannot read, before the weights load."""
    if kv_cache_dtype == "auto":
        return
    if not any(g.fp8 for g in line.state_spec(cfg)):
        raise LoadError(f"--kv-cache-dtype {kv_cache_dtype}: the {line.name} line keeps its cache in the model dtype "
                        "(its attention reads no fp8 cache); serve it without the flag")
    if backend.name == "cuda" and (backend.dtype != "bfloat16" or (backend.compute_capability or 0) < 89):
        raise LoadError(f"--kv-cache-dtype {kv_cache_dtype} on CUDA needs bfloat16 activations on a GPU of compute "
                        f"capability 8.9 or later (this one: {backend.dtype}, sm_{backend.compute_capability})")


def auto_max_num_seqs(budget: int, per_block: int, block_size: int, state_bytes: Callable[[int], int]) -> int:
    """The running sequences a GPU engine seats when --max-num-seqs is not given: the largest decode-graph bucket
    up to GPU_MAX_NUM_SEQS whose seats leave the pool 1k tokens of KV each (a seat the pool cannot fill is a
    graph captured for nothing) and whose bounded state (hybrid models: `state_bytes(seats)`) takes at most half
    of the KV budget."""
    for seats in reversed(buckets(GPU_MAX_NUM_SEQS)):
        state = state_bytes(seats)
        if state <= budget // 2 and (budget - state) // per_block * block_size >= seats * 1024:
            return seats
    return 1


def _seats(backend: Backend, args: EngineArgs, groups: list[StateGroup], per_block: int, state_row: int,
           reserve: int) -> int:
    """auto_max_num_seqs for the KV budget left beside `reserve` bytes of activations, at most args.max_num_seqs;
    every rank of an expert-parallel group seats the fewest any rank can."""
    seats = min(args.max_num_seqs, auto_max_num_seqs(
        _kv_budget(backend, args, reserve), per_block, args.block_size,
        lambda n: _state_rows(groups, replace(args, max_num_seqs=n))[0] * state_row))
    return seats if backend.comm is None else _fewest(backend, seats)


def _fewest(backend: Backend, n: int) -> int:
    """The smallest `n` of every rank (an expert-parallel group agrees on its sizes)."""
    return int(backend.to_host(backend.comm.all_gather(backend.asarray(np.array([n], np.int64)))).min())


def rank_device(device: str, rank: int) -> str:
    """Rank r of an expert-parallel engine on `device` cuda:i uses cuda:i+r; on the CPU every rank is a process."""
    if device == "cpu" or rank == 0:
        return device
    return f"cuda:{int(device.partition(':')[2] or 0) + rank}"


def check_expert_parallel(args: EngineArgs, line_name: str, num_experts: int) -> None:
    """Refuse an --ep the model or the machine cannot take, before anything loads."""
    if args.ep == 1:
        return
    if num_experts == 0:
        raise LoadError(f"--ep {args.ep}: the {line_name} line has no routed experts to shard; serve it without --ep")
    if num_experts % args.ep:
        raise LoadError(f"--ep {args.ep} does not divide the model's {num_experts} routed experts; use a divisor of "
                        f"{num_experts}")
    if args.device != "cpu":
        first = int(args.device.partition(":")[2] or 0)
        visible = _visible_gpus()
        if first + args.ep > visible:
            raise LoadError(f"--ep {args.ep} from {args.device} needs GPUs {first}..{first + args.ep - 1}, but "
                            f"{visible} GPU(s) are visible; lower --ep")


def _check_memory(line: ModelLine, cfg: Any, shapes: dict[str, tuple[int, ...]], weights: WeightSource,
                  args: EngineArgs, name: str) -> None:
    """Refuse, before anything loads, a model whose weights per rank and one full-length sequence's KV exceed what
    the smallest of its GPUs offers."""
    gpu = _gpu_bytes(args.device, args.ep)
    if gpu is None:
        return
    max_len = min(args.max_model_len or line.max_model_len(cfg), line.max_model_len(cfg))
    need = memory_need(line, cfg, shapes, weights, _itemsize(args.dtype or "bfloat16"), args.ep, max_len,
                       args.block_size, args.kv_cache_dtype)
    try:
        check_fits(name, need, gpu, args.gpu_memory_utilization, args.ep)
    except MemoryError as e:
        raise LoadError(str(e)) from None


def _gpu_bytes(device: str, ep: int) -> int | None:
    """The memory of the smallest GPU of ranks 0 .. ep-1 on `device` (None without a usable GPU)."""
    try:
        import cupy
        first = int(device.partition(":")[2] or 0)
        return min(int(cupy.cuda.runtime.getDeviceProperties(first + r)["totalGlobalMem"]) for r in range(ep))
    except Exception:  # noqa: BLE001 — no CuPy, no driver: the backend reports that when it starts
        return None


def _visible_gpus() -> int:
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 — no CuPy, no driver: no usable GPU
        return 0


def _block_manager(ranked: RankModel, args: EngineArgs) -> tuple[BlockManager, HostTier | None]:
    """Rank 0's KV bookkeeping over the pools: the block manager and the host offload tier."""
    num_blocks, pools, rows, checkpoints = ranked.num_blocks, ranked.runner.pools, ranked.rows, ranked.checkpoints
    if rows:
        blocks: BlockManager = HybridBlockManager(num_blocks, args.block_size, args.enable_prefix_caching,
                                                  args.max_num_seqs, checkpoints, args.prefix_cache_hash)
    else:
        blocks = BlockManager(num_blocks, args.block_size, args.enable_prefix_caching, args.prefix_cache_hash)
    host_tier = None
    if args.kv_offload:
        host_blocks = int(args.kv_offload_host_gib * 2**30) // ranked.per_block
        # watermark: the largest restore admission can ask for, so a restore never waits for a save
        host_tier = HostTier(blocks, ranked.runner.backend.block_copier(offloadable_arrays(pools), host_blocks),
                             host_blocks, watermark_blocks=min(blocks.blocks_for(ranked.max_len), blocks.usable_blocks))
        log.info("KV offload: %d host blocks (%.1f MiB)", host_blocks, host_blocks * ranked.per_block / 2**20)
    return blocks, host_tier


def _num_blocks(backend: Any, args: EngineArgs, per_block: int, state_bytes: int, reserve: int, max_len: int,
                checkpoints: int) -> int:
    """The KV budget -> the number of blocks of the device pools."""
    budget = _kv_budget(backend, args, reserve)
    if args.kv_cache_memory_gib is None and backend.name == "numpy":
        # CPU: enough for max_num_seqs full-length sequences, capped by the backend's default budget
        budget = min(budget, (args.max_num_seqs * -(-max_len // args.block_size) + 1) * per_block + state_bytes)
    if state_bytes >= budget:
        raise LoadError(f"the bounded state of {args.max_num_seqs} sequences + {checkpoints} checkpoints needs "
                        f"{state_bytes / 2**20:.0f} MiB, more than the KV budget; lower --max-num-seqs or raise it")
    return max(2, (budget - state_bytes) // per_block)


def _kv_budget(backend: Any, args: EngineArgs, reserve: int) -> int:
    return backend.kv_budget_bytes(None if args.kv_cache_memory_gib is None else int(args.kv_cache_memory_gib * 2**30),
                                   reserve)


def _state_rows(groups: list[StateGroup], args: EngineArgs) -> tuple[int, int]:
    """(state rows, of which checkpoints) for the "slots" groups: one row per running request
    plus prefix checkpoints (kv/hybrid.py); (0, 0) for a model without bounded state."""
    slots = [g for g in groups if g.kind == "slots"]
    if not slots:
        return 0, 0
    checkpoints = 0
    if args.enable_prefix_caching and all(g.checkpointable for g in slots):
        checkpoints = args.max_num_seqs if args.num_state_checkpoints is None else args.num_state_checkpoints
    return num_state_rows(args.max_num_seqs, checkpoints), checkpoints


def _activation_bytes(model: Any, backend: Any, groups: list, args: EngineArgs, max_len: int) -> int:
    """Device memory that steps need beyond weights and KV, measured: a forward of a full token
    budget, plus (for the CUDA graphs' own pool) one of a full decode batch."""
    bs, seqs = args.block_size, args.max_num_seqs
    each = min(args.max_num_batched_tokens, max_len)
    prefill_seqs = -(-args.max_num_batched_tokens // each)
    num_blocks = max(prefill_seqs * -(-each // bs), seqs) + 2
    total = 0
    for batch_seqs, tokens in ((prefill_seqs, each), (0 if args.enforce_eager else seqs, 1)):
        if batch_seqs:
            backend.release_cached()
            rows = 1 + batch_seqs if any(g.kind == "slots" for g in groups) else 0   # dummy_batch's slots
            runner = ModelRunner(model, backend, StatePools(backend, groups, num_blocks, bs, rows), bs)
            before = backend.pool_bytes()   # freed blocks stay in the pool, so its size is the peak
            runner.profile(runner.dummy_batch(batch_seqs, tokens))
            total += backend.pool_bytes() - before
            del runner
    backend.release_cached()
    return total


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]


def _demo(plugins: Plugins) -> tuple[ModelLine, dict[str, Any], Path]:
    for line in plugins.lines.values():
        demo = line.demo_checkpoint()
        if demo is not None:
            config, tok_dir = demo
            return line, config, tok_dir
    raise LoadError(f"no installed model line provides a demo model: {install_hint('openinfer-qwen3')}, "
                    "or pass --model PATH")


def _check_weights(line: ModelLine, cfg: Any, weights: Checkpoint, shapes: dict[str, tuple[int, ...]],
                   model: str) -> None:
    have = set(weights.names())
    missing = sorted(set(shapes) - have)
    if missing:
        raise LoadError(f"{model}: checkpoint lacks {len(missing)} tensor(s) the {line.name} line needs, "
                        f"e.g. {', '.join(missing[:5])}")
    for name, shape in shapes.items():
        _, got, _ = weights.raw(name)
        if tuple(got) != tuple(shape):
            raise LoadError(f"{model}: tensor {name} has shape {tuple(got)}, config.json implies {tuple(shape)}")
    ignored = line.ignored_weights(cfg)
    extra = [n for n in have - set(shapes) if not n.startswith(ignored)] if ignored else sorted(have - set(shapes))
    if extra:
        log.warning("%s: %d checkpoint tensor(s) are not used by the %s line, e.g. %s", model, len(extra),
                    line.name, ", ".join(sorted(extra)[:3]))
