//! Block-scaled FP8 weights as Qwen ships them (`Qwen/Qwen3-8B-FP8`), read by the CPU reference.
//!
//! ```text
//! config.json  quantization_config = {"quant_method": "fp8", "fmt": "e4m3",
//!                                     "activation_scheme": "dynamic", "weight_block_size": [bn, bk]}
//! per quantized linear (q/k/v/o_proj, gate/up/down_proj):
//!   <module>.weight            F8_E4M3 [N, K]
//!   <module>.weight_scale_inv  BF16 | F16 | F32 [ceil(N / bn), ceil(K / bk)]
//!   W[i, j] = fp8[i, j] · scale_inv[i / bn, j / bk]        (despite the name, it multiplies)
//! embeddings, lm_head and every norm stay in their plain dtype.
//! ```
//!
//! Checked against transformers' `integrations/finegrained_fp8.py` (`weight_scale_inv`
//! multiplies the dequantized block) and vLLM's `quantization/fp8.py` (the same block layout).
//! E4M3 here is the "fn" variant every FP8 checkpoint uses: 1 sign, 4 exponent (bias 7) and 3
//! mantissa bits, no infinities, NaN only at `S.1111.111`; its largest value is 448. Every
//! E4M3 value is exactly an f32 (and a bf16), so dequantization rounds once, in the multiply by
//! the scale — the W8A16 semantics the reference computes with (activations stay f32).
//!
//! Everything unrecognised is refused by name: another `quant_method` or `fmt` (e5m2 included),
//! an activation scheme other than dynamic, a block that is not two positive integers, a weight
//! that is not F8_E4M3, a scale of the wrong shape or dtype, a scale that is zero, negative or not
//! finite. A quantized checkpoint is never read as if it were plain.

use crate::checkpoint::json::JsonObject;
use crate::checkpoint::safetensors::Checkpoint;
use crate::error::{Error, Result};

/// A checkpoint's `quantization_config`, when it is the FP8 block scheme.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fp8Quant {
    /// `weight_block_size` [rows, columns] of one scale.
    pub block: [usize; 2],
    /// Module names or prefixes left unquantized (`modules_to_not_convert` / `ignored_layers`).
    pub not_converted: Vec<String>,
}

impl Fp8Quant {
    /// Parses `config.json`'s `quantization_config` object, refusing what it does not know.
    pub fn from_json(j: &JsonObject) -> Result<Fp8Quant> {
        let field = |f: &str| format!("quantization_config.{f}");
        let err = |f: &str, msg: String| j.err(&field(f), msg);
        let method = j.opt_str("quant_method")?.unwrap_or("unnamed");
        if method != "fp8" {
            return Err(err("quant_method", format!("{method:?} is not supported (only \"fp8\" block scaling)")));
        }
        if let Some(fmt) = j.opt_str("fmt")? {
            if fmt != "e4m3" {
                return Err(err("fmt", format!("{fmt:?} is not supported (only \"e4m3\")")));
            }
        }
        if let Some(a) = j.opt_str("activation_scheme")? {
            if a != "dynamic" {
                return Err(err("activation_scheme", format!("{a:?} is not supported (only \"dynamic\")")));
            }
        }
        let block = match j.get("weight_block_size") {
            Some(serde_json::Value::Array(v)) if v.len() == 2 => {
                let dim = |x: &serde_json::Value| x.as_u64().filter(|&d| d > 0).map(|d| d as usize);
                match (dim(&v[0]), dim(&v[1])) {
                    (Some(a), Some(b)) => [a, b],
                    _ => return Err(err("weight_block_size", format!("{v:?} is not two positive integers"))),
                }
            }
            None => return Err(err("weight_block_size", "missing (per-tensor FP8 is not supported)".into())),
            Some(other) => return Err(err("weight_block_size", format!("{other} is not two positive integers"))),
        };
        let mut not_converted = Vec::new();
        for key in ["modules_to_not_convert", "ignored_layers"] {
            match j.get(key) {
                None | Some(serde_json::Value::Null) => {}
                Some(serde_json::Value::Array(v)) => {
                    for m in v {
                        let s = m.as_str().ok_or_else(|| err(key, format!("entry {m} is not a string")))?;
                        not_converted.push(s.to_string());
                    }
                }
                Some(other) => return Err(err(key, format!("{other} is not a list of module names"))),
            }
        }
        Ok(Fp8Quant { block, not_converted })
    }

