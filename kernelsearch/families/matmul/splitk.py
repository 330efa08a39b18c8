"""bf16 matmul for skinny products (decode, M <= 64): the K loop is split over SPLIT_K programs
that write fp32 partials; a second kernel sums them in a fixed order (deterministic, no atomics)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _matmul_splitk(A, B, P, M, N, K, k_per_split, sam, sak, sbk, sbn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    s = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k_start = s * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=STAGES):
        kk = k0 + rk
        kmask = kk < k_end
        a = tl.load(A + rm.to(tl.int64)[:, None] * sam + kk[None, :] * sak,
                    mask=(rm[:, None] < M) & kmask[None, :], other=0.0)
        b = tl.load(B + kk.to(tl.int64)[:, None] * sbk + rn.to(tl.int64)[None, :] * sbn,
                    mask=kmask[:, None] & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    p_ptr = P + (s.to(tl.int64) * M + rm[:, None]) * N + rn[None, :]
    tl.store(p_ptr, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _splitk_reduce(P, C, MN, SPLITS, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(P + s * MN + offs, mask=mask, other=0.0)
    tl.store(C + offs, acc.to(C.dtype.element_ty), mask=mask)


def forward(a, b, *, BLOCK_M: int = 16, BLOCK_N: int = 64, BLOCK_K: int = 128,
            SPLIT_K: int = 4, STAGES: int = 3, num_warps: int = 4):
    M, K = a.shape
    N = b.shape[1]
    k_per_split = ((K + SPLIT_K - 1) // SPLIT_K + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    splits = (K + k_per_split - 1) // k_per_split
    part = torch.empty((splits, M, N), dtype=torch.float32, device=a.device)
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = ((N + BLOCK_N - 1) // BLOCK_N, (M + BLOCK_M - 1) // BLOCK_M, splits)
    _matmul_splitk[grid](a, b, part, M, N, K, k_per_split, a.stride(0), a.stride(1),
                         b.stride(0), b.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                         BLOCK_K=BLOCK_K, STAGES=STAGES, num_warps=num_warps)
    _splitk_reduce[((M * N + 1023) // 1024,)](part, c, M * N, splits, BLOCK=1024, num_warps=4)
    return c
