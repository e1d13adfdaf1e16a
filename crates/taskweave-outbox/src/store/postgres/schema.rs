//! Where the outbox tables live: [`Schema`], a PostgreSQL schema and a table-name prefix,
//! both checked to be plain identifiers since they are written into SQL.

use std::fmt;

/// Where the outbox tables live: a PostgreSQL schema and a table-name prefix.
///
/// The default is schema `public`, prefix `outbox_`: tables `public.outbox_events`,
/// `public.outbox_buckets` and `public.outbox_meta`.
#[derive(Clone, PartialEq, Eq)]
pub struct Schema {
    pub(super) schema: String,
    prefix: String,
}

impl Schema {
    /// Tables in `schema`, with the default `outbox_` prefix.
    ///
    /// # Panics
    ///
    /// Panics unless `schema` is a plain lowercase identifier (`[a-z_][a-z0-9_]*`, at most
    /// 48 bytes): it is written into SQL, so nothing else is accepted.
    #[must_use]
    pub fn new(schema: &str) -> Self {
        assert!(
            is_identifier(schema, false),
            "Schema::new: {schema:?} is not a plain lowercase identifier ([a-z_][a-z0-9_]*, at most 48 bytes)"
        );
        Self {
            schema: schema.to_owned(),
            prefix: "outbox_".to_owned(),
        }
    }

    /// Sets the table-name prefix (it may be empty).
    ///
    /// # Panics
    ///
    /// Panics unless `prefix` is empty or `[a-z_][a-z0-9_]*`, at most 48 bytes.
    #[must_use]
    pub fn with_table_prefix(mut self, prefix: &str) -> Self {
        assert!(
            is_identifier(prefix, true),
            "Schema::with_table_prefix: {prefix:?} is not a plain lowercase identifier ([a-z_][a-z0-9_]*, at most 48 bytes)"
        );
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// The schema's name.
    #[must_use]
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The events table, quoted for SQL.
    #[must_use]
    pub fn events_table(&self) -> String {
        self.table("events")
    }

    /// The buckets table, quoted for SQL.
    #[must_use]
    pub fn buckets_table(&self) -> String {
        self.table("buckets")
    }

    pub(super) fn meta_table(&self) -> String {
        self.table("meta")
    }

    /// The consumer inbox's table of applied events, quoted for SQL.
    #[cfg(feature = "kafka")]
    pub(crate) fn inbox_table(&self) -> String {
        self.table("inbox")
    }

    /// The consumer inbox's table of each key's newest sequence, quoted for SQL.
    #[cfg(feature = "kafka")]
    pub(crate) fn inbox_keys_table(&self) -> String {
        self.table("inbox_keys")
    }

    #[cfg(feature = "kafka")]
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    fn table(&self, name: &str) -> String {
        format!("\"{}\".\"{}{name}\"", self.schema, self.prefix)
    }

    pub(super) fn index(&self, name: &str) -> String {
        format!("\"{}{name}\"", self.prefix)
    }
}

impl Default for Schema {
    fn default() -> Self {
        Self::new("public")
    }
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schema({}.{}*)", self.schema, self.prefix)
    }
}

fn is_identifier(name: &str, may_be_empty: bool) -> bool {
    if name.is_empty() {
        return may_be_empty;
    }
    let bytes = name.as_bytes();
    name.len() <= 48
        && (bytes[0].is_ascii_lowercase() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}
