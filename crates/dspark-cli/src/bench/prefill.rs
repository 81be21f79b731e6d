//! The prefill phase of `dspark bench`: prompts of several lengths through the target's
//! `forward_greedy` (the call `generate` makes for a prompt), and the draft's context append of
//! the same prompt, against the tensor-core roofline measured in the same run.
//!
//! The roofline is cuBLAS itself: the four projection GEMMs of a layer (q|k|v, o, gate|up, down;
//! bf16 operands, f32 out and accumulation — the calls the prefill makes) timed alone on the
//! prompt's chunk shapes, summed over chunks and layers. `gemm / prefill` is then the share of
//! cuBLAS's own GEMM throughput the whole prefill reaches with its attention, norms, RoPE and
//! element-wise kernels included. TFLOP/s count the projections (2·rows·out·in each) and the
//! causal attention (4·hd·heads per visible query–key pair) of every layer, the lm_head of the
//! one logits row, not the element-wise ops.

use super::report::PrefillRow;
use anyhow::{Context, Result};
use dspark_kernels::cuda::gemm::{Blas, GemmIn, WORKSPACE_BYTES};
use dspark_kernels::cuda::ops::WeightBuf;
use dspark_kernels::cuda::Gpu;
use dspark_model::cuda::dspark::CudaDraft;
use dspark_model::cuda::prefill::MAX_PREFILL_ROWS;
use dspark_model::cuda::qwen3::CudaQwen3;
use dspark_model::{Drafter, LogitRows, TargetModel};
use std::time::Instant;

/// Times a prefill of each of `lengths` tokens (median of `iters`, after one warm-up) and the
/// draft's append of its captures, beside the cuBLAS roofline of its projections.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    gpu: &Gpu,
    target: &mut CudaQwen3,
    draft: &mut CudaDraft,
    lengths: &[usize],
    iters: usize,
    mut token: impl FnMut() -> u32,
    suffix: &str,
    profiles: &mut Vec<super::report::Profile>,
) -> Result<Vec<PrefillRow>> {
    let cfg = target.config().clone();
    let (h, q, kv, i) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
    let shapes = [(q + 2 * kv, h), (h, q), (2 * i, h), (h, i)];
    let roofline = Roofline::new(gpu, &shapes)?;
    let mut rows = Vec::new();
    for &len in lengths {
        eprintln!("bench: prefill of {len} tokens");
        let prompt: Vec<u32> = (0..len).map(|_| token()).collect();
        let mut prefill = Vec::new();
        let mut append = Vec::new();
        for it in 0..=iters {
            target.truncate(0)?;
            draft.reset();
            // Without the draft: the prompt's forward alone, as plain greedy decoding runs it.
            target.set_capture(&[])?;
            let t = Instant::now();
            target.forward_greedy(&prompt, LogitRows::Last)?;
            let p = t.elapsed().as_secs_f64() * 1e6;
            // With it: the speculative loop's prefill, captures handed to the draft chunk by
            // chunk, then the last chunk's append (what the first round starts with).
            target.truncate(0)?;
            target.set_capture(draft.target_layer_ids())?;
            let t = Instant::now();
            let (_, pending) = dspark_spec::prefill(target, draft, &prompt)?;
            draft.append_captured(&pending)?;
            gpu.stream.synchronize()?;
            let a = t.elapsed().as_secs_f64() * 1e6 - p;
            if it > 0 {
                prefill.push(p);
                append.push(a);
            }
        }
        // One more prefill and append with per-launch events, for the profile.
        target.truncate(0)?;
        draft.reset();
        gpu.set_profiling(true)?;
        let (_, pending) = dspark_spec::prefill(target, draft, &prompt)?;
        draft.append_captured(&pending)?;
        gpu.stream.synchronize()?;
        profiles.push(super::profile(
            gpu,
            &format!("prefill{suffix}"),
            len,
            super::report::median(&mut prefill.clone()),
        )?);
        gpu.set_profiling(false)?;
        // The chunks the prefill runs (all but the last of the planned rows: `--prefill-chunk`).
        let step = target.prefill_rows().max(1);
        let chunks: Vec<usize> = (0..len).step_by(step).map(|s| (len - s).min(step)).collect();
        let mut gemm_micros = 0.0;
        for &m in &chunks {
            gemm_micros += roofline.layer_micros(gpu, m)? * cfg.num_hidden_layers as f64;
        }
        let gemm_flops: f64 =
            chunks.iter().map(|&m| shapes.iter().map(|&(o, k)| 2.0 * (m * o * k) as f64).sum::<f64>()).sum::<f64>()
                * cfg.num_hidden_layers as f64;
        // Causal pairs: row r sees r + 1 keys.
        let pairs = (len * (len + 1) / 2) as f64;
        let attn_flops = 4.0 * (cfg.head_dim * cfg.num_attention_heads) as f64 * pairs * cfg.num_hidden_layers as f64;
        let head_flops = 2.0 * (cfg.vocab_size * h) as f64;
        let micros = super::report::median(&mut prefill);
        let flops = gemm_flops + attn_flops + head_flops;
        rows.push(PrefillRow {
            weights: suffix.trim_start_matches('_').to_string(),
            tokens: len,
            micros,
            tflops: flops / (micros * 1e6),
            cublas_gemm_micros: gemm_micros,
            cublas_tflops: gemm_flops / (gemm_micros * 1e6),
            gemm_share: gemm_micros / micros,
            draft_append_micros: super::report::median(&mut append),
        });
    }
    target.truncate(0)?;
    draft.reset();
    Ok(rows)
}

