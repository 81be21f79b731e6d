//! Many sequences in one CUDA target, their rows in one forward (issue #30): [`CudaBatch`], the
//! GPU's [`BatchTarget`].
//!
//! A batched round hands the target several requests' rows at once — each request's verify rows
//! (anchor + drafts) or a piece of its prompt. They run as one step of up to [`CHUNK`] rows:
//!
//! ```text
//! x = embed(ids of every item, one after another)
//! per layer: q|k|v, o, gate|up, down   — one matvec each over all rows (weights read once)
//!            RoPE + append + attention — each item over its own caches (one launch per kernel
//!                                        for the verify-shaped items together, below)
//! logits, argmax                       — rows from the first one any item asks for
//! ```
//!
//! Every projection's rows are independent of the other rows of its launch (the small-M
//! kernels' K split and summation order depend on the matrix alone, matvec.cu), and each
//! item's attention runs the same kernels over the same rows as when its sequence runs alone —
//! items that take the tensor-core split attention share one launch per kernel (segmented:
//! `dspark_kernels::cuda::attention_seg`, each block that of the item's own launch), the rest
//! launch alone —
//! so an item's ids and captures equal those of the same tokens through
//! [`TargetModel::forward_greedy`] on that sequence alone, bit for bit: the lossless invariant
//! per request, checked by the GPU tier (`dspark-spec/tests/gpu_model/batched.rs`).
//!
//! Items longer than [`CHUNK`] rows (prompts) run alone through the model's own forward (the
//! GEMM prefill), their sequence's caches swapped in: as solo. Each sequence's K/V caches come
//! from a pool planned when the batch is made, so opening a sequence allocates nothing: either
//! `max_seqs` contiguous caches of the model's `max_len` positions ([`CudaBatch::new`]), or
//! ([`CudaBatch::paged`], `--kv-capacity`) `max_seqs` address ranges of `max_len` positions
//! into which pages of one pool planned for the capacity are mapped as each sequence grows and
//! unmapped as it is rolled back or closed (`cuda::kv_vmm`: the kernels see the same contiguous
//! caches). Batched steps launch eagerly; CUDA graphs stay with single-sequence steps.

use super::{handoff_id, CudaQwen3, CHUNK};
use crate::backend::{check_forward, check_truncate, Captured, DeviceRows, Greedy, LogitRows, TargetModel};
use crate::batch::{check_logit_flags, close_slot, greedy_of, open_slot, slot_mut, slots_mut, BatchTarget, SeqId};
use crate::checkpoint::config::Qwen3Config;
use crate::cuda::kv_vmm::{KvPages, VirtualKv};
use crate::cuda::layers::{capture_layer, drv, gpu_err, kv_caches, run_layers, Segment};
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;
use dspark_kernels::cuda::kv::KvCaches;
use dspark_kernels::cuda::ops::StepLens;

/// One sequence's K/V caches: contiguous, or an address range with pages mapped into it.
enum SeqCaches {
    Plain(KvCaches),
    Paged(VirtualKv),
}

impl SeqCaches {
    fn caches(&mut self) -> &mut KvCaches {
        match self {
            SeqCaches::Plain(c) => c,
            SeqCaches::Paged(v) => v.caches_mut(),
        }
    }
}

/// One sequence's target state: its K/V caches and the positions they hold.
struct SeqKv {
    caches: SeqCaches,
    len: usize,
}

/// A [`CudaQwen3`] holding up to `max_seqs` sequences (see the module docs).
pub struct CudaBatch {
    model: CudaQwen3,
    /// Index = [`SeqId`]; `None` for a free id.
    seqs: Vec<Option<SeqKv>>,
    /// Caches not in use.
    pool: Vec<SeqCaches>,
    /// The pages mapped into paged sequences' ranges ([`CudaBatch::paged`]).
    pages: Option<KvPages>,
    max_seqs: usize,
    /// `[first_pos, kv_len]` of each item of a step, then the step's token ids.
    step_in: CudaSlice<u32>,
}

