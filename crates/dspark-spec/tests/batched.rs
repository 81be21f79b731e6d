//! Continuous batching is lossless per request: every request of a batched run (random arrival
//! rounds, prompt lengths, stopping conditions, batch limits and verify policies — fixed lengths
//! or the paper's budget over random cost tables) produces exactly what plain greedy decoding of
//! its prompt alone produces, tokens and stop reason, whoever shares its rounds; with a fixed
//! verify length it also takes exactly its solo speculative run's rounds (its draft context is
//! its own). Sampled requests (random temperature, top-k, top-p and seed) mixed in produce
//! exactly their solo `speculative_sampled` run's tokens at their fixed verify length (the
//! block under the budget).
//!
//! Pairs are random tiny models (`dspark_model::testing`) on the CPU, through
//! `dspark_model::Sequences` (each request's KV and draft context swapped in for its item).
//! 300 cases unless `PROPTEST_CASES` says otherwise.

use dspark_model::checkpoint::draft_config::MarkovKind;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::testing::{random_draft, target_config, target_weights, DraftSpec};
use dspark_model::{BatchTarget, Greedy, LogitRows, Qwen3Config, SeqId, Sequences, TargetModel};
use dspark_spec::{
    batched, greedy, speculative, speculative_sampled, BatchLimits, BatchRequest, BatchVerify, CostTable, DraftLaw,
    GenerateOptions, SamplingParams, VerifyLen,
};
use proptest::prelude::*;
use std::ops::ControlFlow;

#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    vocab: usize,
    block: usize,
    confidence: bool,
    /// (prompt length, max_tokens, arrival round, with an eos id, sampled with this seed) per
    /// request.
    requests: Vec<(usize, usize, usize, bool, Option<u64>)>,
    max_batch: usize,
    max_pos: usize,
    /// `None`: the budget; `Some(n)`: n drafts a round.
    fixed: Option<usize>,
    /// `Some(x)`: a KV capacity of the largest request's reservation + x.
    capacity_extra: Option<usize>,
    /// Prompt tokens a request puts through a round (`None`: whole prompts).
    prefill_chunk: Option<usize>,
    /// Sampled requests' drafts drawn along the Markov chain (else one-hot).
    sampled_law: bool,
    /// `Some((page, extra))`: target and draft K/V in bounded pools of pages of `page`
    /// positions, as many as the largest reservation takes plus `extra` (`--kv-capacity`).
    pages: Option<(usize, usize)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        4usize..20,
        1usize..=7,
        any::<bool>(),
        prop::collection::vec(
            (1usize..10, 0usize..30, 0usize..8, any::<bool>(), prop_oneof![Just(None), any::<u64>().prop_map(Some)]),
            1..7,
        ),
        1usize..5,
        prop_oneof![Just(128usize), 12usize..40],
        prop_oneof![Just(None), (0usize..9).prop_map(Some)],
        prop_oneof![Just(None), (0usize..60).prop_map(Some)],
        prop_oneof![Just(None), (1usize..5).prop_map(Some)],
        any::<bool>(),
        prop_oneof![Just(None), (1usize..7, 0usize..12).prop_map(Some)],
    )
        .prop_map(
            |(
                seed,
                vocab,
                block,
                confidence,
                requests,
                max_batch,
                max_pos,
                fixed,
                capacity_extra,
                prefill_chunk,
                sampled_law,
                pages,
            )| {
                Case {
                    seed,
                    vocab,
                    block,
                    confidence,
                    requests,
                    max_batch,
                    max_pos,
                    fixed,
                    capacity_extra,
                    prefill_chunk,
                    sampled_law,
                    pages,
                }
            },
        )
}

/// A one-layer draft of `block` drafts with a rank-4 Markov head, with or without confidence.
fn draft_spec(block: usize, confidence: bool) -> DraftSpec {
    DraftSpec {
        layers: 1,
        block_size: block,
        target_layer_ids: vec![0],
        markov_rank: 4,
        markov_kind: MarkovKind::Vanilla,
        confidence_head: confidence,
        confidence_with_markov: confidence,
    }
}

