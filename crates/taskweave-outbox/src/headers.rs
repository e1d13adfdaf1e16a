//! The byte encoding of an event's headers in one `bytea` column: a count, then each name
//! and value with its length (big-endian `u32`s). One column rather than two arrays, so a
//! batch of events inserts as one `unnest` of flat arrays.

use crate::error::StoreError;

pub(crate) fn encode(headers: &[(String, Vec<u8>)]) -> Vec<u8> {
    let size = 4 + headers
        .iter()
        .map(|(name, value)| 8 + name.len() + value.len())
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&len32(headers.len()).to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&len32(name.len()).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&len32(value.len()).to_be_bytes());
        out.extend_from_slice(value);
    }
    out
}

pub(crate) fn decode(mut bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let count = take_len(&mut bytes)?;
    let mut headers = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let name_len = take_len(&mut bytes)?;
        let name = take(&mut bytes, name_len)?;
        let name = String::from_utf8(name.to_vec())
            .map_err(|_| StoreError::Corrupt("a header name is not UTF-8".into()))?;
        let value_len = take_len(&mut bytes)?;
        let value = take(&mut bytes, value_len)?.to_vec();
        headers.push((name, value));
    }
    if !bytes.is_empty() {
        return Err(StoreError::Corrupt(
            "trailing bytes after the headers".into(),
        ));
    }
    Ok(headers)
}

/// Every event is checked against [`crate::Limits`] before it is encoded, and that check
/// keeps the header names and values together within `u32::MAX` bytes (and so their count
/// too, each name being at least one byte): every length fits.
fn len32(len: usize) -> u32 {
    u32::try_from(len).expect("Limits::check keeps header lengths within u32::MAX")
}

fn take_len(bytes: &mut &[u8]) -> Result<usize, StoreError> {
    let raw = take(bytes, 4)?;
    let len = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
    usize::try_from(len).map_err(|_| StoreError::Corrupt("a header length overflows".into()))
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], StoreError> {
    if bytes.len() < n {
        return Err(StoreError::Corrupt("headers cut short".into()));
    }
    let (head, tail) = bytes.split_at(n);
    *bytes = tail;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let headers = vec![
            ("content-type".to_string(), b"application/json".to_vec()),
            ("empty".to_string(), Vec::new()),
            ("content-type".to_string(), vec![0, 255, 7]),
        ];
        assert_eq!(decode(&encode(&headers)).unwrap(), headers);
        assert_eq!(decode(&encode(&[])).unwrap(), Vec::new());
    }

    #[test]
    fn refuses_truncated_or_padded_input() {
        let bytes = encode(&[("a".to_string(), b"b".to_vec())]);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(decode(&padded).is_err());
        // A huge count with no data fails instead of allocating.
        assert!(decode(&u32::MAX.to_be_bytes()).is_err());
    }
}
