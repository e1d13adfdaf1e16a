//! Writing events in the caller's transaction: [`PgStore::enqueue`](super::PgStore::enqueue)
//! and [`enqueue_batch`](super::PgStore::enqueue_batch), then waking the local relays.

use sqlx::Postgres;
use sqlx::postgres::PgConnection;

use super::{PgStore, sql};
use crate::bucket::{bucket_of, key_lock_id};
use crate::error::{EnqueueError, StoreError};
use crate::event::{Event, EventId};
use crate::headers;

impl PgStore {
    /// Writes `event` in the caller's transaction (or on a connection in autocommit, where
    /// it commits at once). It becomes visible to relays when that transaction commits;
    /// call [`commit`](Self::commit) (or [`notify_committed`](Self::notify_committed) after
    /// your own commit) so the relays of this process wake at once.
    ///
    /// # Errors
    ///
    /// [`EnqueueError::Invalid`] before anything is sent when the event breaks a
    /// [`Limits`](crate::Limits) rule; [`EnqueueError::Store`] when the database refuses the
    /// write (the transaction is then aborted: roll it back).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the insert done or not; the transaction decides.
    /// Roll it back unless the future completed.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        event: Event,
    ) -> Result<EventId, EnqueueError> {
        let ids = self.enqueue_batch(conn, vec![event]).await?;
        Ok(ids[0])
    }

    /// Writes `events` in the caller's transaction, in their order (ids grow in that
    /// order), in one round trip however many there are. Either all are written or none
    /// is.
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); an invalid event names its index, and nothing is sent.
    ///
    /// # Cancel safety
    ///
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_batch(
        &self,
        conn: &mut PgConnection,
        events: Vec<Event>,
    ) -> Result<Vec<EventId>, EnqueueError> {
        for (index, event) in events.iter().enumerate() {
            self.inner
                .limits
                .check(event)
                .map_err(|reason| EnqueueError::Invalid { index, reason })?;
        }
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let table = self.inner.schema.events_table();
        // Sorted and deduplicated, so two transactions lock shared keys in one order.
        let mut locks: Vec<i64> = if self.inner.key_lock {
            events.iter().map(|e| key_lock_id(&table, &e.key)).collect()
        } else {
            Vec::new()
        };
        locks.sort_unstable();
        locks.dedup();
        let n = events.len();
        let mut ids = Vec::with_capacity(n);
        let mut event_ids = Vec::with_capacity(n);
        let mut buckets = Vec::with_capacity(n);
        let mut topics = Vec::with_capacity(n);
        let mut keys = Vec::with_capacity(n);
        let mut payloads = Vec::with_capacity(n);
        let mut header_bytes = Vec::with_capacity(n);
        let mut sequences = Vec::with_capacity(n);
        for event in events {
            let id = EventId::new();
            ids.push(id);
            event_ids.push(*id.as_uuid());
            // Below the bucket count, which `connect` read from an `integer` column.
            let bucket = i32::try_from(bucket_of(&event.key, self.inner.buckets))
                .map_err(|_| StoreError::Corrupt(format!("bucket count {}", self.inner.buckets)))?;
            buckets.push(bucket);
            header_bytes.push(headers::encode(&event.headers));
            topics.push(event.topic);
            keys.push(event.key);
            payloads.push(event.payload);
            sequences.push(event.sequence);
        }
        sqlx::query(sql(&self.inner.sql.insert))
            .bind(&event_ids)
            .bind(&buckets)
            .bind(&topics)
            .bind(&keys)
            .bind(&payloads)
            .bind(&header_bytes)
            .bind(&sequences)
            .bind(&locks)
            .bind(self.inner.notify.as_deref())
            .execute(&mut *conn)
            .await
            .map_err(StoreError::from)?;
        Ok(ids)
    }

    /// Commits `tx` and then wakes the relays of this process.
    ///
    /// # Errors
    ///
    /// The commit's error; no relay is woken then.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a commit dropped halfway may or may not have committed.
    pub async fn commit(&self, tx: sqlx::Transaction<'_, Postgres>) -> Result<(), sqlx::Error> {
        tx.commit().await?;
        self.inner.nudge.notify();
        Ok(())
    }

    /// Wakes the relays of this process: call it after committing a transaction that
    /// enqueued events, when you commit it yourself.
    pub fn notify_committed(&self) {
        self.inner.nudge.notify();
    }
}
