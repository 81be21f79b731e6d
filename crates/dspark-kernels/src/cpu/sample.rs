//! The sampler's arithmetic, defined so that a GPU kernel (kernels/sample.cu) reproduces it bit
//! for bit: a request's transform of a logits row into the distribution it draws from, and the
//! draw with a given uniform.
//!
//! ```text
//! M = max logit (NaN counts as −∞)
//! p_i = dexp((l_i − M) / T)                     f64; dexp is this file's exp (below), p_max = 1
//! order: (logit descending, id ascending)      the order top-k and top-p cut in
//! top-k: v = the k-th logit of that order; keep l_i ≥ v (ties with the k-th kept)
//! top-p: W = tree_sum(kept p); walk the order summing kept p one by one; keep the shortest
//!        prefix whose sum ≥ top_p · W (the first token always kept)
//! min-p: keep p_i ≥ min_p (= min_p · p_max)
//! pp_i = p_i / tree_sum(kept p)                 zero outside the kept set
//! draw(pp, u): descend the sum tree of pp: go left iff the left sum is > 0 and either the right
//!        one is 0 or acc + left > u · root; else acc += left and go right
//! ```
//!
//! Why these definitions and not the textbook ones: every quantity that a parallel kernel would
//! otherwise sum in its own order is fixed here. Sums over a row are the pairwise *tree* over
//! the row padded with zeros to a power of two (node j of a level is the sum of nodes 2j and
//! 2j+1 below), which thread blocks compute independently and which zero padding does not change
//! (x + 0 = x exactly). The inverse-CDF draw descends that same tree instead of running a
//! sequential cumulative sum, so the kernel finds the token from a few stored partial sums. The
//! exponential is a fixed Cody–Waite reduction and a degree-13 Taylor polynomial in Horner form,
//! each multiply and add rounded on its own: IEEE defines every step (and the kernel spells them
//! `__dmul_rn` / `__dadd_rn`, which the compiler never fuses), so both sides get the same bits
//! where two `exp` libraries could differ by an ulp. (Not `mul_add`: without a hardware FMA in
//! the build it is a libm call, 6× slower over a 152k-token row.)
//! The only sequential sum left is top-p's walk, which runs over the few tokens it keeps.
//!
//! Every rule keeps at least the most likely token (p = 1), so a transform never leaves an empty
//! distribution, and the descent never enters a zero-sum subtree, so a draw never returns a token
//! of probability 0.

/// A request's filters (the sampler's part of its parameters; the seed lives with the caller).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Filters {
    /// `> 0`; 0 is greedy, handled by the caller (argmax, no draw).
    pub temperature: f32,
    /// Keep the `top_k` largest logits (0: off).
    pub top_k: usize,
    /// Keep the smallest prefix of mass ≥ `top_p` (1: off).
    pub top_p: f32,
    /// Drop tokens below `min_p` times the largest probability (0: off).
    pub min_p: f32,
}

const LOG2E: f64 = f64::from_bits(0x3ff7_1547_652b_82fe);
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// 1/k! for k = 13 down to 2 (Python's correctly rounded `1 / math.factorial(k)`).
const INV_FACT: [u64; 12] = [
    0x3de6_1246_13a8_6d09,
    0x3e21_eed8_eff8_d898,
    0x3e5a_e645_67f5_44e4,
    0x3e92_7e4f_b778_9f5c,
    0x3ec7_1de3_a556_c734,
    0x3efa_01a0_1a01_a01a,
    0x3f2a_01a0_1a01_a01a,
    0x3f56_c16c_16c1_6c17,
    0x3f81_1111_1111_1111,
    0x3fa5_5555_5555_5555,
    0x3fc5_5555_5555_5555,
    0x3fe0_0000_0000_0000,
];

/// e^x for x ≤ 0 (what the sampler needs), a few ulp from the true value and the same bits as
/// `dexp` in kernels/sample.cu. NaN and x < −745.2 give 0.
pub fn dexp(x: f64) -> f64 {
    // NaN fails every comparison, so it lands here too.
    if x.is_nan() || x <= -745.2 {
        return 0.0;
    }
    let n = (x * LOG2E + 0.5).floor();
    // n · LN2_HI is exact (LN2_HI ends in 21 zero bits, |n| < 2¹¹), so r keeps ~60 bits of x − n·ln 2.
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = f64::from_bits(INV_FACT[0]);
    for &c in &INV_FACT[1..] {
        p = p * r + f64::from_bits(c);
    }
    p = p * r + 1.0;
    p = p * r + 1.0;
    // p · 2ⁿ: one exact exponent change while normal, then (deep below) one rounding.
    let n = n as i64;
    if n >= -1022 {
        p * f64::from_bits(((n + 1023) as u64) << 52)
    } else {
        p * f64::from_bits(((n + 1022 + 1023) as u64) << 52) * f64::from_bits(1 << 52)
    }
}

