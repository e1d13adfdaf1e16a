//! `ReorderBuffer`: indexed items in, values out in index order, within a bounded window.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use crate::{MissingIndices, PushError};

/// A bounded reorder buffer: push `(index, value)` in any order, take the values out in
/// index order.
///
/// Indices start at 0 (or at [`starting_at`](Self::starting_at)'s `start`) and must each
/// arrive once. The buffer holds at most `window` entries: the indices from
/// [`next_index`](Self::next_index) to `next_index + window - 1`. An index beyond that is
/// refused with [`PushError::BeyondWindow`] and handed back, so that the caller holds it (and
/// stops producing) until the window moves on: one slow item can never make the buffer grow
/// without bound. Its memory is bounded by what it holds, never by the value of an index:
/// indices near [`next_index`](Self::next_index) sit in a ring of slots (O(1) per
/// operation), and an index far ahead of everything buffered (a window of millions, or
/// `usize::MAX`) takes one entry in an ordered map (O(log n)) until the window reaches it.
/// [`missing`](Self::missing) and [`finish`](Self::finish) are O(n) in what is buffered.
///
/// The index space ends at `u64::MAX`: once that index has been taken out the buffer is
/// [exhausted](Self::is_exhausted), and every push is a duplicate.
///
/// # Examples
///
/// ```
/// use taskweave_reorder::ReorderBuffer;
///
/// let mut buffer = ReorderBuffer::new(4);
/// buffer.push(1, "b").unwrap();
/// assert_eq!(buffer.pop(), None, "index 0 has not arrived");
/// buffer.push(0, "a").unwrap();
/// assert_eq!(buffer.pop(), Some("a"));
/// assert_eq!(buffer.pop(), Some("b"));
/// assert!(buffer.push(6, "g").is_err(), "2 + 4 is the end of the window");
/// ```
pub struct ReorderBuffer<T> {
    // slots[k] holds index `next + k`: the dense part, for the indices near `next`.
    slots: VecDeque<Option<T>>,
    // Entries far ahead of the dense part, every key at or beyond `next + slots.len()`: an
    // index far from `next` costs one entry here, not a slot for every index before it.
    far: BTreeMap<u64, T>,
    next: u64,
    // Set once `u64::MAX` itself has been taken out or skipped: no index is left.
    exhausted: bool,
    window: usize,
    buffered: usize,
}

/// The dense part grows to cover a new index only while it stays within this many slots, or
/// within four slots per buffered entry: its length is bounded by what the buffer holds (or
/// held), never by the value of an index.
const DENSE_FLOOR: usize = 64;

impl<T> ReorderBuffer<T> {
    /// A buffer for indices from 0, holding at most `window` entries.
    ///
    /// # Panics
    ///
    /// Panics if `window` is zero.
    #[must_use]
    pub fn new(window: usize) -> Self {
        Self::starting_at(0, window)
    }

    /// A buffer whose first index is `start`, holding at most `window` entries.
    ///
    /// # Panics
    ///
    /// Panics if `window` is zero.
    #[must_use]
    pub fn starting_at(start: u64, window: usize) -> Self {
        assert!(
            window > 0,
            "ReorderBuffer: window must be greater than zero"
        );
        ReorderBuffer {
            slots: VecDeque::new(),
            far: BTreeMap::new(),
            next: start,
            exhausted: false,
            window,
            buffered: 0,
        }
    }

