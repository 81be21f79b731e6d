#!/usr/bin/env python3
"""Writes a variant of kernels/matvec.cu for scripts/exp/chain_ab.sh: chain_patch.py VARIANT OUT [SRC]
(SRC: another matvec.cu to patch, e.g. one built from matvec_stage.patch).

Variants (each an exact text substitution, checked to apply):
  pre2 — both register sets of weights (two steps) requested before the PDL wait, the loop's
         first refill skipped;
  xprobe — only x row 0 loaded whatever M is (wrong results; a cost probe);
  xfirst — each step's x requested before the next step's weights;
  wsync — a __syncwarp after each step's weight requests (keeps them above the step's MMAs);
  wsync2 — the same barrier after each step's weight and x requests, before its MMAs;
  nosplit — x not split into bf16 parts (a cost probe, wrong results);
  mma1 — one MMA per 16 k instead of three (a cost probe, wrong results);
  one_x0 — one-row kernels with x in lane group 0 only (a cost probe, wrong results);
  presplit — x read as if written pre-split by its producer (a cost probe, wrong results);
  nox  — no x loaded at all (zeros; wrong results; a cost probe);
  swz  — tile groups handed to blocks in a strided order (97·b mod grid);
  rot  — each tile walks its warps' K steps starting at step (tile mod steps) and wrapping
         around, so the warps of a launch do not all read the same column range of their rows
         at the same time (a DRAM channel-balance probe; it changes the order of the sum).
"""
import sys

