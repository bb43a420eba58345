"""Compile every Triton kernel for a GPU architecture without a GPU (catches compile errors in CI).

The Triton interpreter (used by the CPU parity tests) skips Triton's type checks and code
generation; this ahead-of-time compile runs them, down to a cubin via the ``ptxas`` bundled with
triton. Run as ``python -m trainer.kernels.compile_check [--arch 90]``; exits 1 on a failure.
Must run in a process without ``TRITON_INTERPRET=1`` (the kernels would be interpreter functions).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from colaflow.errors import run_cli
from colaflow.wording import help_text
from trainer.kernels import ce_triton, norm_triton


def _norm_variants(dt: str):
    ptrs = {"X": f"*{dt}", "W": f"*{dt}"}
    fwd = dict(ptrs, B=f"*{dt}", Y=f"*{dt}", MEAN="*fp32", RSTD="*fp32", stride_x="i32",
               stride_y="i32", D="i32", eps="fp32")
    bwd = dict(ptrs, DY=f"*{dt}", DX=f"*{dt}", MEAN="*fp32", RSTD="*fp32", DW_PART="*fp32",
               DB_PART="*fp32", stride_x="i32", stride_dy="i32", stride_dx="i32", M="i32", D="i32",
               rows_per_program="i32")
    for is_rms, has_bias in itertools.product((True, False), (True, False)):
        consts = {"IS_RMS": is_rms, "HAS_BIAS": has_bias, "BLOCK_D": 4096}
        yield norm_triton._norm_fwd_kernel, fwd, consts, norm_triton.num_warps(4096)
        yield norm_triton._norm_bwd_kernel, bwd, consts, norm_triton.num_warps(4096)


def _ce_variants(dt: str):
    sig = {"LOGITS": f"*{dt}", "stride_l": "i32", "LABELS": "*i64", "SCALE": "*fp32",
           "LOSS": "*fp32", "V": "i32", "ignore_index": "i32"}
    for grad in (True, False):
        yield ce_triton._ce_chunk_kernel, sig, {"COMPUTE_GRAD": grad, "BLOCK_V": 4096}, ce_triton.num_warps(4096)


def variants(dt: str):
    """``(kernel, signature, constexprs, num_warps)`` of every variant, for dtype ``dt``; the warps
    are those the runtime launches the same block size with (a kernel can compile at 8 warps and
    still fail at 16, e.g. on shared memory)."""
    return itertools.chain(_norm_variants(dt), _ce_variants(dt))


def compile_all(arch: int = 90, dtypes: tuple[str, ...] = ("bf16", "fp32")) -> list[str]:
    """Compile all kernel variants for ``sm_{arch}``; returns one line per variant.

    Raises:
        triton.CompilationError (or another exception from Triton): a kernel does not compile.
        RuntimeError: the kernels were imported under ``TRITON_INTERPRET=1``.
    """
    if not isinstance(norm_triton._norm_fwd_kernel, triton.runtime.JITFunction):
        raise RuntimeError("kernels were imported under TRITON_INTERPRET=1; unset it and rerun")
    target = GPUTarget("cuda", arch, 32)
    done = []
    for dt in dtypes:
        for fn, sig, consts, warps in variants(dt):
            signature = dict(sig, **{k: "constexpr" for k in consts})
            compiled = triton.compile(ASTSource(fn, signature, consts), target=target,
                                      options={"num_warps": warps})
            if not compiled.asm.get("cubin"):
                raise RuntimeError(f"{fn.__name__} {dt} {consts}: no cubin produced")
            done.append(f"{fn.__name__} {dt} {consts}")
    return done


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.kernels.compile_check [--arch 90]``: compile every Triton kernel for that GPU
    architecture without a GPU; returns 0, or 1 after naming the kernel that failed."""
    p = argparse.ArgumentParser(prog="python -m trainer.kernels.compile_check", description=help_text(__doc__.splitlines()[0]))
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 90")
    args = p.parse_args(argv)
    try:
        done = compile_all(args.arch)
    except Exception as exc:  # report which kernel failed, then fail the command
        print(f"compile check for sm_{args.arch} FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"compiled {len(done)} kernel variants for sm_{args.arch}")
    return 0


if __name__ == "__main__":
    run_cli(main)
