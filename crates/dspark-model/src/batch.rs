//! Many sequences in one model: the interface a batched round drives (issue #30) and the
//! reference adapter that gives a single-sequence backend that interface.
//!
//! A batched round runs one target forward over the rows of several requests — each request's
//! verify rows, or its prompt, against that request's own KV cache — and one draft pass over
//! their blocks. [`BatchTarget`] and [`BatchDrafter`] are that contract: a request's state lives
//! in the model under a [`SeqId`] from `open` until `close`, which frees it.
//!
//! [`Sequences`] implements both for any single-sequence model that can swap its per-sequence
//! state in and out ([`SeqState`]: the CPU target's KV cache, the CPU draft's context cache). It
//! runs a batch's items one after another, so it defines what a batched forward must return:
//! each item's result is exactly that of the item alone on its sequence. (A backend that runs
//! the items in one launch — the CUDA small-M kernels take M = all items' rows, attention ragged
//! over each sequence's cache — is the rest of issue #30; it must return the same.)

use crate::backend::{Captured, Drafter, Forward, Greedy, LogitRows, Proposal, TargetModel};
use crate::{Error, Qwen3Config, Result};

/// A sequence's handle in a [`BatchTarget`] or [`BatchDrafter`] (ids of closed sequences are
/// reused).
pub type SeqId = usize;

/// The K/V positions a batch's sequences may hold together: `pages` pages of `page` positions
/// (a sequence of n positions takes ⌈n / page⌉ of them). Planned at start-up from
/// `--kv-capacity`; a batched scheduler admits requests by it (`dspark_spec::Scheduler`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBudget {
    pub page: usize,
    pub pages: usize,
}

impl KvBudget {
    /// Pages `positions` positions take.
    pub fn pages_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.page.max(1))
    }
}

/// A single-sequence model whose per-sequence state can be swapped out: `swap_state` exchanges
/// the model's current state with `state` (the weights stay).
pub trait SeqState {
    type State;
    /// An empty state, as the model has after construction (a GPU model takes it from a pool
    /// planned at start-up, and fails when the pool is empty).
    fn new_state(&mut self) -> Result<Self::State>;
    fn swap_state(&mut self, state: &mut Self::State);
    /// Takes back the state of a closed sequence (a GPU model returns its buffers to the pool).
    fn release_state(&mut self, state: Self::State) {
        drop(state);
    }
    /// The pages all states share, when they were planned once (`None`: each state grows as
    /// it needs).
    fn kv_budget(&self) -> Option<KvBudget> {
        None
    }
}

