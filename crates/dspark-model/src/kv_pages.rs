//! Paged KV positions: the allocator that lets many sequences share one cache (issue #30).
//!
//! A KV cache of a batch holds, per layer, the keys and values of every position of every
//! sequence. Giving each sequence a contiguous slot of the model's whole context wastes what
//! its request never reaches, and fixes how many sequences fit. Paging — vLLM's PagedAttention,
//! llama.cpp's KV cells, TGI's blocks — cuts the storage into pages of `page` positions instead:
//!
//! ```text
//! storage, per layer:  [page 0][page 1][page 2] ... [page P-1]      each page × row values
//! a sequence:          table = [5, 0, 9]     position j lives in page table[j / page],
//!                                            row j % page of it
//! ```
//!
//! A sequence takes pages as it grows ([`PagePool::cover`]), gives back the whole pages past
//! its length when it is rolled back ([`PagePool::shrink`], a rejected verify), and all of them
//! when it ends or is cancelled ([`PagePool::release`]). A position is read only after it was
//! written, so a page comes back into use without being cleared.
//!
//! This module owns only page ids; the storage is the backend's (the CPU reference's
//! [`KvCache`](crate::cpu::kv_cache::KvCache)). A pool is *bounded* — `pages` of them, planned
//! at start-up from `--kv-capacity` — or *growable*, adding a page whenever none is free (a
//! single sequence's cache, as before paging). A bounded pool out of pages is an error naming
//! the capacity; the batched scheduler admits a request only when its reservation fits, so a
//! running request never meets it.

use crate::{Error, Result};

/// Positions a page holds unless a pool is made with another size (vLLM's default block).
pub const DEFAULT_PAGE: usize = 16;

/// One sequence's pages, in position order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pages {
    ids: Vec<u32>,
}

impl Pages {
    /// The page ids, in position order (position j lives in `ids()[j / page]`).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// The page ids of one cache: which are free, and how many exist (see the module docs).
#[derive(Clone, Debug)]
pub struct PagePool {
    page: usize,
    /// Pages that exist (a growable pool's storage holds this many).
    total: usize,
    /// Free ids; the next one taken is the last.
    free: Vec<u32>,
    bounded: bool,
}

impl PagePool {
    /// A pool of exactly `pages` pages of `page` positions.
    pub fn bounded(page: usize, pages: usize) -> Result<PagePool> {
        check_page(page)?;
        if pages == 0 || pages > u32::MAX as usize {
            return Err(Error::Request(format!("a KV pool of {pages} pages: 1 ..= {} are possible", u32::MAX)));
        }
        // Reversed so that the first pages taken are 0, 1, 2, ...
        let free = (0..pages as u32).rev().collect();
        Ok(PagePool { page, total: pages, free, bounded: true })
    }

    /// A pool that adds a page whenever none is free.
    pub fn growable(page: usize) -> Result<PagePool> {
        check_page(page)?;
        Ok(PagePool { page, total: 0, free: Vec::new(), bounded: false })
    }

    /// Positions per page.
    pub fn page(&self) -> usize {
        self.page
    }

    /// Pages that exist: a backend's storage must hold this many after [`PagePool::cover`].
    pub fn total(&self) -> usize {
        self.total
    }

    /// Pages no sequence holds.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    pub fn is_bounded(&self) -> bool {
        self.bounded
    }

    /// Pages `positions` positions take.
    pub fn pages_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.page)
    }

    /// Gives `table` the pages it needs to hold `positions` positions (a bounded pool out of
    /// pages: an error, `table` unchanged).
    pub fn cover(&mut self, table: &mut Pages, positions: usize) -> Result<()> {
        let need = self.pages_for(positions).saturating_sub(table.len());
        if need == 0 {
            return Ok(());
        }
        if self.bounded && need > self.free.len() {
            return Err(Error::Request(format!(
                "the KV cache is full: {need} more pages of {} positions wanted, {} of {} free (--kv-capacity)",
                self.page,
                self.free.len(),
                self.total
            )));
        }
        for _ in 0..need {
            let id = match self.free.pop() {
                Some(id) => id,
                None => {
                    let id = u32::try_from(self.total)
                        .map_err(|_| Error::Request("the KV cache has 2^32 pages already".into()))?;
                    self.total += 1;
                    id
                }
            };
            table.ids.push(id);
        }
        Ok(())
    }

    /// Frees the pages of `table` past those `positions` positions take; returns the freed ids
    /// (a backend may poison them).
    pub fn shrink(&mut self, table: &mut Pages, positions: usize) -> Vec<u32> {
        let keep = self.pages_for(positions).min(table.len());
        let freed = table.ids.split_off(keep);
        // Freed in reverse so that the next sequence to grow takes them in their old order.
        self.free.extend(freed.iter().rev());
        freed
    }

    /// Frees every page of `table`; returns the freed ids.
    pub fn release(&mut self, mut table: Pages) -> Vec<u32> {
        self.shrink(&mut table, 0)
    }
}

