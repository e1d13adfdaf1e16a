//! `ReorderBuffer`: indexed items in, values out in index order, within a bounded window.

use std::collections::VecDeque;
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
/// without bound. Every operation is O(1), except [`missing`](Self::missing) and
/// [`finish`](Self::finish).
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
    // slots[k] holds index `next + k`.
    slots: VecDeque<Option<T>>,
    next: u64,
    window: usize,
    buffered: usize,
}

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
            next: start,
            window,
            buffered: 0,
        }
    }

    /// Buffers `value` at `index`.
    ///
    /// # Errors
    ///
    /// [`PushError::Duplicate`] when `index` is buffered already or was taken out before;
    /// [`PushError::BeyondWindow`] when `index >= next_index() + window`. Either way the
    /// value is handed back and the buffer is unchanged.
    pub fn push(&mut self, index: u64, value: T) -> Result<(), PushError<T>> {
        let Some(offset) = index.checked_sub(self.next) else {
            return Err(PushError::Duplicate { index, value });
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
        if offset >= self.slots.len() {
            self.slots.resize_with(offset + 1, || None);
        }
        let slot = &mut self.slots[offset];
        if slot.is_some() {
            return Err(PushError::Duplicate { index, value });
        }
        *slot = Some(value);
        self.buffered += 1;
        Ok(())
    }

    /// Takes out the value at [`next_index`](Self::next_index), if it has arrived, and moves
    /// the window on by one.
    pub fn pop(&mut self) -> Option<T> {
        let value = self.slots.front_mut()?.take()?;
        self.slots.pop_front();
        self.next += 1;
        self.buffered -= 1;
        Some(value)
    }

    /// Skips the index at [`next_index`](Self::next_index), declaring it lost, and moves the
    /// window on by one. Returns the value if it had in fact arrived.
    pub fn skip(&mut self) -> Option<T> {
        self.next += 1;
        let value = self.slots.pop_front().flatten();
        if value.is_some() {
            self.buffered -= 1;
        }
        value
    }

    /// The index the next [`pop`](Self::pop) waits for.
    #[must_use]
    pub fn next_index(&self) -> u64 {
        self.next
    }

    /// The bound on buffered entries.
    #[must_use]
    pub fn window(&self) -> usize {
        self.window
    }

    /// `true` when `index` can be pushed without [`PushError::BeyondWindow`].
    #[must_use]
    pub fn fits(&self, index: u64) -> bool {
        index
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

    /// The indices below the highest buffered one that have not arrived, ascending.
    #[must_use]
    pub fn missing(&self) -> Vec<u64> {
        let end = self.slots.iter().rposition(Option::is_some).unwrap_or(0);
        (0..end)
            .filter(|&k| self.slots[k].is_none())
            .map(|k| self.next + k as u64)
            .collect()
    }

    /// Once nothing more can arrive: the next value in order, else the missing indices (the
    /// first time there are gaps; `gaps_reported` remembers it), stepping over the gaps so that
    /// the values behind them follow; `None` when the buffer is empty.
    pub(crate) fn next_after_end(
        &mut self,
        gaps_reported: &mut bool,
    ) -> Option<Result<T, MissingIndices>> {
        loop {
            if let Some(value) = self.pop() {
                return Some(Ok(value));
            }
            if self.is_empty() {
                return None;
            }
            if !*gaps_reported {
                *gaps_reported = true;
                return Some(Err(MissingIndices {
                    indices: self.missing(),
                }));
            }
            let _ = self.skip();
        }
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
            Err(MissingIndices {
                indices: self.missing(),
            })
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
