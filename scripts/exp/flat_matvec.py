#!/usr/bin/env python3
"""Writes kernels/matvec.cu with kernels/mma_bf16.cuh inlined at its include: flat_matvec.py OUT.

The experiment patches (matvec_stage.patch, matvec_one.patch) and chain_patch.py's variants
change one file, written when the tensor-core helpers still lived in matvec.cu; they apply to
this flattened copy, which compiles like the engine's file (-I kernels for common.cuh)."""
import sys

src = open("kernels/matvec.cu").read()
header = open("kernels/mma_bf16.cuh").read().split('#include "common.cuh"\n', 1)[1]
include = '#include "mma_bf16.cuh"\n'
if include not in src:
    sys.exit("kernels/matvec.cu no longer includes mma_bf16.cuh")
open(sys.argv[1], "w").write(src.replace(include, header, 1))