impl CudaBatch {
    /// Plans K/V caches for `max_seqs` sequences of the model's `max_len` positions each (the
    /// model's own caches are the first of them).
    pub fn new(mut model: CudaQwen3, max_seqs: usize) -> Result<CudaBatch> {
        if max_seqs == 0 {
            return Err(Error::Request("a batch of 0 sequences".into()));
        }
        let (layers, kv) = (model.cfg.num_hidden_layers, model.cfg.kv_dim());
        let dtype = model.kv_dtype();
        let own = std::mem::replace(&mut model.caches, KvCaches::F32 { k: Vec::new(), v: Vec::new() });
        let mut pool = vec![SeqCaches::Plain(own)];
        for _ in 1..max_seqs {
            let caches = kv_caches(&model.arena, dtype, layers, model.max_len * kv).map_err(|e| {
                Error::Request(format!("K/V caches for {max_seqs} sequences of {} positions: {e}", model.max_len))
            })?;
            pool.push(SeqCaches::Plain(caches));
        }
        Self::with_pool(model, max_seqs, pool, None)
    }

    /// Plans paged K/V for `max_seqs` sequences sharing `capacity` positions (`--kv-capacity`;
    /// see the module docs): the pages now, for `capacity` positions rounded up to whole pages,
    /// and an address range of `max_len` positions for each sequence. The model's own
    /// contiguous caches are freed.
    pub fn paged(mut model: CudaQwen3, max_seqs: usize, capacity: usize) -> Result<CudaBatch> {
        if max_seqs == 0 {
            return Err(Error::Request("a batch of 0 sequences".into()));
        }
        let (layers, kv) = (model.cfg.num_hidden_layers, model.cfg.kv_dim());
        let shape = (layers, kv, model.max_len);
        let pages = KvPages::new(model.gpu.clone(), model.kv_dtype(), shape, (capacity, 0))?;
        drop(std::mem::replace(&mut model.caches, KvCaches::F32 { k: Vec::new(), v: Vec::new() }));
        let pool = (0..max_seqs).map(|_| pages.reserve().map(SeqCaches::Paged)).collect::<Result<Vec<_>>>()?;
        Self::with_pool(model, max_seqs, pool, Some(pages))
    }

    fn with_pool(
        mut model: CudaQwen3,
        max_seqs: usize,
        pool: Vec<SeqCaches>,
        pages: Option<KvPages>,
    ) -> Result<CudaBatch> {
        let layers = model.cfg.num_hidden_layers;
        let step_in = model.arena.zeros::<u32>(3 * CHUNK).map_err(drv)?;
        // A step's sequences attend in one launch per kernel (layers::step_segments).
        let m = &mut model;
        m.scratch.reserve_segments(&m.arena, &m.gpu, &m.cfg, layers, max_seqs.min(CHUNK))?;
        model.len = 0;
        Ok(CudaBatch { model, seqs: Vec::new(), pool, pages, max_seqs, step_in })
    }

    /// Bytes of device memory the pages take (`None`: contiguous caches).
    pub fn kv_page_bytes(&self) -> Option<usize> {
        self.pages.as_ref().map(KvPages::bytes)
    }

    /// Pages free now (`None`: contiguous caches).
    pub fn kv_pages_free(&self) -> Option<usize> {
        self.pages.as_ref().map(KvPages::free)
    }

    /// Maps pages into sequence `id` until it holds `positions` (paged caches only).
    fn cover(&mut self, id: SeqId, positions: usize) -> Result<()> {
        let seq = slot_mut(&mut self.seqs, id)?;
        match (&mut self.pages, &mut seq.caches) {
            (Some(p), SeqCaches::Paged(v)) => p.cover(v, positions),
            _ => Ok(()),
        }
    }

    /// Unmaps sequence `id`'s pages past `positions` (paged caches only).
    fn shrink(&mut self, id: SeqId, positions: usize) -> Result<()> {
        let seq = slot_mut(&mut self.seqs, id)?;
        match (&mut self.pages, &mut seq.caches) {
            (Some(p), SeqCaches::Paged(v)) => p.shrink(v, positions),
            _ => Ok(()),
        }
    }

    /// The model (with no sequence's caches in it).
    pub fn model(&mut self) -> &mut CudaQwen3 {
        &mut self.model
    }

    fn seq(&mut self, id: SeqId) -> Result<&mut SeqKv> {
        slot_mut(&mut self.seqs, id)
    }

