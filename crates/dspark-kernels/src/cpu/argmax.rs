//! Greedy token choice: the index of the largest logit.
//!
//! Ties go to the lowest index, which is what `torch.argmax` returns on CPU and what the
//! golden continuations were made with. NaN never wins: a NaN logit is treated as smaller
//! than everything, so one bad value cannot silently become the chosen token.

/// Index of the maximum of `row` (lowest index on ties). `row` must not be empty.
pub fn argmax(row: &[f32]) -> usize {
    assert!(!row.is_empty(), "argmax of an empty row");
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// Argmax of every `vocab`-long row of `logits`.
pub fn argmax_rows(logits: &[f32], vocab: usize) -> Vec<usize> {
    logits.chunks_exact(vocab).map(argmax).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_index_wins_ties_and_nan_never_wins() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -5.0]), 1);
        assert_eq!(argmax_rows(&[0.0, 1.0, 2.0, 1.0], 2), vec![1, 0]);
    }
}