/// A target holding several sequences, whose forward takes rows of many of them at once.
pub trait BatchTarget {
    fn config(&self) -> &Qwen3Config;
    /// Positions one sequence may hold.
    fn max_len(&self) -> usize;
    /// The K/V pages all sequences share, when planned once (`--kv-capacity`); `None`: no limit
    /// beyond `max_len` each. (No default: a wrapper that forgot to pass it on would let the
    /// scheduler admit more than the pages hold.)
    fn kv_budget(&self) -> Option<KvBudget>;
    /// The prompt chunk a single-sequence prefill of this target takes
    /// ([`TargetModel::prefill_chunk`]): a batched prompt in chunks of it runs as it does alone.
    fn prefill_chunk(&self) -> usize {
        usize::MAX
    }
    /// A new, empty sequence.
    fn open(&mut self) -> Result<SeqId>;
    /// Frees a sequence's state.
    fn close(&mut self, id: SeqId) -> Result<()>;
    /// Positions sequence `id` holds.
    fn seq_len(&mut self, id: SeqId) -> Result<usize>;
    fn truncate(&mut self, id: SeqId, len: usize) -> Result<()>;
    /// Which layers' outputs every forward captures (the draft's taps).
    fn set_capture(&mut self, layers: &[usize]) -> Result<()>;
    /// One forward over every item: item i's tokens appended to its sequence, its result the
    /// greedy ids of the rows `rows` asks for and the captured rows of all its tokens.
    fn forward_batch(&mut self, items: &[(SeqId, &[u32], LogitRows)]) -> Result<Vec<Greedy>>;
    /// [`BatchTarget::forward_batch`], and for each item with `logits[i]` set the logits of its
    /// requested rows on the host too (`[rows, V]`: a sampled request draws from them). The
    /// default runs those items one by one through [`TargetModel::forward`] on their sequence
    /// (host captures; ids = the rows' argmax, ties to the lowest index, as on the device), then
    /// the rest in one forward; a backend with a batched forward fetches the rows from it.
    fn forward_batch_logits(
        &mut self,
        items: &[(SeqId, &[u32], LogitRows)],
        logits: &[bool],
    ) -> Result<Vec<(Greedy, Vec<f32>)>> {
        check_logit_flags(items.len(), logits)?;
        let vocab = self.config().vocab_size;
        let mut out: Vec<Option<(Greedy, Vec<f32>)>> = vec![None; items.len()];
        for (i, &(id, tokens, rows)) in items.iter().enumerate().filter(|(i, _)| logits[*i]) {
            let mut got = None;
            self.with_target(id, &mut |t| {
                got = Some(t.forward(tokens, rows)?);
                Ok(())
            })?;
            let f = got.ok_or_else(|| Error::Request("the forward did not run".into()))?;
            out[i] = Some(greedy_of(f, vocab));
        }
        let rest: Vec<usize> = (0..items.len()).filter(|&i| !logits[i]).collect();
        let batch: Vec<(SeqId, &[u32], LogitRows)> = rest.iter().map(|&i| items[i]).collect();
        for (&i, g) in rest.iter().zip(self.forward_batch(&batch)?) {
            out[i] = Some((g, Vec::new()));
        }
        out.into_iter().map(|o| o.ok_or_else(|| Error::Request("an item was not run".into()))).collect()
    }
    /// Runs `f` on sequence `id` as a single-sequence target (what a batched round does not
    /// cover — a sampled request, logprobs — runs through the plain loops this way).
    fn with_target(&mut self, id: SeqId, f: &mut dyn FnMut(&mut dyn TargetModel) -> Result<()>) -> Result<()>;
}

/// A draft holding several sequences' context caches.
pub trait BatchDrafter {
    fn block_size(&self) -> usize;
    fn target_layer_ids(&self) -> &[usize];
    fn open(&mut self) -> Result<SeqId>;
    fn close(&mut self, id: SeqId) -> Result<()>;
    /// Appends the target's captured rows to sequence `id`'s context.
    fn append_captured(&mut self, id: SeqId, captured: &Captured) -> Result<()>;
    /// One proposal per item, after anchor `.1`, from sequence `.0`'s context.
    fn propose_batch(&mut self, items: &[(SeqId, u32)]) -> Result<Vec<Proposal>>;
    /// Runs `f` on sequence `id` as a single-sequence draft.
    fn with_draft(&mut self, id: SeqId, f: &mut dyn FnMut(&mut dyn Drafter) -> Result<()>) -> Result<()>;
}

/// Checks one logits flag per item of a batched forward.
pub(crate) fn check_logit_flags(items: usize, logits: &[bool]) -> Result<()> {
    if logits.len() != items {
        return Err(Error::Request(format!("{} logits flags for {items} items", logits.len())));
    }
    Ok(())
}

/// A host forward's result as a batched item's: the rows' argmax (ties to the lowest index, as
/// the device argmax), its captures, its logits.
pub(crate) fn greedy_of(f: Forward, vocab: usize) -> (Greedy, Vec<f32>) {
    let ids = dspark_kernels::cpu::argmax::argmax_rows(&f.logits, vocab).into_iter().map(|t| t as u32).collect();
    (Greedy { ids, captured: Captured::Host(f.captured) }, f.logits)
}

/// Several sequences over one single-sequence model, run item by item (see the module docs).
pub struct Sequences<M: SeqState> {
    model: M,
    /// Index = [`SeqId`]; `None` for an id that is free.
    states: Vec<Option<M::State>>,
}

