//! The slots of an executor's KV cache, as every device keeps them: what a sequence's cache
//! holds ([`SeqCache`]: a cursor over a [`KvLayout`]), a device's cursor into its own storage
//! ([`SlotKv`]) and the bookkeeping of a set of slots ([`Slots`]: lengths, rollbacks, resets,
//! a prefix taken over from another slot). The storage itself is the device's.

use std::ops::{Deref, DerefMut};

use super::layout::Cursor;
use super::{KvCache, KvLayout, KvOverflow, KvWindowError};

/// What the forward pass reads of a sequence's cache: its cursor. The storage behind it is
/// the backend's.
pub trait SeqCache {
    /// Positions held (the next token goes to position `len`).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Refuse `n` more positions past the capacity.
    fn check_fits(&self, n: usize) -> Result<(), KvOverflow>;
    /// Refuse `n` more positions that sliding-window rings could not hold beside the window.
    fn check_window(&self, n: usize) -> Result<(), KvWindowError>;
    /// Commit `n` positions written by the pass.
    fn advance(&mut self, n: usize) -> Result<(), KvOverflow>;
    /// Keep the first `n` positions; returns how many are kept.
    fn rollback(&mut self, n: usize) -> usize;
    /// Forget every position.
    fn reset(&mut self);
}

impl SeqCache for KvCache {
    fn len(&self) -> usize {
        KvCache::len(self)
    }
    fn check_fits(&self, n: usize) -> Result<(), KvOverflow> {
        KvCache::check_fits(self, n)
    }
    fn check_window(&self, n: usize) -> Result<(), KvWindowError> {
        KvCache::check_window(self, n)
    }
    fn advance(&mut self, n: usize) -> Result<(), KvOverflow> {
        KvCache::advance(self, n)
    }
    fn rollback(&mut self, n: usize) -> usize {
        KvCache::rollback(self, n)
    }
    fn reset(&mut self) {
        KvCache::reset(self)
    }
}

/// One sequence's cursor into a device's KV cache (the storage is the device session's): the
/// same bookkeeping as a cache in RAM ([`Cursor`], over the same [`KvLayout`]: sliding-window
/// layers keep rings).
#[derive(Clone, Debug)]
pub struct SlotKv {
    cur: Cursor,
    layout: KvLayout,
    /// Which of the session's cache slots holds this sequence.
    pub slot: usize,
}

impl SlotKv {
    pub fn new(slot: usize, layout: KvLayout) -> SlotKv {
        SlotKv {
            cur: Cursor::default(),
            layout,
            slot,
        }
    }

    pub fn capacity(&self) -> usize {
        self.layout.max_len
    }

    pub fn would_overflow(&self, n: usize) -> bool {
        self.cur.would_overflow(&self.layout, n)
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    pub fn cursor(&self) -> Cursor {
        self.cur
    }

    /// Take over a cursor (after the session copied the positions it covers into this slot).
    pub fn set_cursor(&mut self, c: Cursor) {
        self.cur = c;
    }
}

impl SeqCache for SlotKv {
    fn len(&self) -> usize {
        self.cur.len
    }
    fn check_fits(&self, n: usize) -> Result<(), KvOverflow> {
        self.cur.check_fits(&self.layout, n)
    }
    fn check_window(&self, n: usize) -> Result<(), KvWindowError> {
        self.cur.check_window(&self.layout, n)
    }
    fn advance(&mut self, n: usize) -> Result<(), KvOverflow> {
        self.cur.advance(&self.layout, n)
    }
    /// Positions past `len` are never read: going back is moving the cursor.
    fn rollback(&mut self, n: usize) -> usize {
        self.cur.rollback(&self.layout, n)
    }
    fn reset(&mut self) {
        self.cur = Cursor::default();
    }
}

/// An executor's slots: one cache (or cursor) per sequence held at once.
#[derive(Debug)]
pub struct Slots<K>(Vec<K>);

impl<K: SeqCache> Slots<K> {
    pub fn new(slots: Vec<K>) -> Slots<K> {
        Slots(slots)
    }

    /// Positions held by slot `slot`.
    pub fn kv_len(&self, slot: usize) -> usize {
        self.0[slot].len()
    }

    /// Refuse `n` more tokens that would not fit slot `slot`.
    pub fn check_fits(&self, slot: usize, n: usize) -> Result<(), KvOverflow> {
        self.0[slot].check_fits(n)
    }

    /// Keep the first `n` positions of slot `slot`; returns how many are kept.
    pub fn rollback(&mut self, slot: usize, n: usize) -> usize {
        self.0[slot].rollback(n)
    }

    /// Forget slot `slot`.
    pub fn reset(&mut self, slot: usize) {
        self.0[slot].reset();
    }