/// A [`BatchTarget`] that records the most KV positions its open sequences held at once (during
/// a forward, before the rollback).
struct Metered<T> {
    inner: T,
    lens: std::collections::HashMap<SeqId, usize>,
    peak: usize,
}

impl<T: BatchTarget> Metered<T> {
    fn new(inner: T) -> Self {
        Metered { inner, lens: Default::default(), peak: 0 }
    }
}

impl<T: BatchTarget> BatchTarget for Metered<T> {
    fn config(&self) -> &Qwen3Config {
        self.inner.config()
    }
    fn max_len(&self) -> usize {
        self.inner.max_len()
    }
    fn kv_budget(&self) -> Option<dspark_model::KvBudget> {
        self.inner.kv_budget()
    }
    fn open(&mut self) -> dspark_model::Result<SeqId> {
        let id = self.inner.open()?;
        self.lens.insert(id, 0);
        Ok(id)
    }
    fn close(&mut self, id: SeqId) -> dspark_model::Result<()> {
        self.lens.remove(&id);
        self.inner.close(id)
    }
    fn seq_len(&mut self, id: SeqId) -> dspark_model::Result<usize> {
        self.inner.seq_len(id)
    }
    fn truncate(&mut self, id: SeqId, len: usize) -> dspark_model::Result<()> {
        self.lens.insert(id, len);
        self.inner.truncate(id, len)
    }
    fn set_capture(&mut self, layers: &[usize]) -> dspark_model::Result<()> {
        self.inner.set_capture(layers)
    }
    fn with_target(
        &mut self,
        id: SeqId,
        f: &mut dyn FnMut(&mut dyn dspark_model::TargetModel) -> dspark_model::Result<()>,
    ) -> dspark_model::Result<()> {
        self.inner.with_target(id, f)
    }

    fn forward_batch(&mut self, items: &[(SeqId, &[u32], LogitRows)]) -> dspark_model::Result<Vec<Greedy>> {
        for &(id, tokens, _) in items {
            let len = self.inner.seq_len(id)? + tokens.len();
            self.lens.insert(id, len);
        }
        self.peak = self.peak.max(self.lens.values().sum());
        self.inner.forward_batch(items)
    }
}

fn limits(max_batch: usize) -> BatchLimits {
    BatchLimits { max_batch, kv_capacity: None, prefill_chunk: None, law: DraftLaw::Greedy }
}

fn prompt(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// A request's sampler from its seed: temperature 0.5–1.2, top-k off / 3 / 5, top-p off / 0.9
/// / 0.7.
fn sampler(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.5 + (seed % 8) as f32 * 0.1,
        top_k: [0, 3, 5][(seed / 8 % 3) as usize],
        top_p: [1.0, 0.9, 0.7][(seed / 24 % 3) as usize],
        min_p: 0.0,
        seed,
    }
}

