//! The [`Store`] a relay claims from, in memory: claims under the PostgreSQL store's rules,
//! counts, the parked-event operations and retention.

use std::time::Duration;

use tokio::time::Instant;

use super::{MemoryBatch, MemoryStore, far_or, unpark};
use crate::bucket::bucket_of;
use crate::error::StoreError;
use crate::nudge::Nudge;
use crate::store::{ClaimLimits, OutboxStats, ParkedEvent, Store};

impl Store for MemoryStore {
    type Batch = MemoryBatch;

    async fn claim(&self, limits: ClaimLimits) -> Result<MemoryBatch, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        // Free buckets with claimable events, oldest first claimable event first (PgStore's
        // order).
        let mut candidates: Vec<(i64, u32)> = state
            .pending
            .keys()
            .filter(|bucket| !state.claimed.contains(bucket))
            .filter_map(|&bucket| {
                state
                    .claimable(bucket, now)
                    .next()
                    .map(|first| (first, bucket))
            })
            .collect();
        candidates.sort_unstable();
        candidates.truncate(limits.buckets as usize);
        let buckets: Vec<u32> = candidates.into_iter().map(|(_, bucket)| bucket).collect();
        let mut ids: Vec<i64> = buckets
            .iter()
            .flat_map(|&bucket| state.claimable(bucket, now).take(limits.events as usize))
            .collect();
        ids.sort_unstable();
        ids.truncate(limits.events as usize);
        let records = ids.iter().map(|id| state.rows[id].record.clone()).collect();
        state.claimed.extend(buckets.iter().copied());
        Ok(MemoryBatch {
            store: self.clone(),
            buckets,
            records,
        })
    }

    async fn has_pending(&self, within: Duration) -> Result<bool, StoreError> {
        let horizon = far_or(Instant::now(), within);
        let state = self.lock();
        // A key counts up to its first row held beyond the horizon.
        let found = state
            .pending
            .keys()
            .any(|&bucket| state.claimable(bucket, horizon).next().is_some());
        Ok(found)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        Ok(self.stats_now())
    }

    async fn parked(&self, limit: u32) -> Result<Vec<ParkedEvent>, StoreError> {
        let state = self.lock();
        let mut parked: Vec<ParkedEvent> = state
            .pending
            .values()
            .flatten()
            .filter_map(|id| {
                let row = &state.rows[id];
                row.parked.map(|parked_at| ParkedEvent {
                    id: *id,
                    event_id: row.record.event_id,
                    topic: row.record.topic.clone(),
                    key: row.record.key.clone(),
                    attempts: row.record.attempts,
                    last_error: row.last_error.clone(),
                    created_at: row.created.1,
                    parked_at,
                })
            })
            .collect();
        parked.sort_unstable_by_key(|event| event.id);
        parked.truncate(limit as usize);
        Ok(parked)
    }

    async fn retry_parked(&self, id: i64) -> Result<bool, StoreError> {
        let retried = {
            let mut state = self.lock();
            state.rows.get_mut(&id).is_some_and(|row| {
                let parked = row.parked.is_some() && row.dispatched.is_none();
                if parked {
                    unpark(row);
                }
                parked
            })
        };
        if retried {
            self.inner.nudge.notify();
        }
        Ok(retried)
    }

    async fn retry_parked_key(&self, key: &[u8]) -> Result<u64, StoreError> {
        let bucket = bucket_of(key, self.inner.buckets);
        let retried = {
            let mut state = self.lock();
            let state = &mut *state;
            let mut retried = 0;
            for id in state.pending.get(&bucket).into_iter().flatten() {
                if let Some(row) = state.rows.get_mut(id)
                    && row.record.key == key
                    && row.parked.is_some()
                {
                    unpark(row);
                    retried += 1;
                }
            }
            retried
        };
        if retried > 0 {
            self.inner.nudge.notify();
        }
        Ok(retried)
    }

    async fn purge_parked(&self, id: i64) -> Result<bool, StoreError> {
        let purged = {
            let mut state = self.lock();
            let parked = state
                .rows
                .get(&id)
                .is_some_and(|row| row.parked.is_some() && row.dispatched.is_none());
            if parked
                && let Some(row) = state.rows.remove(&id)
                && let Some(pending) = state.pending.get_mut(&row.record.bucket)
            {
                pending.remove(&id);
            }
            parked
        };
        if purged {
            self.inner.nudge.notify();
        }
        Ok(purged)
    }

    async fn delete_dispatched(&self, older_than: Duration, limit: u32) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let mut old: Vec<(Instant, i64)> = state
            .rows
            .iter()
            .filter_map(|(id, row)| row.dispatched.map(|at| (at, *id)))
            .filter(|(at, _)| now.saturating_duration_since(*at) > older_than)
            .collect();
        old.sort_unstable();
        old.truncate(limit as usize);
        for (_, id) in &old {
            state.rows.remove(id);
        }
        Ok(old.len() as u64)
    }

    fn nudge(&self) -> &Nudge {
        &self.inner.nudge
    }
}
