//! Launch wrappers of the matvec family (kernels/matvec.cu): the tensor-core small-M kernels
//! for bf16 and block-scaled FP8 weights, picked per shape so the grid fits one wave, and the
//! general kernels for any dtype and row count (kernels/fp8.cu `matvec_fp8` for FP8).

use super::matvec_pick::{
    a8x_smem, fp8_a8_twins, fp8_n1_twin, fp8_n1x_twin, fp8_twin, holds, looping, n1x_smem, tc_kernel, tc_kernel_plain,
    tc_launch_grid, wide_twin, x1_twin, x1h_twin, TC_ROWS, TC_WARPS,
};
use super::matvec_split::SplitLaunch;
use super::ops::{aligned16, cfg, check, fp8_tile_rows, launch, launch_v, Fp8Buf, WeightBuf, WeightView};
use super::pdl::{device_addr, dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

/// Arguments of a tensor-core matvec launch at most (the FP8 twins': the bf16 ones and the block
/// scales).
const TC_ARGS: usize = 28;
// A launch refuses more arguments than its fixed array holds (pdl.rs): checked here at build time.
const _: () = assert!(TC_ARGS <= Gpu::MAX_ARGS);

/// Extra epilogue work of one tensor-core matvec (the RMSNorm fold, see `norm_fold.rs`), as
/// device addresses with their lengths in f32 values (checked at launch).
#[derive(Clone, Copy, Default)]
pub(crate) struct Epilogue {
    /// Scale output row m by `1/rms` of its input row from `parts` partial sums of squares per
    /// row: partials `[m, parts]`.
    pub norm_in: Option<NormIn>,
    /// Also write the (accumulated) output times γ and this block's partial Σ y² per row.
    pub norm_out: Option<NormOut>,
    /// Reduce the (one-row) output to its argmax in the same launch (`matvec_tc_argmax_bf16`).
    pub argmax: Option<ArgmaxEpi>,
    /// x holds bf16 rows of `d_in` values (a [`NormOut::bf16`] producer's `xg`): the `_x1h`
    /// twin reads them (`--activations bf16` only).
    pub x_bf16: bool,
    /// The SwiGLU epilogue writes act as bf16 rows (rounded as an `_x1` consumer rounds x) for
    /// an `_x1h` consumer: down reads half the bytes (`--activations bf16` only).
    pub y_bf16: bool,
}

/// The argmax epilogue's buffers: `v`, `i` one pair per block, `ticket` (zero between
/// launches), `out` the token, and the row `table[token, 0..dim)` into `gathered` (bf16 table;
/// `dim` = 0 gathers nothing).
#[derive(Clone, Copy)]
pub(crate) struct ArgmaxEpi {
    pub v: (u64, usize),
    pub i: (u64, usize),
    pub ticket: u64,
    pub out: u64,
    pub table: u64,
    pub gathered: u64,
    pub dim: usize,
}

#[derive(Clone, Copy)]
pub(crate) struct NormIn {
    pub ss: (u64, usize),
    pub parts: usize,
    pub eps: f32,
}

/// `gamma [d_out]`; `xg [m, d_out]` = y·γ; `ss [m, grid]` the partials.
#[derive(Clone, Copy)]
pub(crate) struct NormOut {
    pub gamma: (u64, usize),
    pub xg: (u64, usize),
    pub ss: (u64, usize),
    /// Write `xg` as bf16 rows (rounded as an `_x1` consumer rounds x) for an `_x1h` consumer.
    pub bf16: bool,
}

/// The device address of a view, with its length, for an [`Epilogue`].
pub(crate) fn addr<T>(gpu: &Gpu, v: &impl cudarc::driver::DevicePtr<T>, len: usize) -> (u64, usize) {
    (device_addr(gpu, v), len)
}

impl Gpu {
    /// Whether `matvec_rows` over `w` with `d_in` inputs takes the tensor-core kernel.
    pub(crate) fn tc_path(&self, w: &WeightBuf, x: &CudaView<f32>, d_in: usize) -> bool {
        self.tc_ok(w, &w.view(0..w.len()), x, d_in)
    }

    /// The tensor-core kernel `matvec_rows` picks for `d_out` rows of `d_in` of `w`.
    pub(crate) fn tc_name(&self, w: &WeightBuf, d_out: usize, d_in: usize) -> &'static str {
        let name = tc_kernel(d_out.div_ceil(16), d_in, self.sms);
        if matches!(w, WeightBuf::Fp8(_)) {
            fp8_twin(name)
        } else {
            name
        }
    }

    /// [`Gpu::matvec_tc`] over a whole bf16 matrix with the host's K split.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matvec_tc_epi(
        &self,
        name: &str,
        w: &WeightBuf,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        shape: (usize, usize, usize),
        y_cols: usize,
        accumulate: bool,
        epi: Epilogue,
    ) -> CudaResult<usize> {
        self.matvec_tc(name, &w.view(0..w.len()), x, y, shape, y_cols, accumulate, None, epi)
    }

    /// `y[m, o] (+)= Σ_k x[m, k] · W[o, k]` for `m` rows (any m).
    pub fn matvec(
        &self,
        w: &WeightBuf,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        shape: (usize, usize, usize),
        accumulate: bool,
    ) -> CudaResult<()> {
        self.matvec_rows(w, 0, x, y, shape, accumulate)
    }

    /// [`Gpu::matvec`] over rows `row0 .. row0 + d_out` of `w` (a block of a stacked matrix,
    /// such as the k|v rows of the fused q|k|v projection).
    ///
    /// bf16 weights with `d_in % 8 == 0` and 16-byte aligned buffers take the tensor-core kernel
    /// in launches of up to 8 rows; everything else the general kernel in launches of 16.
    pub fn matvec_rows(
        &self,
        w: &WeightBuf,
        row0: usize,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        (m, d_in, d_out): (usize, usize, usize),
        accumulate: bool,
    ) -> CudaResult<()> {
        check("matvec w", w.len(), (row0 + d_out) * d_in)?;
        check("matvec x", x.len(), m * d_in)?;
        check("matvec y", y.len(), m * d_out)?;
        fp8_tile_rows("matvec", w, row0, d_out)?;
        let wv = w.view(row0 * d_in..(row0 + d_out) * d_in);
        if self.tc_ok(w, &wv, x, d_in) {
            let name = match w {
                WeightBuf::Fp8(_) => self.tc_name(w, d_out, d_in),
                _ => tc_kernel_plain(d_out.div_ceil(16), d_in, self.sms),
            };
            self.matvec_tc(name, &wv, x, y, (m, d_in, d_out), d_out, accumulate, None, Epilogue::default())?;
            return Ok(());
        }
        // The general kernels, 16 rows a launch: matvec_fp8 for FP8 (its scales as four more
        // arguments), matvec_{bf16,f16,f32} otherwise.
        let name = format!("matvec_{}", w.suffix());
        let mut start = 0;
        while start < m {
            let rows = (m - start).min(16);
            let xs = x.slice(start * d_in..(start + rows) * d_in);
            let mut ys = y.slice_mut(start * d_out..(start + rows) * d_out);
            let (mm, di, dout, acc) = (rows as i32, d_in as i32, d_out as i32, accumulate as i32);
            if let WeightView::Fp8 { q, scale, srow, scale_cols, block_k, tiled, .. } = &wv {
                // matvec_fp8(w, x, y, m, in, out, acc, scale, srow, scale_cols, kb, tiled)
                let args = [
                    dptr(self, q),
                    dptr(self, &xs),
                    dptr_mut(self, &mut ys),
                    Arg::I32(mm),
                    Arg::I32(di),
                    Arg::I32(dout),
                    Arg::I32(acc),
                    dptr(self, scale),
                    dptr(self, srow),
                    Arg::I32(*scale_cols as i32),
                    Arg::I32(*block_k as i32),
                    Arg::I32(*tiled as i32),
                ];
                self.launch_pdl("matvec_fp8", (d_out.div_ceil(8) as u32, 1, 1), 256, &args)?;
            } else {
                launch_v!(self, name, wv, cfg(d_out.div_ceil(8), 256), |b| {
                    b.arg(&xs).arg(&mut ys).arg(&mm).arg(&di).arg(&dout).arg(&acc);
                });
            }
            start += rows;
        }
        Ok(())
    }

    /// Launches a tensor-core matvec kernel `name` (same signature as `matvec_tc_bf16`) in
    /// chunks of 8 rows. `y` is `[m, y_cols]`: `d_out`, or `d_out / 2` for the SwiGLU epilogue.
    /// Returns the grid size (the number of partial sums of squares a norm producer writes per
    /// row).
    #[allow(clippy::too_many_arguments)]
    fn matvec_tc(
        &self,
        name: &str,
        wv: &WeightView<'_>,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        (m, d_in, d_out): (usize, usize, usize),
        y_cols: usize,
        accumulate: bool,
        ks_override: Option<usize>,
        epi: Epilogue,
    ) -> CudaResult<usize> {
        let name = if self.activations == crate::Activations::Bf16 { x1_twin(name) } else { name };
        let name = match (epi.x_bf16, x1h_twin(name)) {
            (false, _) => name,
            (true, Some(twin)) => twin,
            (true, None) => return Err(CudaError::Shape(format!("{name}: no kernel reads x as bf16 rows"))),
        };
        let tiles = d_out.div_ceil(16);
        if looping(name) && (ks_override.is_some() || epi.norm_in.is_some() || epi.norm_out.is_some()) {
            return Err(CudaError::Shape(format!("{name}: the tile-looping kernel has no K split or RMSNorm fold")));
        }
        let (ks, grid) = match ks_override {
            Some(ks) => (ks, tiles.div_ceil(TC_WARPS / ks)),
            None => tc_launch_grid(name, tiles, d_in, self.sms),
        };
        let fp8 = name.ends_with("_fp8");
        if fp8 && (epi.norm_out.is_some_and(|o| o.bf16) || epi.y_bf16) {
            return Err(CudaError::Shape(format!("{name}: the FP8 kernels write xg and act in f32 only")));
        }
        if epi.y_bf16 && !name.contains("swiglu") {
            return Err(CudaError::Shape(format!("{name}: only the SwiGLU epilogue writes bf16 act rows")));
        }
        // The kernels' last flag: xg (a norm producer) or act (SwiGLU) as bf16 rows.
        let out_bf16 = epi.norm_out.is_some_and(|o| o.bf16) || epi.y_bf16;
        // x's row width in f32 slots: bf16 rows take half (d_in is a multiple of 8 here).
        let xw = if epi.x_bf16 { d_in / 2 } else { d_in };
        let (w, fp8_args, xsplit) = match wv {
            WeightView::U16(v) if !fp8 => (dptr(self, v), None, None),
            WeightView::Fp8 { q, scale, srow, scale_cols, block_k, xsplit, .. } if fp8 => {
                let args = [
                    dptr(self, scale),
                    dptr(self, srow),
                    Arg::I32(*scale_cols as i32),
                    Arg::I32(block_k.trailing_zeros() as i32),
                ];
                if xsplit.len() < Fp8Buf::xsplit_len(d_in) {
                    return Err(CudaError::Shape(format!(
                        "{name}: x-split scratch of {} pairs for in {d_in}",
                        xsplit.len()
                    )));
                }
                (dptr(self, q), Some(args), Some(device_addr(self, xsplit)))
            }
            _ => return Err(CudaError::Shape(format!("{name}: the weights are not in this kernel's dtype"))),
        };
        // E4M3 activations (experiment `DSPARK_FP8_A8=1`, fp8.cuh): Qwen's 128-wide blocks on
        // the sm_89 and sm_90 PTX, every launch of at most 8 rows (no wide twins), x quantized before it.
        let a8 = match wv {
            WeightView::Fp8 { block_k: 128, .. } if self.fp8_a8 && d_in.is_multiple_of(128) && self.ptx.e4m3_mma() => {
                fp8_a8_twins(name)
            }
            _ => None,
        };
        if name.starts_with("matvec_tc_u4b1h") && !holds(d_in, ks) {
            return Err(CudaError::Shape(format!("{name}: K {d_in} at K split {ks} does not fit a warp's registers")));
        }
        if let Some(n) = &epi.norm_in {
            check("matvec norm partials", n.ss.1, m * n.parts)?;
        }
        if let Some(a) = &epi.argmax {
            if m != 1 {
                return Err(CudaError::Shape(format!("{name}: the argmax epilogue takes one row, got {m}")));
            }
            check("matvec argmax partials", a.v.1.min(a.i.1), grid)?;
        }
        if let Some(o) = &epi.norm_out {
            check("matvec norm gamma", o.gamma.1, d_out)?;
            check("matvec norm x·gamma", o.xg.1, m * d_out)?;
            check("matvec norm partials", o.ss.1, m * grid)?;
        }
        let at = |base: u64, offset: usize| Arg::Ptr(base + 4 * offset as u64); // f32 elements
        let null = Arg::Ptr(0);
        let y_base = device_addr(self, &y.as_view());
        let mut start = 0;
        while start < m {
            let wide = if self.wide && a8.is_none() { wide_twin(name, m - start) } else { None };
            let rows = (m - start).min(wide.map_or(TC_ROWS, |w| w.1));
            let xs = x.slice(start * xw..(start + rows) * xw);
            let mut ys = y.slice_mut(start * y_cols..(start + rows) * y_cols);
            // bf16 act rows: 2 bytes a value from y's start.
            let y_arg =
                if epi.y_bf16 { Arg::Ptr(y_base + 2 * (start * y_cols) as u64) } else { dptr_mut(self, &mut ys) };
            let (ss_in, parts, eps) = match epi.norm_in {
                Some(n) => (at(n.ss.0, start * n.parts), n.parts, n.eps),
                None => (null, 0, 0.0),
            };
            let (gamma, xg, ss_out) = match epi.norm_out {
                // bf16 xg: 2 bytes a value.
                Some(o) if o.bf16 => {
                    (at(o.gamma.0, 0), Arg::Ptr(o.xg.0 + 2 * (start * d_out) as u64), at(o.ss.0, start * grid))
                }
                Some(o) => (at(o.gamma.0, 0), at(o.xg.0, start * d_out), at(o.ss.0, start * grid)),
                None => (null, null, null),
            };
            // bf16 activations: the split twin stages x once per block (matvec_split.rs).
            if let Some(split) =
                wide.filter(|_| ks_override.is_none()).and_then(|(twin, _)| self.split_for(twin, d_out, d_in))
            {
                let l = SplitLaunch {
                    w,
                    x: dptr(self, &xs),
                    y: y_arg,
                    rows,
                    cap: wide.map_or(TC_ROWS, |w| w.1),
                    d_in,
                    d_out,
                    accumulate,
                    ss_in,
                    parts,
                    eps,
                    gamma,
                    xg,
                    ss_out,
                    xg_bf16: out_bf16,
                };
                self.launch_split(split, &l)?;
                start += rows;
                continue;
            }
            let (av, ai, at_, ao, atab, agat, adim) = match epi.argmax {
                Some(a) => (
                    Arg::Ptr(a.v.0),
                    Arg::Ptr(a.i.0),
                    Arg::Ptr(a.ticket),
                    Arg::Ptr(a.out),
                    Arg::Ptr(a.table),
                    Arg::Ptr(a.gathered),
                    a.dim,
                ),
                None => (null, null, null, null, null, null, 0),
            };
            // matvec_tc_*(w, x, y, m, in, out, accumulate, ksplit, ss_in, parts, eps, gamma, xg,
            // ss_out, am_v, am_i, am_ticket, am_out, am_table, am_gathered, am_dim)
            let mut args = [Arg::I32(0); TC_ARGS];
            let base = [
                w,
                dptr(self, &xs),
                y_arg,
                Arg::I32(rows as i32),
                Arg::I32(d_in as i32),
                Arg::I32(d_out as i32),
                Arg::I32(accumulate as i32),
                Arg::I32(ks as i32),
                ss_in,
                Arg::I32(parts as i32),
                Arg::F32(eps),
                gamma,
                xg,
                ss_out,
                av,
                ai,
                at_,
                ao,
                atab,
                agat,
                Arg::I32(adim as i32),
            ];
            args[..base.len()].copy_from_slice(&base);
            // FP8: + scale, srow, scale_cols, kb_log2, xs, plane, tiled (a fixed array: no allocation per
            // launch), after split_x_f16x2 has written the launch's rows of x in two parts.
            // One row on a GPU whose shared memory holds its split: the `_n1x` twin splits it in
            // each block (the same bits), and no split launch runs first.
            let smem_for = if a8.is_some() { a8x_smem } else { n1x_smem };
            let in_block = match a8.map(|t| t.1).or(fp8_n1x_twin(name)) {
                Some(twin) if rows == 1 && self.fp8_split_in_block && self.xsm_limit(twin) >= smem_for(d_in) => {
                    Some(twin)
                }
                _ => None,
            };
            let n = match (fp8_args, xsplit) {
                (Some(f), Some(xsp)) => {
                    let pairs = rows * d_in / 2;
                    // split_x_f16x2_row(x, planes, in, plane): one block a row, the row's loads
                    // all in flight at once, split from registers after the block's maximum (one
                    // L2 round trip; FP8 verify −2.0 / −2.2% on an H100 against the form below). Rows
                    // wider than one block holds: split_x_f16x2, blocks of 256 threads along each
                    // row, a pair a thread, each block reading the whole row for its largest |x|
                    // (fp8.cuh `block_abs_max`), a row per grid row.
                    if in_block.is_none() {
                        let split = [dptr(self, &xs), Arg::Ptr(xsp), Arg::I32(d_in as i32), Arg::I32(pairs as i32)];
                        let quant_grid = ((d_in / 128).div_ceil(8) as u32, rows as u32, 1);
                        match split_row_threads(d_in).filter(|_| self.fp8_split_row) {
                            _ if a8.is_some() => self.launch_pdl("quant_x_e4m3", quant_grid, 256, &split)?,
                            Some(threads) => {
                                self.launch_pdl("split_x_f16x2_row", (1, rows as u32, 1), threads, &split)?
                            }
                            None => self.launch_pdl(
                                "split_x_f16x2",
                                ((d_in / 2).div_ceil(256) as u32, rows as u32, 1),
                                256,
                                &split,
                            )?,
                        }
                    }
                    args[base.len()..base.len() + 4].copy_from_slice(&f);
                    args[base.len() + 4] = Arg::Ptr(xsp);
                    args[base.len() + 5] = Arg::I32(pairs as i32);
                    args[base.len() + 6] = Arg::I32(matches!(wv, WeightView::Fp8 { tiled: true, .. }) as i32);
                    args.len()
                }
                _ => {
                    // bf16: xg_bf16, the last argument.
                    args[base.len()] = Arg::I32(out_bf16 as i32);
                    base.len() + 1
                }
            };
            let kernel = match (wide, in_block) {
                (Some((twin, _)), _) => twin,
                (None, Some(twin)) => twin,
                (None, None) if a8.is_some() => a8.map_or(name, |t| t.0),
                (None, None) if fp8 && rows <= 4 => fp8_n1_twin(name),
                (None, None) => name,
            };
            let smem = if in_block.is_some() { smem_for(d_in) as u32 } else { 0 };
            self.launch_pdl_smem(kernel, (grid as u32, 1, 1), 32 * TC_WARPS as u32, smem, &args[..n])?;
            start += rows;
        }
        Ok(grid)
    }

    /// Whether a weight view and its activations can take the tensor-core kernels: bf16 with
    /// `d_in % 8 == 0`, or FP8 with `d_in % 16 == 0` and scale blocks of a power of two ≥ 64
    /// columns (a 64-wide chunk in one block), and 16-byte aligned buffers. F16 / f32 weights
    /// never take them.
    fn tc_ok(&self, w: &WeightBuf, wv: &WeightView<'_>, x: &CudaView<f32>, d_in: usize) -> bool {
        let w_ok = match wv {
            WeightView::U16(v) => matches!(w, WeightBuf::Bf16(_)) && aligned16(self, v) && d_in.is_multiple_of(8),
            WeightView::Fp8 { q, block_k, .. } => {
                aligned16(self, q) && d_in.is_multiple_of(16) && block_k.is_power_of_two() && *block_k >= 64
            }
            WeightView::F32(_) => false,
        };
        w_ok && aligned16(self, x)
    }

    /// Times-only entry for `dspark bench --matvec-variants`: a named tensor-core variant on a
    /// bf16 or FP8 weight (the name's dtype must be the weight's).
    pub fn matvec_tc_variant(
        &self,
        name: &str,
        w: &WeightBuf,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        shape: (usize, usize, usize),
    ) -> CudaResult<()> {
        check("matvec w", w.len(), shape.1 * shape.2)?;
        check("matvec x", x.len(), shape.0 * shape.1)?;
        check("matvec y", y.len(), shape.0 * shape.2)?;
        if !self.tc_ok(w, &w.view(0..w.len()), x, shape.1) {
            return Err(CudaError::Shape(format!("{name}: not a shape and dtype of the tensor-core kernels")));
        }
        // `name@ks` forces the K split (1, 2, 4 or 8) instead of the host's choice.
        let (name, ks) = match name.split_once('@') {
            Some((n, k)) => match k.parse::<usize>() {
                Ok(k) if [1, 2, 4, 8].contains(&k) => (n, Some(k)),
                _ => return Err(CudaError::Shape(format!("{name}: the K split after @ must be 1, 2, 4 or 8"))),
            },
            None => (name, None),
        };
        self.matvec_tc(name, &w.view(0..w.len()), x, y, shape, shape.2, false, ks, Epilogue::default())?;
        Ok(())
    }

    /// `act = silu(gate) ⊙ up` where gate|up is one matrix `[2·inter, d_in]` with rows
    /// interleaved (gate_0, up_0, gate_1, up_1, …): the MLP's first half in one launch on the
    /// tensor-core path (the SwiGLU is its epilogue); other weights run the general matvec into
    /// `gate_up` and a pairwise SwiGLU.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_swiglu(
        &self,
        w: &WeightBuf,
        x: &CudaView<f32>,
        gate_up: &mut CudaViewMut<f32>,
        act: &mut CudaViewMut<f32>,
        shape: (usize, usize, usize),
    ) -> CudaResult<()> {
        self.swiglu_with(w, x, gate_up, act, shape, (None, false, false))
    }

    /// [`Gpu::matvec_swiglu`], with a pending RMSNorm of `x` applied in the tensor-core epilogue
    /// (`norm_in` is only given where `tc_path` holds; see `norm_fold.rs`).
    pub(crate) fn swiglu_with(
        &self,
        w: &WeightBuf,
        x: &CudaView<f32>,
        gate_up: &mut CudaViewMut<f32>,
        act: &mut CudaViewMut<f32>,
        (m, d_in, inter): (usize, usize, usize),
        (norm_in, x_bf16, y_bf16): (Option<NormIn>, bool, bool),
    ) -> CudaResult<()> {
        check("matvec_swiglu w", w.len(), 2 * inter * d_in)?;
        check("matvec_swiglu x", x.len(), m * d_in)?;
        check("matvec_swiglu act", act.len(), m * inter)?;
        if self.tc_path(w, x, d_in) {
            let epi = Epilogue { norm_in, x_bf16, y_bf16, ..Epilogue::default() };
            let name = if matches!(w, WeightBuf::Fp8(_)) { "matvec_tc_swiglu_fp8" } else { "matvec_tc_swiglu_bf16" };
            self.matvec_tc_epi(name, w, x, act, (m, d_in, 2 * inter), inter, false, epi)?;
            return Ok(());
        }
        if norm_in.is_some() || y_bf16 {
            return Err(CudaError::Shape(
                "matvec_swiglu: a pending norm or bf16 act rows need the tensor-core path".into(),
            ));
        }
        self.matvec(w, x, gate_up, (m, d_in, 2 * inter), false)?;
        let (i, r) = (inter as i32, m as i32);
        let mut b = self.stream.launch_builder(self.function("swiglu_pairs_f32")?);
        b.arg(gate_up).arg(act).arg(&i).arg(&r);
        // SAFETY: matches swiglu_pairs_f32(gu, act, inter, rows); lengths checked above.
        launch!(self, "swiglu_pairs_f32", b, cfg((m * inter).div_ceil(256), 256));
        Ok(())
    }
}

