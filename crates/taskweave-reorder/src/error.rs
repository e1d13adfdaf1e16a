//! Errors of the reorder buffer and the reorder adapter.

use std::error::Error;
use std::fmt;
use std::ops::RangeInclusive;

/// Why [`ReorderBuffer::push`](crate::ReorderBuffer::push) refused an item; the item comes
/// back with the error.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PushError<T> {
    /// The index is already buffered, or was already taken out (or skipped).
    Duplicate {
        /// The index pushed twice.
        index: u64,
        /// The refused value.
        value: T,
    },
    /// The index is at or beyond `next + window`: buffering it would let the buffer grow
    /// past its bound. Hold it back and push it again once the window has moved on.
    BeyondWindow {
        /// The refused index.
        index: u64,
        /// The next index to be taken out when the item was refused.
        next: u64,
        /// The refused value.
        value: T,
    },
}

impl<T> PushError<T> {
    /// The refused value.
    pub fn into_inner(self) -> T {
        match self {
            PushError::Duplicate { value, .. } | PushError::BeyondWindow { value, .. } => value,
        }
    }

    /// The refused index.
    #[must_use]
    pub fn index(&self) -> u64 {
        match self {
            PushError::Duplicate { index, .. } | PushError::BeyondWindow { index, .. } => *index,
        }
    }
}

impl<T> fmt::Debug for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Duplicate { index, .. } => f
                .debug_struct("Duplicate")
                .field("index", index)
                .finish_non_exhaustive(),
            PushError::BeyondWindow { index, next, .. } => f
                .debug_struct("BeyondWindow")
                .field("index", index)
                .field("next", next)
                .finish_non_exhaustive(),
        }
    }
}

impl<T> fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Duplicate { index, .. } => {
                write!(
                    f,
                    "duplicate index {index} (buffered, taken or skipped already)"
                )
            }
            PushError::BeyondWindow { index, next, .. } => {
                write!(f, "index {index} is beyond the window (next is {next})")
            }
        }
    }
}

impl<T> Error for PushError<T> {}

/// Indices that never arrived: returned by
/// [`ReorderBuffer::finish`](crate::ReorderBuffer::finish) and
/// [`missing`](crate::ReorderBuffer::missing), and yielded by the [`reorder`](crate::reorder)
/// adapter and the [`reorder_channel`](crate::reorder_channel) receiver when they step over
/// a gap.
///
/// Kept as ranges, so that a gap of any width (`0` missing while `u64::MAX - 1` is buffered)
/// costs one range, not an entry per index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingIndices {
    ranges: Vec<RangeInclusive<u64>>,
}

impl MissingIndices {
    /// Ascending, non-overlapping, non-adjacent ranges, none empty.
    pub(crate) fn from_ranges(ranges: Vec<RangeInclusive<u64>>) -> Self {
        debug_assert!(ranges.iter().all(|range| range.start() <= range.end()));
        MissingIndices { ranges }
    }

    /// The missing indices, ascending.
    pub fn indices(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(Clone::clone)
    }

    /// The missing indices as ascending ranges of consecutive indices.
    #[must_use]
    pub fn ranges(&self) -> &[RangeInclusive<u64>] {
        &self.ranges
    }

    /// How many indices are missing (saturating at `u64::MAX`).
    #[must_use]
    pub fn count(&self) -> u64 {
        self.ranges.iter().fold(0_u64, |total, range| {
            total.saturating_add((range.end() - range.start()).saturating_add(1))
        })
    }
}

impl fmt::Display for MissingIndices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.count() {
            1 => f.write_str("1 index never arrived: ")?,
            n => write!(f, "{n} indices never arrived: ")?,
        }
        for (i, index) in self.indices().take(10).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{index}")?;
        }
        if self.count() > 10 {
            f.write_str(", …")?;
        }
        Ok(())
    }
}

impl Error for MissingIndices {}

/// An error item of the [`reorder`](crate::reorder) adapter. The adapter goes on after
/// each one, so no value it accepted is lost.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReorderError<T> {
    /// A duplicate index, or an index too far ahead for the window; the value is handed
    /// back here.
    Refused(PushError<T>),
    /// The input ended with these indices missing; the values buffered after the gaps
    /// follow, in order.
    Missing(MissingIndices),
}

impl<T> fmt::Debug for ReorderError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReorderError::Refused(error) => f.debug_tuple("Refused").field(error).finish(),
            ReorderError::Missing(missing) => f.debug_tuple("Missing").field(missing).finish(),
        }
    }
}

impl<T> fmt::Display for ReorderError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReorderError::Refused(error) => write!(f, "item refused: {error}"),
            ReorderError::Missing(missing) => write!(f, "input ended early: {missing}"),
        }
    }
}

impl<T> Error for ReorderError<T> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ReorderError::Refused(_) => None,
            ReorderError::Missing(missing) => Some(missing),
        }
    }
}
