//! Conversions between the crate's values and the events table's columns: rows read back
//! into records, errors and durations written as parameters.

use std::time::{Duration, SystemTime};

use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use crate::error::StoreError;
use crate::event::{EventId, OutboxRecord};
use crate::headers;

/// The longest error text kept on a row.
const MAX_ERROR_BYTES: usize = 4_096;

/// An error's text as PostgreSQL's `text` accepts it (no NUL) and at most
/// [`MAX_ERROR_BYTES`] long: a publisher's message may quote arbitrary bytes.
pub(super) fn storable_error(error: &str) -> String {
    let mut text = error.replace('\0', "\u{fffd}");
    if text.len() > MAX_ERROR_BYTES {
        let mut end = MAX_ERROR_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// `duration` in milliseconds, at most a hundred years (PostgreSQL's intervals and
/// timestamps overflow far below `i64::MAX` milliseconds).
pub(super) fn millis_in_range(duration: Duration) -> i64 {
    const CENTURY_MS: u128 = 100 * 365 * 86_400 * 1_000;
    i64::try_from(duration.as_millis().min(CENTURY_MS))
        .expect("a century in milliseconds fits an i64")
}

/// Seconds since the epoch, as the database gave them.
pub(super) fn system_time(secs: f64) -> SystemTime {
    Duration::try_from_secs_f64(secs.max(0.0))
        .ok()
        .and_then(|since| SystemTime::UNIX_EPOCH.checked_add(since))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

pub(super) fn record_of(row: &PgRow) -> Result<OutboxRecord, StoreError> {
    let bucket: i32 = row.try_get("bucket")?;
    let header_bytes: Vec<u8> = row.try_get("headers")?;
    let event_id: Uuid = row.try_get("event_id")?;
    Ok(OutboxRecord {
        id: row.try_get("id")?,
        event_id: EventId::from_uuid(event_id),
        bucket: u32::try_from(bucket)
            .map_err(|_| StoreError::Corrupt(format!("bucket {bucket}")))?,
        topic: row.try_get("topic")?,
        key: row.try_get("key")?,
        payload: row.try_get("payload")?,
        headers: headers::decode(&header_bytes)?,
        sequence: row.try_get("seq")?,
        attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_texts_are_stored_without_nul_and_bounded() {
        assert_eq!(storable_error("key \0 bytes"), "key \u{fffd} bytes");
        let long = "é".repeat(MAX_ERROR_BYTES);
        let stored = storable_error(&long);
        assert!(stored.len() <= MAX_ERROR_BYTES && stored.len() > MAX_ERROR_BYTES - 2);
        assert!(stored.chars().all(|c| c == 'é'));
        assert_eq!(millis_in_range(Duration::MAX), 100 * 365 * 86_400 * 1_000);
    }
}
