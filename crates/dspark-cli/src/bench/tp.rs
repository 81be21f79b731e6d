//! The tensor-parallel floor model of a decode step (issue #32, item 5): what N GPUs of one host
//! could do for a Qwen3 target before the code that splits it exists.
//!
//! Megatron-style splitting, as issue #32 specifies it: q/k/v and gate/up by output columns with
//! whole KV heads per GPU, o and down by input rows, embedding and lm_head by vocabulary. Each
//! GPU then streams 1/N of every projection and of lm_head, and reads 1/N of the KV cache (its
//! own heads); the norms (a few KB) are on every GPU. A step adds 2 all-reduces per layer (after
//! o and after down) and one all-gather of the argmax candidates. So per step:
//!
//!   floor(N) = (W_proj + W_head + KV) / N / ceiling  +  (2·L + 1) · t_collective
//!
//! with the ceiling measured on the machine (the bench's own copy ceiling) and `t_collective` the
//! latency of one small NCCL all-reduce (hidden-size rows: 8–16 KB a decode step, latency-bound).
//! That latency is a parameter until a multi-GPU run measures it (`--allreduce-us`); the speed-up
//! over one GPU follows from both, and the all-reduces' share of the step is what bounds it.

use crate::bench::configs::QWEN3_8B;
use dspark_model::checkpoint::json::JsonObject;
use dspark_model::{Qwen3Config, Result};
use std::path::Path;

/// The Qwen3-14B target config (`Qwen/Qwen3-14B`'s config.json): Qwen3-8B's with the shapes
/// that differ.
pub fn qwen3_14b() -> Result<Qwen3Config> {
    let text = QWEN3_8B
        .replace("\"hidden_size\": 4096", "\"hidden_size\": 5120")
        .replace("\"intermediate_size\": 12288", "\"intermediate_size\": 17408")
        .replace("\"num_hidden_layers\": 36", "\"num_hidden_layers\": 40")
        .replace("\"num_attention_heads\": 32", "\"num_attention_heads\": 40");
    Qwen3Config::from_json(&JsonObject::parse(Path::new("<built-in Qwen3-14B config>"), &text)?)
}

/// One row of the model: a decode step of `cfg` on `n` GPUs at `ctx` cached positions.
#[derive(Clone, Debug, PartialEq)]
pub struct TpFloor {
    pub n: usize,
    /// Bytes each GPU streams a step: its share of the projections, lm_head and KV cache.
    pub bytes_per_gpu: f64,
    /// Those bytes at the copy ceiling, µs.
    pub stream_us: f64,
    /// Collectives a step (2 per layer + the argmax gather; none at N = 1).
    pub collectives: usize,
    /// stream_us + collectives · allreduce_us.
    pub floor_us: f64,
    /// floor(1) / floor(N).
    pub speedup: f64,
}

/// The model for each N in `ns` (bf16 weights: 2 bytes each; `kv_bytes` per cached element).
/// N must divide the KV heads (whole heads per GPU) and the intermediate size.
pub fn tp_floors(
    cfg: &Qwen3Config,
    ctx: usize,
    kv_bytes: usize,
    ceiling_gbs: f64,
    allreduce_us: f64,
    ns: &[usize],
) -> std::result::Result<Vec<TpFloor>, String> {
    let (h, q, kv, i, layers) =
        (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size, cfg.num_hidden_layers);
    let proj = layers * (h * (q + 2 * kv) + q * h + 3 * h * i) * 2;
    let head = cfg.vocab_size * h * 2;
    let cache = 2 * layers * ctx * kv * kv_bytes;
    let total = (proj + head + cache) as f64;
    let one = total / (ceiling_gbs * 1e3);
    ns.iter()
        .map(|&n| {
            if n == 0 || !cfg.num_key_value_heads.is_multiple_of(n) || !i.is_multiple_of(n) {
                return Err(format!(
                    "--tensor-parallel {n}: must divide the {} KV heads and the intermediate size {i}",
                    cfg.num_key_value_heads
                ));
            }
            let stream_us = one / n as f64;
            let collectives = if n > 1 { 2 * layers + 1 } else { 0 };
            let floor_us = stream_us + collectives as f64 * allreduce_us;
            Ok(TpFloor {
                n,
                bytes_per_gpu: total / n as f64,
                stream_us,
                collectives,
                floor_us,
                speedup: one / floor_us,
            })
        })
        .collect()
}

