//! Which bucket a key belongs to: a hash that must never change.

/// The bucket of `key` among `buckets`: FNV-1a (64-bit) of the key's bytes, modulo the
/// bucket count.
///
/// Written here rather than taken from a hashing crate on purpose: the value is stored with
/// every row and computed by every writer and relay, on every version of this crate, so its
/// definition is part of the storage format. A dependency's hasher is free to change its
/// output between releases (std's `DefaultHasher` says so); these eight lines cannot.
///
/// # Panics
///
/// Panics if `buckets` is zero.
#[must_use]
pub fn bucket_of(key: &[u8], buckets: u32) -> u32 {
    assert!(
        buckets > 0,
        "bucket_of: the bucket count must be greater than zero"
    );
    let hash = fnv1a(key.iter().copied());
    // The remainder is below `buckets`, which is a u32.
    u32::try_from(hash % u64::from(buckets)).expect("a remainder below a u32 fits a u32")
}

/// The 64-bit advisory-lock key that serialises writers of one key until they commit, so
/// that outbox ids grow with commit order for each key. Salted with the table name so that
/// two outboxes in one database do not wait on each other.
#[cfg(feature = "postgres")]
pub(crate) fn key_lock_id(table: &str, key: &[u8]) -> i64 {
    let bytes = table.as_bytes().iter().chain(&[0]).chain(key).copied();
    i64::from_ne_bytes(fnv1a(bytes).to_ne_bytes())
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: impl Iterator<Item = u8>) -> u64 {
    bytes.fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_never_change() {
        // FNV-1a test vectors: the storage format depends on these.
        assert_eq!(
            bucket_of(b"", u32::MAX),
            (0xcbf2_9ce4_8422_2325u64 % u64::from(u32::MAX)) as u32
        );
        assert_eq!(
            bucket_of(b"a", u32::MAX),
            (0xaf63_dc4c_8601_ec8cu64 % u64::from(u32::MAX)) as u32
        );
        assert_eq!(
            bucket_of(b"foobar", u32::MAX),
            (0x8594_4171_f739_67e8u64 % u64::from(u32::MAX)) as u32
        );
    }

    #[test]
    fn buckets_are_in_range_and_spread() {
        let mut seen = [0u32; 16];
        for i in 0..1600 {
            let bucket = bucket_of(format!("key-{i}").as_bytes(), 16);
            seen[bucket as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn lock_ids_differ_by_table() {
        assert_ne!(key_lock_id("a.events", b"k"), key_lock_id("b.events", b"k"));
        assert_eq!(key_lock_id("a.events", b"k"), key_lock_id("a.events", b"k"));
    }
}
