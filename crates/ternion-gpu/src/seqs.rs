//! Sequences of a [`GpuModel`](super::GpuModel) and the pages of its KV caches.
//!
//! The GPU caches are paged like the CPU's ([`crate::kv`]): every layer's keys and values
//! live in one buffer of `capacity` pages of [`PAGE_POSITIONS`] positions, and each sequence
//! slot has a page table (the page ids it owns, in position order) that the kernels read.
//! This module is the host side: which slots and pages are taken. A [`GpuSeq`] handle owns
//! one slot; dropping it (or truncating it) gives its pages back at once, so a server that
//! drops a cancelled sequence frees its cache without touching the model.
//!
//! [`GpuSeq::fork`] opens a slot sharing another's pages (a prompt evaluated once for
//! several choices). A page held by several slots is copy-on-write: before a slot writes
//! into it, [`KvTable::reserve`] gives the slot a fresh page and queues the copy, which the
//! next step records before its kernels ([`KvTable::take_copies`]).

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
    /// Slots holding each page.
    refs: Vec<u32>,
    /// Whole pages to copy (from, to) before the next step's kernels.
    copies: Vec<(u32, u32)>,
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
            refs: vec![0; pages],
            copies: Vec::new(),
        }))
    }

    /// Opens a slot holding the positions of `from`'s slot, in the same pages.
    fn fork(table: &Arc<Mutex<KvTable>>, from: u32) -> Result<GpuSeq> {
        let seq = KvTable::open(table)?;
        let mut t = lock(table);
        let src = &t.slots[from as usize];
        let len = src.len;
        let pages = src.pages[..len.div_ceil(PAGE_POSITIONS)].to_vec();
        for &p in &pages {
            t.refs[p as usize] += 1;
        }
        let slot = &mut t.slots[seq.slot as usize];
        (slot.pages, slot.len) = (pages, len);
        Ok(seq)
    }

    /// The indices of `slot`'s pages, among the first `want`, that positions from its
    /// length on fall in and another slot holds too (`refs`: the holders of each page).
    fn shared<'a>(
        refs: &'a [u32],
        slot: &'a Slot,
        want: usize,
    ) -> impl Iterator<Item = usize> + 'a {
        (slot.len / PAGE_POSITIONS..want.min(slot.pages.len()))
            .filter(move |&i| refs[slot.pages[i] as usize] > 1)
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

    /// Pages the tokens of each `(slot, tokens)` need beyond those their slots own, with a
    /// copy of each shared page they write into: a page written by w of its r holders
    /// takes w copies, or w − 1 when all of them write (the last one writes in place, as
    /// [`KvTable::reserve`] does).
    fn pages_needed(&self, grow: &[(u32, &[u32])]) -> usize {
        // One entry per (writer, shared page); empty, so no allocation, without forks.
        let mut writes: Vec<u32> = Vec::new();
        let fresh: usize = grow
            .iter()
            .map(|&(s, tokens)| {
                let slot = &self.slots[s as usize];
                let want = (slot.len + tokens.len()).div_ceil(PAGE_POSITIONS);
                writes.extend(Self::shared(&self.refs, slot, want).map(|i| slot.pages[i]));
                want.saturating_sub(slot.pages.len())
            })
            .sum();
        writes.sort_unstable();
        let copies: usize = writes
            .chunk_by(|a, b| a == b)
            .map(|w| w.len() - usize::from(w.len() >= self.refs[w[0] as usize] as usize))
            .sum();
        fresh + copies
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
            let first = self.slots[s as usize].len / PAGE_POSITIONS;
            for i in first..want.min(self.slots[s as usize].pages.len()) {
                if self.refs[self.slots[s as usize].pages[i] as usize] < 2 {
                    continue;
                }
                let Some(to) = self.free_pages.pop() else {
                    break;
                };
                let slot = &mut self.slots[s as usize];
                let from = std::mem::replace(&mut slot.pages[i], to);
                slot.dirty = true;
                self.refs[from as usize] -= 1;
                self.refs[to as usize] = 1;
                self.copies.push((from, to));
            }
            while self.slots[s as usize].pages.len() < want {
                let Some(p) = self.free_pages.pop() else {
                    break;
                };
                self.refs[p as usize] = 1;
                let slot = &mut self.slots[s as usize];
                slot.pages.push(p);
                slot.dirty = true;
            }
        }
        Ok(())
    }

    /// The page copies queued by [`KvTable::reserve`], to record before the step's kernels.
    pub(crate) fn take_copies(&mut self) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.copies)
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
            for p in s.pages.drain(keep..).rev() {
                self.refs[p as usize] -= 1;
                if self.refs[p as usize] == 0 {
                    self.free_pages.push(p);
                }
            }
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

    /// A new sequence holding this one's positions in the same pages (copied only when
    /// one of them writes into a shared page); fails when no slot is free.
    pub fn fork(&self) -> Result<GpuSeq> {
        KvTable::fork(&self.table, self.slot)
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

    #[test]
    fn forks_share_pages_and_copy_the_one_they_write() {
        let t = KvTable::new(3, 6, 4 * PAGE_POSITIONS);
        let a = KvTable::open(&t).unwrap();
        let tokens = [0u32; 70];
        lock(&t).reserve(&[(a.slot(), &tokens)]).unwrap();
        lock(&t).advance(a.slot(), 70);
        let b = a.fork().unwrap();
        let c = b.fork().unwrap();
        assert!(a.fork().is_err(), "three slots only");
        assert_eq!((c.len(), lock(&t).pages_in_use()), (70, 3));
        let one = &tokens[..1];
        let parts = [(a.slot(), one), (b.slot(), one), (c.slot(), one)];
        lock(&t).reserve(&parts).unwrap();
        let mut table = lock(&t);
        assert_eq!(
            table.take_copies(),
            [(2, 3), (2, 4)],
            "a and b copy page 2; c keeps it"
        );
        assert!(table.take_copies().is_empty());
        assert_eq!(table.pages_in_use(), 5);
        assert_eq!(table.free_pages.len(), 1);
        let ids = |s: &GpuSeq| table.slots[s.slot() as usize].pages.clone();
        assert_eq!(
            (ids(&a), ids(&b), ids(&c)),
            (vec![0, 1, 3], vec![0, 1, 4], vec![0, 1, 2])
        );
        drop(table);
        drop(a);
        drop(c);
        assert_eq!(lock(&t).pages_in_use(), 3, "b holds pages 0, 1 and 4");
        drop(b);
        assert_eq!(lock(&t).pages_in_use(), 0);
    }

    #[test]
    fn the_last_holder_of_a_shared_page_needs_no_copy() {
        // Three holders of 3 pages all write into the shared last one: 2 copies, so a pool
        // of 5 is enough and one of 4 is short by exactly one page.
        for (pages, ok) in [(5, true), (4, false)] {
            let t = KvTable::new(3, pages, 4 * PAGE_POSITIONS);
            let a = KvTable::open(&t).unwrap();
            let tokens = [0u32; 70];
            lock(&t).reserve(&[(a.slot(), &tokens)]).unwrap();
            lock(&t).advance(a.slot(), 70);
            let (b, c) = (a.fork().unwrap(), a.fork().unwrap());
            let one = &tokens[..1];
            let parts = [(a.slot(), one), (b.slot(), one), (c.slot(), one)];
            let mut table = lock(&t);
            assert_eq!(table.pages_needed(&parts), 2);
            match table.reserve(&parts) {
                Ok(()) => assert!(ok && table.free_pages.is_empty()),
                Err(Error::KvPoolExhausted { need, free, .. }) => {
                    assert!(!ok);
                    assert_eq!((need, free), (2, 1));
                }
                Err(e) => panic!("unexpected error {e}"),
            }
        }
    }
}