fn check(c: &Case) -> Result<(), TestCaseError> {
    let cfg = target_config(c.vocab, 16, 2, 2, 1, 8, c.max_pos);
    let weights = target_weights(c.seed, &cfg);
    let spec = draft_spec(c.block, c.confidence);
    let requests: Vec<BatchRequest> = c
        .requests
        .iter()
        .enumerate()
        .map(|(i, &(len, max_tokens, arrival, eos, sampled))| BatchRequest {
            prompt: prompt(c.seed ^ (i as u64 * 977 + 1), len, c.vocab),
            opts: GenerateOptions {
                max_tokens,
                eos_token_ids: if eos { vec![(c.seed % c.vocab as u64) as u32] } else { vec![] },
                logprobs: None,
            },
            params: sampled.map_or(SamplingParams::greedy(), sampler),
            arrival,
        })
        .collect();
    // The budget's cost table: a random slope per verify token, up to every request's full block.
    let verify = match c.fixed {
        Some(n) => BatchVerify::Fixed(n),
        None => {
            let slope = (c.seed % 11) as f64 * 0.04;
            let tokens = requests.len() * (c.block + 1);
            BatchVerify::Budget(CostTable { seconds: (1..=tokens).map(|n| 1.0 + slope * n as f64).collect() })
        }
    };
    // A KV capacity from the largest request's reservation up (or none): never exceeded.
    let largest = requests.iter().map(|r| (r.prompt.len() + r.opts.max_tokens).min(c.max_pos)).max().unwrap_or(0);
    let capacity = c.capacity_extra.map(|x| largest + x);
    let fail = |e: dspark_model::Error| TestCaseError::fail(e.to_string());
    let (mut t, mut d) =
        (CpuQwen3::new(cfg.clone(), weights.clone()), random_draft(c.seed ^ 0xD5, &cfg, &weights, &spec));
    if let Some((page, extra)) = c.pages {
        let pages = largest.div_ceil(page) + extra;
        (t, d) = (t.with_kv_pages(page, pages).map_err(fail)?, d.with_kv_pages(page, pages).map_err(fail)?);
    }
    let (target, mut draft) = (Sequences::new(t), Sequences::new(d));
    let mut target = Metered::new(target);
    let law = if c.sampled_law { DraftLaw::Sampled } else { DraftLaw::Greedy };
    let limits = BatchLimits { max_batch: c.max_batch, kv_capacity: capacity, prefill_chunk: c.prefill_chunk, law };
    let out =
        batched(&mut target, &mut draft, &requests, &verify, limits).map_err(|e| TestCaseError::fail(e.to_string()))?;
    if let Some(cap) = capacity {
        // On pages the capacity is rounded up to whole ones.
        let cap = c.pages.map_or(cap, |(page, _)| cap.div_ceil(page) * page);
        prop_assert!(target.peak <= cap, "{} KV positions held at once, capacity {}", target.peak, cap);
    }
    let mut target = target.inner;
    prop_assert_eq!(target.open_count(), 0, "every sequence closed");
    if c.pages.is_some() {
        // Every page came back: the pools are as planned.
        let ((_, tf, tt), (_, df, dt)) = (target.model().kv_pages(), draft.model().kv_pages());
        prop_assert_eq!((tf, df), (tt, dt), "pages still held after every request ended");
    }
    let mut alone = CpuQwen3::new(cfg.clone(), weights.clone());
    for (i, r) in requests.iter().enumerate() {
        if !r.params.is_greedy() {
            // Sampled: its solo run at its fixed verify length, token for token.
            let k = c.fixed.map_or(c.block, |n| n.min(c.block));
            let mut solo_draft = random_draft(c.seed ^ 0xD5, &cfg, &weights, &spec);
            let verify = VerifyLen::Fixed(k);
            let solo =
                speculative_sampled(&mut alone, &mut solo_draft, &r.prompt, &r.opts, &verify, &r.params, law, |_| {
                    ControlFlow::Continue(())
                })
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&out[i].tokens, &solo.tokens, "sampled request {} ({:?})", i, r.params);
            prop_assert_eq!(out[i].stop, solo.stop, "sampled request {}", i);
            prop_assert_eq!(Some(&out[i].spec), solo.spec.as_ref(), "sampled request {}: its rounds", i);
            continue;
        }
        let plain = greedy(&mut alone, &r.prompt, &r.opts, |_| ControlFlow::Continue(()))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&out[i].tokens, &plain.tokens, "request {}", i);
        prop_assert_eq!(out[i].stop, plain.stop, "request {}", i);
        prop_assert!(out[i].rounds.0 >= r.arrival, "request {} ran before it arrived", i);
        // With a fixed verify length a request's rounds are its solo speculative run's: the
        // same proposals from its own draft context, so the same acceptance and round count.
        if let Some(n) = c.fixed {
            let mut solo_draft = random_draft(c.seed ^ 0xD5, &cfg, &weights, &spec);
            let solo = speculative(&mut alone, &mut solo_draft, &r.prompt, &r.opts, &VerifyLen::Fixed(n), |_| {
                ControlFlow::Continue(())
            })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let rounds = solo.spec.as_ref().map_or(0, |s| s.verified.len());
            // Round by round: the same drafts verified and accepted.
            prop_assert_eq!(Some(&out[i].spec), solo.spec.as_ref(), "request {}: its rounds", i);
            // Its prompt took one round, or one a chunk.
            let prefill = c.prefill_chunk.map_or(1, |k| r.prompt.len().div_ceil(k));
            prop_assert_eq!(out[i].rounds.1 - out[i].rounds.0 + 1, prefill + rounds, "request {}: rounds", i);
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
    #[test]
    fn batched_requests_equal_their_solo_greedy_runs(c in case()) {
        check(&c)?;
    }
}

