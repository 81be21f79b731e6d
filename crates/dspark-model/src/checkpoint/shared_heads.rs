//! Whether a draft's own `embed_tokens` / `lm_head` are the target's, byte for byte.
//!
//! A native DSpark draft ships its own copies of the target's embedding and output head (for
//! the 8B draft 2 × 1.24 GB in bf16) so that it loads on its own; they equal the target's.
//! When they do, the draft uses the target's matrices instead of a second copy. "Equal" means
//! the same dtype, the same shape and the same bytes — checked on the two checkpoints' mapped
//! bytes at load: a few 4 KiB windows first (most differing copies differ everywhere), then the
//! whole tensor (a memcmp, ~0.1 s for 1.24 GB in the page cache). A copy in another dtype (an
//! f32 draft beside a bf16 target) is not shared: its values are rounded differently.

use crate::checkpoint::safetensors::Checkpoint;

/// Which of a draft's own copies equal the target's (`false` where the draft has none: it
/// borrows the target's matrices then anyway).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedHeads {
    pub embed_tokens: bool,
    pub lm_head: bool,
}

/// Window size and count of the quick comparison before the full one.
const WINDOW: usize = 4096;
const WINDOWS: usize = 16;

impl SharedHeads {
    /// Compares the draft's `embed_tokens.weight` with the target's `model.embed_tokens.weight`,
    /// and its `lm_head.weight` with the target's output head (`lm_head.weight`, or the
    /// embedding when `tied`), each `[vocab, hidden]`. A tensor either side lacks, or cannot
    /// read, is simply not shared (the loaders report bad tensors themselves).
    pub fn find(draft: &Checkpoint, target: &Checkpoint, tied: bool, shape: [usize; 2]) -> SharedHeads {
        let head = if tied { "model.embed_tokens.weight" } else { "lm_head.weight" };
        SharedHeads {
            embed_tokens: same(draft, "embed_tokens.weight", target, "model.embed_tokens.weight", &shape),
            lm_head: same(draft, "lm_head.weight", target, head, &shape),
        }
    }

    /// How many of the two matrices are shared.
    pub fn count(&self) -> usize {
        usize::from(self.embed_tokens) + usize::from(self.lm_head)
    }
}

fn same(a: &Checkpoint, a_name: &str, b: &Checkpoint, b_name: &str, shape: &[usize]) -> bool {
    if !a.contains(a_name) || !b.contains(b_name) {
        return false;
    }
    let (Ok((da, x)), Ok((db, y))) = (a.raw(a_name, shape), b.raw(b_name, shape)) else {
        return false;
    };
    if da != db || x.len() != y.len() {
        return false;
    }
    let n = x.len();
    let quick = (0..WINDOWS).all(|i| {
        let start = (n.saturating_sub(WINDOW)) * i / (WINDOWS - 1).max(1);
        let end = (start + WINDOW).min(n);
        x[start..end] == y[start..end]
    });
    quick && x == y
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> Checkpoint {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name);
        Checkpoint::open_dir(&dir).unwrap()
    }

    #[test]
    fn copies_are_found_only_where_the_bytes_are_the_target_s() {
        let draft = fixture("dspark-tiny-vanilla"); // f32 copies of qwen3-tiny-f32's matrices
        let both = SharedHeads { embed_tokens: true, lm_head: true };
        assert_eq!(SharedHeads::find(&draft, &fixture("qwen3-tiny-f32"), false, [512, 64]), both);
        // The bf16 target holds other bytes (another dtype); a draft without copies shares none.
        assert_eq!(SharedHeads::find(&draft, &fixture("qwen3-tiny-bf16"), false, [512, 64]), SharedHeads::default());
        let none = fixture("dspark-tiny-rnn");
        assert_eq!(SharedHeads::find(&none, &fixture("qwen3-tiny-f32"), false, [512, 64]), SharedHeads::default());
        // A wrong shape reads nothing.
        assert_eq!(SharedHeads::find(&draft, &fixture("qwen3-tiny-f32"), false, [64, 512]), SharedHeads::default());
        // One byte changed mid-tensor (inside no quick window): that matrix alone is not shared.
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/dspark-tiny-vanilla");
        let tmp = tempfile::tempdir().unwrap();
        let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let off = header["embed_tokens.weight"]["data_offsets"][0].as_u64().unwrap() as usize;
        let mid = 8 + n + off + 512 * 64 * 4 / 2 + 1001;
        bytes[mid] ^= 1;
        std::fs::write(tmp.path().join("model.safetensors"), bytes).unwrap();
        let edited = Checkpoint::open_dir(tmp.path()).unwrap();
        let got = SharedHeads::find(&edited, &fixture("qwen3-tiny-f32"), false, [512, 64]);
        assert_eq!(got, SharedHeads { embed_tokens: false, lm_head: true });
    }
}
