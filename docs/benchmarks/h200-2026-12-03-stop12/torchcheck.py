"""Which files under a framework's folder the CUDA engine maps, and whether torch is in sys.modules (GPU, ad hoc)."""
import sys
from openinfer.engine import EngineArgs, build_engine
eng = build_engine("qwen3-4b", EngineArgs(device="cuda", load_format="dummy", max_num_seqs=8, max_model_len=4096))
print("torch in sys.modules:", "torch" in sys.modules, [m for m in sys.modules if m.startswith("torch")][:5])
lines = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/torch/" in l})
print(len(lines), "mapped files under /torch/:")
for l in lines[:20]:
    print(" ", l)
import importlib.util
print("cuda.pathfinder cublas:", end=" ")
try:
    from cuda.pathfinder import load_nvidia_dynamic_lib
    print(load_nvidia_dynamic_lib("cublas").abs_path, load_nvidia_dynamic_lib("nvrtc").abs_path)
except Exception as e:
    print(e)