impl<M: SeqState> Sequences<M> {
    pub fn new(model: M) -> Sequences<M> {
        Sequences { model, states: Vec::new() }
    }

    /// Sequences open now.
    pub fn open_count(&self) -> usize {
        self.states.iter().filter(|s| s.is_some()).count()
    }

    /// The model itself (its current state is the one it had before any sequence opened).
    pub fn model(&mut self) -> &mut M {
        &mut self.model
    }

    fn open_state(&mut self) -> Result<SeqId> {
        let state = self.model.new_state()?;
        Ok(open_slot(&mut self.states, state))
    }

    fn close_state(&mut self, id: SeqId) -> Result<()> {
        let state = close_slot(&mut self.states, id)?;
        self.model.release_state(state);
        Ok(())
    }

    /// Runs `f` on the model with sequence `id`'s state swapped in (the bench holds a draft
    /// context's length fixed through it).
    pub fn with<R>(&mut self, id: SeqId, f: impl FnOnce(&mut M) -> Result<R>) -> Result<R> {
        let state = slot_mut(&mut self.states, id)?;
        self.model.swap_state(state);
        let out = f(&mut self.model);
        self.model.swap_state(state);
        out
    }
}

impl<M: SeqState + TargetModel> BatchTarget for Sequences<M> {
    fn config(&self) -> &Qwen3Config {
        self.model.config()
    }

    fn max_len(&self) -> usize {
        self.model.max_len()
    }

    fn kv_budget(&self) -> Option<KvBudget> {
        self.model.kv_budget()
    }

    fn prefill_chunk(&self) -> usize {
        self.model.prefill_chunk()
    }

    fn open(&mut self) -> Result<SeqId> {
        self.open_state()
    }

    fn close(&mut self, id: SeqId) -> Result<()> {
        self.close_state(id)
    }

    fn seq_len(&mut self, id: SeqId) -> Result<usize> {
        self.with(id, |m| Ok(m.len()))
    }

    fn truncate(&mut self, id: SeqId, len: usize) -> Result<()> {
        self.with(id, |m| m.truncate(len))
    }

    fn set_capture(&mut self, layers: &[usize]) -> Result<()> {
        self.model.set_capture(layers)
    }

    fn forward_batch(&mut self, items: &[(SeqId, &[u32], LogitRows)]) -> Result<Vec<Greedy>> {
        items.iter().map(|&(id, tokens, rows)| self.with(id, |m| m.forward_greedy(tokens, rows))).collect()
    }

    fn with_target(&mut self, id: SeqId, f: &mut dyn FnMut(&mut dyn TargetModel) -> Result<()>) -> Result<()> {
        self.with(id, |m| f(m))
    }
}

impl<M: SeqState + Drafter> BatchDrafter for Sequences<M> {
    fn block_size(&self) -> usize {
        self.model.block_size()
    }

    fn target_layer_ids(&self) -> &[usize] {
        self.model.target_layer_ids()
    }

    fn open(&mut self) -> Result<SeqId> {
        self.open_state()
    }

    fn close(&mut self, id: SeqId) -> Result<()> {
        self.close_state(id)
    }

    fn append_captured(&mut self, id: SeqId, captured: &Captured) -> Result<()> {
        self.with(id, |m| m.append_captured(captured))
    }

    fn propose_batch(&mut self, items: &[(SeqId, u32)]) -> Result<Vec<Proposal>> {
        items.iter().map(|&(id, anchor)| self.with(id, |m| m.propose(anchor))).collect()
    }

    fn with_draft(&mut self, id: SeqId, f: &mut dyn FnMut(&mut dyn Drafter) -> Result<()>) -> Result<()> {
        self.with(id, |m| f(m))
    }
}

/// Puts `item` in the first free slot of `slots` (a new one at the end when none is free): the
/// `SeqId` of a sequence opened in a batch.
pub(crate) fn open_slot<T>(slots: &mut Vec<Option<T>>, item: T) -> SeqId {
    match slots.iter().position(Option::is_none) {
        Some(id) => {
            slots[id] = Some(item);
            id
        }
        None => {
            slots.push(Some(item));
            slots.len() - 1
        }
    }
}