/// The batch is real: with four requests arriving together and room for four, they share
/// rounds (each one's first and last rounds overlap the others'), and a limit of one runs them
/// strictly one after another, with the same tokens.
#[test]
fn requests_share_rounds_up_to_the_batch_limit() {
    let cfg = target_config(9, 16, 2, 2, 1, 8, 128);
    let weights = target_weights(7, &cfg);
    let spec = draft_spec(4, true);
    let opts = GenerateOptions { max_tokens: 20, eos_token_ids: vec![], logprobs: None };
    let requests: Vec<BatchRequest> = (0..4)
        .map(|i| BatchRequest {
            prompt: prompt(i, 5, 9),
            opts: opts.clone(),
            params: SamplingParams::greedy(),
            arrival: 0,
        })
        .collect();
    let run = |max_batch| {
        let mut target = Sequences::new(CpuQwen3::new(cfg.clone(), weights.clone()));
        let mut draft = Sequences::new(random_draft(8, &cfg, &weights, &spec));
        let out = batched(&mut target, &mut draft, &requests, &BatchVerify::Fixed(4), limits(max_batch)).unwrap();
        assert_eq!(target.max_len(), 128);
        out
    };
    let (four, one) = (run(4), run(1));
    assert!(four.iter().all(|o| o.rounds.0 == 0), "{four:?}");
    for w in one.windows(2) {
        assert!(w[1].rounds.0 > w[0].rounds.1, "one at a time: {one:?}");
    }
    for (a, b) in four.iter().zip(&one) {
        assert_eq!(a.tokens, b.tokens);
    }
    // A bad request is refused before any work: an empty prompt, named by its index.
    let mut bad = requests.clone();
    bad[2].prompt.clear();
    let mut target = Sequences::new(CpuQwen3::new(cfg.clone(), weights.clone()));
    let mut draft = Sequences::new(random_draft(8, &cfg, &weights, &spec));
    let e = batched(&mut target, &mut draft, &bad, &BatchVerify::Fixed(4), limits(2)).unwrap_err();
    assert!(e.to_string().contains("request 2"), "{e}");
}

