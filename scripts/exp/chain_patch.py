#!/usr/bin/env python3
"""Writes a variant of kernels/matvec.cu for scripts/exp/chain_ab.sh: chain_patch.py VARIANT OUT.

Variants (each an exact text substitution, checked to apply):
  pre2 — both register sets of weights (two steps) requested before the PDL wait, the loop's
         first refill skipped;
  xprobe — only x row 0 loaded whatever M is (wrong results; a cost probe);
  swz  — tile groups handed to blocks in a strided order (97·b mod grid);
  rot  — each tile walks its warps' K steps starting at step (tile mod steps) and wrapping
         around, so the warps of a launch do not all read the same column range of their rows
         at the same time (a DRAM channel-balance probe; it changes the order of the sum).
"""
import sys

SRC = "kernels/matvec.cu"
VARIANTS = {
    "pre2": [
        ("    load(a0, b0, kbeg);\n",
         "    load(a0, b0, kbeg);\n    if (kbeg + step < kend) load(a1, b1, kbeg + step);\n"),
        ("        load(a1, b1, chunk + step);\n",
         "        if (chunk != kbeg) load(a1, b1, chunk + step);\n"),
    ],
    "rot": [
        ("    auto load = [&](uint4* va, uint4* vb, int chunk) {\n",
         "    const int nst = (kend - kbeg + step - 1) / step, rot = tile % max(nst, 1);\n"
         "    const int kwrap = kbeg + nst * step, kshift = rot * step;\n"
         "    auto rotc = [&](int chunk) {  // no division per load: one compare and subtract\n"
         "        const int c = chunk + kshift;\n"
         "        return chunk >= kwrap ? chunk : c >= kwrap ? c - nst * step : c;\n"
         "    };\n"
         "    auto load = [&](uint4* va, uint4* vb, int chunk) {\n"),
        ("            int k = chunk + u * stride + 8 * t;\n", "            int k = rotc(chunk) + u * stride + 8 * t;\n"),
    ],
    # A probe, wrong results: only activation row 0 is loaded (and split), whatever M is — how much
    # of M = 8's extra time is the other rows' x loads and splits.
    "xprobe": [("    const bool has_x = g < m;\n", "    const bool has_x = g < min(m, 1);\n")],
    # Block b takes tile group (97·b) mod grid instead of b, so that blocks with neighbouring
    # indices — which land on the same SM as a launch fills in — do not read neighbouring rows.
    "swz": [
        ("    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n    const int g = lane >> 2",
         "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n"
         "    const int bsw = (int)((97ull * blockIdx.x) % gridDim.x);\n    const int g = lane >> 2"),
        ("blockIdx.x * tiles_per_block", "bsw * tiles_per_block"),
    ],
}

variant, out = sys.argv[1], sys.argv[2]
text = open(SRC).read()
for old, new in VARIANTS[variant]:
    n = text.count(old)
    if n == 0:
        sys.exit(f"{variant}: {old!r} not found in {SRC}")
    text = text.replace(old, new)
open(out, "w").write(text)