    /// Runs `f` on the model with sequence `id`'s caches swapped in.
    fn alone<R>(&mut self, id: SeqId, f: impl FnOnce(&mut CudaQwen3) -> Result<R>) -> Result<R> {
        let seq = slot_mut(&mut self.seqs, id)?;
        std::mem::swap(&mut self.model.caches, seq.caches.caches());
        self.model.len = seq.len;
        let out = f(&mut self.model);
        seq.len = self.model.len;
        std::mem::swap(&mut self.model.caches, seq.caches.caches());
        self.model.len = 0;
        out
    }

    /// A result's device captures copied to the host (another forward is about to overwrite
    /// their buffer before the draft reads them).
    fn to_host(&self, g: Greedy) -> Result<Greedy> {
        let captured = Captured::Host(self.host_captures(&g.captured)?);
        Ok(Greedy { ids: g.ids, captured })
    }

    /// The rows `captured` names, on the host (tests compare them with a sequence run alone).
    pub fn host_captures(&self, captured: &Captured) -> Result<Vec<f32>> {
        let d = match captured {
            Captured::Host(v) => return Ok(v.clone()),
            Captured::Device(d) => d,
        };
        let row = self.model.capture.len() * self.model.cfg.hidden_size;
        let shared = match &self.model.prefill {
            Some(pf) if handoff_id(&pf.captured) == d.buffer => pf.captured.clone(),
            _ => self.model.captured.clone(),
        };
        let cap = shared.lock().map_err(|_| Error::Request("capture buffer poisoned".into()))?;
        if d.generation != cap.generation || d.buffer != handoff_id(&shared) {
            return Err(Error::Request("device captures are stale: read them before the next forward".into()));
        }
        let mut host = vec![0f32; d.rows * row];
        let rows = cap.data.slice(d.first * row..(d.first + d.rows) * row);
        self.model.gpu.stream.memcpy_dtoh(&rows, &mut host).map_err(drv)?;
        Ok(host)
    }