/// The scheduler as a server drives it: tokens stream through the callback in commit order and
/// add up to each request's output; a `Break` from the callback stops that request alone
/// (`Stopped`, the tokens up to and including the one that broke); `cancel` frees a running
/// request's sequences at once and a queued one's place; a KV capacity refuses what cannot fit.
#[test]
fn the_scheduler_streams_stops_and_cancels() {
    use dspark_spec::{Scheduler, StopReason};
    let cfg = target_config(11, 16, 2, 2, 1, 8, 128);
    let weights = target_weights(3, &cfg);
    let spec = draft_spec(3, false);
    let mut target = Sequences::new(CpuQwen3::new(cfg.clone(), weights.clone()));
    let mut draft = Sequences::new(random_draft(4, &cfg, &weights, &spec));
    let opts = GenerateOptions { max_tokens: 24, eos_token_ids: vec![], logprobs: None };
    let mut sched = Scheduler::new(BatchVerify::Fixed(3), 2).unwrap();
    let ids: Vec<usize> = (0..4).map(|i| sched.submit(&target, prompt(i + 40, 4, 11), opts.clone()).unwrap()).collect();
    let mut streamed: Vec<Vec<u32>> = vec![Vec::new(); 4];
    let mut done = Vec::new();
    // Request 1 breaks after its 5th token; request 3 (queued behind the first two) is cancelled.
    assert_eq!(sched.cancel(&mut target, &mut draft, ids[3]).unwrap(), Some(vec![]));
    while !sched.is_idle() {
        let finished = sched
            .step(&mut target, &mut draft, |id, e| {
                streamed[id].push(e.token);
                if id == ids[1] && streamed[id].len() == 5 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .unwrap();
        assert!(target.open_count() <= 2, "at most max_batch sequences");
        done.extend(finished);
    }
    assert_eq!(target.open_count(), 0);
    let mut alone = CpuQwen3::new(cfg.clone(), weights.clone());
    for f in &done {
        assert_eq!(f.output.tokens, streamed[f.id], "request {}: streamed = output", f.id);
        let plain = greedy(&mut alone, &prompt(f.id as u64 + 40, 4, 11), &opts, |_| ControlFlow::Continue(())).unwrap();
        if f.id == ids[1] {
            assert_eq!(f.output.stop, StopReason::Stopped);
            assert_eq!(f.output.tokens[..], plain.tokens[..5]);
        } else {
            assert_eq!((&f.output.tokens, f.output.stop), (&plain.tokens, plain.stop));
        }
    }
    let mut ended: Vec<usize> = done.iter().map(|f| f.id).collect();
    ended.sort();
    assert_eq!(ended, vec![0, 1, 2], "the cancelled request never runs");
    // Cancelling a running request frees its sequences before its end.
    let id = sched.submit(&target, prompt(7, 4, 11), opts.clone()).unwrap();
    sched.step(&mut target, &mut draft, |_, _| ControlFlow::Continue(())).unwrap();
    assert_eq!(target.open_count(), 1);
    let so_far = sched.cancel(&mut target, &mut draft, id).unwrap().unwrap();
    assert_eq!(so_far.len(), 1, "the prompt's round commits one token");
    assert_eq!((target.open_count(), sched.is_idle()), (0, true));
    assert_eq!(sched.cancel(&mut target, &mut draft, id).unwrap(), None);
    // A request that could outgrow the whole KV capacity is refused when submitted.
    let mut small = Scheduler::new(BatchVerify::Fixed(3), 2).unwrap().with_kv_capacity(27);
    let e = small.submit(&target, prompt(5, 4, 11), opts.clone()).unwrap_err();
    assert!(e.to_string().contains("28 KV positions") && e.to_string().contains("27"), "{e}");
    assert!(small.submit(&target, prompt(5, 3, 11), opts.clone()).is_ok());
}

/// Bounded pages (`--kv-capacity`): a request waits until its reservation's pages are free, runs
/// to its solo tokens, and gives its pages back when it ends or is cancelled; one that could
/// outgrow every page is refused at submit, naming the capacity.
#[test]
fn paged_requests_wait_for_pages_and_give_them_back() {
    use dspark_spec::Scheduler;
    let cfg = target_config(11, 16, 2, 2, 1, 8, 128);
    let weights = target_weights(5, &cfg);
    let spec = draft_spec(3, false);
    // 5 pages of 4 positions; each request reserves 4 + 6 = 10 positions = 3 pages.
    let t = CpuQwen3::new(cfg.clone(), weights.clone()).with_kv_pages(4, 5).unwrap();
    let d = random_draft(6, &cfg, &weights, &spec).with_kv_pages(4, 5).unwrap();
    let (mut target, mut draft) = (Sequences::new(t), Sequences::new(d));
    let opts = GenerateOptions { max_tokens: 6, eos_token_ids: vec![], logprobs: None };
    let mut sched = Scheduler::new(BatchVerify::Fixed(3), 4).unwrap();
    let ids: Vec<usize> = (0..2).map(|i| sched.submit(&target, prompt(i + 60, 4, 11), opts.clone()).unwrap()).collect();
    let mut done = Vec::new();
    while !sched.is_idle() {
        done.extend(sched.step(&mut target, &mut draft, |_, _| ControlFlow::Continue(())).unwrap());
        assert!(sched.running() <= 1 && sched.kv_reserved() <= 12, "3 pages each, 5 in all: one at a time");
    }
    let mut alone = CpuQwen3::new(cfg.clone(), weights.clone());
    assert_eq!(done.iter().map(|f| f.id).collect::<Vec<_>>(), ids);
    assert!(done[1].output.rounds.0 > done[0].output.rounds.1, "the second waited for pages");
    for f in &done {
        let plain = greedy(&mut alone, &prompt(f.id as u64 + 60, 4, 11), &opts, |_| ControlFlow::Continue(())).unwrap();
        assert_eq!(f.output.tokens, plain.tokens, "request {}", f.id);
    }
    assert_eq!((target.model().kv_pages(), draft.model().kv_pages()), ((4, 5, 5), (4, 5, 5)), "all pages back");
    // A cancelled request's pages come back at once.
    let id = sched.submit(&target, prompt(9, 4, 11), opts.clone()).unwrap();
    sched.step(&mut target, &mut draft, |_, _| ControlFlow::Continue(())).unwrap();
    assert!(target.model().kv_pages().1 < 5, "the prompt took pages");
    sched.cancel(&mut target, &mut draft, id).unwrap();
    assert_eq!((target.model().kv_pages().1, draft.model().kv_pages().1, sched.kv_reserved()), (5, 5, 0));
    // 4 + 17 = 21 positions take 6 pages: more than there are.
    let long = GenerateOptions { max_tokens: 17, ..opts };
    let e = sched.submit(&target, prompt(9, 4, 11), long).unwrap_err().to_string();
    assert!(e.contains("= 21 KV positions (24 in whole pages of 4)") && e.contains("capacity of 20"), "{e}");
}

/// A long prompt on the CPU goes through the rounds in the model's own chunks
/// (`dspark_model::cpu::PREFILL_CHUNK`), as the server schedules it: the short requests sharing
/// those rounds get tokens while it prefills, and every output equals its solo greedy and
/// speculative runs (which prefill in the same chunks).
#[test]
fn a_long_prompt_prefills_in_chunks_beside_the_others_tokens() {
    use dspark_model::cpu::PREFILL_CHUNK;
    let cfg = target_config(13, 16, 2, 2, 1, 8, 1024);
    let weights = target_weights(9, &cfg);
    let spec = draft_spec(4, true);
    let target = CpuQwen3::new(cfg.clone(), weights.clone());
    let chunk = target.prefill_chunk();
    assert_eq!(chunk, PREFILL_CHUNK);
    let (mut target, mut draft) = (Sequences::new(target), Sequences::new(random_draft(10, &cfg, &weights, &spec)));
    let long = prompt(77, 2 * PREFILL_CHUNK + 88, 13);
    let opts = GenerateOptions { max_tokens: 12, eos_token_ids: vec![], logprobs: None };
    let requests: Vec<BatchRequest> = [long.clone(), prompt(78, 5, 13), prompt(79, 7, 13)]
        .into_iter()
        .map(|p| BatchRequest { prompt: p, opts: opts.clone(), params: SamplingParams::greedy(), arrival: 0 })
        .collect();
    let mut sched = dspark_spec::Scheduler::new(BatchVerify::Fixed(4), 3).unwrap().with_prefill_chunk(chunk);
    let ids: Vec<usize> =
        requests.iter().map(|r| sched.submit(&target, r.prompt.clone(), opts.clone()).unwrap()).collect();
    // The round of each committed token, per request.
    let mut at: Vec<Vec<usize>> = vec![Vec::new(); 3];
    let mut done = Vec::new();
    while !sched.is_idle() {
        let round = sched.round();
        done.extend(
            sched
                .step(&mut target, &mut draft, |id, _| {
                    at[id].push(round);
                    ControlFlow::Continue(())
                })
                .unwrap(),
        );
    }
    // Three chunks (256, 256, 88): the long prompt's first token comes in round 2, and by then
    // each short request has committed tokens in rounds 0 and 1.
    assert_eq!(at[ids[0]].first(), Some(&2), "{at:?}");
    for &i in &ids[1..] {
        assert!(at[i].contains(&0) && at[i].contains(&1), "request {i} waited for the long prompt: {at:?}");
    }
    let mut alone = CpuQwen3::new(cfg.clone(), weights.clone());
    for (f, r) in done.iter().map(|f| (f, &requests[f.id])) {
        let plain = greedy(&mut alone, &r.prompt, &opts, |_| ControlFlow::Continue(())).unwrap();
        let mut d = random_draft(10, &cfg, &weights, &spec);
        let spec_run =
            speculative(&mut alone, &mut d, &r.prompt, &opts, &VerifyLen::Fixed(4), |_| ControlFlow::Continue(()))
                .unwrap();
        assert_eq!((&f.output.tokens, &spec_run.tokens), (&plain.tokens, &plain.tokens), "request {}", f.id);
    }
    assert_eq!(done.len(), 3);
}

#[test]
fn logprobs_stream_with_the_batched_tokens() {
    use dspark_spec::{Emitted, Scheduler};
    // Greedy and sampled requests reporting logprobs (top 3), under both draft laws, sharing
    // rounds: each streams its solo run's tokens with the same logprobs, bit for bit.
    let cfg = target_config(13, 16, 2, 2, 1, 8, 128);
    let weights = target_weights(21, &cfg);
    let spec = draft_spec(4, true);
    for law in [DraftLaw::Greedy, DraftLaw::Sampled] {
        let mut target = Sequences::new(CpuQwen3::new(cfg.clone(), weights.clone()));
        let mut draft = Sequences::new(random_draft(22, &cfg, &weights, &spec));
        let opts = GenerateOptions { max_tokens: 20, eos_token_ids: vec![], logprobs: Some(3) };
        let params = [SamplingParams::greedy(), sampler(5), SamplingParams::greedy(), sampler(29)];
        let mut sched = Scheduler::new(BatchVerify::Fixed(4), 4).unwrap().with_draft_law(law);
        for (i, p) in params.iter().enumerate() {
            sched.submit_sampled(&target, prompt(i as u64 + 60, 3 + i, 13), opts.clone(), *p).unwrap();
        }
        let mut streamed: Vec<Vec<Emitted>> = vec![Vec::new(); params.len()];
        while !sched.is_idle() {
            sched
                .step(&mut target, &mut draft, |id, e| {
                    streamed[id].push(e.clone());
                    ControlFlow::Continue(())
                })
                .unwrap();
        }
        let mut alone = CpuQwen3::new(cfg.clone(), weights.clone());
        for (i, p) in params.iter().enumerate() {
            let mut solo: Vec<Emitted> = Vec::new();
            let mut d = random_draft(22, &cfg, &weights, &spec);
            let collect = |e: &Emitted| {
                solo.push(e.clone());
                ControlFlow::Continue(())
            };
            let prompt = prompt(i as u64 + 60, 3 + i, 13);
            speculative_sampled(&mut alone, &mut d, &prompt, &opts, &VerifyLen::Fixed(4), p, law, collect).unwrap();
            assert!(solo.iter().all(|e| e.logprob.is_some()), "solo reports logprobs");
            assert_eq!(streamed[i], solo, "{law:?}, request {i} ({p:?})");
        }
    }
}
