"""Which kernels a qwen3-4b decode graph (bucket 1) launches during capture (GPU only, ad hoc)."""
import collections, sys
from openinfer.kernels.cuda import module
names = []
real = module._function_with_smem
def rec(source, name, smem):
    import cupy as cp
    if cp.cuda.get_current_stream().is_capturing():
        names.append(name)
    return real(source, name, smem)
module._function_with_smem = rec
from openinfer.engine import EngineArgs, build_engine
eng = build_engine(sys.argv[1], EngineArgs(device="cuda", load_format="dummy", max_num_seqs=8, max_model_len=4096))
print("counters:", sorted(p for (_, p) in module._counters))
c = collections.Counter(names)
print(f"{len(names)} launches captured over all buckets")
for n, k in c.most_common(30):
    print(f"{k:6d} {n}")