    /// Slot `dst` (changed) and slot `src` (read), `dst != src`.
    pub fn pair_mut(&mut self, dst: usize, src: usize) -> (&mut K, &K) {
        assert_ne!(dst, src, "a slot paired with itself");
        if dst < src {
            let (a, b) = self.0.split_at_mut(src);
            (&mut a[dst], &b[0])
        } else {
            let (a, b) = self.0.split_at_mut(dst);
            (&mut b[0], &a[src])
        }
    }

    /// Make slot `dst` hold the first `n` positions of slot `src`, `take(dst, src, n)` doing
    /// it where `dst != src` (returning how many `dst` then holds); within one slot it is a
    /// rollback.
    pub fn copy_prefix(
        &mut self,
        dst: usize,
        src: usize,
        n: usize,
        take: impl FnOnce(&mut K, &K, usize) -> usize,
    ) -> usize {
        if dst == src {
            return self.rollback(dst, n);
        }
        let (d, s) = self.pair_mut(dst, src);
        take(d, s, n)
    }
}

impl Slots<SlotKv> {
    /// `n` slots of a device's cache, each over `layout`.
    pub fn device(n: usize, layout: &KvLayout) -> Slots<SlotKv> {
        Slots((0..n).map(|i| SlotKv::new(i, layout.clone())).collect())
    }

    /// [`Slots::copy_prefix`] for a device's cursors: `copy(dst, src, n)` copies the first `n`
    /// positions' keys and values between the device's slots (false where it failed); slot
    /// `dst` then holds what it copied (nothing where `src`'s rings no longer hold the window
    /// before `n`, or the copy failed).
    pub fn copy_device_prefix(
        &mut self,
        dst: usize,
        src: usize,
        n: usize,
        copy: impl FnOnce(usize, usize, usize) -> bool,
    ) -> usize {
        self.copy_prefix(dst, src, n, |d, s, n| {
            let (n, cur) = Cursor::prefix_of(&s.cursor(), s.layout(), n);
            d.reset();
            match n > 0 && copy(d.slot, s.slot, n) {
                true => {
                    d.set_cursor(cur);
                    n
                }
                // Nothing to take over, or the device failed: nothing is reused.
                false => 0,
            }
        })
    }
}

impl<K> Deref for Slots<K> {
    type Target = [K];
    fn deref(&self) -> &[K] {
        &self.0
    }
}

impl<K> DerefMut for Slots<K> {
    fn deref_mut(&mut self) -> &mut [K] {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(n: usize) -> Slots<SlotKv> {
        Slots::device(n, &KvLayout::full(1, 1, 4, 4, 16))
    }

    #[test]
    fn slots_keep_lengths_roll_back_and_reset() {
        let mut s = slots(2);
        s[0].advance(5).unwrap();
        assert_eq!((s.kv_len(0), s.kv_len(1)), (5, 0));
        assert!(s.check_fits(0, 11).is_ok());
        let e = s.check_fits(0, 12).unwrap_err();
        assert_eq!((e.capacity, e.current, e.requested), (16, 5, 12));
        assert_eq!(s.rollback(0, 3), 3);
        assert_eq!(s.kv_len(0), 3);
        s.reset(0);
        assert_eq!(s.kv_len(0), 0);
    }

    #[test]
    fn a_prefix_is_taken_over_only_where_the_device_copied_it() {
        let mut s = slots(3);
        s[2].advance(7).unwrap();
        s[0].advance(4).unwrap();
        let mut seen = None;
        let got = s.copy_device_prefix(0, 2, 5, |d, src, n| {
            seen = Some((d, src, n));
            true
        });
        assert_eq!((got, s.kv_len(0), seen), (5, 5, Some((0, 2, 5))));
        // More than the source holds: what it holds.
        assert_eq!(s.copy_device_prefix(1, 2, 9, |_, _, n| n == 7), 7);
        // A failed copy leaves the destination empty.
        assert_eq!(s.copy_device_prefix(0, 2, 3, |_, _, _| false), 0);
        assert_eq!(s.kv_len(0), 0);
        // Nothing to copy: the device is not asked.
        s[1].reset();
        assert_eq!(s.copy_device_prefix(0, 1, 3, |_, _, _| panic!()), 0);
        // Within one slot: a rollback.
        assert_eq!(s.copy_device_prefix(2, 2, 2, |_, _, _| panic!()), 2);
        assert_eq!(s.kv_len(2), 2);
    }

    #[test]
    fn pairs_borrow_two_distinct_slots_either_way() {
        let mut s = slots(3);
        s[1].advance(2).unwrap();
        let (d, src) = s.pair_mut(2, 1);
        assert_eq!((d.slot, src.slot, src.len()), (2, 1, 2));
        let (d, src) = s.pair_mut(0, 1);
        assert_eq!((d.slot, src.slot), (0, 1));
    }
}