    /// One step over `items` (indices into `all`, at most [`CHUNK`] rows in total); the items
    /// with `logits[i]` also get their rows' logits on the host.
    fn step(
        &mut self,
        all: &[(SeqId, &[u32], LogitRows)],
        items: &[usize],
        logits: &[bool],
    ) -> Result<Vec<(Greedy, Vec<f32>)>> {
        let m = &mut self.model;
        let gpu = m.gpu.clone();
        let (h, v) = (m.cfg.hidden_size, m.cfg.vocab_size);
        let n: usize = items.iter().map(|&i| all[i].1.len()).sum();
        let s_count = items.len();
        // Positions of every item, then the ids, in one copy (which also orders the step after
        // every earlier kernel, as `run_step`'s does).
        let mut up = Vec::with_capacity(2 * s_count + n);
        for &i in items {
            let seq = self.seqs[all[i].0].as_ref().ok_or_else(|| Error::Request("sequence closed".into()))?;
            up.extend_from_slice(&[seq.len as u32, (seq.len + all[i].1.len()) as u32]);
        }
        for &i in items {
            up.extend_from_slice(all[i].1);
        }
        gpu.stream.memcpy_htod(&up, &mut self.step_in.slice_mut(..up.len())).map_err(drv)?;
        let ids_at = 2 * s_count;
        gpu.embedding(&*m.embed_tokens, h, &self.step_in.slice(ids_at..ids_at + n), n, &mut m.x.slice_mut(..n * h))
            .map_err(gpu_err)?;
        // The first row whose logits an item wants: rows from there to n get them.
        let (mut at, mut from) = (0, n);
        for &i in items {
            let len = all[i].1.len();
            let first = match all[i].2 {
                LogitRows::All => at,
                LogitRows::Last => at + len - 1,
            };
            from = from.min(first);
            at += len;
        }
        let shared = m.captured.clone();
        let mut cap = shared.lock().map_err(|_| Error::Request("capture buffer poisoned".into()))?;
        cap.generation += 1;
        let generation = cap.generation;
        let t = m.capture.len();
        let capture = &m.capture;
        // Each item's segment: its rows, its positions, its caches (disjoint borrows of seqs).
        let mut segments = Vec::with_capacity(s_count);
        let ids: Vec<SeqId> = items.iter().map(|&i| all[i].0).collect();
        let mut owned: Vec<(usize, &mut SeqKv)> =
            slots_mut(&mut self.seqs, &ids, "step")?.into_iter().enumerate().collect();
        let mut start = 0;
        for (k, seq) in owned.iter_mut() {
            let rows = all[items[*k]].1.len();
            let lens =
                StepLens { dev: self.step_in.slice(2 * *k..2 * *k + 2), first_pos: seq.len, kv_cap: seq.len + rows };
            segments.push(Segment { start, rows, lens, caches: seq.caches.caches().layers_mut() });
            start += rows;
        }
        let normed = run_layers(
            &gpu,
            &m.cfg,
            &m.layers,
            &mut m.scratch,
            &mut m.x.slice_mut(..n * h),
            (n, true),
            &m.inv_freq,
            &mut segments,
            Some(&m.norm),
            |l, x| capture_layer(&gpu, capture, l, &x.as_view(), (n, h), &mut cap.data),
        )?;
        drop(segments);
        drop(cap);
        let rows = m.head_logits(normed, from, n)?;
        gpu.argmax_split(
            &m.logits.slice(..rows * v),
            v,
            v,
            rows,
            &mut m.next_ids.slice_mut(..rows),
            &mut m.scratch.ops,
        )
        .map_err(gpu_err)?;
        let mut ids = vec![0u32; rows];
        gpu.stream.memcpy_dtoh(&m.next_ids.slice(..rows), &mut ids).map_err(drv)?;
        let mut out = Vec::with_capacity(s_count);
        let mut start = 0;
        for (k, seq) in owned {
            let (_, tokens, want) = all[items[k]];
            let len = tokens.len();
            let (first, picked) = match want {
                LogitRows::All => (start - from, ids[start - from..start + len - from].to_vec()),
                LogitRows::Last => (start + len - 1 - from, vec![ids[start + len - 1 - from]]),
            };
            let mut host = Vec::new();
            if logits[items[k]] {
                host = vec![0f32; picked.len() * v];
                let rows = m.logits.slice(first * v..(first + picked.len()) * v);
                gpu.stream.memcpy_dtoh(&rows, &mut host).map_err(drv)?;
            }
            let captured = if t == 0 {
                Captured::Host(Vec::new())
            } else {
                Captured::Device(DeviceRows { buffer: handoff_id(&shared), generation, first: start, rows: len })
            };
            seq.len += len;
            out.push((Greedy { ids: picked, captured }, host));
            start += len;
        }
        Ok(out)
    }
}

impl BatchTarget for CudaBatch {
    fn config(&self) -> &Qwen3Config {
        &self.model.cfg
    }

    fn max_len(&self) -> usize {
        self.model.max_len
    }

    /// The pages of a paged batch; contiguous caches have no shared pages to bound.
    fn kv_budget(&self) -> Option<crate::batch::KvBudget> {
        self.pages.as_ref().map(KvPages::budget)
    }

    fn prefill_chunk(&self) -> usize {
        self.model.prefill_chunk()
    }

    fn open(&mut self) -> Result<SeqId> {
        let caches = self.pool.pop().ok_or_else(|| {
            Error::Request(format!("all {} sequences' K/V caches are in use (the batch's size)", self.max_seqs))
        })?;
        Ok(open_slot(&mut self.seqs, SeqKv { caches, len: 0 }))
    }

    fn close(&mut self, id: SeqId) -> Result<()> {
        self.shrink(id, 0)?;
        let seq = close_slot(&mut self.seqs, id)?;
        self.pool.push(seq.caches);
        Ok(())
    }

    fn seq_len(&mut self, id: SeqId) -> Result<usize> {
        Ok(self.seq(id)?.len)
    }

    fn truncate(&mut self, id: SeqId, len: usize) -> Result<()> {
        let seq = self.seq(id)?;
        check_truncate(seq.len, len)?;
        seq.len = len;
        self.shrink(id, len)
    }

    fn set_capture(&mut self, layers: &[usize]) -> Result<()> {
        self.model.set_capture(layers)
    }