    /// Buffers `value` at `index`.
    ///
    /// # Errors
    ///
    /// [`PushError::Duplicate`] when `index` is buffered already or was taken out before
    /// (after `u64::MAX` was taken out, every index was); [`PushError::BeyondWindow`] when
    /// `index >= next_index() + window`. Either way the value is handed back and the buffer
    /// holds what it held.
    pub fn push(&mut self, index: u64, value: T) -> Result<(), PushError<T>> {
        let offset = match index.checked_sub(self.next) {
            Some(offset) if !self.exhausted => offset,
            _ => return Err(PushError::Duplicate { index, value }),
        };
        let offset = match usize::try_from(offset) {
            Ok(offset) if offset < self.window => offset,
            _ => {
                return Err(PushError::BeyondWindow {
                    index,
                    next: self.next,
                    value,
                });
            }
        };
        if offset >= self.slots.len() && offset < self.dense_reach() {
            self.grow_dense(offset + 1);
        }
        if offset < self.slots.len() {
            let slot = &mut self.slots[offset];
            if slot.is_some() {
                return Err(PushError::Duplicate { index, value });
            }
            *slot = Some(value);
        } else {
            match self.far.entry(index) {
                Entry::Occupied(_) => return Err(PushError::Duplicate { index, value }),
                Entry::Vacant(vacant) => {
                    vacant.insert(value);
                }
            }
        }
        self.buffered += 1;
        Ok(())
    }

    /// How far the dense part may reach now.
    fn dense_reach(&self) -> usize {
        DENSE_FLOOR.max(self.buffered.saturating_mul(4))
    }

    /// Lengthens the dense part to `len` slots and moves the far entries it now covers in.
    fn grow_dense(&mut self, len: usize) {
        self.slots.resize_with(len, || None);
        while let Some(entry) = self.far.first_entry() {
            // Every far key is at or beyond the dense part's old end, so at or beyond `next`.
            let offset = *entry.key() - self.next;
            match usize::try_from(offset) {
                Ok(offset) if offset < len => self.slots[offset] = Some(entry.remove()),
                _ => break,
            }
        }
    }

    /// Brings the entry for `next` into the dense part when it is the first far entry.
    fn settle_front(&mut self) {
        if !self.slots.is_empty() {
            return;
        }
        if let Some(entry) = self.far.first_entry()
            && *entry.key() == self.next
        {
            self.slots.push_back(Some(entry.remove()));
        }
    }

    /// Moves `next` on by one; past `u64::MAX` the buffer is exhausted.
    fn advance(&mut self) {
        match self.next.checked_add(1) {
            Some(next) => self.next = next,
            None => self.exhausted = true,
        }
    }

    /// Takes out the value at [`next_index`](Self::next_index), if it has arrived, and moves
    /// the window on by one.
    pub fn pop(&mut self) -> Option<T> {
        if self.exhausted {
            return None;
        }
        self.settle_front();
        let value = self.slots.front_mut()?.take()?;
        self.slots.pop_front();
        self.advance();
        self.buffered -= 1;
        Some(value)
    }

    /// Skips the index at [`next_index`](Self::next_index), declaring it lost, and moves the
    /// window on by one. Returns the value if it had in fact arrived. Does nothing once the
    /// buffer is exhausted.
    pub fn skip(&mut self) -> Option<T> {
        if self.exhausted {
            return None;
        }
        self.settle_front();
        let value = self.slots.pop_front().flatten();
        self.advance();
        if value.is_some() {
            self.buffered -= 1;
        }
        value
    }

    /// Skips every missing index up to the first buffered one, in one step whatever the
    /// distance. Returns how many indices were skipped.
    fn skip_to_buffered(&mut self) -> u64 {
        let Some(target) = self.first_buffered() else {
            return 0;
        };
        let skipped = target - self.next;
        self.move_next_to(target);
        skipped
    }

    /// The lowest buffered index.
    fn first_buffered(&self) -> Option<u64> {
        let dense = self.slots.iter().position(Option::is_some);
        dense
            .map(|k| self.next + k as u64)
            .or_else(|| self.far.keys().next().copied())
    }

    /// Moves `next` on to `target`, at most the first buffered index: the slots before it
    /// are missing ones.
    fn move_next_to(&mut self, target: u64) {
        match usize::try_from(target - self.next) {
            Ok(k) if k <= self.slots.len() => drop(self.slots.drain(..k)),
            _ => self.slots.clear(),
        }
        self.next = target;
    }

