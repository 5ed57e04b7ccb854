"""TileLang programs of the glm52 DSA kernels (build time only: build_tilelang.py lowers them to CUDA and cubins).

Shapes follow the numpy references in openinfer_glm52/ops.py. Paged caches reach the kernels as flat row views:
a layer view [num_blocks, block_size, D] with block stride `block_rows * D` elements is the matrix [rows, D] that
starts at the view's first row, and key position s of sequence `seq` is its row
block_tables[seq, s // block_size] * block_rows + s % block_size.

- sparse_rows: each selected key position -> its flat cache row, -1 where none (padding, or past the query).
- sparse_mla: absorbed MLA attention over the selected rows, split over the selection: each split writes its
  normalised partial output and log2-sum-exp (flash-decoding); sparse_mla_combine merges the splits in bf16.
- indexer_scores: I(t, s) = sum_h w[t, h] * relu(q[t, h] . k_s * scale), -inf where s is not visible to t.
- topk_select: each token's exact causal top-k of its scores, ascending, ties at the cut to the earlier key.
"""

import tilelang
import tilelang.language as T

LOG2E = 1.4426950408889634
PASS_CONFIGS = {
    # plain pointers, no tensor-map descriptors: the launcher passes device pointers and scalars only
    tilelang.PassConfigKey.TL_DISABLE_TMA_LOWER: True,
    tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True,
}

# sparse MLA tiling: HEAD_BLOCK heads of one token a block, BI selected keys a tile
R, P, HEAD_BLOCK, BI, MLA_THREADS, MLA_STAGES = 512, 64, 64, 64, 256, 1
ROWS_THREADS = 128
COMBINE_THREADS = 128
# indexer tiling: BN keys of one token a block, the GLM-5.x indexer's 32 heads of 128 dims
INDEX_HEADS, INDEX_DIM, BN, INDEX_THREADS = 32, 128, 128, 128
SELECT_THREADS = 1024


@T.macro
def dependent_launch():
    """A kernel's first statement: wait for the previous kernel of the stream to complete and its writes to be
    visible, then let the next one launch (programmatic dependent launch; kernels.json marks the kernels that call it,
    and the launcher gives them the attribute). Nothing is read before the wait."""
    T.pdl_sync()
    T.pdl_trigger()


