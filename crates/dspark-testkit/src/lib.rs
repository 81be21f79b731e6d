//! Test support shared by every crate of the workspace, below all of them (it depends only on
//! serde_json): [`Rng`], the seeded generator the tests (and the bench's random weights) draw
//! from, [`rel_err`], the relative error every tolerance refers to, and [`files`], the
//! loader tests' way of breaking a copied checkpoint one field at a time.
//!
//! The random tiny models stay in `dspark_model::testing` (they need model types), which
//! re-exports these two, so crates above `dspark-model` import all three from one module.

pub mod files;

/// SplitMix64: a tiny deterministic generator, so tests draw fresh inputs per case from a
/// (proptest-chosen) seed without another dependency. The state is public so a seed is just
/// `Rng(seed)`; every method draws from the one stream of [`Rng::next_u64`], so a seed gives
/// the same values in every crate.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits (one SplitMix64 step).
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The top 24 bits of one draw as a uniform f32 in `[0, 1)` (exact: 24 bits fit the
    /// mantissa).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[-1, 1)`, one draw.
    pub fn f32(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }

    /// `n` values of [`Rng::f32`]: uniform in `[-1, 1)`.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }

    /// Uniform in `[0, n)`, one draw (modulo; the bias is negligible for test sizes).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Approximately normal with standard deviation `std`: the sum of four uniforms, four draws.
    pub fn normal(&mut self, std: f32) -> f32 {
        let u: f32 = (0..4).map(|_| self.unit()).sum::<f32>() - 2.0;
        u * std * (3.0f32).sqrt()
    }

    /// `n` values of [`Rng::normal`] with standard deviation `std`.
    pub fn normal_vec(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal(std)).collect()
    }

    /// `n` RMSNorm weights: `1 + 0.1·N(0, 1)`.
    pub fn norm(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| 1.0 + self.normal(0.1)).collect()
    }
}

/// Largest absolute difference over the largest reference magnitude (`max |got − want| /
/// max |want|`, the scale floored at 1e-30): the "relative" error every tolerance in the tests
/// refers to. Infinite when `got` holds a NaN or an infinity, which `f32::max` would otherwise
/// skip. Panics when the lengths differ.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    if got.iter().any(|v| !v.is_finite()) {
        return f32::INFINITY;
    }
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// The repository root, for tests that read `fixtures/`: `DSPARK_ROOT` when a test binary runs
/// from a bundle on another machine (scripts/gpu-tier.sh sets it), else the source tree this
/// crate was built in.
pub fn repo_root() -> std::path::PathBuf {
    match std::env::var_os("DSPARK_ROOT") {
        Some(r) => std::path::PathBuf::from(r),
        None => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."),
    }
}

#[cfg(test)]
mod tests {
    use super::{rel_err, Rng};

    #[test]
    fn rng_is_splitmix64() {
        // SplitMix64's published first outputs for seed 0.
        let mut rng = Rng(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        // Every draw is one step of the same stream.
        let (mut a, mut b) = (Rng(42), Rng(42));
        assert_eq!(a.f32(), ((b.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0);
        assert_eq!(a.below(7), (b.next_u64() % 7) as usize);
        a.normal(1.0);
        for _ in 0..4 {
            b.next_u64();
        }
        assert_eq!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn rng_draws_stay_in_range() {
        let mut rng = Rng(7);
        let u = rng.vec(10_000);
        assert!(u.iter().all(|&x| (-1.0..1.0).contains(&x)));
        assert!(u.iter().sum::<f32>().abs() / 10_000.0 < 0.05, "uniform mean near 0");
        assert!((0..1000).all(|_| rng.below(5) < 5));
        let n = rng.normal_vec(10_000, 2.0);
        let var = n.iter().map(|x| x * x).sum::<f32>() / 10_000.0;
        assert!((var.sqrt() - 2.0).abs() < 0.1, "std {}", var.sqrt());
        assert!(rng.norm(100).iter().all(|&w| (0.6..1.4).contains(&w)));
    }

    #[test]
    fn rel_err_is_max_abs_over_max_reference() {
        assert_eq!(rel_err(&[1.0, 2.5], &[1.0, 2.0]), 0.25);
        assert_eq!(rel_err(&[0.0; 3], &[0.0; 3]), 0.0);
        assert_eq!(rel_err(&[1.0, f32::NAN], &[1.0, 2.0]), f32::INFINITY);
        assert_eq!(rel_err(&[f32::INFINITY], &[1.0]), f32::INFINITY);
    }

    #[test]
    #[should_panic(expected = "length mismatch")]
    fn rel_err_rejects_different_lengths() {
        rel_err(&[1.0], &[1.0, 2.0]);
    }
}
