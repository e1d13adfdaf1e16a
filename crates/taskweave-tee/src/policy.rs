//! `Policy`: what an output does when its consumer falls behind.

/// The capacity of each output of [`tee`](crate::tee) and [`tee_n`](crate::tee_n).
///
/// 32, the same default as the tee's outputs and the pipeline's stages (one constant in
/// `taskweave-supervise`).
pub const DEFAULT_CAPACITY: usize = taskweave_supervise::internal::DEFAULT_CAPACITY;

/// The largest capacity an output accepts: 1,048,576 items. An output's channel allocates
/// its capacity up front, so a capacity near `usize::MAX` would be an allocation failure (an
/// abort), not a buffer; it is refused with a panic when the policy is made.
pub const MAX_CAPACITY: usize = 1 << 20;

/// The most outputs one tee feeds: 65,536.
pub const MAX_OUTPUTS: usize = 1 << 16;

/// What a tee output does when its consumer falls behind and its buffer is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Policy {
    /// Wait for room (the default, and Go's tee): the slowest lockstep consumer sets the pace
    /// of the tee and of every other output.
    Lockstep {
        /// Items buffered for this output.
        capacity: usize,
    },
    /// Never wait: when the buffer is full, drop its oldest item to make room and count it in
    /// [`TeeOutput::lagged`](crate::TeeOutput::lagged) (like tokio's broadcast `Lagged`, but
    /// for this output alone).
    DropOldest {
        /// Items buffered for this output.
        capacity: usize,
    },
    /// Never wait: when the buffer is full, disconnect this output. Its consumer still gets
    /// the buffered items, then its stream ends and
    /// [`TeeOutput::is_disconnected`](crate::TeeOutput::is_disconnected) is `true`.
    Disconnect {
        /// Items buffered for this output before it is disconnected.
        capacity: usize,
    },
}

impl Policy {
    /// [`Policy::Lockstep`] with `capacity` items.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is zero or above [`MAX_CAPACITY`].
    #[must_use]
    pub fn lockstep(capacity: usize) -> Self {
        Policy::Lockstep {
            capacity: nonzero(capacity),
        }
    }

    /// [`Policy::DropOldest`] with `capacity` items.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is zero or above [`MAX_CAPACITY`].
    #[must_use]
    pub fn drop_oldest(capacity: usize) -> Self {
        Policy::DropOldest {
            capacity: nonzero(capacity),
        }
    }

    /// [`Policy::Disconnect`] after `capacity` items.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is zero or above [`MAX_CAPACITY`].
    #[must_use]
    pub fn disconnect(capacity: usize) -> Self {
        Policy::Disconnect {
            capacity: nonzero(capacity),
        }
    }

    /// The output's buffer size.
    #[must_use]
    pub fn capacity(&self) -> usize {
        match *self {
            Policy::Lockstep { capacity }
            | Policy::DropOldest { capacity }
            | Policy::Disconnect { capacity } => capacity,
        }
    }
}

impl Default for Policy {
    /// Lockstep with [`DEFAULT_CAPACITY`] items.
    fn default() -> Self {
        Policy::Lockstep {
            capacity: DEFAULT_CAPACITY,
        }
    }
}

fn nonzero(capacity: usize) -> usize {
    assert!(
        capacity > 0,
        "tee: an output's capacity must be greater than zero"
    );
    assert!(
        capacity <= MAX_CAPACITY,
        "tee: an output's capacity of {capacity} is above MAX_CAPACITY ({MAX_CAPACITY})"
    );
    capacity
}