    /// Whether the linear `module` (e.g. `model.layers.3.self_attn.q_proj`) is stored in FP8.
    pub fn quantizes(&self, module: &str) -> bool {
        !self
            .not_converted
            .iter()
            .any(|m| module == m || module.starts_with(&format!("{m}.")) || module.ends_with(&format!(".{m}")))
    }

    /// Loads `<module>.weight` `[n, k]` as f32: FP8 dequantized by its block scales when the
    /// module is quantized, else the plain tensor.
    pub fn load_linear(&self, ck: &Checkpoint, module: &str, (n, k): (usize, usize)) -> Result<Vec<f32>> {
        let Some((bytes, scales)) = self.check_linear(ck, module, (n, k))? else {
            return ck.f32(&format!("{module}.weight"), &[n, k]);
        };
        Ok(dequantize(bytes, &scales, (n, k), self.block))
    }

    /// Checks `<module>.weight` `[n, k]` and, when the module is quantized, its scales: returns
    /// the FP8 bytes and the scales (`None` for a plain module, checked as one).
    pub fn check_linear<'a>(
        &self,
        ck: &'a Checkpoint,
        module: &str,
        (n, k): (usize, usize),
    ) -> Result<Option<(&'a [u8], Vec<f32>)>> {
        let name = format!("{module}.weight");
        if !self.quantizes(module) {
            ck.check(&name, &[n, k])?;
            return Ok(None);
        }
        let t = ck.tensors.get(&name).ok_or_else(|| Error::tensor(ck.describe(), &name, "missing"))?;
        let path = ck.path_of(&name).to_path_buf();
        if t.dtype_name != F8_E4M3 {
            return Err(Error::tensor(
                &path,
                &name,
                format!("dtype {}, expected {F8_E4M3} (quantization_config)", t.dtype_name),
            ));
        }
        if t.shape != [n, k] {
            return Err(Error::tensor(&path, &name, format!("shape {:?}, expected {:?}", t.shape, [n, k])));
        }
        let bytes = ck.bytes_of(t);
        if bytes.len() != n * k {
            return Err(Error::tensor(&path, &name, format!("{} bytes for {n} × {k} {F8_E4M3}", bytes.len())));
        }
        let [bn, bk] = self.block;
        let (sn, sk) = (n.div_ceil(bn), k.div_ceil(bk));
        let sname = format!("{module}.weight_scale_inv");
        let scales = ck.f32(&sname, &[sn, sk])?;
        if let Some(i) = scales.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
            let spath = ck.path_of(&sname).to_path_buf();
            return Err(Error::tensor(
                spath,
                &sname,
                format!("scale [{}, {}] is {}: block scales must be finite and positive", i / sk, i % sk, scales[i]),
            ));
        }
        Ok(Some((bytes, scales)))
    }
}

// The decode and the dequantization are the kernels' CPU reference (one definition).
pub use dspark_kernels::cpu::fp8::{dequantize, e4m3_to_f32};

/// The E4M3 byte nearest to `x` (ties to the even code), saturating at ±448; NaN → `0x7f`. For
/// the fixture generator and tests (a table search: not fast).
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let mut best = 0u8;
    let mut best_err = f32::INFINITY;
    for b in 0..=0x7eu8 {
        let v = e4m3_to_f32(b);
        let err = (v - x.abs()).abs();
        if err < best_err || (err == best_err && b & 1 == 0) {
            best = b;
            best_err = err;
        }
    }
    if x.is_sign_negative() && best != 0 {
        best | 0x80
    } else {
        best
    }
}

/// Quantizes `w` `[n, k]` as Qwen does: per `[bn, bk]` block, scale = amax / 448 (1 for an
/// all-zero block), fp8 = round(w / scale). Returns the bytes and the `[ceil(n/bn), ceil(k/bk)]`
/// scales (as f32; the caller stores them in its scale dtype and must quantize with those).
pub fn quantize_blocks(w: &[f32], (n, k): (usize, usize), [bn, bk]: [usize; 2]) -> (Vec<u8>, Vec<f32>) {
    let (sn, sk) = (n.div_ceil(bn), k.div_ceil(bk));
    let mut scales = vec![1f32; sn * sk];
    for (bi, s) in scales.iter_mut().enumerate() {
        let (r0, c0) = ((bi / sk) * bn, (bi % sk) * bk);
        let mut amax = 0f32;
        for i in r0..(r0 + bn).min(n) {
            for j in c0..(c0 + bk).min(k) {
                amax = amax.max(w[i * k + j].abs());
            }
        }
        if amax > 0.0 {
            *s = amax / 448.0;
        }
    }
    quantize_with(w, (n, k), [bn, bk], scales)
}

