"""CPU-only checks of the CUDA kernel layer: every .cu compiles to an sm_90a cubin with NVRTC
(no GPU needed), the cache works, and importing the package touches neither cupy nor a GPU."""
from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from openinfer.kernels.cuda import BF16_OPS, DTYPES, OPS, compile as kc, register
from openinfer.kernels.registry import KernelRegistry

WRAPPERS = Path(kc.__file__).parent


def _nvrtc_or_skip() -> None:
    try:
        kc._nvrtc()
    except kc.KernelCompileError as e:
        pytest.skip(f"no NVRTC library to compile with: {e}")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    return tmp_path / "kernels"


# INT4 experts on bf16 take quant_mma.cu's kernels at decode: quant.cu builds no GEMV form of them
NO_GEMV_FORMS = ("moe_q_gate_up_int4_bf16", "moe_q_down_int4_bf16")
MMA_ROW_TILES = {"quant": ("2", "8")}   # the grouped GEMMs' row tiles (16 * mt rows): moe.py's 1 and 8, quant.py's


def _launched_names() -> set[str]:
    """Every kernel name the Python wrappers launch (or name in a DecodeKernel), f-string parts expanded."""
    text = "\n".join(p.read_text() for p in WRAPPERS.glob("*.py"))
    names = set()
    for source, name in re.findall(r'(?:launch|DecodeKernel)\("(\w+)", f?"([\w{}.()]+)"', text):
        variants = [name]
        row_tiles = MMA_ROW_TILES.get(source, ("1", "8"))
        for field, values in (("{suffix(x.dtype)}", ("bf16", "f32")), ("{suffix(q.dtype)}", ("bf16", "f32")),
                              ("{suffix(k.dtype)}", ("bf16", "f32")), ("{suffix(gate_up.dtype)}", ("bf16", "f32")),
                              ("{dtype}", ("bf16", "f32")), ("{suffix(out.dtype)}", ("bf16", "f32")),
                              ("{suffix(y.dtype)}", ("bf16", "f32")),
                              ("{fmt}", ("int4", "fp8")), ("{form}", ("", "kv8_")),
                              ("{sfx}", ("bf16", "f32", "bf16_wf32")), ("{d}", ("64", "128", "256")),
                              ("{unit}", ("16", "4", "2", "1")), ("{variant}", ("", "_m1")),
                              ("{gemm}", ("m1", "m8", "m1_s6")),   # moe.py's grouped GEMMs: row tiles, stages
                              ("{mt}", row_tiles),
                              ("{p.name}", ("l32r4u1", "l32r4u2")),   # quant.py's expert forms
                              ("{tiles}", ("", "_n64", "_nostagger", "_ov", "_n64ov"))):
            variants = [v.replace(field, val) for v in variants for val in (values if field in v else ("",))]
        names |= {(source, v) for v in variants if not v.startswith(NO_GEMV_FORMS)}
    return names


def test_every_source_compiles_to_sm90a_cubin(cache):
    _nvrtc_or_skip()
    cubins = kc.compile_all("sm_90a")
    assert set(cubins) == set(kc.sources()) >= {"attention", "elementwise", "kv", "norm", "rope", "sampling"}
    for name, path in cubins.items():
        data = path.read_bytes()
        assert data[:4] == b"\x7fELF", f"{name}: not a cubin"
        assert path.parent == cache


def test_every_launched_kernel_exists(cache):
    _nvrtc_or_skip()
    cubins = {name: path.read_bytes() for name, path in kc.compile_all("sm_90a").items()}
    launched = _launched_names()
    assert len(launched) > 30
    for source, name in launched:
        assert "{" not in name, f"unexpanded kernel name {name}"
        assert name.encode() + b"\0" in cubins[source], f"{source}.cu has no kernel {name}"


def test_cache_hit_skips_nvrtc(cache, monkeypatch):
    _nvrtc_or_skip()
    first = kc.compile_source("kv", "sm_90a")
    mtime = first.stat().st_mtime_ns
    with monkeypatch.context() as m:
        m.setattr(kc._nvrtc(), "compileProgram", lambda *a: pytest.fail("recompiled on a cache hit"))
        assert kc.compile_source("kv", "sm_90a") == first and first.stat().st_mtime_ns == mtime
    assert kc.compile_source("kv", "sm_90") != first  # the arch is part of the key


@pytest.fixture
def broken_source(cache, monkeypatch, tmp_path) -> str:
    """The only core source is broken.cu, which does not compile."""
    _nvrtc_or_skip()
    src = tmp_path / "src"
    src.mkdir()
    (src / "broken.cu").write_text('extern "C" __global__ void k() { undefined_thing(); }\n')
    monkeypatch.setattr(kc, "SOURCE_DIR", src)
    return "broken"