/// The logit's place in the order as an unsigned key (larger logit, larger key); NaN is 0, below
/// every number.
pub fn order_key(l: f32) -> u32 {
    if l.is_nan() {
        return 0;
    }
    let b = l.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The pairwise tree sum of `v` padded with zeros to a power of two.
pub fn tree_sum(v: &[f64]) -> f64 {
    tree(v)[1]
}

/// The sum tree in heap order: `t[1]` the root, `t[j] = t[2j] + t[2j+1]`, leaves `t[P + i]`.
fn tree(v: &[f64]) -> Vec<f64> {
    let p = v.len().next_power_of_two().max(1);
    let mut t = vec![0f64; 2 * p];
    t[p..p + v.len()].copy_from_slice(v);
    for j in (1..p).rev() {
        t[j] = t[2 * j] + t[2 * j + 1];
    }
    t
}

/// The largest logit (NaN never counts).
fn max_logit(logits: &[f32]) -> f32 {
    logits.iter().fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m })
}

/// `p` of one logit given the row's largest `m`: dexp((l − m) / T), 0 for NaN.
fn weight(l: f32, m: f32, f: &Filters) -> f64 {
    if l.is_nan() {
        0.0
    } else {
        dexp((l as f64 - m as f64) / f.temperature as f64)
    }
}

/// The unnormalised probabilities `p_i` (before any filter).
fn weights(f: &Filters, logits: &[f32]) -> Vec<f64> {
    let m = max_logit(logits);
    logits.iter().map(|&l| weight(l, m, f)).collect()
}

/// The distribution a row is drawn from (see the module header): zero outside the kept set,
/// the kept entries `p_i / Σ`.
pub fn transform(f: &Filters, logits: &[f32]) -> Vec<f64> {
    let n = logits.len();
    if n == 0 {
        return Vec::new();
    }
    let top_k = f.top_k > 0 && f.top_k < n;
    // With top-k only its set is weighed (the rest is 0 anyway).
    let mut p = if top_k { vec![0f64; n] } else { weights(f, logits) };
    // (key, !id) packed in one u64: descending order is (logit descending, id ascending).
    let filtered = top_k || f.top_p < 1.0;
    let mut packed: Vec<u64> = if filtered {
        logits.iter().enumerate().map(|(i, &l)| ((order_key(l) as u64) << 32) | !(i as u32) as u64).collect()
    } else {
        Vec::new()
    };
    let id = |x: u64| !(x as u32) as usize;
    // The order is needed only as far as the filters cut: top-k's k-th key comes from a
    // selection, and only top-p sorts, over what top-k kept (the whole row without top-k).
    let mut keep = n;
    if top_k {
        packed.select_nth_unstable_by(f.top_k - 1, |a, b| b.cmp(a));
        let kth = packed[f.top_k - 1] >> 32;
        packed.retain(|&x| x >> 32 >= kth);
        keep = packed.len();
        let m = max_logit(logits);
        for &x in &packed {
            p[id(x)] = weight(logits[id(x)], m, f);
        }
    }
    if f.top_p < 1.0 {
        packed.sort_unstable_by(|a, b| b.cmp(a));
        // p is already zero outside the top-k set.
        let goal = f.top_p as f64 * tree_sum(&p);
        let mut cum = 0.0;
        let mut cut = keep;
        for (r, &x) in packed[..keep].iter().enumerate() {
            cum += p[id(x)];
            if cum >= goal {
                cut = r + 1;
                break;
            }
        }
        keep = cut.max(1);
    }
    if keep < packed.len() {
        for &x in &packed[keep..] {
            p[id(x)] = 0.0;
        }
    }
    if f.min_p > 0.0 {
        // Elementwise (the most likely token has p = 1 ≥ min_p, so it stays).
        let floor = f.min_p as f64;
        for pi in p.iter_mut().filter(|pi| **pi < floor) {
            *pi = 0.0;
        }
    }
    let total = tree_sum(&p);
    for pi in p.iter_mut() {
        *pi /= total;
    }
    p
}