    /// On paged caches the sequence gets every page free (up to `max_len`) for the call, and
    /// the model's `max_len` is what they hold, so a plain loop stops at a clear "context full"
    /// rather than past its pages; the pages past its length are unmapped after.
    fn with_target(&mut self, id: SeqId, f: &mut dyn FnMut(&mut dyn TargetModel) -> Result<()>) -> Result<()> {
        let max_len = self.model.max_len;
        if let Some((page, free)) = self.pages.as_ref().map(|p| (p.budget().page, p.free())) {
            let held = self.seq(id)?.len;
            let reach = ((held.div_ceil(page) + free) * page).min(max_len);
            self.cover(id, reach)?;
            self.model.max_len = reach;
        }
        let out = self.alone(id, |m| f(m));
        self.model.max_len = max_len;
        let len = self.seq(id)?.len;
        out.and(self.shrink(id, len))
    }

    fn forward_batch(&mut self, items: &[(SeqId, &[u32], LogitRows)]) -> Result<Vec<Greedy>> {
        Ok(self.run(items, &vec![false; items.len()])?.into_iter().map(|(g, _)| g).collect())
    }

    fn forward_batch_logits(
        &mut self,
        items: &[(SeqId, &[u32], LogitRows)],
        logits: &[bool],
    ) -> Result<Vec<(Greedy, Vec<f32>)>> {
        check_logit_flags(items.len(), logits)?;
        self.run(items, logits)
    }
}

impl CudaBatch {
    /// The batched forward (see the module docs); items with `logits[i]` get their rows'
    /// logits on the host.
    fn run(&mut self, items: &[(SeqId, &[u32], LogitRows)], logits: &[bool]) -> Result<Vec<(Greedy, Vec<f32>)>> {
        let (cfg, max_len) = (self.model.cfg.clone(), self.model.max_len);
        for (k, &(id, tokens, _)) in items.iter().enumerate() {
            if items[..k].iter().any(|it| it.0 == id) {
                return Err(Error::Request(format!("sequence {id} appears twice in one forward")));
            }
            let len = self.seq(id)?.len;
            check_forward(&cfg, len, max_len, tokens)?;
        }
        // Paged caches: every item's rows get their pages before anything runs.
        for &(id, tokens, _) in items {
            let len = self.seq(id)?.len;
            self.cover(id, len + tokens.len())?;
        }
        let mut out: Vec<Option<(Greedy, Vec<f32>)>> = vec![None; items.len()];
        // Prompts longer than a step run alone (the GEMM prefill); a later one overwrites the
        // prefill's capture buffer, so every one but the last hands its captures over the host.
        let long: Vec<usize> = (0..items.len()).filter(|&i| items[i].1.len() > CHUNK).collect();
        for (j, &i) in long.iter().enumerate() {
            let (id, tokens, rows) = items[i];
            if logits[i] {
                // Logits to the host: the plain forward (captures to the host as well).
                let f = self.alone(id, |m| m.forward(tokens, rows))?;
                out[i] = Some(greedy_of(f, cfg.vocab_size));
                continue;
            }
            let g = self.alone(id, |m| m.forward_greedy(tokens, rows))?;
            out[i] = Some((if j + 1 < long.len() { self.to_host(g)? } else { g }, Vec::new()));
        }
        // The rest in steps of up to CHUNK rows, in order; all but the last step's captures go
        // to the host for the same reason.
        let mut steps: Vec<Vec<usize>> = Vec::new();
        let mut rows = CHUNK;
        for i in (0..items.len()).filter(|&i| items[i].1.len() <= CHUNK) {
            let len = items[i].1.len();
            if rows + len > CHUNK {
                steps.push(Vec::new());
                rows = 0;
            }
            rows += len;
            if let Some(step) = steps.last_mut() {
                step.push(i);
            }
        }
        let last = steps.len().saturating_sub(1);
        for (si, step) in steps.iter().enumerate() {
            let got = self.step(items, step, logits)?;
            for (&i, (g, l)) in step.iter().zip(got) {
                out[i] = Some((if si < last { self.to_host(g)? } else { g }, l));
            }
        }
        out.into_iter().map(|g| g.ok_or_else(|| Error::Request("an item of the batch was not run".into()))).collect()
    }
}
