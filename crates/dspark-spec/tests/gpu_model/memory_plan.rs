//! The memory plan's two levers on whole models (`dspark_model::cuda::plan`):
//!
//! * `--embeddings host`: the target's token embedding in mapped host memory, read by the
//!   embedding kernel over PCIe. The table holds the checkpoint's bytes and the kernel widens
//!   them as the device kernel does, so the logits must be the device table's bit for bit — a
//!   prompt, an eight-row verify-shaped step after a rollback, a decode step, a GEMM prefill —
//!   on a bf16 and an FP8 target. The arena holds exactly the table's bytes less. A draft
//!   sharing the table (its copy found equal, as `generate` finds it) reads it too:
//!   speculative = greedy on the host table = greedy on the device table, and each round
//!   accepts what the same draft on the device table accepts. A tied target refuses
//!   the plan, naming the flag.
//! * Each draft's arena equals what its loader checks for before it loads — the tensors it
//!   uploads plus `CudaDraft::planned_bytes` — within 1%.
//! * `--prefill-chunk`: a target planned for 48-row chunks prefills a 200-token prompt in five
//!   GEMM chunks within the GEMM bound of the CPU (3e-2), the draft's prefill buffers follow the
//!   target's rows, and speculative = greedy after it; with the small card's plan too, whose
//!   draft projects context rows a layer at a time (GEMMs for the prompt, matvecs each round).

use super::*;
use dspark_kernels::KvDtype;
use dspark_model::checkpoint::draft_config::DraftConfig;
use dspark_model::checkpoint::safetensors::Checkpoint;
use dspark_model::checkpoint::shared_heads::SharedHeads;
use dspark_model::cuda::plan::{Embeddings, TargetPlan};
use dspark_model::cuda::prefill::PrefillMode;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The draft in `ddir` on `t`, sharing what `generate` would find equal to the target's.
fn shared_draft(ddir: &std::path::Path, tdir: &std::path::Path, t: &CudaQwen3) -> (CudaDraft, SharedHeads) {
    let (dck, tck) = (Checkpoint::open_dir(ddir).unwrap(), Checkpoint::open_dir(tdir).unwrap());
    let c = t.config();
    let shared = SharedHeads::find(&dck, &tck, c.tie_word_embeddings, [c.vocab_size, c.hidden_size]);
    let d = CudaDraft::from_source_sharing(DraftConfig::from_dir(ddir).unwrap(), &dck, t, shared).unwrap();
    (d, shared)
}

/// The draft's arena against what its loader checks before it loads: the checkpoint tensors it
/// uploads (`device_bytes_without`, the heads it shares and W1 on the host left out) plus its
/// plan (`CudaDraft::planned_bytes`), within 1% (or 4 KiB: the plan leaves out buffers of less
/// than a kilobyte). The target side the loader's fit derives from `t`'s plan before anything
/// loads (`DraftSide::of_plan`) must be the built target's.
fn check_planned(
    d: &CudaDraft,
    ddir: &std::path::Path,
    t: &CudaQwen3,
    plan: TargetPlan,
    shared: SharedHeads,
    what: &str,
) {
    use dspark_model::cuda::dspark::{DraftHost, DraftSide};
    let ck = Checkpoint::open_dir(ddir).unwrap();
    let host = DraftHost::of(t);
    let side = DraftSide::of_plan(t.config(), &plan, PrefillMode::Gemm, host.gpu.sms);
    assert_eq!(side, DraftSide::of_host(&host), "{what}: the target side foreseen from its plan");
    let host_tables = t.host_bytes() > 0;
    let skip = CudaDraft::kept_off_device(d.config(), shared, host_tables);
    let weights = dspark_model::cuda::fit::device_bytes_without(&ck, &skip);
    let planned = CudaDraft::planned_bytes(d.config(), &host, CudaDraft::layer_elem(&ck));
    let (want, got) = (weights + planned, d.arena.bytes());
    let off = want.abs_diff(got);
    assert!(
        off <= (got / 100).max(4096),
        "{what}: the draft's arena holds {got} bytes; its weights {weights} + plan {planned} = {want}"
    );
}