SRC = None  # default: kernels/matvec.cu with mma_bf16.cuh inlined (flat_matvec.py)
VARIANTS = {
    "pre2": [
        ("    load(a0, b0, kbeg);\n",
         "    load(a0, b0, kbeg);\n    if (kbeg + step < kend) load(a1, b1, kbeg + step);\n"),
        ("        load(a1, b1, chunk + step);\n",
         "        if (chunk != kbeg) load(a1, b1, chunk + step);\n"),
    ],
    "rot": [
        ("    auto load = [&](uint4* va, uint4* vb, int chunk) { load_w_step<UNROLL>(wa, wb, chunk, stride, kend, t, va, vb); };\n",
         "    const int nst = (kend - kbeg + step - 1) / step, rot = tile % max(nst, 1);\n"
         "    const int kwrap = kbeg + nst * step, kshift = rot * step;\n"
         "    auto rotc = [&](int chunk) {  // no division per load: one compare and subtract\n"
         "        const int c = chunk + kshift;\n"
         "        return chunk >= kwrap ? chunk : c >= kwrap ? c - nst * step : c;\n"
         "    };\n"
         "    auto load = [&](uint4* va, uint4* vb, int chunk) {\n"
         "        load_w_step<UNROLL>(wa, wb, rotc(chunk), stride, kend, t, va, vb);\n    };\n"),
    ],
    # A probe, wrong results: only activation row 0 is loaded (and split), whatever M is — how much
    # of M = 8's extra time is the other rows' x loads and splits.
    "xprobe": [("    const bool has_x = g < m;\n", "    const bool has_x = g < min(m, 1);\n")],
    # A probe, wrong results: no activation row is loaded (x taken as zeros) — how much of a
    # launch's time after its wait is its x loads.
    "nox": [("    const bool has_x = g < m;\n", "    const bool has_x = false;\n")],
    # Each step's x requested before the next step's weights, so that the x loads (L2 hits the
    # step waits for) are not queued behind that step's weight requests (HBM misses).
    "xfirst": [
        ("        load(a1, b1, chunk + step);\n        if (XP) {\n            load_x(x1, chunk + step);\n"
         "        } else {\n            load_x(x0, chunk);\n        }\n",
         "        if (!XP) load_x(x0, chunk);\n        load(a1, b1, chunk + step);\n"
         "        if (XP) load_x(x1, chunk + step);\n"),
        ("        load(a0, b0, chunk + step);\n        if (XP) {\n            load_x(x0, chunk + step);\n"
         "            compute(a1, b1, x1);\n        } else {\n            load_x(x0, chunk);\n",
         "        if (!XP) load_x(x0, chunk);\n        load(a0, b0, chunk + step);\n        if (XP) {\n"
         "            load_x(x0, chunk + step);\n            compute(a1, b1, x1);\n        } else {\n"),
    ],
    # A warp barrier after each step's weight requests, so that ptxas cannot sink them below
    # the step's first MMA, which waits for the step's x (an L2 round trip).
    "wsync": [
        ("        load(a1, b1, chunk + step);\n", "        load(a1, b1, chunk + step);\n        __syncwarp();\n"),
        ("        load(a0, b0, chunk + step);\n", "        load(a0, b0, chunk + step);\n        __syncwarp();\n"),
    ],
    # The same barrier after each step's weight and x requests, before its MMAs.
    "wsync2": [
        ("            load_x(x0, chunk);\n        }\n        compute(a0, b0, x0);\n",
         "            load_x(x0, chunk);\n        }\n        __syncwarp();\n        compute(a0, b0, x0);\n"),
        ("            load_x(x0, chunk);\n            compute(a1, b1, x0);\n",
         "            load_x(x0, chunk);\n            __syncwarp();\n            compute(a1, b1, x0);\n"),
    ],
    # A probe, wrong results: x not split into three bf16 parts (each part the upper half of x,
    # one byte permute a pair) — what the split's arithmetic costs the loop. (Stop 18 measured it
    # against the seven-conversion split3 that b5b9d36 replaced.)
    "nosplit": [
        ("    hi = pack_bf16(a, b);  // low half bf16_rn(a), high half bf16_rn(b)\n",
         "    hi = mid = lo = __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);\n    return;\n"),
    ],
    # A probe, wrong results: one MMA per 16 k (the hi part's) instead of three — what the other
    # two parts' MMAs cost the loop.
    "mma1": [
        ("    mma_bf16(acc[1], va.x, vb.x, va.y, vb.y, md[0], md[1]);\n"
         "    mma_bf16(acc[2], va.x, vb.x, va.y, vb.y, lo[0], lo[1]);\n", ""),
        ("    mma_bf16(acc[1], va.z, vb.z, va.w, vb.w, md[2], md[3]);\n"
         "    mma_bf16(acc[2], va.z, vb.z, va.w, vb.w, lo[2], lo[3]);\n",
         "#pragma unroll\n    for (int j = 0; j < 4; j++) asm volatile(\"\" ::\"r\"(md[j]), \"r\"(lo[j]));  // split kept\n"),
    ],
    # A probe, wrong results, on matvec_one.patch's kernels (SRC): the one-row kernels with x
    # loaded by lane group 0 only (groups 1 and 2, which pass mid and lo, get zeros).
    "one_x0": [("    const bool has_x = ONE ? g < 3 : g < m;", "    const bool has_x = ONE ? g < 1 : g < m;")],
    # A probe, wrong results: x as if its producer had written it already split (three bf16
    # parts of every 8 values, 48 bytes, at 1.5 × the f32 offset; chain.cu's activation buffers
    # are twice their size for it): three 16-byte loads per chunk and no split.
    "presplit": [
        ("float (*xv)[8]", "float (*xv)[12]"),
        ("    float x0[UNROLL][8], x1[UNROLL][8];\n", "    float x0[UNROLL][12], x1[UNROLL][12];\n"),
        ("        float xv[UNROLL][8];\n", "        float xv[UNROLL][12];\n"),
        ("            for (int i = 0; i < 8; i++) xv[u][i] = 0.f;\n", "            for (int i = 0; i < 12; i++) xv[u][i] = 0.f;\n"),
        ("    const float* p = x + (size_t)row * in + k;\n"
         "    float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);\n"
         "    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;\n",
         "    const float* p = x + ((size_t)row * in + k) * 3 / 2;\n"
         "    float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4),\n"
         "           c = *reinterpret_cast<const float4*>(p + 8);\n"
         "    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;\n"
         "    v[8] = c.x; v[9] = c.y; v[10] = c.z; v[11] = c.w;\n"),
        ("    for (int j = 0; j < 4; j++) split3(xv[2 * j], xv[2 * j + 1], h[j], md[j], lo[j]);\n",
         "    for (int j = 0; j < 4; j++) {\n        h[j] = __float_as_uint(xv[j]);\n"
         "        md[j] = __float_as_uint(xv[4 + j]);\n        lo[j] = __float_as_uint(xv[8 + j]);\n    }\n"),
    ],
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
if len(sys.argv) > 3:
    SRC = sys.argv[3]
if SRC is None:
    import subprocess, tempfile
    SRC = tempfile.mktemp(suffix=".cu")
    subprocess.run([sys.executable, "scripts/exp/flat_matvec.py", SRC], check=True)
text = open(SRC).read()
for old, new in VARIANTS[variant]:
    n = text.count(old)
    if n == 0:
        sys.exit(f"{variant}: {old!r} not found in {SRC}")
    text = text.replace(old, new)
open(out, "w").write(text)
