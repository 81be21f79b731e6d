//! One rank's weights from a whole checkpoint: a [`WeightSource`] that hands each matrix the
//! rank's slice of the tensor on disk, as [`crate::tp::TpShard`] plans it (the CPU reference,
//! `cpu/tp.rs`, slices the same rows and columns).
//!
//! | tensor                         | the rank's part                          |
//! |--------------------------------|------------------------------------------|
//! | `q_proj`                       | rows of its query heads (`heads · hd`)   |
//! | `k_proj`, `v_proj`             | rows of its KV heads                     |
//! | `o_proj`                       | columns of its query heads               |
//! | `gate_proj`, `up_proj`         | rows `ff`                                |
//! | `down_proj`                    | columns `ff`                             |
//! | `embed_tokens`, `lm_head`      | rows `vocab`                             |
//! | norms (and anything else)      | whole                                    |
//!
//! The loader asks with the rank's shapes (its layer config: `TpShard::layer_config`); the
//! tensor is read at the whole model's shape, so a checkpoint of another shape is refused by the
//! checkpoint's own shape check, naming the tensor. The bytes are sliced in their dtype, so the
//! rank's matrices hold the checkpoint's values exactly. FP8 checkpoints are refused for now:
//! their 128 × 128 scale blocks would have to be split along with the bytes.

use crate::checkpoint::safetensors::Checkpoint;
use crate::cuda::layers::drv;
use crate::cuda::weights::{interleave_rows, WeightSource};
use crate::error::{Error, Result};
use crate::tp::TpShard;
use crate::Qwen3Config;
use cudarc::driver::CudaSlice;
use dspark_kernels::cuda::ops::WeightBuf;
use dspark_tensor::arena::Arena;
use std::ops::Range;

/// How a tensor splits.
enum Cut {
    Rows(Range<usize>),
    Cols(Range<usize>),
    Whole,
}

/// Rank `shard`'s slices of the tensors of `ck`, a checkpoint of the whole model `full`.
pub struct ShardSource<'a> {
    pub ck: &'a Checkpoint,
    pub full: &'a Qwen3Config,
    pub shard: TpShard,
}

impl ShardSource<'_> {
    /// The cut of tensor `name` and its shape in the whole model.
    fn cut(&self, name: &str, rank_shape: &[usize]) -> (Cut, Vec<usize>) {
        let (c, s) = (self.full, &self.shard);
        let (h, hd) = (c.hidden_size, c.head_dim);
        let heads = s.heads.start * hd..s.heads.end * hd;
        let kv = s.kv_heads.start * hd..s.kv_heads.end * hd;
        let ends = |suffix: &str| name.ends_with(suffix);
        if ends("self_attn.q_proj.weight") {
            (Cut::Rows(heads), vec![c.q_dim(), h])
        } else if ends("self_attn.k_proj.weight") || ends("self_attn.v_proj.weight") {
            (Cut::Rows(kv), vec![c.kv_dim(), h])
        } else if ends("self_attn.o_proj.weight") {
            (Cut::Cols(heads), vec![h, c.q_dim()])
        } else if ends("mlp.gate_proj.weight") || ends("mlp.up_proj.weight") {
            (Cut::Rows(s.ff.clone()), vec![c.intermediate_size, h])
        } else if ends("mlp.down_proj.weight") {
            (Cut::Cols(s.ff.clone()), vec![h, c.intermediate_size])
        } else if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
            (Cut::Rows(s.vocab.clone()), vec![c.vocab_size, h])
        } else {
            (Cut::Whole, rank_shape.to_vec())
        }
    }

    /// The rank's bytes of `name` (rank shape `shape`) and their dtype.
    fn bytes(&self, name: &str, shape: &[usize]) -> Result<(dspark_tensor::DType, Vec<u8>)> {
        if self.full.quantization.is_some() {
            return Err(Error::Request(format!(
                "--tensor-parallel {}: FP8 checkpoints are not split yet ({name})",
                self.shard.n
            )));
        }
        let (cut, full_shape) = self.cut(name, shape);
        let (dtype, raw) = self.ck.raw(name, &full_shape)?;
        let es = dtype.size();
        let cols = full_shape.get(1).copied().unwrap_or(1);
        let out = match cut {
            Cut::Whole => raw.to_vec(),
            Cut::Rows(r) => raw[r.start * cols * es..r.end * cols * es].to_vec(),
            Cut::Cols(k) => {
                raw.chunks_exact(cols * es).flat_map(|row| row[k.start * es..k.end * es].iter().copied()).collect()
            }
        };
        let want: usize = shape.iter().product::<usize>() * es;
        if out.len() != want {
            return Err(Error::Request(format!(
                "{name}: rank {} of {} takes {} bytes, its shape {shape:?} needs {want}",
                self.shard.rank,
                self.shard.n,
                out.len()
            )));
        }
        Ok((dtype, out))
    }
}