/// The model as a markdown table, one row per N.
pub fn markdown(name: &str, ctx: usize, allreduce_us: f64, rows: &[TpFloor]) -> String {
    let mut s = format!(
        "\n### Tensor-parallel floor model: {name}, decode at {ctx} keys (not measured: per-GPU bytes at this run's ceiling + {allreduce_us} µs per collective, assumed)\n\n| N | GB per GPU | stream µs | collectives | floor µs | × one GPU |\n|---:|---:|---:|---:|---:|---:|\n"
    );
    for r in rows {
        s += &format!(
            "| {} | {:.2} | {:.1} | {} | {:.1} | {:.2}× |\n",
            r.n,
            r.bytes_per_gpu / 1e9,
            r.stream_us,
            r.collectives,
            r.floor_us,
            r.speedup
        );
    }
    s
}

/// `dspark bench --tensor-parallel N`: `CudaQwen3Tp` on GPUs 0..N with random bf16 weights of
/// each rank's shapes, Qwen3-8B and Qwen3-14B, against the single-GPU target on GPU 0: the
/// all-reduce's latency (one decode row, measured), then a decode step and an eight-row verify
/// at `ctx` keys, each against the per-GPU floor with that latency: bytes / N at the ceiling
/// plus (2·L + 1) collectives. The split target launches eagerly and gathers logits on the host
/// (no CUDA graphs yet), which the ratios show.
pub fn measure(
    n: usize,
    ctx: usize,
    kv: dspark_kernels::KvDtype,
    ceiling: f64,
    iters: usize,
) -> anyhow::Result<String> {
    use dspark_kernels::cuda::Gpu;
    use dspark_model::cuda::qwen3::CudaQwen3;
    use dspark_model::cuda::tp::CudaQwen3Tp;
    use dspark_model::cuda::weights::{RandomWeights, WeightSource};
    use dspark_model::{LogitRows, TargetModel};
    use std::sync::Arc;
    let have =
        cudarc::driver::CudaContext::device_count().map_err(|e| anyhow::anyhow!("CUDA devices: {e:?}"))? as usize;
    if n < 2 || n > have {
        anyhow::bail!("--tensor-parallel {n}: needs 2 to {have} GPUs (this machine has {have})");
    }
    let gpus = (0..n).map(|i| Gpu::new(i).map(Arc::new)).collect::<std::result::Result<Vec<_>, _>>()?;
    let mut out = format!(
        "\n### Tensor parallel, measured: N = {n} ({}), {ctx} keys, {} KV\n\n| model | phase | N = 1 ms | N = {n} ms | × N = 1 | floor ms | × floor |\n|---|---|---:|---:|---:|---:|---:|\n",
        "NCCL", kv.name()
    );
    let time = |t: &mut dyn TargetModel, rows: usize, token: &mut dyn FnMut() -> u32| -> anyhow::Result<f64> {
        let base = t.len();
        let mut v = Vec::new();
        for it in 0..iters + 2 {
            let step: Vec<u32> = (0..rows).map(|_| token()).collect();
            let s = std::time::Instant::now();
            t.forward(&step, if rows == 1 { LogitRows::Last } else { LogitRows::All })?;
            if it >= 2 {
                v.push(s.elapsed().as_secs_f64() * 1e3);
            }
            t.truncate(base)?;
        }
        Ok(crate::bench::report::median(&mut v))
    };
    for (name, cfg) in [("Qwen3-8B", crate::bench::configs::qwen3_8b()?), ("Qwen3-14B", qwen3_14b()?)] {
        eprintln!("bench: tensor parallel {name}, N = {n}");
        let mut token = super::tokens(7, cfg.vocab_size);
        let prompt: Vec<u32> = (0..ctx).map(|_| token()).collect();
        let one = {
            let w = RandomWeights::new(gpus[0].clone(), 1, 0.02);
            let mut t = CudaQwen3::from_source_kv(gpus[0].clone(), cfg.clone(), &w, ctx + 16, kv)?;
            t.forward_greedy(&prompt, LogitRows::Last)?;
            (time(&mut t, 1, &mut token)?, time(&mut t, 8, &mut token)?)
        };
        let mut t = CudaQwen3Tp::from_sources(gpus.clone(), cfg.clone(), ctx + 16, kv, |s| {
            Box::new(RandomWeights::new(gpus[s.rank].clone(), 1 + s.rank as u64, 0.02)) as Box<dyn WeightSource>
        })?;
        let ar = t.time_all_reduce(1, 200)?;
        t.forward(&prompt, LogitRows::Last)?;
        let split = (time(&mut t, 1, &mut token)?, time(&mut t, 8, &mut token)?);
        let floor = tp_floors(&cfg, ctx, kv.bytes(), ceiling, ar, &[n]).map_err(anyhow::Error::msg)?[0].floor_us / 1e3;
        out += &format!("| {name} | all-reduce of one row | — | {:.1} µs | — | — | — |\n", ar);
        for (phase, a, b) in [("decode", one.0, split.0), ("verify of 8", one.1, split.1)] {
            out +=
                &format!("| {name} | {phase} | {a:.2} | {b:.2} | {:.2}× | {floor:.2} | {:.2}× |\n", a / b, b / floor);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::configs::qwen3_8b;

    #[test]
    fn qwen3_8b_splits_its_bytes_and_pays_its_collectives() {
        let cfg = qwen3_8b().unwrap();
        let rows = tp_floors(&cfg, 4096, 4, 4278.0, 8.0, &[1, 2, 4, 8]).unwrap();
        // One GPU: the bench's own decode floor at 4,096 keys, f32 cache (16,346.0 MB, 3,821 µs
        // at 4,276 GB/s in the record run; the norms and the embedding row, 1.8 MB, are the
        // difference).
        assert!((rows[0].bytes_per_gpu / 1e6 - 16_346.0).abs() < 2.0, "{}", rows[0].bytes_per_gpu);
        assert_eq!(rows[0].collectives, 0);
        assert_eq!(rows[0].speedup, 1.0);
        for r in &rows[1..] {
            assert_eq!(r.collectives, 73);
            assert!((r.bytes_per_gpu * r.n as f64 - rows[0].bytes_per_gpu).abs() < 1.0);
            assert!((r.floor_us - (rows[0].stream_us / r.n as f64 + 73.0 * 8.0)).abs() < 1e-6);
        }
        // The collectives bound the speed-up: each of 8 GPUs gains less than each of 2.
        assert!(rows[1].speedup > 1.0 && rows[3].speedup / 8.0 < rows[1].speedup / 2.0, "{rows:?}");
        assert!(tp_floors(&cfg, 4096, 4, 4278.0, 8.0, &[3]).is_err(), "3 does not divide 8 KV heads");
        assert!(tp_floors(&cfg, 4096, 4, 4278.0, 8.0, &[16]).is_err());
    }

    #[test]
    fn qwen3_14b_config_parses() {
        let c = qwen3_14b().unwrap();
        assert_eq!((c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.q_dim()), (40, 5120, 17408, 5120));
        let rows = tp_floors(&c, 4096, 2, 4278.0, 8.0, &[1, 2]).unwrap();
        // 26.42 GB of projections + 1.56 GB of lm_head + 0.67 GB of bf16 KV at 4,096 keys.
        assert!(rows[0].bytes_per_gpu > 28.5e9 && rows[0].bytes_per_gpu < 28.8e9, "{}", rows[0].bytes_per_gpu);
    }
}
