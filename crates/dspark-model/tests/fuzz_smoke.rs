//! A smoke run of the checkpoint readers' fuzz target (`dspark_model::fuzzing::read_all`) in
//! the plain test suite: the seed corpus, then seeded random mutations of it (bit flips, byte
//! overwrites with interesting values, insertions, deletions, truncations, splices of two
//! seeds) — no panic, and the seeds themselves must reach the deepest reader, so the mutations
//! start from inputs the loaders accept. The coverage-guided run (cargo-fuzz, ≥ 1M executions)
//! is `cargo xtask fuzz`.

use dspark_model::fuzzing::{read_all, seeds};
use dspark_model::testing::Rng;
use std::path::PathBuf;

const MUTANTS: usize = 6000;

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut x = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let n = x.len().max(1);
        match rng.below(6) {
            0 if !x.is_empty() => {
                let i = rng.below(n);
                x[i] ^= 1 << rng.below(8);
            }
            1 if !x.is_empty() => {
                let i = rng.below(n);
                x[i] = [0u8, 0xff, 0x7f, 0x80, b'"', b'9', b'-', b'{', b']'][rng.below(9)];
            }
            2 => {
                let i = rng.below(n + 1).min(x.len());
                let b = [b'9', b'0', b'e', b'[', b',', 0][rng.below(6)];
                x.splice(i..i, std::iter::repeat_n(b, 1 + rng.below(8)));
            }
            3 if !x.is_empty() => {
                let i = rng.below(n);
                let j = (i + 1 + rng.below(64)).min(x.len());
                x.drain(i..j);
            }
            4 => x.truncate(rng.below(n + 1)),
            _ => {
                let other = &seeds[rng.below(seeds.len())];
                let (i, j) = (rng.below(x.len() + 1), rng.below(other.len() + 1));
                x.truncate(i);
                x.extend_from_slice(&other[j..]);
            }
        }
    }
    x
}

#[test]
fn the_readers_survive_mutated_checkpoints() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let scratch = tempfile::tempdir().unwrap();
    let corpus = seeds(&root.join("fixtures"), scratch.path()).unwrap();
    // A target with its draft passes every reader (two checkpoints, two configs, the target's
    // weights, the draft's = 6); the index seed only its own.
    let deepest = corpus.iter().map(|s| read_all(s)).max().unwrap();
    assert_eq!(deepest, 6, "no seed reaches the draft loader");
    let mut rng = Rng(0xf022);
    let mut accepted = 0;
    for _ in 0..MUTANTS {
        accepted += read_all(&mutate(&mut rng, &corpus));
    }
    eprintln!("fuzz smoke: {MUTANTS} mutants, {accepted} reader acceptances");
    assert!(accepted > MUTANTS, "mutants almost never parse: the smoke run tests nothing");
}