def test_compile_error_shows_the_log(broken_source):
    with pytest.raises(kc.KernelCompileError, match="undefined_thing"):
        kc.compile_source(broken_source, "sm_90a")


def test_plugin_source_by_path_sees_core_and_its_own_headers(cache, tmp_path):
    _nvrtc_or_skip()
    src = tmp_path / "plugin"
    src.mkdir()
    (src / "mine.cuh").write_text("__device__ float twice(float x) { return 2.f * x; }\n")
    (src / "mine.cu").write_text('#include "common.cuh"\n#include "mine.cuh"\n'
                                 'extern "C" __global__ void k(float* x) { x[0] = warp_sum(twice(x[0])); }\n')
    cubin = kc.compile_source(src / "mine.cu", "sm_90a")
    assert cubin.parent == cache and cubin.name.startswith("mine-sm_90a-")
    assert b"k\0" in cubin.read_bytes()


def test_arch_for():
    assert kc.arch_for(9, 0) == "sm_90a"
    assert kc.arch_for(8, 6) == "sm_86"


def test_import_touches_no_gpu_library():
    code = ("import sys, openinfer.kernels.cuda, openinfer.backends.cuda_backend; "
            "bad = [m for m in ('cupy', 'nvmath', 'cuda') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_register_is_lazy_and_complete():
    reg = KernelRegistry()
    register(reg.register)
    for op in OPS:
        for dtype in DTYPES:
            impl = reg.candidates(op, "cuda", dtype)[0]
            assert impl.impl == f"openinfer.kernels.cuda.ops:{op}"
    for op, module in BF16_OPS.items():   # the MLA and MoE ops: bf16 models only
        assert reg.candidates(op, "cuda", "bfloat16")[0].impl == f"openinfer.kernels.cuda.{module}:{op}"
        assert not reg.candidates(op, "cuda", "float32")
    assert not reg.candidates("rms_norm", "cuda", "float16")


def test_every_kernel_waits_for_its_predecessor():
    """Kernels are launched with programmatic dependent launch (kernels/cuda/pdl.py): one that read or
    wrote global memory before griddepcontrol.wait (pdl_begin() in common.cuh) would race with the
    kernel before it. Every entry of every core and plugin source must execute the wait."""
    from openinfer.testing.launch_check import ptx_entries, require_nvrtc
    require_nvrtc()
    plugin_dirs = [Path(p.__file__).parent / "cuda" for p in _plugin_packages()]
    sources = [*kc.sources(), *(p for d in plugin_dirs for p in sorted(d.glob("*.cu")))]
    missing = [f"{Path(str(src)).name}:{name}" for src in sources
               for name, (_, body) in ptx_entries(src).items() if "griddepcontrol.wait" not in body]
    assert len(sources) > len(kc.sources()) and not missing, missing


def test_grouped_expert_gemms_trigger_after_their_main_loop():
    """The grouped expert GEMMs (moe.cu, quant.cu) launch with PDL and let the next kernel launch only after their
    main loop (common.cuh: pdl_wait, pdl_trigger): in the PTX the wait comes first and the one launch_dependents
    follows the last mma / warp reduction."""
    from openinfer.kernels.cuda import pdl
    from openinfer.testing.launch_check import ptx_entries, require_nvrtc
    require_nvrtc()
    gemms = {**{n: b for n, (_, b) in ptx_entries("moe").items() if n.startswith(("moe_gate_up", "moe_down"))},
             **{n: b for n, (_, b) in ptx_entries("quant").items() if n.startswith("moe_q_")},
             **{n: b for n, (_, b) in ptx_entries("quant_mma").items()}}
    # moe.cu: 2 kernels x 3 forms (16-row tiles at three and six stages, 128-row tiles); quant.cu: 2 x 2 forms x (FP8
    # on 2 dtypes, INT4 on float32); quant_mma.cu: 2
    assert len(gemms) == 6 + 12 + 2
    assert {n.rsplit("_", 1)[1] for n in gemms if n.startswith("moe_q_") and "_mma_" not in n} == {"l32r4u1", "l32r4u2"}
    for name, body in gemms.items():
        assert name.startswith(pdl.KERNELS), name
        last_loop = max(body.rfind("mma.sync"), body.rfind("shfl.sync"))
        assert body.count("griddepcontrol.launch_dependents") == 1, name
        assert body.find("griddepcontrol.wait") < last_loop < body.find("griddepcontrol.launch_dependents"), name


def _plugin_packages() -> list:
    """The installed model-line packages that ship CUDA sources."""
    import importlib
    out = []
    for name in ("openinfer_qwen3", "openinfer_qwen35"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if (Path(mod.__file__).parent / "cuda").is_dir():
            out.append(mod)
    return out


def test_precompile_compiles_each_source_once_in_the_background(cache, monkeypatch):
    """precompile's threads compile every named source; a compile_source asking for one of them meanwhile waits for
    that compile instead of running NVRTC again; a later call is a cache hit."""
    import threading
    _nvrtc_or_skip()
    nvrtc = kc._nvrtc()
    real, calls, gate = nvrtc.compileProgram, [], threading.Event()

    def slow(prog, options):
        calls.append(options)
        gate.wait(10)   # hold the first compiles until the foreground call is waiting
        return real(prog, options)
    monkeypatch.setattr(nvrtc, "compileProgram", slow)
    threads = kc.precompile("sm_90a", ["kv", "norm"], workers=2)
    while len(calls) < 2:
        threading.Event().wait(0.01)
    waiter = threading.Thread(target=lambda: calls.append(("foreground", kc.compile_source("kv", "sm_90a"))))
    waiter.start()
    threading.Event().wait(0.2)
    gate.set()
    waiter.join(60)
    for t in threads:
        t.join(60)
    assert len(calls) == 3 and calls[2][0] == "foreground" and calls[2][1].exists()   # NVRTC ran twice, not three times
    assert sorted(p.name.split("-")[0] for p in cache.glob("*.cubin")) == ["kv", "norm"] and not kc._inflight


def test_precompile_leaves_failures_to_the_launch(broken_source):
    for t in kc.precompile("sm_90a"):
        t.join(60)
    with pytest.raises(kc.KernelCompileError, match="undefined_thing"):
        kc.compile_source(broken_source, "sm_90a")


@functools.cache
def _ptxas_usage(source: str) -> dict[str, tuple[int, int]]:
    """{kernel: (registers, spilled bytes stored and loaded)} of a source compiled for sm_90a (ptxas -v via NVRTC),
    compiled once for the tests that read it."""
    from openinfer.testing.launch_check import nvrtc_compiled   # imports cupy, which this file's other tests do not
    log = nvrtc_compiled(source, ["-arch=sm_90a", "-Xptxas=-v"], lambda nvrtc, prog: nvrtc.getProgramLog(prog))
    usage = {}
    for entry in re.split(r"Compiling entry function '", log)[1:]:
        name = entry.split("'", 1)[0]
        regs = re.search(r"Used (\d+) registers", entry)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", entry)
        usage[name] = (int(regs.group(1)), int(spills.group(1)) + int(spills.group(2)))
    return usage


def test_quantized_expert_kernels_fit_128_registers_without_spills():
    """quant.cu's GEMV expert kernels on bf16 activations (FP8's served decode path) keep at most 128 registers a
    thread, so two blocks of 256 threads share an SM, and spill nothing: a pass's loads stay in registers."""
    _nvrtc_or_skip()
    usage = _ptxas_usage("quant")
    experts = {n: u for n, u in usage.items() if n.startswith("moe_q_") and "_bf16_" in n}
    assert len(experts) == 4, sorted(usage)   # 2 kernels x 2 forms, FP8
    assert all(regs <= 128 and not spilled for regs, spilled in experts.values()), experts


def test_grouped_expert_gemms_spill_nothing():
    """The tensor-core grouped GEMMs (moe.cu's bf16 ones, quant.cu's INT4 / FP8 ones: a scale group's partial sums
    beside the accumulators) keep every accumulator in registers: ptxas -v through NVRTC reports no spills."""
    _nvrtc_or_skip()
    usage = {**_ptxas_usage("moe"), **_ptxas_usage("quant")}
    gemms = {n: s for n, (_, s) in usage.items() if re.fullmatch(r"moe_(gate_up|down)_(bf16|int4|fp8)_m\d", n)}
    assert len(gemms) == 12, sorted(usage)   # 2 kernels x (bf16 x 2 tiles + 2 formats x 2 tiles)
    assert not any(gemms.values()), gemms


def test_wgmma_expert_gemms_spill_nothing():
    """moe_wgmma.cu's two GEMMs hold their 64 accumulators (m64n128 fp32) and the copy addresses in registers."""
    _nvrtc_or_skip()
    usage = _ptxas_usage("moe_wgmma")
    assert sorted(usage) == ["moe_down_bf16_wgmma", "moe_gate_up_bf16_wgmma"]
    assert not any(spilled for _, spilled in usage.values()), usage


def test_decode_attention_kernels_spill_nothing():
    """Both split-KV decode kernels (attention_decode.cu's tensor-core one and its fp8-cache form, attention.cu's fp32
    one, whose blocks take a sequence's splits in turn) keep their state in registers: ptxas -v through NVRTC
    reports no spills."""
    _nvrtc_or_skip()
    usage = {**_ptxas_usage("attention_decode"), **_ptxas_usage("attention")}
    decode = {n: s for n, (_, s) in usage.items() if n.startswith("paged_decode_")}
    assert len(decode) == 12, sorted(usage)   # 3 head dims x (tensor-core on bf16 and fp8 caches, fp32 on bf16, f32)
    assert not any(decode.values()), decode
