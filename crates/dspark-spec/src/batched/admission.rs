//! Admission by KV capacity (`--kv-capacity`, issue #30): what a request reserves, and the
//! capacity it comes from — the scheduler's own bound, the target's planned pages, or both.

use super::Scheduler;
use crate::greedy::GenerateOptions;
use dspark_model::BatchTarget;

impl Scheduler {
    /// Bounds the KV positions running requests hold together (`--kv-capacity`): a request is
    /// admitted only when its reservation — the most positions it can reach, prompt + max_tokens
    /// at most the target's context (a verify never runs past the tokens still wanted, so the
    /// drafts need no more) — fits beside the others', in submission order (a large request
    /// waits rather than being passed), and gives it back when it ends or is cancelled. No
    /// request then runs out of cache mid-generation. A request whose reservation exceeds the
    /// whole capacity is refused at `submit`.
    ///
    /// A target whose sequences share pages planned at start-up ([`BatchTarget::kv_budget`]) is
    /// bounded by them without this call: each reservation is rounded up to whole pages, and the
    /// capacity is the pages' positions (or this one rounded up to whole pages, if smaller) — TGI's admission by
    /// `max_batch_total_tokens`, over vLLM-style pages.
    pub fn with_kv_capacity(mut self, tokens: usize) -> Scheduler {
        self.kv_capacity = Some(tokens);
        self
    }

    /// KV positions the running requests have reserved (whole pages on a paged target).
    pub fn kv_reserved(&self) -> usize {
        self.reserved
    }

    /// The positions a request reserves and the capacity they come from (see
    /// [`Scheduler::with_kv_capacity`]; `None`: no limit).
    pub(super) fn reservation<T: BatchTarget + ?Sized>(
        &self,
        target: &T,
        prompt: usize,
        opts: &GenerateOptions,
    ) -> (usize, Option<usize>) {
        let need = (prompt + opts.max_tokens).min(target.max_len());
        match target.kv_budget() {
            Some(b) => {
                // Whole pages: the capacity asked for, rounded up to them, at most those planned.
                let pages = self.kv_capacity.map_or(b.pages, |c| b.pages_for(c).min(b.pages));
                (b.pages_for(need) * b.page, Some(pages * b.page))
            }
            None => (need, self.kv_capacity),
        }
    }
}
