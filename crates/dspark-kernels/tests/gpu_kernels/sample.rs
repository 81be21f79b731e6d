//! The device sampler (kernels/sample.cu) against the CPU reference (`cpu::sample`): for fresh
//! random logits rows, filters and injected uniforms, a sampled verify must give exactly the
//! drafts accepted and the token the host loop would (the same law, the same bits). Rows are
//! LLM-like (a few strong logits over a normal floor) and, in some cases, rounded to bf16 so
//! ties at the top-k and top-p boundaries occur. The sampled draft law's path — each draft drawn
//! on the device from its own q row, the verify judging it against that row's state — is
//! compared with the host rule on q the same way.
use super::{full_size, gpu};
use dspark_kernels::cpu::sample::{draw, transform, Filters};
use dspark_kernels::cuda::sample::{sample_cfg, SampleIo, SampleScratch, SampleShape, CAND, ROW_WORDS};
use dspark_testkit::Rng;

/// What the speculative loop's host path does (`dspark_spec`'s `host_rule`): accept d iff
/// q(d) > 0 and u < p'(d) / q(d), with q one-hot on d (`q` None, the greedy draft law) or the
/// sampled draft's rows; at a rejection the residual — p' without d (one-hot) or
/// max(0, p' − q) — or p' itself when that has no mass; after all k the bonus from row k.
fn host_verify(
    f: &Filters,
    logits: &[f32],
    vocab: usize,
    drafts: &[u32],
    q: Option<&[Vec<f64>]>,
    u: &[f64],
) -> (u32, u32) {
    let k = drafts.len();
    for (i, &d) in drafts.iter().enumerate() {
        let pp = transform(f, &logits[i * vocab..(i + 1) * vocab]);
        let qd = q.map_or(1.0, |q| q[i][d as usize]);
        if qd > 0.0 && u[i] < pp[d as usize] / qd {
            continue;
        }
        let mut r = match q {
            None => {
                let mut r = pp.clone();
                r[d as usize] = 0.0;
                r
            }
            Some(q) => pp.iter().zip(&q[i]).map(|(a, b)| (a - b).max(0.0)).collect(),
        };
        if r.iter().sum::<f64>() <= 0.0 {
            r = pp;
        }
        return (i as u32, draw(&r, u[k]));
    }
    (k as u32, draw(&transform(f, &logits[k * vocab..(k + 1) * vocab]), u[k]))
}

fn row(rng: &mut Rng, vocab: usize, ties: bool) -> Vec<f32> {
    let mut l: Vec<f32> = (0..vocab).map(|_| rng.normal(2.0)).collect();
    for _ in 0..1 + rng.below(6) {
        l[rng.below(vocab)] += 6.0 + 6.0 * rng.f32().abs();
    }
    if ties {
        for x in l.iter_mut() {
            *x = half::bf16::from_f32(*x).to_f32();
        }
    }
    l
}