/// cuBLAS GEMMs of a layer's projection shapes on random bf16 weights.
struct Roofline {
    blas: Blas,
    weights: Vec<(WeightBuf, usize, usize)>,
    x: cudarc::driver::CudaSlice<u16>,
    y: cudarc::driver::CudaSlice<f32>,
}

impl Roofline {
    fn new(gpu: &Gpu, shapes: &[(usize, usize)]) -> Result<Roofline> {
        let blas = Blas::new(gpu, gpu.stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?).context("cuBLAS")?;
        let mut weights = Vec::new();
        for (s, &(out, inp)) in shapes.iter().enumerate() {
            let mut w = gpu.stream.alloc_zeros::<u16>(out * inp)?;
            gpu.fill_uniform_bf16(&mut w, 77 + s as u64, 0.02)?;
            weights.push((WeightBuf::Bf16(w), out, inp));
        }
        let max_in = shapes.iter().map(|s| s.1).max().unwrap_or(1);
        let max_out = shapes.iter().map(|s| s.0).max().unwrap_or(1);
        let mut x = gpu.stream.alloc_zeros::<u16>(MAX_PREFILL_ROWS * max_in)?;
        gpu.fill_uniform_bf16(&mut x, 99, 1.0)?;
        let y = gpu.stream.alloc_zeros::<f32>(MAX_PREFILL_ROWS * max_out)?;
        Ok(Roofline { blas, weights, x, y })
    }

    /// µs of one layer's four GEMMs at `m` rows: CUDA-event mean of 5 repetitions after one.
    fn layer_micros(&self, gpu: &Gpu, m: usize) -> Result<f64> {
        let mut y = self.y.clone();
        let run = |y: &mut cudarc::driver::CudaSlice<f32>| -> Result<()> {
            for (w, out, inp) in &self.weights {
                let x = GemmIn::Half(self.x.slice(..m * inp));
                gpu.gemm(&self.blas, w, &x, &mut y.slice_mut(..m * out), (m, *inp, *out), false)?;
            }
            Ok(())
        };
        run(&mut y)?;
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let reps = 5;
        let start = gpu.stream.record_event(flags)?;
        for _ in 0..reps {
            run(&mut y)?;
        }
        let end = gpu.stream.record_event(flags)?;
        Ok(start.elapsed_ms(&end)? as f64 * 1e3 / reps as f64)
    }
}
