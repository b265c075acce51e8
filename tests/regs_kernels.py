"""Two kernels for test_bench_regs (imported in a subprocess without TRITON_INTERPRET)."""

import triton
import triton.language as tl


@triton.jit
def scale_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(Y + offs, 2.0 * tl.load(X + offs, mask=m), mask=m)


@triton.jit
def big_tile_kernel(X, Y, N: tl.constexpr):
    # an [N, N] fp32 tile live across its own column sums: at N = 128 on one warp that is 512
    # values a thread, past the 255 registers
    r = tl.arange(0, N)
    t = tl.load(X + r[:, None] * N + r[None, :])
    s = tl.sum(t, axis=0)
    tl.store(Y + r[:, None] * N + r[None, :], t * s[None, :] + tl.exp(t))