impl WeightSource for ShardSource<'_> {
    fn matrix(&self, arena: &Arena, name: &str, shape: &[usize]) -> Result<WeightBuf> {
        let (dtype, bytes) = self.bytes(name, shape)?;
        arena.weight(dtype, &bytes).map_err(drv)
    }

    fn stacked(&self, arena: &Arena, parts: &[(&str, &[usize])]) -> Result<WeightBuf> {
        let raw = parts.iter().map(|(n, s)| self.bytes(n, s)).collect::<Result<Vec<_>>>()?;
        let dtype = raw.first().map(|r| r.0).ok_or_else(|| Error::Request("stacked: no parts".into()))?;
        if raw.iter().any(|r| r.0 != dtype) {
            return Err(Error::Request(format!("{}: parts of mixed dtypes", parts[0].0)));
        }
        let bytes: Vec<u8> = raw.into_iter().flat_map(|r| r.1).collect();
        arena.weight(dtype, &bytes).map_err(drv)
    }

    fn interleaved(&self, arena: &Arena, a: &str, b: &str, shape: &[usize]) -> Result<WeightBuf> {
        let ((da, ba), (db, bb)) = (self.bytes(a, shape)?, self.bytes(b, shape)?);
        if da != db {
            return Err(Error::Request(format!("{a}, {b}: mixed dtypes")));
        }
        let rows = shape.first().copied().unwrap_or(1);
        arena.weight(da, &interleave_rows(&ba, &bb, rows)).map_err(drv)
    }

    fn host_table(
        &self,
        _ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
        name: &str,
        _shape: &[usize],
    ) -> Result<dspark_kernels::cuda::host_table::HostTable> {
        Err(Error::Request(format!(
            "--tensor-parallel {}: {name} stays on the device (no --embeddings host)",
            self.shard.n
        )))
    }

    fn vector(&self, arena: &Arena, name: &str, shape: &[usize]) -> Result<CudaSlice<f32>> {
        arena.upload(&self.ck.f32(name, shape)?).map_err(drv)
    }

    fn host(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.ck.f32(name, shape)
    }

    fn contains(&self, name: &str) -> bool {
        self.ck.contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{target_config, target_weights, write_target_dir_as, DType};
    use crate::tp::{take_cols, take_rows};

    /// Every tensor a rank loads is the CPU reference's slice of it (`tp::take_rows` /
    /// `take_cols`, what `cpu/tp.rs` runs), for bf16 and f32 checkpoints at N = 1, 2, 4.
    #[test]
    fn rank_bytes_are_the_reference_slices() {
        let cfg = target_config(97, 64, 2, 8, 4, 16, 96);
        let w = target_weights(7, &cfg);
        for dtype in [DType::F32, DType::BF16] {
            let dir = tempfile::tempdir().unwrap();
            write_target_dir_as(dir.path(), &cfg, &w, dtype).unwrap();
            let ck = Checkpoint::open_dir(dir.path()).unwrap();
            let (h, hd) = (cfg.hidden_size, cfg.head_dim);
            for n in [1, 2, 4] {
                for shard in TpShard::plan(&cfg, n).unwrap() {
                    let src = ShardSource { ck: &ck, full: &cfg, shard: shard.clone() };
                    let lc = shard.layer_config(&cfg);
                    let p = "model.layers.1.";
                    let heads = shard.heads.start * hd..shard.heads.end * hd;
                    let kv = shard.kv_heads.start * hd..shard.kv_heads.end * hd;
                    let cases: Vec<(String, Vec<usize>, Vec<f32>)> = vec![
                        (format!("{p}self_attn.q_proj.weight"), vec![lc.q_dim(), h], {
                            take_rows(
                                &ck.f32(&format!("{p}self_attn.q_proj.weight"), &[cfg.q_dim(), h]).unwrap(),
                                h,
                                heads.clone(),
                            )
                        }),
                        (format!("{p}self_attn.v_proj.weight"), vec![lc.kv_dim(), h], {
                            take_rows(
                                &ck.f32(&format!("{p}self_attn.v_proj.weight"), &[cfg.kv_dim(), h]).unwrap(),
                                h,
                                kv,
                            )
                        }),
                        (format!("{p}self_attn.o_proj.weight"), vec![h, lc.q_dim()], {
                            take_cols(
                                &ck.f32(&format!("{p}self_attn.o_proj.weight"), &[h, cfg.q_dim()]).unwrap(),
                                cfg.q_dim(),
                                heads,
                            )
                        }),
                        (format!("{p}mlp.up_proj.weight"), vec![lc.intermediate_size, h], {
                            let i = cfg.intermediate_size;
                            take_rows(&ck.f32(&format!("{p}mlp.up_proj.weight"), &[i, h]).unwrap(), h, shard.ff.clone())
                        }),
                        (format!("{p}mlp.down_proj.weight"), vec![h, lc.intermediate_size], {
                            let i = cfg.intermediate_size;
                            take_cols(
                                &ck.f32(&format!("{p}mlp.down_proj.weight"), &[h, i]).unwrap(),
                                i,
                                shard.ff.clone(),
                            )
                        }),
                        ("lm_head.weight".into(), vec![shard.vocab.len(), h], {
                            take_rows(&ck.f32("lm_head.weight", &[cfg.vocab_size, h]).unwrap(), h, shard.vocab.clone())
                        }),
                        (
                            format!("{p}input_layernorm.weight"),
                            vec![h],
                            ck.f32(&format!("{p}input_layernorm.weight"), &[h]).unwrap(),
                        ),
                    ];
                    for (name, shape, want) in cases {
                        let (dt, bytes) = src.bytes(&name, &shape).unwrap();
                        assert_eq!(dt.to_f32(&bytes), want, "{dtype:?} N = {n} rank {}: {name}", shard.rank);
                    }
                    // A rank shape that does not match its slice is an error naming the tensor.
                    let e = src.bytes(&format!("{p}mlp.up_proj.weight"), &[lc.intermediate_size + 1, h]).unwrap_err();
                    assert!(e.to_string().contains("up_proj"), "{e}");
                }
            }
        }
    }
}
