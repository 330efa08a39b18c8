"""The Hopper-era variants (matmul/persistent: TMA descriptors built on the device, persistent
grid; matmul/skinny: decode-shaped weight stream with split-K; decode_attention/flashdec:
one-pass merge over many KV splits) on every path their forward can take, under the Triton
interpreter. The full judge (guard, poisoned outputs, in-place rewrite, ghost run, timing) runs
on each, at shapes that force the path named in the test."""
import pytest
import torch

from kernelsearch.families import get
from kernelsearch.harness import check, sandbox


def _judge(family, variant, cfg, shapes):
    fam = get(family)
    v = check(family, fam.variants[variant].file, cfg, isolate=False, dtypes=["float16"],
              shapes=shapes, random_shapes=0, seeds=1, reps=2)
    assert v.accepted, v
    return v


def _launches(family, variant, cfg, args):
    """Run forward once, counting its launches per kernel: {kernel: launches}."""
    fam = get(family)
    src = fam.variants[variant].file.read_text()
    mod = sandbox.load(src, "t")
    from kernelsearch.harness.guard import launched_kernels

    names = sorted(launched_kernels(src))
    with sandbox.LaunchCount() as c:
        out = mod.forward(*args, **cfg)
    return out, {n: c.by_name.get(n, 0) for n in names}


PERSISTENT = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "STAGES": 3,
              "NUM_SMS": 132, "SUBTILE": 1, "num_warps": 8}


def test_persistent_takes_tma_when_rows_are_aligned_and_pointers_otherwise():
    fam = get("matmul")
    g = torch.Generator().manual_seed(0)
    aligned = fam.make_inputs((20, 48, 64), "float16", "cpu", g)  # 16-byte rows: TMA
    out, n = _launches("matmul", "persistent", PERSISTENT, aligned)
    assert n == {"_mm_persistent_ptr": 0, "_mm_persistent_tma": 1}
    torch.testing.assert_close(out.double(), fam.reference(*aligned), atol=2e-2, rtol=2e-2)
    odd = fam.make_inputs((19, 33, 45), "float16", "cpu", g)  # K = 45: rows not 16-byte aligned
    out, n = _launches("matmul", "persistent", PERSISTENT, odd)
    assert n == {"_mm_persistent_ptr": 1, "_mm_persistent_tma": 0}
    torch.testing.assert_close(out.double(), fam.reference(*odd), atol=2e-2, rtol=2e-2)


def test_persistent_row_major_b_and_more_tiles_than_programs():
    """B as a plain row-major [K, N] (the other TMA layout), and more output tiles than
    programs (NUM_SMS = 2: each program walks several tiles)."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(300, 64, generator=g).half()
    b = torch.randn(64, 272, generator=g).half()
    cfg = dict(PERSISTENT, NUM_SMS=2, BLOCK_N=128, SUBTILE=0, num_warps=4)
    out, n = _launches("matmul", "persistent", cfg, (a, b))
    assert n["_mm_persistent_tma"] == 1
    torch.testing.assert_close(out.double(), a.double() @ b.double(), atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("shape", [(20, 48, 64), (19, 33, 45)])
def test_persistent_passes_the_judge_on_both_paths(shape):
    _judge("matmul", "persistent", PERSISTENT, [shape])


def test_skinny_split_k_two_pass_and_single_pass():
    cfg = {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 2, "STAGES": 3, "num_warps": 4}
    assert cfg in get("matmul").variant("skinny").configs((3, 50, 1100))
    g = torch.Generator().manual_seed(2)
    args = get("matmul").make_inputs((3, 50, 1100), "float16", "cpu", g)
    _, n = _launches("matmul", "skinny", cfg, args)
    assert n == {"_skinny": 1, "_skinny_reduce": 1}
    _judge("matmul", "skinny", cfg, [(3, 50, 1100), (16, 40, 1030)])
    one = dict(cfg, SPLIT_K=1)
    _, n = _launches("matmul", "skinny", one, args)
    assert n == {"_skinny": 1, "_skinny_reduce": 0}


def test_skinny_is_offered_for_decode_shapes_only_but_computes_any_m():
    fam = get("matmul")
    assert fam.variant("skinny").configs((8, 28672, 8192))
    assert not fam.variant("skinny").configs((17, 4096, 4096))
    assert not fam.variant("persistent").configs((16, 4096, 4096))
    cfg = {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 1, "STAGES": 3, "num_warps": 4}
    args = fam.make_inputs((37, 30, 100), "float16", "cpu", torch.Generator().manual_seed(3))
    out, n = _launches("matmul", "skinny", cfg, args)
    assert n["_skinny"] == 3  # 16 + 16 + 5 rows
    torch.testing.assert_close(out.double(), fam.reference(*args), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("shape,split", [((1, 8, 2, 700, 32), 128), ((2, 4, 4, 300, 16), 32)])
def test_flashdec_merges_many_splits_in_one_pass(shape, split):
    """6 and 10 chunks (padded to 8 and 16 in the merge tile), GQA group 4 and group 1."""
    cfg = {"BLOCK_N": 32, "SPLIT": split, "STAGES": 2, "num_warps": 4}
    _judge("decode_attention", "flashdec", cfg, [shape])


def test_flashdec_split_count_is_bounded_by_the_merge_tile():
    fam = get("decode_attention")
    for cfg in fam.variant("flashdec").configs((8, 32, 8, 131072, 128)):
        assert -(-131072 // cfg["SPLIT"]) <= 128


def test_scratch_allocator_is_installed_once_and_never_replaces_the_applications():
    import triton
    from triton.runtime import _allocation

    from kernelsearch import runtime

    before = _allocation._allocator.get()
    try:
        triton.set_allocator(_allocation.NullAllocator())
        runtime.ensure_scratch_allocator()
        assert _allocation._allocator.get() is runtime._alloc

        def app_alloc(size, alignment, stream):
            return torch.empty(size, dtype=torch.int8)

        triton.set_allocator(app_alloc)
        runtime.ensure_scratch_allocator()
        assert _allocation._allocator.get() is app_alloc
    finally:
        triton.set_allocator(before)
