//! A batch claimed from a [`MemoryStore`](super::MemoryStore): [`MemoryBatch`], which
//! frees its buckets when completed or dropped.

use std::fmt;
use std::time::SystemTime;

use tokio::time::Instant;

use super::{MemoryStore, far_or};
use crate::error::StoreError;
use crate::event::OutboxRecord;
use crate::retry::{FailedAttempt, NextAttempt};
use crate::store::Batch;

/// A batch claimed from a [`MemoryStore`]; dropping it frees its buckets.
pub struct MemoryBatch {
    pub(super) store: MemoryStore,
    pub(super) buckets: Vec<u32>,
    pub(super) records: Vec<OutboxRecord>,
}

impl Batch for MemoryBatch {
    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    async fn complete(
        mut self,
        dispatched: Vec<i64>,
        failed: Vec<FailedAttempt>,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut state = self.store.lock();
        for id in dispatched {
            if let Some(row) = state.rows.get_mut(&id)
                && row.dispatched.is_none()
            {
                row.dispatched = Some(now);
                let bucket = row.record.bucket;
                if let Some(pending) = state.pending.get_mut(&bucket) {
                    pending.remove(&id);
                }
            }
        }
        for failure in failed {
            if let Some(row) = state.rows.get_mut(&failure.id)
                && row.dispatched.is_none()
            {
                row.record.attempts = row.record.attempts.saturating_add(1);
                row.last_error = Some(failure.error);
                match failure.next {
                    NextAttempt::After(delay) => {
                        row.next_attempt = Some(far_or(now, delay));
                    }
                    NextAttempt::Park => {
                        row.next_attempt = None;
                        row.parked = Some(SystemTime::now());
                    }
                }
            }
        }
        for bucket in self.buckets.drain(..) {
            state.claimed.remove(&bucket);
        }
        Ok(())
    }
}

impl Drop for MemoryBatch {
    fn drop(&mut self) {
        if !self.buckets.is_empty() {
            let mut state = self.store.lock();
            for bucket in self.buckets.drain(..) {
                state.claimed.remove(&bucket);
            }
        }
    }
}

impl fmt::Debug for MemoryBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBatch")
            .field("buckets", &self.buckets)
            .field("records", &self.records.len())
            .finish()
    }
}
