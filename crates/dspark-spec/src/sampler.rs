//! The sampler: a request's transform of a logits row into the distribution it draws from, and
//! the counter-based uniforms it draws with.
//!
//! ```text
//! p = softmax(logits / T)                          temperature T > 0 (T = 0: greedy, no draw)
//! keep the k largest logits, ties at the k-th kept  top-k (0: off)
//! keep the shortest prefix of the order with mass ≥ top_p of what top-k kept (the largest
//!   token always kept)                              top-p (1: off)
//! drop tokens with p < min_p · max p                min-p (0: off)
//! renormalise; draw with u from the request's stream (inverse CDF, by a sum-tree descent)
//! ```
//!
//! The order is the one vLLM and transformers apply (temperature, top-k, top-p, min-p). Sorting
//! is by (logit descending, token id ascending), so ties resolve the same way everywhere. The
//! arithmetic lives in `dspark_kernels::cpu::sample`: probabilities in f64 from f32 logits, with
//! every sum a fixed pairwise tree and the exponential a fixed polynomial, so the GPU sampler
//! (kernels/sample.cu) gets the same bits and, given the same uniforms, the same tokens.
//!
//! Uniforms come from Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
//! 3", SC'11) keyed by the request's seed, with the draw's index as the counter: draw `i` of a
//! request is a pure function of `(seed, i)`, so a CUDA graph can replay it, and a plain and a
//! speculative run consume the same stream in the same order.

use dspark_kernels::cpu::sample;

/// How one request samples. `temperature == 0` is greedy decoding, bit for bit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the `top_k` largest logits (0: off).
    pub top_k: usize,
    /// Keep the smallest set of mass ≥ `top_p` (1: off).
    pub top_p: f32,
    /// Drop tokens below `min_p` times the largest probability (0: off).
    pub min_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams::greedy()
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0).
    pub fn greedy() -> SamplingParams {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The filters the sampler applies (everything but the seed).
    pub fn filters(&self) -> sample::Filters {
        sample::Filters { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p, min_p: self.min_p }
    }

    /// Checks every field, naming the offending one and its value (the CLI's flags and the
    /// server's fields share these names).
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!("temperature must be a finite number ≥ 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        Ok(())
    }
}

/// The distribution a row is drawn from: `probs[i]` ≥ 0, zero outside the kept set, summing to
/// 1 (up to rounding). For greedy parameters it is one-hot on the argmax (lowest index on ties).
/// The arithmetic is `dspark_kernels::cpu::sample`'s, which the GPU sampler reproduces bit for
/// bit.
pub fn transform(params: &SamplingParams, logits: &[f32]) -> Vec<f64> {
    if params.is_greedy() {
        let mut p = vec![0f64; logits.len()];
        if !logits.is_empty() {
            p[dspark_kernels::cpu::argmax::argmax(logits)] = 1.0;
        }
        return p;
    }
    sample::transform(&params.filters(), logits)
}

/// The token of a draw with uniform `u` ∈ (0, 1) from `probs` (not necessarily normalised):
/// the descent of their sum tree (`dspark_kernels::cpu::sample::draw`); never a zero-probability
/// token.
pub fn draw(probs: &[f64], u: f64) -> u32 {
    sample::draw(probs, u)
}

/// Philox4x32-10: 4 × 32 counter bits, a 64-bit key, ten rounds.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let p0 = M0 * c[0] as u64;
        let p1 = M1 * c[2] as u64;
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    c
}

/// The uniform stream of one request: draw `index` is `(philox(index, seed) >> 8 + 0.5) / 2²⁴`,
/// in (0, 1), a function of `(seed, index)` alone.
#[derive(Clone, Debug)]
pub struct Uniforms {
    seed: u64,
    index: u64,
}

impl Uniforms {
    pub fn new(seed: u64) -> Uniforms {
        Uniforms { seed, index: 0 }
    }

    /// Uniform number `index` of the stream of `seed`.
    pub fn at(seed: u64, index: u64) -> f64 {
        let out = philox4x32([index as u32, (index >> 32) as u32, 0, 0], [seed as u32, (seed >> 32) as u32]);
        ((out[0] >> 8) as f64 + 0.5) / (1u64 << 24) as f64
    }

    /// The next uniform.
    pub fn next_uniform(&mut self) -> f64 {
        let u = Uniforms::at(self.seed, self.index);
        self.index += 1;
        u
    }

