//! Row-exact attention (`Gpu::row_exact`): a decode step's row takes the tensor-core split
//! attention that verify steps use, and every split attention takes a row's keys in tiles fixed
//! by the GPU (`dspark_kernels::cuda::attention_split::split_plan`), so a token's logits are the same bits
//! whether it is decoded alone, verified among drafts or batched with other requests:
//!
//! * a verify-shaped step's logits equal the same tokens decoded one at a time, bit for bit, on
//!   Qwen3-8B's attention shape (head dim 128, four query heads per KV head) and the fixture
//!   pairs' (head dim 64, two), with the prompt's and the steps' lengths random, through CUDA
//!   graphs (power-of-two grids) and eagerly — so speculative decoding equals plain greedy
//!   decoding by construction, not to within a margin;
//! * on the default GPU (decode on the four-query kernel) they differ somewhere: the test can
//!   fail, and the mode is not a no-op;
//! * batched rounds equal each request's solo runs on a row-exact GPU (`batched.rs`'s test).

use super::*;

/// A second handle on the GPU whose one-row steps attend on the tensor-core kernel.
pub(super) fn gpu_row_exact() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let mut g = Gpu::new(0).expect("the GPU tier needs a CUDA device");
        g.row_exact = true;
        Arc::new(g)
    })
    .clone()
}

/// For `seeds` random targets of `cfg`: (verify steps whose logits equal their tokens' decode
/// steps bit for bit, steps compared).
pub(super) fn verify_equals_decode(
    g: &Arc<Gpu>,
    cfg: &dspark_model::checkpoint::config::Qwen3Config,
    graphs: bool,
) -> (usize, usize) {
    let spec = two_layer_draft(4, MarkovKind::Vanilla, false);
    let (mut equal, mut steps) = (0, 0);
    for seed in 0..6u64 {
        let (_dir, tdir, _ddir) = write_pair(cfg, 9100 + seed, &spec, DType::BF16);
        let mut rng = Rng(seed + 177);
        let mut t = CudaQwen3::load(g.clone(), &tdir, 160).unwrap();
        t.set_graphs(graphs);
        let prompt: Vec<u32> = (0..1 + rng.below(60)).map(|_| rng.below(96) as u32).collect();
        t.forward(&prompt, LogitRows::Last).unwrap();
        for _ in 0..3 {
            let at = t.len();
            let step: Vec<u32> = (0..2 + rng.below(7)).map(|_| rng.below(96) as u32).collect();
            let verify = t.forward(&step, LogitRows::All).unwrap().logits;
            t.truncate(at).unwrap();
            let mut decode = Vec::new();
            for &tok in &step {
                decode.extend(t.forward(&[tok], LogitRows::All).unwrap().logits);
            }
            assert_eq!(verify.len(), decode.len());
            equal += usize::from(verify.iter().zip(&decode).all(|(a, b)| a.to_bits() == b.to_bits()));
            steps += 1;
        }
    }
    (equal, steps)
}

#[test]
fn verify_rows_equal_decode_rows_bit_for_bit() {
    // Qwen3-8B's attention shape, then the fixture pairs'.
    let shapes = [target_config(96, 128, 3, 8, 2, 128, 160), target_config(96, 64, 3, 2, 1, 64, 128)];
    for cfg in &shapes {
        for graphs in [true, false] {
            let (equal, steps) = verify_equals_decode(&gpu_row_exact(), cfg, graphs);
            assert_eq!(equal, steps, "hd {}, graphs {graphs}: verify steps unlike their decode steps", cfg.head_dim);
        }
    }
    // The default GPU's decode kernel is another: its rows agree to about 2⁻²², not bit for bit.
    let (equal, steps) = verify_equals_decode(&gpu(), &shapes[0], true);
    assert!(equal < steps, "the default GPU's decode rows equal its verify rows: is row_exact a no-op?");
}

#[test]
fn batched_rounds_equal_solo_runs_on_a_row_exact_gpu() {
    super::batched::rounds_equal_solo_runs(gpu_row_exact(), 100..104);
}

#[test]
fn batched_forwards_equal_each_sequence_alone_on_a_row_exact_gpu() {
    super::batched::forward_items_equal_each_sequence_alone(gpu_row_exact());
}
