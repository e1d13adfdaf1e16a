//! A pooled connection that never goes back to the pool inside a transaction (`Guarded`),
//! and `bounded`, a statement in a transaction of its own with a server-side timeout.

use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Postgres};

use super::sql;

type PgQuery<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

/// Runs `statement` in a transaction of its own whose `statement_timeout` is `timeout`, so
/// the server stops it too (a client-side timeout alone would leave it running); returns
/// the rows it changed.
pub(super) async fn bounded<'q>(
    conn: &mut Guarded,
    statement: &Arc<str>,
    timeout: Duration,
    bind: impl FnOnce(PgQuery<'q>) -> PgQuery<'q>,
) -> Result<u64, sqlx::Error> {
    let ms = timeout.as_millis().max(1);
    sqlx::raw_sql(AssertSqlSafe(format!(
        "BEGIN; SET LOCAL statement_timeout = {ms}"
    )))
    .execute(conn.open())
    .await?;
    let done = bind(sqlx::query(sql(statement)))
        .execute(conn.get())
        .await?;
    conn.commit().await?;
    Ok(done.rows_affected())
}

/// A pooled connection that never goes back to the pool inside a transaction.
///
/// sqlx 0.8 and 0.9.0 return a connection to the pool still inside a transaction when a
/// `begin` future is dropped halfway (sqlx issue 4393), and the next borrower's queries then
/// fail. We issue `BEGIN`/`COMMIT` ourselves and, if this guard is dropped while a
/// transaction may be open (a cancelled or aborted future, an error mid-way), detach the
/// connection from the pool and drop it: the socket closes and the server rolls back. This
/// relies only on documented behaviour: `PoolConnection::detach`, and PostgreSQL aborting
/// the transaction of a session that disconnects.
pub(crate) struct Guarded {
    conn: Option<PoolConnection<Postgres>>,
    in_transaction: bool,
}

impl Guarded {
    pub(crate) fn new(conn: PoolConnection<Postgres>) -> Self {
        Self {
            conn: Some(conn),
            in_transaction: false,
        }
    }

    /// A connection from `pool` with a transaction opened by a plain `BEGIN`: what
    /// `Pool::begin` does, without its flaw (sqlx issue 4393, above).
    pub(crate) async fn begin(pool: &sqlx::PgPool) -> Result<Self, sqlx::Error> {
        let mut conn = Self::new(pool.acquire().await?);
        sqlx::raw_sql("BEGIN").execute(conn.open()).await?;
        Ok(conn)
    }

    /// The connection, marked as possibly inside a transaction from now on (call it for the
    /// statement that opens one).
    pub(crate) fn open(&mut self) -> &mut PgConnection {
        self.in_transaction = true;
        self.get()
    }

    pub(crate) fn get(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("the connection is held until the guard drops")
    }

    pub(crate) fn in_transaction(&self) -> bool {
        self.in_transaction
    }

    pub(crate) async fn commit(&mut self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("COMMIT").execute(self.get()).await?;
        self.in_transaction = false;
        Ok(())
    }

    pub(crate) async fn rollback(&mut self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("ROLLBACK").execute(self.get()).await?;
        self.in_transaction = false;
        Ok(())
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if self.in_transaction
            && let Some(conn) = self.conn.take()
        {
            drop(conn.detach());
        }
    }
}
