"""bf16 matmul C = A @ B (any strides), fp32 accumulation, grouped tile order for L2 reuse."""
import torch
import triton
import triton.language as tl


@triton.jit
def _matmul_tiled(A, B, C, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % per_group) % size_m)
    pid_n = (pid % per_group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptr = A + rm.to(tl.int64)[:, None] * sam + rk[None, :] * sak
    b_ptr = B + rk[:, None] * sbk + rn.to(tl.int64)[None, :] * sbn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        kmask = (k0 + rk) < K
        a = tl.load(a_ptr, mask=(rm[:, None] < M) & kmask[None, :], other=0.0)
        b = tl.load(b_ptr, mask=kmask[:, None] & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptr += BLOCK_K * sak
        b_ptr += BLOCK_K * sbk
    c_ptr = C + rm.to(tl.int64)[:, None] * scm + rn[None, :] * scn
    tl.store(c_ptr, acc.to(C.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def forward(a, b, *, BLOCK_M: int = 128, BLOCK_N: int = 128, BLOCK_K: int = 64,
            GROUP_M: int = 8, STAGES: int = 3, num_warps: int = 8):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N),)
    _matmul_tiled[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                        BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, STAGES=STAGES, num_warps=num_warps)
    return c