/// The token of a draw with uniform `u` ∈ (0, 1) from `probs` (≥ 0, not necessarily
/// normalised, some entry > 0): the descent of the sum tree (module header). Never a token of
/// probability 0.
pub fn draw(probs: &[f64], u: f64) -> u32 {
    let t = tree(probs);
    let p = t.len() / 2;
    let target = u * t[1];
    let (mut j, mut acc) = (1usize, 0f64);
    while j < p {
        let (l, r) = (t[2 * j], t[2 * j + 1]);
        if l > 0.0 && (r == 0.0 || acc + l > target) {
            j *= 2;
        } else {
            acc += l;
            j = 2 * j + 1;
        }
    }
    (j - p) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dexp_is_within_a_few_ulp_of_exp() {
        let mut worst = 0f64;
        for i in 0..200_000 {
            let x = -(i as f64) * 7.45e-3 - (i % 7) as f64 * 1e-7;
            let (a, b) = (dexp(x), x.exp());
            if b > 1e-300 {
                worst = worst.max(((a - b) / b).abs());
            }
        }
        assert!(worst < 1e-15, "worst relative error {worst}");
        assert_eq!(dexp(0.0), 1.0);
        assert_eq!(dexp(f64::NEG_INFINITY), 0.0);
        assert_eq!(dexp(f64::NAN), 0.0);
        assert!(dexp(-745.0) > 0.0 && dexp(-745.0) < 1e-320);
    }

    #[test]
    fn order_key_is_monotone() {
        let xs = [f32::NEG_INFINITY, -3.0e38, -1.0, -1e-40, -0.0, 0.0, 1e-40, 2.0, f32::INFINITY];
        for w in xs.windows(2) {
            assert!(order_key(w[0]) <= order_key(w[1]), "{w:?}");
        }
        assert!(order_key(f32::NAN) < order_key(f32::NEG_INFINITY));
    }

    #[test]
    fn tree_sum_pairs_neighbours_and_ignores_padding() {
        let v = [1e16, 1.0, -1e16, 1.0, 3.0];
        // ((1e16 + 1) + (−1e16 + 1)) + ((3 + 0) + 0): 1e16 + 1 rounds to 1e16.
        assert_eq!(tree_sum(&v), ((1e16 + 1.0) + (-1e16 + 1.0)) + 3.0);
        let mut padded = v.to_vec();
        padded.resize(32, 0.0);
        assert_eq!(tree_sum(&padded).to_bits(), tree_sum(&v).to_bits());
    }

    /// The filters the slow way: sort the whole row, cut the sorted prefix (same arithmetic).
    fn transform_by_sort(f: &Filters, logits: &[f32]) -> Vec<f64> {
        let n = logits.len();
        let mut p = weights(f, logits);
        let keys: Vec<u32> = logits.iter().map(|&l| order_key(l)).collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| keys[b].cmp(&keys[a]).then(a.cmp(&b)));
        let mut keep = n;
        if f.top_k > 0 && f.top_k < n {
            let kth = keys[order[f.top_k - 1]];
            keep = order.iter().take_while(|&&i| keys[i] >= kth).count();
        }
        if f.top_p < 1.0 {
            let kept: Vec<f64> = (0..n).map(|i| if keys[i] >= keys[order[keep - 1]] { p[i] } else { 0.0 }).collect();
            let goal = f.top_p as f64 * tree_sum(&kept);
            let (mut cum, mut cut) = (0.0, keep);
            for (r, &i) in order[..keep].iter().enumerate() {
                cum += p[i];
                if cum >= goal {
                    cut = r + 1;
                    break;
                }
            }
            keep = cut.max(1);
        }
        for &i in &order[keep..] {
            p[i] = 0.0;
        }
        for pi in p.iter_mut().filter(|pi| **pi < f.min_p as f64) {
            *pi = 0.0;
        }
        let total = tree_sum(&p);
        p.iter().map(|x| x / total).collect()
    }

    #[test]
    fn selection_equals_the_full_sort_bit_for_bit() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        for case in 0..300 {
            let n = 1 + (next() * 3000.0) as usize;
            // Coarse logits (many ties) every other case.
            let logits: Vec<f32> = (0..n)
                .map(|_| {
                    let x = ((next() - 0.5) * 16.0) as f32;
                    if case % 2 == 0 {
                        (x * 4.0).round() / 4.0
                    } else {
                        x
                    }
                })
                .collect();
            let f = Filters {
                temperature: 0.2 + next() as f32 * 1.5,
                top_k: [0, 1, 5, 20, 200, n][case % 6],
                top_p: [1.0, 0.9, 0.5, 0.99][case % 4],
                min_p: [0.0, 0.05][case % 2],
            };
            let (a, b) = (transform(&f, &logits), transform_by_sort(&f, &logits));
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "case {case}: {f:?}");
            assert!(a.iter().any(|&x| x > 0.0));
        }
    }

    #[test]
    fn draws_never_pick_zero_mass_and_follow_the_cdf() {
        let probs = [0.0, 0.25, 0.0, 0.5, 0.25, 0.0];
        // Intervals in id order: 1 → [0, .25), 3 → [.25, .75), 4 → [.75, 1).
        for (u, t) in [(0.01, 1), (0.2499, 1), (0.2501, 3), (0.7499, 3), (0.7501, 4), (0.9999, 4)] {
            assert_eq!(draw(&probs, u), t, "u = {u}");
        }
        // A padded tail of zeros is never entered, even at u → 1.
        assert_eq!(draw(&[0.3, 0.7, 0.0], 1.0 - 1e-12), 1);
    }
}
