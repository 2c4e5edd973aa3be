//! Sequences of a [`GpuModel`](super::GpuModel) and the pages of its KV caches.
//!
//! The GPU caches are paged like the CPU's ([`crate::kv`]): every layer's keys and values
//! live in one buffer of `capacity` pages of [`PAGE_POSITIONS`] positions, and each sequence
//! slot has a page table (the page ids it owns, in position order) that the kernels read.
//! This module is the host side: which slots and pages are taken. A [`GpuSeq`] handle owns
//! one slot; dropping it (or truncating it) gives its pages back at once, so a server that
//! drops a cancelled sequence frees its cache without touching the model.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::kv::PAGE_POSITIONS;
use crate::{Error, Result};

/// One slot's pages and length.
#[derive(Default)]
struct Slot {
    taken: bool,
    pages: Vec<u32>,
    len: usize,
    /// The page table changed since it was last written to the GPU.
    dirty: bool,
}

/// Every slot and the free pages.
pub(crate) struct KvTable {
    slots: Vec<Slot>,
    free_pages: Vec<u32>,
    capacity: usize,
    n_ctx: usize,
}

impl KvTable {
    /// `slots` sequence slots of up to `n_ctx` positions sharing `pages` pages.
    pub(crate) fn new(slots: usize, pages: usize, n_ctx: usize) -> Arc<Mutex<KvTable>> {
        let pages = pages.min(u32::MAX as usize);
        Arc::new(Mutex::new(KvTable {
            slots: (0..slots).map(|_| Slot::default()).collect(),
            // Popped from the end: page 0 is handed out first.
            free_pages: (0..pages as u32).rev().collect(),
            capacity: pages,
            n_ctx,
        }))
    }

    /// Takes a free slot.
    pub(crate) fn open(table: &Arc<Mutex<KvTable>>) -> Result<GpuSeq> {
        let mut t = lock(table);
        let n = t.slots.len();
        let Some(slot) = t.slots.iter().position(|s| !s.taken) else {
            return Err(Error::Request(format!(
                "all {n} GPU sequence slots are in use"
            )));
        };
        t.slots[slot] = Slot {
            taken: true,
            dirty: true,
            ..Slot::default()
        };
        Ok(GpuSeq {
            slot: slot as u32,
            table: table.clone(),
        })
    }

    /// Positions filled in `slot`.
    pub(crate) fn len(&self, slot: u32) -> usize {
        self.slots[slot as usize].len
    }

    /// Pages the tokens of each `(slot, tokens)` need beyond those their slots own.
    fn pages_needed(&self, grow: &[(u32, &[u32])]) -> usize {
        grow.iter()
            .map(|&(s, tokens)| {
                let slot = &self.slots[s as usize];
                (slot.len + tokens.len())
                    .div_ceil(PAGE_POSITIONS)
                    .saturating_sub(slot.pages.len())
            })
            .sum()
    }

    /// Makes room for the tokens of each `(slot, tokens)` (a step's parts): every page or
    /// none (a typed error when the pool is short).
    pub(crate) fn reserve(&mut self, grow: &[(u32, &[u32])]) -> Result<()> {
        let need = self.pages_needed(grow);
        if need > self.free_pages.len() {
            return Err(Error::KvPoolExhausted {
                need,
                free: self.free_pages.len(),
                capacity: self.capacity,
            });
        }
        for &(s, tokens) in grow {
            let want = (self.slots[s as usize].len + tokens.len()).div_ceil(PAGE_POSITIONS);
            while self.slots[s as usize].pages.len() < want {
                let Some(p) = self.free_pages.pop() else {
                    break;
                };
                let slot = &mut self.slots[s as usize];
                slot.pages.push(p);
                slot.dirty = true;
            }
        }
        Ok(())
    }

    /// Records that `n` positions were added to `slot`.
    pub(crate) fn advance(&mut self, slot: u32, n: usize) {
        let s = &mut self.slots[slot as usize];
        s.len = (s.len + n).min(self.n_ctx);
    }

