"""Rebuilds the glm52 TileLang kernels that ship in openinfer_glm52/cuda/tilelang/: lowers each program of
programs.py to CUDA for sm_90a with TileLang, compiles the source to a cubin with nvcc, and writes the launch
metadata (kernel name, parameter order and types, block, dynamic shared memory, grid expressions, whether it
takes programmatic dependent launch) to kernels.json. Serving loads the cubins through CuPy and never imports tilelang.

Build environment only (tilelang 0.1.15 pulls torch): `pip install tilelang==0.1.15`, nvcc 13.0 on PATH; no GPU
is needed. Run from anywhere:
    python plugins/glm52/kernels_src/build_tilelang.py            # every kernel
    python plugins/glm52/kernels_src/build_tilelang.py --source-only --out DIR sparse_rows   # .cu only
"""
import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "openinfer_glm52" / "cuda" / "tilelang"
ARCH = "sm_90a"
sys.path.insert(0, str(HERE))

import tilelang  # noqa: E402
from tilelang import tvm  # noqa: E402

from programs import PASS_CONFIGS, PROGRAMS  # noqa: E402


def programs_digest() -> str:
    """sha256 of programs.py: kernels.json records the one its kernels were built from."""
    return hashlib.sha256((HERE / "programs.py").read_bytes()).hexdigest()


def _launch_call(host_mod, kernel: str):
    """The host module's packed call that launches `kernel` (its arguments: parameters, then launch values)."""
    found = []

    def visit(node):
        if isinstance(node, tvm.tirx.Call) and node.args and isinstance(node.args[0], tvm.tirx.StringImm) \
                and node.args[0].value == kernel:
            found.append(node)

    for _, func in host_mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    if len(found) != 1:
        raise RuntimeError(f"{kernel}: expected one launch in the host module, found {len(found)}")
    return found[0]


def lower(name: str) -> tuple[str, dict]:
    """The CUDA source of program `name` (its kernel renamed to `name`) and its launch metadata."""
    target = tvm.target.Target({"kind": "cuda", "arch": ARCH})
    with tilelang.transform.PassContext(config=PASS_CONFIGS), target:
        art = tilelang.lower(PROGRAMS[name](), target=target)
    [(gv, dev)] = list(art.device_mod.functions.items())
    kernel = dev.attrs["global_symbol"]
    params = [{"name": p.name, "type": "ptr" if p.dtype == "handle" else str(p.dtype)} for p in dev.params]
    for p, buf in zip(params, dev.params):
        if p["type"] == "ptr":   # the element type of a pointer parameter, from the buffer it backs
            p["type"] = f"ptr:{str(buf.type_annotation.element_type.dtype)}"
    tags = [str(t) for t in dev.attrs["tirx.kernel_launch_params"]]
    launch_values = list(_launch_call(art.host_mod, kernel).args[1 + len(params):])
    extents = dict(zip(tags, launch_values))
    smem = int(extents.pop("tirx.use_dyn_shared_memory", 0))
    meta = {
        "kernel": name,
        "params": params,
        "grid": [str(extents.get(f"blockIdx.{a}", 1)) for a in "xyz"],
        "block": [int(extents.get(f"threadIdx.{a}", 1)) for a in "xyz"],
        "smem": smem,
        "pdl": "has_cuda_pdl_sync" in dev.attrs,   # it waits in griddepcontrol: launch it with the attribute
    }
    source = art.kernel_source.replace(kernel, name)
    return source, meta


def compile_cubin(cu: Path, cubin: Path) -> None:
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH
    subprocess.run(["nvcc", "-cubin", "-O3", "-std=c++20", "-w", "-Xcudafe", "--diag_suppress=177",
                    f"-gencode=arch=compute_{ARCH[3:]},code={ARCH}", f"-I{TILELANG_TEMPLATE_PATH}",
                    f"-I{CUTLASS_INCLUDE_DIR}", "-o", str(cubin), str(cu)], check=True)


def nvcc_version() -> str:
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"programs to build (default: all of {', '.join(PROGRAMS)})")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--source-only", action="store_true", help="write the .cu files only (no nvcc, no metadata)")
    args = ap.parse_args()
    names = args.names or list(PROGRAMS)
    args.out.mkdir(parents=True, exist_ok=True)
    meta_path = args.out / "kernels.json"
    kernels = json.loads(meta_path.read_text())["kernels"] if meta_path.exists() else {}
    for name in names:
        source, meta = lower(name)
        cu = args.out / f"{name}.cu"
        cu.write_text(source)
        if args.source_only:
            continue
        compile_cubin(cu, args.out / f"{name}.cubin")
        meta["cubin_sha256"] = hashlib.sha256((args.out / f"{name}.cubin").read_bytes()).hexdigest()
        kernels[name] = meta
        print(f"{name}: block {meta['block']}, grid {meta['grid']}, {meta['smem']} B dynamic shared memory")
    if not args.source_only:
        meta_path.write_text(json.dumps({"arch": ARCH, "tilelang": tilelang.__version__, "nvcc": nvcc_version(),
                                         "programs_sha256": programs_digest(),
                                         "kernels": dict(sorted(kernels.items()))}, indent=1) + "\n")


if __name__ == "__main__":
    main()