#[test]
fn sampled_verify_equals_the_host_loop() {
    let g = gpu();
    let mut rng = Rng(0x5a3d1e);
    let filters = [
        Filters { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0 },
        Filters { temperature: 0.7, top_k: 20, top_p: 0.8, min_p: 0.0 },
        Filters { temperature: 0.6, top_k: 20, top_p: 0.95, min_p: 0.0 },
        Filters { temperature: 1.0, top_k: 0, top_p: 0.9, min_p: 0.0 },
        Filters { temperature: 1.3, top_k: 50, top_p: 1.0, min_p: 0.05 },
        Filters { temperature: 0.3, top_k: 0, top_p: 1.0, min_p: 0.2 },
        Filters { temperature: 1.0, top_k: 1500, top_p: 0.7, min_p: 0.0 },
        Filters { temperature: 2.0, top_k: 1, top_p: 1.0, min_p: 0.0 },
        Filters { temperature: 0.9, top_k: 64, top_p: 0.9, min_p: 0.02 },
    ];
    // Under compute-sanitizer (small shapes) two vocabularies and fewer trials.
    let (mut vocabs, trials) = if full_size() { (vec![97usize, 1000, 5000], 6) } else { (vec![97usize, 3000], 2) };
    if full_size() {
        vocabs.push(151_936);
    }
    let (mut cases, mut accepted, mut overflows, mut fused) = (0, 0, 0, 0);
    for &vocab in &vocabs {
        let mut scratch = SampleScratch::new(&g.stream, 8, vocab).unwrap();
        for f in &filters {
            for trial in 0..trials {
                let rows = 1 + rng.below(8);
                let k = rows - 1;
                let ties = trial % 2 == 1;
                let logits: Vec<f32> = (0..rows).flat_map(|_| row(&mut rng, vocab, ties)).collect();
                // Drafts: mostly the row's argmax (so some are accepted), else any token.
                let drafts: Vec<u32> = (0..k)
                    .map(|i| {
                        let r = &logits[i * vocab..(i + 1) * vocab];
                        if rng.below(4) > 0 {
                            dspark_kernels::cpu::argmax::argmax(r) as u32
                        } else {
                            rng.below(vocab) as u32
                        }
                    })
                    .collect();
                let u: Vec<f64> =
                    (0..rows).map(|_| ((rng.next_u64() >> 40) as f64 + 0.5) / (1u64 << 24) as f64).collect();
                let want = host_verify(f, &logits, vocab, &drafts, None, &u);
                let dl = g.stream.clone_htod(&logits).unwrap();
                let cfg = g.stream.clone_htod(&sample_cfg(f, k, &u)).unwrap();
                let dd = g.stream.clone_htod(&if drafts.is_empty() { vec![0u32] } else { drafts.clone() }).unwrap();
                let shape = SampleShape::of(f, vocab);
                // The fused sampler and its phase-per-launch reference, each from poisoned out words.
                let mut run = |shape: SampleShape| {
                    g.stream.memcpy_htod(&[0xdead_beefu32; 4], &mut scratch.out).unwrap();
                    g.sample_verify(
                        &dl.as_view(),
                        (rows, vocab, vocab),
                        &cfg.as_view(),
                        &dd.as_view(),
                        shape,
                        &mut scratch,
                    )
                    .unwrap();
                    g.sample_result(&scratch).unwrap()
                };
                let out = run(shape);
                if shape.fused {
                    assert_eq!(out, run(shape.unfused()), "{f:?} V {vocab} rows {rows}: fused != phase per launch");
                    fused += 1;
                }
                if out[2] != 0 {
                    // The candidates ran out: only allowed when top-p keeps more than they hold.
                    let kept = (0..rows)
                        .map(|r| transform(f, &logits[r * vocab..(r + 1) * vocab]).iter().filter(|&&p| p > 0.0).count())
                        .max()
                        .unwrap();
                    assert!(f.top_p < 1.0 && kept > CAND, "{f:?} V {vocab}: overflow with {kept} kept");
                    overflows += 1;
                    continue;
                }
                assert_eq!((out[0], out[1]), want, "{f:?} V {vocab} rows {rows} ties {ties}");
                assert_eq!(out[3], want.0, "the draw's row");
                cases += 1;
                accepted += want.0;
            }
        }
    }
    eprintln!(
        "sampled verify: {cases} cases equal ({fused} fused, equal to the phases too), {accepted} drafts accepted in all, {overflows} overflows"
    );
    assert!(fused >= filters.len() * vocabs.len() * trials / 3, "too few fused cases ({fused})");
    assert!(cases >= filters.len() * vocabs.len() * trials * 2 / 3, "too few compared cases ({cases})");
    assert!(accepted > 0, "no draft was ever accepted: the test exercises no accept path");
}