/// [`quantize_blocks`] with given scales (e.g. already rounded to bf16).
pub fn quantize_with(w: &[f32], (n, k): (usize, usize), [bn, bk]: [usize; 2], scales: Vec<f32>) -> (Vec<u8>, Vec<f32>) {
    let sk = k.div_ceil(bk);
    let bytes = (0..n * k).map(|x| f32_to_e4m3(w[x] / scales[(x / k / bn) * sk + (x % k) / bk])).collect();
    (bytes, scales)
}

/// The safetensors name of the E4M3 dtype (not a `DType`: it is never loaded as a plain
/// tensor).
pub const F8_E4M3: &str = "F8_E4M3";

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn every_e4m3_code_decodes_to_its_definition() {
        // The defining points: 0, the smallest subnormal 2^-9, the largest subnormal, 1, 448, NaN.
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        // Monotone over the positive codes, and exact in bf16 (so the GPU's widening is exact).
        for b in 1..=0x7eu8 {
            let (lo, hi) = (e4m3_to_f32(b - 1), e4m3_to_f32(b));
            assert!(hi > lo, "{b:#x}");
            assert_eq!(half::bf16::from_f32(hi).to_f32(), hi);
            assert_eq!(f32_to_e4m3(hi), b, "round trip of {hi}");
            assert_eq!(e4m3_to_f32(b | 0x80), -hi);
        }
        assert_eq!(f32_to_e4m3(1e9), 0x7e);
        assert_eq!(f32_to_e4m3(-1e9), 0xfe);
    }

    fn quant(text: &str) -> Result<Fp8Quant> {
        Fp8Quant::from_json(&JsonObject::parse(Path::new("config.json"), text)?)
    }

    #[test]
    fn qwens_config_parses_and_others_are_refused_by_field() {
        let q = quant(r#"{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}"#)
            .unwrap();
        assert_eq!(q, Fp8Quant { block: [128, 128], not_converted: vec![] });
        for (text, field) in [
            (r#"{"quant_method": "awq", "weight_block_size": [128, 128]}"#, "quant_method"),
            (r#"{"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}"#, "fmt"),
            (
                r#"{"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}"#,
                "activation_scheme",
            ),
            (r#"{"quant_method": "fp8"}"#, "weight_block_size"),
            (r#"{"quant_method": "fp8", "weight_block_size": [128, 0]}"#, "weight_block_size"),
            (r#"{"quant_method": "fp8", "weight_block_size": [128]}"#, "weight_block_size"),
            (r#"{"quant_method": "fp8", "weight_block_size": [1, 1], "ignored_layers": "x"}"#, "ignored_layers"),
        ] {
            let e = quant(text).unwrap_err().to_string();
            assert!(e.contains(&format!("quantization_config.{field}")), "{text}: {e}");
        }
        let q = quant(r#"{"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", "model.layers.1.mlp"]}"#)
            .unwrap();
        assert!(!q.quantizes("model.layers.1.mlp.down_proj"));
        assert!(q.quantizes("model.layers.0.mlp.down_proj"));
    }

    #[test]
    fn block_quantization_stays_within_half_a_step() {
        let mut rng = dspark_testkit::Rng(7);
        let (n, k) = (37, 300);
        let w: Vec<f32> = (0..n * k).map(|_| rng.normal(0.05)).collect();
        let (bytes, scales) = quantize_blocks(&w, (n, k), [16, 128]);
        assert_eq!(scales.len(), 3 * 3);
        for x in 0..n * k {
            let s = scales[(x / k / 16) * 3 + (x % k) / 128];
            let back = e4m3_to_f32(bytes[x]) * s;
            // E4M3 keeps 3 mantissa bits: relative error ≤ 2^-4 above the subnormals.
            assert!((back - w[x]).abs() <= w[x].abs() / 16.0 + s * 2f32.powi(-9), "{} vs {}", back, w[x]);
        }
    }
}