#[test]
fn host_embeddings_give_the_device_tables_bits() {
    let cfg = target_config(300, 128, 3, 4, 2, 32, 512);
    let spec = two_layer_draft(7, MarkovKind::Vanilla, true);
    let (_a, bf16_t, bf16_d) = write_pair(&cfg, 9100, &spec, DType::BF16);
    let (_b, fp8_t, fp8_d) = super::fp8::write_fp8_pair(&cfg, 9200, [128, 128], &spec);
    for (name, tdir, ddir) in [("bf16", &bf16_t, &bf16_d), ("fp8", &fp8_t, &fp8_d)] {
        let mut rng = Rng(name.len() as u64);
        let plan = TargetPlan::new(256, KvDtype::F32);
        let load = |p: TargetPlan| CudaQwen3::load_plan(gpu(), tdir, p).unwrap();
        let (mut dev, mut host) = (load(plan), load(plan.with_embeddings(Embeddings::Host)));
        let table = 300 * 128 * 2;
        assert_eq!(dev.arena.bytes() - host.arena.bytes(), table, "{name}: the arena keeps the table");
        assert_eq!((host.host_bytes(), dev.host_bytes()), (table, 0), "{name}");
        // The ledger of `bench --memory-sites` accounts for every byte and allocation.
        for t in [&dev, &host] {
            let sites = t.arena.sites();
            assert_eq!(sites.iter().map(|s| s.bytes).sum::<usize>(), t.arena.bytes(), "{name}: site bytes");
            assert_eq!(sites.iter().map(|s| s.allocations).sum::<usize>(), t.arena.allocations(), "{name}");
            assert!(sites.windows(2).all(|w| w[0].bytes >= w[1].bytes), "{name}: largest first");
        }

        let prompt: Vec<u32> = (0..3 + rng.below(20)).map(|_| rng.below(300) as u32).collect();
        let rows: Vec<u32> = (0..8).map(|_| rng.below(300) as u32).collect();
        let same = |dev: &mut CudaQwen3, host: &mut CudaQwen3, tokens: &[u32], what: &str| {
            let (a, b) = (dev.forward(tokens, LogitRows::All).unwrap(), host.forward(tokens, LogitRows::All).unwrap());
            assert!(a.logits.iter().all(|x| x.is_finite()), "{name}: {what}: non-finite logits");
            assert_eq!(bits(&b.logits), bits(&a.logits), "{name}: {what}: host table != device table");
        };
        same(&mut dev, &mut host, &prompt, "prompt");
        let keep = prompt.len() / 2;
        dev.truncate(keep).unwrap();
        host.truncate(keep).unwrap();
        same(&mut dev, &mut host, &rows, "verify-shaped step");
        same(&mut dev, &mut host, &rows[..1], "decode step");
        // A GEMM prefill in 64-row chunks: every chunk's embedding from the table.
        let long: Vec<u32> = (0..200).map(|_| rng.below(300) as u32).collect();
        for t in [&mut dev, &mut host] {
            t.truncate(0).unwrap();
            t.set_prefill_shape(1, 64);
        }
        same(&mut dev, &mut host, &long, "GEMM prefill");

        // Lossless with the draft reading the host table.
        let opts = GenerateOptions { max_tokens: 32 + rng.below(16), eos_token_ids: vec![], logprobs: None };
        let (mut dev, mut host) = (load(plan), load(plan.with_embeddings(Embeddings::Host)));
        let want = greedy(&mut dev, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        let plain = greedy(&mut host, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        assert_eq!(plain, want, "{name}: greedy on the host table != on the device table");
        // The draft carries copies of the target's tables, as a published one does: found equal,
        // it reads the host table, and proposes what the same draft on the device table does.
        let own = super::tp::draft_with_heads(ddir, tdir, 300, 128);
        let (mut dr, shared) = shared_draft(own.path(), tdir, &host);
        assert!(shared.embed_tokens && shared.lm_head, "{name}: the draft's copies should equal the target's");
        let (mut dr_dev, _) = shared_draft(own.path(), tdir, &dev);
        check_planned(
            &dr,
            own.path(),
            &host,
            plan.with_embeddings(Embeddings::Host),
            shared,
            &format!("{name}, host tables"),
        );
        check_planned(&dr_dev, own.path(), &dev, plan, shared, &format!("{name}, device tables"));
        // Markov W1 follows the embedding to the host: out of the draft's arena, byte for byte;
        // and the small card's draft keeps no stacked copy of its layers' k|v rows.
        let w1 = dr.host_bytes();
        assert!(w1 >= 300 * spec.markov_rank * 2, "{name}: W1 [300, {}] on the host: {w1} bytes", spec.markov_rank);
        assert_eq!(dr_dev.host_bytes(), 0, "{name}: W1 on the device");
        let l = &dr.config().layer;
        let stacked = l.num_hidden_layers * 2 * l.kv_dim() * l.hidden_size * 2;
        assert_eq!((dr.ctx_kv_bytes(), dr_dev.ctx_kv_bytes()), (0, stacked), "{name}: the stacked k|v copy");
        assert_eq!(dr_dev.arena.bytes() - dr.arena.bytes(), w1 + stacked, "{name}: the draft's arena keeps W1 + k|v");
        for k in [7, 1 + rng.below(7)] {
            let run = |t: &mut CudaQwen3, d: &mut CudaDraft| {
                speculative(t, d, &prompt, &opts, &VerifyLen::Fixed(k), |_| ControlFlow::Continue(())).unwrap()
            };
            let (a, b) = (run(&mut dev, &mut dr_dev), run(&mut host, &mut dr));
            assert_eq!(b.tokens, want, "{name}: speculative (verify {k}) on the host table != greedy");
            let accepted = |g: &dspark_spec::stats::Generation| g.spec.as_ref().map(|s| s.accepted.clone());
            assert_eq!(
                accepted(&b),
                accepted(&a),
                "{name}: verify {k}: the draft on the host table proposed otherwise"
            );
        }
    }

    // A tied head streams the table: the plan is refused, naming the flag.
    let mut tied = target_config(300, 128, 2, 4, 2, 32, 512);
    tied.tie_word_embeddings = true;
    let w = target_weights(9300, &tied);
    let dir = tempfile::tempdir().unwrap();
    write_target_dir_as(dir.path(), &tied, &w, DType::BF16).unwrap();
    let plan = TargetPlan::new(256, KvDtype::F32).with_embeddings(Embeddings::Host);
    let e = CudaQwen3::load_plan(gpu(), dir.path(), plan).err().expect("a tied target on a host table").to_string();
    assert!(e.contains("--embeddings host") && e.contains("tie_word_embeddings"), "{e}");
}

#[test]
fn short_prefill_chunks_plan_less_and_stay_lossless() {
    let cfg = target_config(300, 128, 3, 4, 2, 32, 512);
    let spec = two_layer_draft(7, MarkovKind::Vanilla, true);
    let (_dir, tdir, ddir) = write_pair(&cfg, 9400, &spec, DType::BF16);
    let plan = TargetPlan::new(256, KvDtype::F32);
    let full = CudaQwen3::load_plan(gpu(), &tdir, plan).unwrap();
    let mut short = CudaQwen3::load_plan(gpu(), &tdir, plan.with_prefill_rows(48)).unwrap();
    assert_eq!((full.prefill_rows(), short.prefill_rows()), (256, 48));
    assert!(short.arena.bytes() < full.arena.bytes(), "48-row chunks plan fewer bytes than 256-row ones");
    drop(full);

    let mut rng = Rng(94);
    let long: Vec<u32> = (0..200).map(|_| rng.below(300) as u32).collect();
    let mut cpu = CpuQwen3::load(&tdir).unwrap();
    short.set_prefill_shape(1, usize::MAX);
    let a = cpu.forward(&long, LogitRows::All).unwrap();
    let b = short.forward(&long, LogitRows::All).unwrap();
    let e = rel_err(&b.logits, &a.logits);
    assert!(e <= 3e-2, "48-row GEMM prefill logits rel err {e}");

    short.truncate(0).unwrap();
    short.set_prefill(PrefillMode::Gemm);
    let opts = GenerateOptions { max_tokens: 40, eos_token_ids: vec![], logprobs: None };
    let plain = greedy(&mut short, &long, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
    let (mut dr, _) = shared_draft(&ddir, &tdir, &short);
    let g =
        speculative(&mut short, &mut dr, &long, &opts, &VerifyLen::Fixed(7), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(g.tokens, plain, "speculative != greedy after a 48-row-chunk prefill");
    let stacked = g.spec.map(|s| s.accepted);
    drop((short, dr));

    // The small card's plan: the draft projects its context a layer at a time (no stacked k|v
    // copy), on the GEMM path for the prompt's chunks and the matvec for each round's rows. It
    // stays lossless and accepts what the stacked projection accepts.
    let host = plan.with_prefill_rows(48).with_embeddings(Embeddings::Host);
    let mut small = CudaQwen3::load_plan(gpu(), &tdir, host).unwrap();
    small.set_prefill(PrefillMode::Gemm);
    let (mut dr, shared) = shared_draft(&ddir, &tdir, &small);
    assert_eq!(dr.ctx_kv_bytes(), 0, "the small plan's draft holds no stacked k|v");
    check_planned(&dr, &ddir, &small, host, shared, "48-row chunks, host tables");
    let g =
        speculative(&mut small, &mut dr, &long, &opts, &VerifyLen::Fixed(7), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(g.tokens, plain, "speculative (k|v a layer at a time) != greedy after a 48-row-chunk prefill");
    assert_eq!(g.spec.map(|s| s.accepted), stacked, "k|v a layer at a time accepted otherwise");
}