#[test]
fn sampled_draft_law_equals_the_host_rule() {
    let g = gpu();
    let mut rng = Rng(0x9b17c3);
    let filters = [
        Filters { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0 },
        Filters { temperature: 0.7, top_k: 20, top_p: 0.8, min_p: 0.0 },
        Filters { temperature: 0.6, top_k: 20, top_p: 0.95, min_p: 0.0 },
        Filters { temperature: 1.3, top_k: 50, top_p: 1.0, min_p: 0.05 },
        Filters { temperature: 2.0, top_k: 1, top_p: 1.0, min_p: 0.0 },
        Filters { temperature: 0.9, top_k: 64, top_p: 0.9, min_p: 0.02 },
    ];
    let (vocabs, trials) = if full_size() { (vec![97usize, 1000, 151_936], 8) } else { (vec![97usize, 3000], 3) };
    let uniform = |rng: &mut Rng| ((rng.next_u64() >> 40) as f64 + 0.5) / (1u64 << 24) as f64;
    let (mut cases, mut accepted, mut rejected, mut slots) = (0, 0, 0, 0);
    for &vocab in &vocabs {
        let mut scratch = SampleScratch::new(&g.stream, 8, vocab).unwrap();
        for f in &filters {
            for trial in 0..trials {
                let rows = 2 + rng.below(7);
                let k = rows - 1;
                let ties = trial % 2 == 1;
                let logits: Vec<f32> = (0..rows).flat_map(|_| row(&mut rng, vocab, ties)).collect();
                // q rows near the target's (so drafts are often accepted) or unrelated to it.
                let near = trial % 3 != 2;
                let q_logits: Vec<f32> = (0..k)
                    .flat_map(|i| {
                        if near {
                            logits[i * vocab..(i + 1) * vocab].iter().map(|&x| x + rng.normal(0.7)).collect::<Vec<_>>()
                        } else {
                            row(&mut rng, vocab, ties)
                        }
                    })
                    .collect();
                let uq: Vec<f64> = (0..k).map(|_| uniform(&mut rng)).collect();
                let u: Vec<f64> = (0..rows).map(|_| uniform(&mut rng)).collect();
                // Each slot drawn on the device from its own row, state kept for the verify.
                let dq = g.stream.clone_htod(&q_logits).unwrap();
                let mut q_state = g.stream.clone_htod(&vec![0xdead_beefu32; k * ROW_WORDS]).unwrap();
                let mut dd = g.stream.clone_htod(&vec![u32::MAX; k]).unwrap();
                let shape = SampleShape::of(f, vocab);
                let mut overflow = false;
                for (i, &ui) in uq.iter().enumerate() {
                    let cfg = g.stream.clone_htod(&sample_cfg(f, 0, &[ui])).unwrap();
                    g.stream.memcpy_htod(&[0xdead_beefu32; 4], &mut scratch.out).unwrap();
                    let io = SampleIo {
                        state: Some(q_state.slice_mut(i * ROW_WORDS..(i + 1) * ROW_WORDS)),
                        q: None,
                        out: None,
                        token: Some(dd.slice_mut(i..i + 1)),
                    };
                    let qi = dq.slice(i * vocab..(i + 1) * vocab);
                    g.sample_rows(&qi, (1, vocab, vocab), &cfg.as_view(), &cfg.as_view(), shape, &mut scratch, io)
                        .unwrap();
                    overflow |= g.sample_result(&scratch).unwrap()[2] != 0;
                }
                if overflow {
                    continue;
                }
                let q: Vec<Vec<f64>> = (0..k).map(|i| transform(f, &q_logits[i * vocab..(i + 1) * vocab])).collect();
                let drafts: Vec<u32> = (0..k).map(|i| draw(&q[i], uq[i])).collect();
                let got = g.stream.clone_dtoh(&dd).unwrap();
                assert_eq!(got, drafts, "{f:?} V {vocab}: the slots' device draws != the CPU sampler's");
                slots += k;
                let want = host_verify(f, &logits, vocab, &drafts, Some(&q), &u);
                let dl = g.stream.clone_htod(&logits).unwrap();
                let cfg = g.stream.clone_htod(&sample_cfg(f, k, &u)).unwrap();
                g.stream.memcpy_htod(&[0xdead_beefu32; 4], &mut scratch.out).unwrap();
                let io = SampleIo { q: Some((dq.as_view(), vocab, q_state.as_view())), ..Default::default() };
                g.sample_rows(
                    &dl.as_view(),
                    (rows, vocab, vocab),
                    &cfg.as_view(),
                    &dd.as_view(),
                    shape,
                    &mut scratch,
                    io,
                )
                .unwrap();
                let out = g.sample_result(&scratch).unwrap();
                if out[2] != 0 {
                    continue;
                }
                assert_eq!((out[0], out[1]), want, "{f:?} V {vocab} rows {rows} ties {ties} near {near}");
                cases += 1;
                accepted += want.0;
                rejected += usize::from((want.0 as usize) < k);
            }
        }
    }
    eprintln!(
        "sampled draft law: {cases} verifies and {slots} slot draws equal, {accepted} accepted, {rejected} residuals"
    );
    assert!(cases >= filters.len() * vocabs.len() * trials / 2, "too few compared cases ({cases})");
    assert!(accepted > 0 && rejected > 0, "the accept ({accepted}) or residual ({rejected}) path never ran");
}