    /// The index the next [`pop`](Self::pop) waits for. Once `u64::MAX` has been taken out
    /// (or skipped) it stays `u64::MAX`, and [`is_exhausted`](Self::is_exhausted) is `true`.
    #[must_use]
    pub fn next_index(&self) -> u64 {
        self.next
    }

    /// `true` once index `u64::MAX` has been taken out or skipped: no index is left to push.
    #[must_use]
    pub fn is_exhausted(&self) -> bool {
        self.exhausted
    }

    /// The bound on buffered entries.
    #[must_use]
    pub fn window(&self) -> usize {
        self.window
    }

    /// `true` when `index` can be pushed without [`PushError::BeyondWindow`].
    #[must_use]
    pub fn fits(&self, index: u64) -> bool {
        !self.exhausted
            && index
                .checked_sub(self.next)
                .and_then(|offset| usize::try_from(offset).ok())
                .is_some_and(|offset| offset < self.window)
    }

    /// Values buffered (arrived, not yet taken out).
    #[must_use]
    pub fn len(&self) -> usize {
        self.buffered
    }

    /// `true` when no value is buffered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buffered == 0
    }

    /// The indices below the highest buffered one that have not arrived, as ranges: at most
    /// one more range than values buffered, however far apart the indices are.
    #[must_use]
    pub fn missing(&self) -> MissingIndices {
        let next = self.next;
        let dense = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.is_some())
            .map(|(k, _)| next + k as u64);
        let mut ranges = Vec::new();
        let mut expected = next;
        for index in dense.chain(self.far.keys().copied()) {
            if index > expected {
                ranges.push(expected..=index - 1);
            }
            match index.checked_add(1) {
                Some(after) => expected = after,
                None => break,
            }
        }
        MissingIndices::from_ranges(ranges)
    }

    /// Once nothing more can arrive: the next value in order, else the missing indices (the
    /// first time there are gaps; `gaps_reported` remembers it), stepping over the gaps so that
    /// the values behind them follow; `None` when the buffer is empty.
    pub(crate) fn next_after_end(
        &mut self,
        gaps_reported: &mut bool,
    ) -> Option<Result<T, MissingIndices>> {
        if let Some(value) = self.pop() {
            return Some(Ok(value));
        }
        if self.is_empty() {
            return None;
        }
        if !*gaps_reported {
            *gaps_reported = true;
            return Some(Err(self.missing()));
        }
        self.skip_to_buffered();
        self.pop().map(Ok)
    }

    /// When nothing that could fill the gap before `index` can arrive any more (every sender
    /// left is held back at or beyond `index`): skips the missing indices in front, up to the
    /// first buffered value or until `index` fits the window, whichever comes first. Returns
    /// the skipped indices, or `None` when nothing had to be skipped.
    pub(crate) fn skip_until_fits(&mut self, index: u64) -> Option<MissingIndices> {
        // An index the window has passed needs no skip (its send fails as a duplicate).
        if self.exhausted || index < self.next || self.fits(index) {
            return None;
        }
        self.settle_front();
        if self.slots.front().is_some_and(Option::is_some) {
            return None;
        }
        // The window must start at `index - window + 1` for `index` to fit; a buffered value
        // before that stops the skip.
        let fitting = index - (self.window as u64 - 1);
        let target = self
            .first_buffered()
            .map_or(fitting, |buffered| buffered.min(fitting));
        let start = self.next;
        self.move_next_to(target);
        Some(MissingIndices::from_ranges(vec![start..=target - 1]))
    }

    /// Ends the sequence: `Ok` when nothing is left, otherwise the indices that never
    /// arrived (and so block the values buffered after them).
    ///
    /// # Errors
    ///
    /// [`MissingIndices`] when values are still buffered behind gaps.
    pub fn finish(&self) -> Result<(), MissingIndices> {
        if self.buffered == 0 {
            Ok(())
        } else {
            Err(self.missing())
        }
    }
}

impl<T> fmt::Debug for ReorderBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReorderBuffer")
            .field("next", &self.next)
            .field("window", &self.window)
            .field("buffered", &self.buffered)
            .finish()
    }
}