    /// The page table of `slot` if it changed since the last call (marks it written).
    pub(crate) fn take_dirty(&mut self, slot: u32) -> Option<&[u32]> {
        let s = &mut self.slots[slot as usize];
        if !s.dirty {
            return None;
        }
        s.dirty = false;
        Some(&s.pages)
    }

    fn truncate(&mut self, slot: u32, len: usize) {
        let s = &mut self.slots[slot as usize];
        s.len = s.len.min(len);
        let keep = s.len.div_ceil(PAGE_POSITIONS);
        if s.pages.len() > keep {
            self.free_pages.extend(s.pages.drain(keep..).rev());
            s.dirty = true;
        }
    }

    fn close(&mut self, slot: u32) {
        self.truncate(slot, 0);
        self.slots[slot as usize].taken = false;
    }

    /// Pages held by sequences.
    pub(crate) fn pages_in_use(&self) -> usize {
        self.capacity - self.free_pages.len()
    }

    /// Pages in the pool.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

pub(crate) fn lock(table: &Mutex<KvTable>) -> MutexGuard<'_, KvTable> {
    table.lock().unwrap_or_else(|p| p.into_inner())
}

/// One sequence of a [`GpuModel`](super::GpuModel): a slot with its own page table in the
/// model's KV caches. Made by [`GpuModel::new_seq`](super::GpuModel::new_seq); dropping it
/// frees the slot and returns its pages.
pub struct GpuSeq {
    slot: u32,
    table: Arc<Mutex<KvTable>>,
}

impl GpuSeq {
    /// The slot (page-table row) this sequence owns.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Positions in its cache.
    pub fn len(&self) -> usize {
        lock(&self.table).len(self.slot)
    }

    /// True when nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every position after the first `len`; pages past them go back to the pool.
    pub fn truncate(&self, len: usize) {
        lock(&self.table).truncate(self.slot, len);
    }

    /// True when this handle belongs to the model whose table is `table`.
    pub(crate) fn belongs_to(&self, table: &Arc<Mutex<KvTable>>) -> bool {
        Arc::ptr_eq(&self.table, table)
    }
}

impl Drop for GpuSeq {
    fn drop(&mut self) {
        lock(&self.table).close(self.slot);
    }
}

impl std::fmt::Debug for GpuSeq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSeq")
            .field("slot", &self.slot)
            .field("len", &self.len())
            .finish()
    }
}

/// One sequence's part of a multi-sequence step: its handle and the tokens to add.
pub struct GpuSeqStep<'a> {
    /// The sequence.
    pub seq: &'a GpuSeq,
    /// Tokens at the positions after those cached (at least one).
    pub tokens: &'a [u32],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_come_and_go_with_sequences() {
        let t = KvTable::new(2, 5, 4 * PAGE_POSITIONS);
        let a = KvTable::open(&t).unwrap();
        let b = KvTable::open(&t).unwrap();
        assert!(KvTable::open(&t).is_err(), "two slots only");
        let tokens = [0u32; 128];
        let n = |len: usize| &tokens[..len];
        lock(&t)
            .reserve(&[(a.slot(), n(40)), (b.slot(), n(1))])
            .unwrap();
        assert_eq!(lock(&t).pages_in_use(), 3);
        // All or nothing: 3 more pages for `a` and 1 for `b` exceed the 2 left.
        lock(&t).advance(a.slot(), 40);
        lock(&t).advance(b.slot(), 1);
        let err = lock(&t)
            .reserve(&[(a.slot(), n(88)), (b.slot(), n(40))])
            .unwrap_err();
        assert!(matches!(
            err,
            Error::KvPoolExhausted {
                need: 3,
                free: 2,
                capacity: 5
            }
        ));
        assert_eq!(lock(&t).pages_in_use(), 3);
        a.truncate(33);
        assert_eq!((a.len(), lock(&t).pages_in_use()), (33, 3));
        a.truncate(32);
        assert_eq!((a.len(), lock(&t).pages_in_use()), (32, 2));
        drop(a);
        assert_eq!(lock(&t).pages_in_use(), 1);
        let c = KvTable::open(&t).unwrap();
        assert_eq!(c.len(), 0, "a reopened slot starts empty");
        drop(b);
        drop(c);
        assert_eq!(lock(&t).pages_in_use(), 0);
    }
}