/// Threads of `split_x_f16x2_row`'s one block a row for rows of `d_in` values, or `None` where
/// a row needs more than fp8.cu's `SPLIT_ROW_Q` = 8 groups of 4 on each of 1024 threads
/// (`split_x_f16x2` then splits it). At most four groups a thread where 1024 threads allow, at
/// least 256 threads: on an H100 (bench projections at M = 7, 2026-12-06) 1024 threads took
/// down_proj's 12,288-wide rows 27.8 → 27.1 µs against 512, and lost 2–7% against 256 on the
/// 4,096-wide rows of q|k|v and gate|up.
fn split_row_threads(d_in: usize) -> Option<u32> {
    (d_in <= 4 * 8 * 1024).then(|| d_in.div_ceil(4 * 4).next_power_of_two().clamp(256, 1024) as u32)
}

#[cfg(test)]
mod tests {
    use half::bf16;

    /// The split's threads a row: Qwen3-8B's widths, the smallest rows, and the last width one
    /// block takes (4 · 8 · 1024 values) before the grid form.
    #[test]
    fn split_row_threads_cover_the_row_in_at_most_eight_groups_a_thread() {
        let t = super::split_row_threads;
        assert_eq!((t(16), t(4096), t(6144), t(12288)), (Some(256), Some(256), Some(512), Some(1024)));
        assert_eq!((t(25600), t(32768), t(32784)), (Some(1024), Some(1024), None));
        for d in (16..=32768).step_by(16) {
            let n = t(d).map(|n| n as usize).unwrap_or(0);
            assert!(d.div_ceil(4) <= 8 * n && n.is_power_of_two(), "{d} values on {n} threads");
        }
    }