/// Sequence `id`'s item in `slots` (an error naming it when it is not open).
pub(crate) fn slot_mut<T>(slots: &mut [Option<T>], id: SeqId) -> Result<&mut T> {
    match slots.get_mut(id) {
        Some(Some(item)) => Ok(item),
        _ => Err(Error::Request(format!("sequence {id} is not open"))),
    }
}

/// The items of sequences `ids` (distinct), borrowed together, in `ids`' order; an error when
/// one is not open or appears twice in one `what` ("step", "pass").
pub(crate) fn slots_mut<'a, T>(slots: &'a mut [Option<T>], ids: &[SeqId], what: &str) -> Result<Vec<&'a mut T>> {
    let mut order: Vec<(SeqId, usize)> = ids.iter().enumerate().map(|(k, &id)| (id, k)).collect();
    order.sort_unstable();
    let mut taken: Vec<(usize, &mut T)> = Vec::with_capacity(ids.len());
    let mut rest = slots.iter_mut().enumerate();
    for (id, k) in order {
        let item = loop {
            match rest.next() {
                Some((j, Some(item))) if j == id => break item,
                Some(_) => continue,
                None => return Err(Error::Request(format!("sequence {id} is not open, or twice in a {what}"))),
            }
        };
        taken.push((k, item));
    }
    taken.sort_unstable_by_key(|(k, _)| *k);
    Ok(taken.into_iter().map(|(_, item)| item).collect())
}

/// Takes sequence `id`'s item out of `slots`, freeing the id (an error naming it when it is not
/// open).
pub(crate) fn close_slot<T>(slots: &mut [Option<T>], id: SeqId) -> Result<T> {
    slots.get_mut(id).and_then(Option::take).ok_or_else(|| Error::Request(format!("sequence {id} is not open")))
}

#[cfg(test)]
mod tests {
    use super::{close_slot, open_slot, slot_mut, slots_mut};

    #[test]
    fn slots_reuse_the_first_free_id_and_refuse_closed_ones() {
        let mut slots: Vec<Option<&str>> = Vec::new();
        assert_eq!((open_slot(&mut slots, "a"), open_slot(&mut slots, "b"), open_slot(&mut slots, "c")), (0, 1, 2));
        assert_eq!(close_slot(&mut slots, 1).ok(), Some("b"));
        let again = close_slot(&mut slots, 1).map_err(|e| e.to_string());
        assert!(again.is_err_and(|e| e.contains("sequence 1 is not open")), "closing a closed id");
        assert!(close_slot(&mut slots, 7).is_err(), "an id never opened");
        assert_eq!(open_slot(&mut slots, "d"), 1, "the freed id first");
        assert_eq!(open_slot(&mut slots, "e"), 3);
        assert_eq!(slots, [Some("a"), Some("d"), Some("c"), Some("e")]);
        assert_eq!(slot_mut(&mut slots, 2).map(|s| *s).ok(), Some("c"));
        assert!(slot_mut(&mut slots, 4).is_err(), "an id past the table");
    }

    #[test]
    fn several_slots_borrow_together_in_the_ids_order() {
        let mut slots = vec![Some(10), None, Some(12), Some(13)];
        let got = slots_mut(&mut slots, &[3, 0, 2], "step").map(|v| v.into_iter().map(|x| *x).collect::<Vec<_>>());
        assert_eq!(got.ok(), Some(vec![13, 10, 12]));
        for (ids, why) in [(&[0, 1][..], "a free id"), (&[2, 2][..], "an id twice"), (&[9][..], "an id past the table")]
        {
            let err = slots_mut(&mut slots, ids, "step").map(|_| ()).map_err(|e| e.to_string());
            assert!(err.is_err_and(|e| e.contains("twice in a step")), "{why}");
        }
    }
}