def sparse_rows():
    """Rows[t, k] = the flat cache row of Indices[t, k], or -1 when it is -1 or past the token's position."""
    t_n, topk, n_seq, width = T.dynamic("t_n"), T.dynamic("topk"), T.dynamic("n_seq"), T.dynamic("width")

    @T.prim_func
    def main(Indices: T.Tensor((t_n, topk), T.int32), Positions: T.Tensor((t_n,), T.int32),
             TokenSeq: T.Tensor((t_n,), T.int32), BlockTable: T.Tensor((n_seq, width), T.int32),
             block_size: T.int32, block_rows: T.int32, Rows: T.Tensor((t_n, topk), T.int32)):
        with T.Kernel(t_n, T.ceildiv(topk, ROWS_THREADS), threads=ROWS_THREADS) as (bx, by):
            dependent_launch()
            for i in T.Parallel(ROWS_THREADS):
                k = by * ROWS_THREADS + i
                if k < topk:
                    s = Indices[bx, k]
                    ok = (s >= 0) and (s <= Positions[bx])
                    s0 = T.if_then_else(ok, s, 0)
                    row = BlockTable[TokenSeq[bx], s0 // block_size] * block_rows + s0 % block_size
                    Rows[bx, k] = T.if_then_else(ok, row, -1)

    return main


def sparse_mla():
    """Partial attention of each split s of each token's selection (tiles s, s + splits, ...): OPart [splits, T, H,
    R] float32 normalised within the split, LsePart [splits, T, H] log2-sum-exp (-inf when the split saw no key).
    Block bz takes splits bz * per .. bz * per + per - 1 in turn (per divides splits), each from fresh accumulators:
    a split's arithmetic is the same whatever per, so the grid can fit the batch without moving a bit."""
    t_n, heads, topk = T.dynamic("t_n"), T.dynamic("heads"), T.dynamic("topk")
    kv_rows, splits = T.dynamic("kv_rows"), T.dynamic("splits")
    D = R + P

    @T.prim_func
    def main(QL: T.Tensor((t_n, heads, R), T.bfloat16), QP: T.Tensor((t_n, heads, P), T.bfloat16),
             KV: T.Tensor((kv_rows, D), T.bfloat16), Rows: T.Tensor((t_n, topk), T.int32), scale: T.float32,
             per: T.int32, OPart: T.Tensor((splits, t_n, heads, R), T.float32),
             LsePart: T.Tensor((splits, t_n, heads), T.float32)):
        with T.Kernel(t_n, T.ceildiv(heads, HEAD_BLOCK), T.ceildiv(splits, per), threads=MLA_THREADS) as (bx, by, bz):
            dependent_launch()
            Q_shared = T.alloc_shared([HEAD_BLOCK, R], T.bfloat16)
            QP_shared = T.alloc_shared([HEAD_BLOCK, P], T.bfloat16)
            KV_shared = T.alloc_shared([BI, R], T.bfloat16)
            KP_shared = T.alloc_shared([BI, P], T.bfloat16)
            S_shared = T.alloc_shared([HEAD_BLOCK, BI], T.bfloat16)
            mask = T.alloc_fragment([BI], "bool")
            acc_o = T.alloc_fragment([HEAD_BLOCK, R], T.float32)
            acc_s = T.alloc_fragment([HEAD_BLOCK, BI], T.float32)
            sumexp = T.alloc_fragment([HEAD_BLOCK], T.float32)
            sumexp_i = T.alloc_fragment([HEAD_BLOCK], T.float32)
            alpha = T.alloc_fragment([HEAD_BLOCK], T.float32)
            m_i = T.alloc_fragment([HEAD_BLOCK], T.float32)
            m_i_prev = T.alloc_fragment([HEAD_BLOCK], T.float32)
            sm = scale * LOG2E
            h0 = by * HEAD_BLOCK

            for h, d in T.Parallel(HEAD_BLOCK, R):
                Q_shared[h, d] = T.if_then_else(h0 + h < heads, QL[bx, T.min(h0 + h, heads - 1), d], 0)
            for h, d in T.Parallel(HEAD_BLOCK, P):
                QP_shared[h, d] = T.if_then_else(h0 + h < heads, QP[bx, T.min(h0 + h, heads - 1), d], 0)

            tiles = T.ceildiv(topk, BI)
            for sp in T.serial(per):
                split = bz * per + sp
                T.fill(acc_o, 0)
                T.fill(sumexp, 0)
                T.fill(m_i, -(2**30))   # finite: a tile with no key must not give -inf - -inf
                for j in T.Pipelined(T.ceildiv(tiles - split, splits), num_stages=MLA_STAGES):
                    base = (split + j * splits) * BI
                    for i in T.Parallel(BI):
                        mask[i] = (base + i < topk) and (Rows[bx, T.min(base + i, topk - 1)] >= 0)
                    for i, d in T.Parallel(BI, R):
                        KV_shared[i, d] = KV[T.max(Rows[bx, T.min(base + i, topk - 1)], 0), d]
                    for i, d in T.Parallel(BI, P):
                        KP_shared[i, d] = KV[T.max(Rows[bx, T.min(base + i, topk - 1)], 0), R + d]
                    for h, i in T.Parallel(HEAD_BLOCK, BI):
                        acc_s[h, i] = T.if_then_else(mask[i], 0, -T.infinity(T.float32))
                    T.gemm(Q_shared, KV_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.gemm(QP_shared, KP_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(m_i, m_i_prev)
                    T.reduce_max(acc_s, m_i, dim=1, clear=False)
                    for h in T.Parallel(HEAD_BLOCK):
                        m_i[h] = T.max(m_i[h], m_i_prev[h])
                    for h in T.Parallel(HEAD_BLOCK):
                        alpha[h] = T.exp2((m_i_prev[h] - m_i[h]) * sm)
                    for h, i in T.Parallel(HEAD_BLOCK, BI):
                        acc_s[h, i] = T.exp2(acc_s[h, i] * sm - m_i[h] * sm)
                    T.reduce_sum(acc_s, sumexp_i, dim=1)
                    for h in T.Parallel(HEAD_BLOCK):
                        sumexp[h] = sumexp[h] * alpha[h] + sumexp_i[h]
                    for h, d in T.Parallel(HEAD_BLOCK, R):
                        acc_o[h, d] = acc_o[h, d] * alpha[h]
                    T.copy(acc_s, S_shared)
                    T.gemm(S_shared, KV_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

                for h, d in T.Parallel(HEAD_BLOCK, R):
                    if h0 + h < heads:
                        OPart[split, bx, h0 + h, d] = T.if_then_else(sumexp[h] > 0, acc_o[h, d] / sumexp[h], 0)
                for h in T.Parallel(HEAD_BLOCK):
                    if h0 + h < heads:
                        LsePart[split, bx, h0 + h] = T.if_then_else(sumexp[h] > 0, T.log2(sumexp[h]) + m_i[h] * sm,
                                                                    -T.infinity(T.float32))

    return main


def sparse_mla_combine():
    """Out[t, h] = sum over splits of 2^(lse_s - max) * OPart_s / sum of 2^(lse_s - max), in bf16 (0 when no split
    saw a key)."""
    t_n, heads, splits = T.dynamic("t_n"), T.dynamic("heads"), T.dynamic("splits")

    @T.prim_func
    def main(OPart: T.Tensor((splits, t_n, heads, R), T.float32), LsePart: T.Tensor((splits, t_n, heads), T.float32),
             Out: T.Tensor((t_n, heads, R), T.bfloat16)):
        with T.Kernel(t_n, heads, threads=COMBINE_THREADS) as (bx, by):
            dependent_launch()
            acc = T.alloc_fragment([R], T.float32)
            top = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            top = -T.infinity(T.float32)
            total = 0
            for s in T.serial(splits):
                top = T.max(top, LsePart[s, bx, by])
            T.fill(acc, 0)
            for s in T.serial(splits):
                w = T.if_then_else(LsePart[s, bx, by] == -T.infinity(T.float32), 0, T.exp2(LsePart[s, bx, by] - top))
                total = total + w
                for d in T.Parallel(R):
                    acc[d] = acc[d] + w * OPart[s, bx, by, d]
            for d in T.Parallel(R):
                Out[bx, by, d] = T.if_then_else(total > 0, acc[d] / total, 0)

    return main


def indexer_scores():
    """Scores [T, width] float32 of every key position below width (module docstring); the keys of a tile are
    gathered through the block table, one token's 32 heads multiply them on the tensor cores."""
    t_n, kv_rows, n_seq, tw = T.dynamic("t_n"), T.dynamic("kv_rows"), T.dynamic("n_seq"), T.dynamic("tw")
    width = T.dynamic("width")

    @T.prim_func
    def main(Q: T.Tensor((t_n, INDEX_HEADS, INDEX_DIM), T.bfloat16), W: T.Tensor((t_n, INDEX_HEADS), T.float32),
             K: T.Tensor((kv_rows, INDEX_DIM), T.bfloat16), Positions: T.Tensor((t_n,), T.int32),
             TokenSeq: T.Tensor((t_n,), T.int32), BlockTable: T.Tensor((n_seq, tw), T.int32), block_size: T.int32,
             block_rows: T.int32, scale: T.float32, Scores: T.Tensor((t_n, width), T.float32)):
        with T.Kernel(t_n, T.ceildiv(width, BN), threads=INDEX_THREADS) as (bx, by):
            dependent_launch()
            Q_shared = T.alloc_shared([INDEX_HEADS, INDEX_DIM], T.bfloat16)
            K_shared = T.alloc_shared([BN, INDEX_DIM], T.bfloat16)
            rows = T.alloc_shared([BN], T.int32)
            w_shared = T.alloc_shared([INDEX_HEADS], T.float32)
            acc = T.alloc_fragment([BN, INDEX_HEADS], T.float32)
            score = T.alloc_fragment([BN], T.float32)
            pos = Positions[bx]
            seq = TokenSeq[bx]
            T.copy(Q[bx, :, :], Q_shared)
            for h in T.Parallel(INDEX_HEADS):
                w_shared[h] = W[bx, h]
            for i in T.Parallel(BN):
                key = T.min(by * BN + i, pos)
                rows[i] = BlockTable[seq, key // block_size] * block_rows + key % block_size
            for i, d in T.Parallel(BN, INDEX_DIM):
                K_shared[i, d] = K[rows[i], d]
            T.clear(acc)
            T.gemm(K_shared, Q_shared, acc, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
            for i, h in T.Parallel(BN, INDEX_HEADS):
                acc[i, h] = w_shared[h] * T.max(acc[i, h] * scale, 0)
            T.reduce_sum(acc, score, dim=1)
            for i in T.Parallel(BN):
                if by * BN + i < width:
                    Scores[bx, by * BN + i] = T.if_then_else(by * BN + i <= pos, score[i], -T.infinity(T.float32))

    return main


def order_key(x):
    """A float32's bits as a uint32 that orders like the float (+0 and -0 one key, as they compare equal)."""
    u = T.reinterpret(T.if_then_else(x == T.float32(0), T.float32(0), x), T.uint32)
    return T.if_then_else((u & T.uint32(0x80000000)) != T.uint32(0), ~u, u | T.uint32(0x80000000))


def topk_select():
    """Out[t] = the exact top-k of Scores[t, 0 .. Positions[t]] as ascending key positions, -1 padded (every visible
    key when there are at most topk). Four 8-bit radix passes find the k-th largest key; then one scan a chunk of
    keys places every larger key and the earliest `need` equal ones (the reference's tie rule): a key's output slot
    is the larger keys before it plus min(equal keys before it, need)."""
    t_n, width, topk = T.dynamic("t_n"), T.dynamic("width"), T.dynamic("topk")
    N = SELECT_THREADS

    @T.prim_func
    def topk_select(Scores: T.Tensor((t_n, width), T.float32), Positions: T.Tensor((t_n,), T.int32),
                    Out: T.Tensor((t_n, topk), T.int32)):
        with T.Kernel(t_n, threads=N) as bx:
            dependent_launch()
            tx = T.get_thread_binding()
            hist = T.alloc_shared([256], T.int32)
            found = T.alloc_shared([2], T.uint32)
            counts = T.alloc_shared([N], T.int32)
            prefix = T.alloc_var(T.uint32)
            mask = T.alloc_var(T.uint32)
            need = T.alloc_var(T.int32)
            above = T.alloc_var(T.int32)
            bin_ = T.alloc_var(T.int32)
            done = T.alloc_var(T.int32)
            gt_seen = T.alloc_var(T.int32)
            eq_seen = T.alloc_var(T.int32)
            visible = Positions[bx] + 1
            if visible <= topk:
                for i in T.serial(T.ceildiv(topk, N)):
                    if i * N + tx < topk:
                        Out[bx, i * N + tx] = T.if_then_else(i * N + tx < visible, i * N + tx, -1)
            else:
                prefix = T.uint32(0)
                mask = T.uint32(0)
                need = topk
                for p in T.serial(4):
                    shift = T.uint32(24) - T.uint32(8) * T.cast(p, T.uint32)
                    if tx < 256:
                        hist[tx] = 0
                    T.sync_threads()
                    for i in T.serial(T.ceildiv(visible, N)):
                        if i * N + tx < visible:
                            key = order_key(Scores[bx, i * N + tx])
                            if (key & mask) == prefix:
                                T.atomic_add(hist[T.cast((key >> shift) & T.uint32(255), T.int32)], 1)
                    T.sync_threads()
                    if tx == 0:
                        above = 0
                        bin_ = 0
                        done = 0
                        for j in T.serial(256):
                            if done == 0:
                                if j == 255 or above + hist[255 - j] >= need:
                                    bin_ = 255 - j
                                    done = 1
                                else:
                                    above = above + hist[255 - j]
                        found[0] = prefix | (T.cast(bin_, T.uint32) << shift)
                        found[1] = T.cast(need - above, T.uint32)
                    T.sync_threads()
                    prefix = found[0]
                    need = T.cast(found[1], T.int32)
                    mask = mask | (T.uint32(255) << shift)
                    T.sync_threads()
                gt_seen = 0
                eq_seen = 0
                for i in T.serial(T.ceildiv(visible, N)):
                    s = i * N + tx
                    key = T.if_then_else(s < visible, order_key(Scores[bx, T.min(s, visible - 1)]), T.uint32(0))
                    gt = T.if_then_else(s < visible and key > prefix, 1, 0)
                    eq = T.if_then_else(s < visible and key == prefix, 1, 0)
                    counts[tx] = eq * 65536 + gt
                    T.sync_threads()
                    T.cumsum(counts, dim=0)
                    T.sync_threads()
                    before = counts[tx] - (eq * 65536 + gt)
                    eq_before = eq_seen + (before >> 16)
                    slot = gt_seen + (before & 65535) + T.min(eq_before, need)
                    if gt == 1 or (eq == 1 and eq_before < need):
                        Out[bx, slot] = s
                    gt_seen = gt_seen + (counts[N - 1] & 65535)
                    eq_seen = eq_seen + (counts[N - 1] >> 16)
                    T.sync_threads()

    return topk_select


PROGRAMS = {
    "sparse_rows": sparse_rows,
    "sparse_mla": sparse_mla,
    "sparse_mla_combine": sparse_mla_combine,
    "indexer_scores": indexer_scores,
    "topk_select": topk_select,
}