    /// kernels/matvec.cu `split3`, as it was (seven conversions: every part rounded) and as it is
    /// (two: lo taken as the upper half of its f32 bits), on the host: the parts must be the same
    /// bits, and hi + mid + lo must be x exactly, for normal x of every exponent.
    fn split_rounded(x: f32) -> [u16; 3] {
        let hi = bf16::from_f32(x);
        let r = x - hi.to_f32();
        let mid = bf16::from_f32(r);
        [hi.to_bits(), mid.to_bits(), bf16::from_f32(r - mid.to_f32()).to_bits()]
    }
    fn split_kernel(x: f32) -> [u16; 3] {
        let hi = bf16::from_f32(x).to_bits();
        let r = x - f32::from_bits((hi as u32) << 16);
        let mid = bf16::from_f32(r).to_bits();
        let l = r - f32::from_bits((mid as u32) << 16);
        [hi, mid, (l.to_bits() >> 16) as u16]
    }

    proptest::proptest! {
        #[test]
        fn split3_lo_needs_no_rounding(bits in 0u32..=u32::MAX) {
            let x = f32::from_bits(bits);
            // Normal values whose parts stay normal (the kernel header's condition).
            proptest::prop_assume!(x.is_normal() && x.abs() > f32::MIN_POSITIVE * 2f32.powi(20));
            let (k, r) = (split_kernel(x), split_rounded(x));
            proptest::prop_assert_eq!(k, r, "x = {:e}", x);
            let sum: f64 = k.iter().map(|&p| bf16::from_bits(p).to_f32() as f64).sum();
            proptest::prop_assert_eq!(sum, x as f64, "x = {:e}", x);
        }
    }
}