fn check_page(page: usize) -> Result<()> {
    if page == 0 || page > 1 << 20 {
        return Err(Error::Request(format!("a KV page of {page} positions: 1 ..= 2^20 are possible")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{PagePool, Pages};
    use proptest::prelude::*;

    #[test]
    fn pages_come_in_order_go_back_whole_and_a_full_pool_names_the_capacity() {
        let mut pool = PagePool::bounded(4, 3).map_err(|e| e.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let (mut a, mut b) = (Pages::default(), Pages::default());
        assert!(pool.cover(&mut a, 5).is_ok());
        assert_eq!(a.ids(), [0, 1], "5 positions take 2 pages of 4");
        assert!(pool.cover(&mut a, 8).is_ok());
        assert_eq!(a.ids(), [0, 1], "8 still fit");
        let full = pool.cover(&mut b, 9).map_err(|e| e.to_string());
        assert!(
            full.as_ref().is_err_and(|e| e.contains("3 more pages of 4 positions wanted, 1 of 3 free")),
            "{full:?}"
        );
        assert!(b.is_empty(), "a failed cover takes nothing");
        assert_eq!(pool.shrink(&mut a, 3), [1]);
        assert_eq!((a.ids(), pool.free()), (&[0u32][..], 2));
        assert!(pool.cover(&mut b, 8).is_ok());
        assert_eq!(b.ids(), [1, 2], "the freed page first, then the never used one");
        assert_eq!(pool.release(std::mem::take(&mut b)), [1, 2]);
        assert_eq!(pool.free(), 2);
    }

    proptest! {
        /// Random covers, shrinks and releases over several tables: no page is in two tables,
        /// every page is held or free, a bounded pool never grows and a growable one only when
        /// nothing is free, and every table holds exactly the pages its length takes.
        #[test]
        fn pages_are_never_shared_or_lost(
            bounded in any::<bool>(),
            page in 1usize..6,
            ops in proptest::collection::vec((0usize..4, 0u8..3, 0usize..40), 1..120),
        ) {
            let mut pool = if bounded { PagePool::bounded(page, 12) } else { PagePool::growable(page) }
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut tables = vec![(Pages::default(), 0usize); 4];
            for (t, op, n) in ops {
                let before = pool.total();
                let (table, len) = &mut tables[t];
                match op {
                    0 => {
                        let free = pool.free();
                        match pool.cover(table, n) {
                            Ok(()) => *len = (*len).max(n),
                            Err(_) => prop_assert!(bounded && pool.pages_for(n).saturating_sub(table.len()) > free),
                        }
                    }
                    1 => {
                        pool.shrink(table, n.min(*len));
                        *len = n.min(*len);
                    }
                    _ => {
                        pool.release(std::mem::take(table));
                        *len = 0;
                    }
                }
                prop_assert!(!bounded || pool.total() == 12);
                prop_assert!(pool.total() == before || pool.free() == 0, "grew with pages free");
                let mut seen = vec![false; pool.total()];
                for id in tables.iter().flat_map(|(t, _)| t.ids()).chain(&pool.free) {
                    prop_assert!(!std::mem::replace(&mut seen[*id as usize], true), "page {id} twice");
                }
                prop_assert!(seen.iter().all(|&s| s), "a page is lost");
                for (table, len) in &tables {
                    prop_assert_eq!(table.len(), pool.pages_for(*len));
                }
            }
        }
    }
}