    /// Draws consumed so far.
    pub fn position(&self) -> u64 {
        self.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, min_p, seed: 0 }
    }

    #[test]
    fn philox_matches_the_published_known_answers() {
        // Random123's kat_vectors for philox4x32_10.
        assert_eq!(philox4x32([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32([u32::MAX; 4], [u32::MAX; 2]), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(
            philox4x32([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn uniforms_are_a_function_of_seed_and_index_in_the_open_interval() {
        let mut a = Uniforms::new(7);
        let xs: Vec<f64> = (0..1000).map(|_| a.next_uniform()).collect();
        assert!(xs.iter().all(|&u| u > 0.0 && u < 1.0));
        assert_eq!(xs[500], Uniforms::at(7, 500));
        assert_ne!(Uniforms::at(7, 0), Uniforms::at(8, 0));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.03, "mean {mean}");
    }

    #[test]
    fn greedy_is_one_hot_on_the_lowest_argmax() {
        let p = transform(&SamplingParams::greedy(), &[0.5, 2.0, 2.0, -1.0]);
        assert_eq!(p, vec![0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn filters_match_a_scalar_reference() {
        // logits 4, 3, 3, 1, 0 at T = 1: softmax, then each filter by hand.
        let l = [4.0f32, 3.0, 3.0, 1.0, 0.0];
        let e: Vec<f64> = l.iter().map(|&x| ((x - 4.0) as f64).exp()).collect();
        let norm = |v: Vec<f64>| {
            let s: f64 = v.iter().sum();
            v.into_iter().map(|x| x / s).collect::<Vec<_>>()
        };
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
        assert!(close(&transform(&params(1.0, 0, 1.0, 0.0), &l), &norm(e.clone())));
        // top-k 2: ties with the 2nd largest kept, so three tokens.
        assert!(close(&transform(&params(1.0, 2, 1.0, 0.0), &l), &norm(vec![e[0], e[1], e[2], 0.0, 0.0])));
        // top-p: p0 = 0.5767… alone is < 0.6, with p1 ≥ 0.6.
        let p = norm(e.clone());
        assert!(p[0] < 0.6 && p[0] + p[1] >= 0.6);
        assert!(close(&transform(&params(1.0, 0, 0.6, 0.0), &l), &norm(vec![e[0], e[1], 0.0, 0.0, 0.0])));
        // The largest is always kept, however small top_p.
        assert!(close(&transform(&params(1.0, 0, 1e-6, 0.0), &l), &[1.0, 0.0, 0.0, 0.0, 0.0]));
        // min-p 0.3: p1 / p0 = e⁻¹ = 0.37 kept, p3 / p0 = e⁻³ dropped.
        assert!(close(&transform(&params(1.0, 0, 1.0, 0.3), &l), &norm(vec![e[0], e[1], e[2], 0.0, 0.0])));
        // Temperature 0.5 sharpens: exp(2(l − max)).
        let e2: Vec<f64> = l.iter().map(|&x| (2.0 * (x - 4.0) as f64).exp()).collect();
        assert!(close(&transform(&params(0.5, 0, 1.0, 0.0), &l), &norm(e2)));
    }

    #[test]
    fn no_filter_combination_leaves_no_token() {
        let mut u = Uniforms::new(3);
        for _ in 0..500 {
            let n = 1 + (u.next_uniform() * 40.0) as usize;
            let logits: Vec<f32> = (0..n).map(|_| ((u.next_uniform() - 0.5) * 20.0) as f32).collect();
            let p = params(
                (u.next_uniform() * 2.0) as f32 + 0.01,
                (u.next_uniform() * 5.0) as usize,
                (u.next_uniform() as f32).max(1e-3),
                u.next_uniform() as f32,
            );
            let probs = transform(&p, &logits);
            let kept = probs.iter().filter(|&&x| x > 0.0).count();
            assert!(kept >= 1, "{p:?} left no token of {logits:?}");
            assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            let t = draw(&probs, u.next_uniform());
            assert!(probs[t as usize] > 0.0);
        }
    }

    #[test]
    fn draws_follow_the_distribution() {
        let probs = [0.1, 0.0, 0.6, 0.3];
        let mut u = Uniforms::new(11);
        let mut counts = [0usize; 4];
        let n = 20_000;
        for _ in 0..n {
            counts[draw(&probs, u.next_uniform()) as usize] += 1;
        }
        assert_eq!(counts[1], 0);
        for (c, p) in counts.iter().zip(probs) {
            assert!((*c as f64 / n as f64 - p).abs() < 0.015, "{counts:?}");
        }
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let ok = params(0.7, 20, 0.8, 0.0);
        assert!(ok.validate().is_ok());
        for (bad, field) in [
            (params(-0.1, 0, 1.0, 0.0), "temperature"),
            (params(f32::NAN, 0, 1.0, 0.0), "temperature"),
            (params(0.7, 0, 0.0, 0.0), "top_p"),
            (params(0.7, 0, 1.5, 0.0), "top_p"),
            (params(0.7, 0, 1.0, 1.5), "min_p"),
        ] {
            let e = bad.validate().unwrap_err();
            assert!(e.starts_with(field), "{e}");
        }
    }
}
