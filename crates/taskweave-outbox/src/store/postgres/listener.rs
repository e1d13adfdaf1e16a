//! Cross-process wake-ups: `listen` holds a `LISTEN` connection and nudges the local
//! relays on every notification.

use std::time::Duration;

use sqlx::postgres::PgPool;
use tokio_util::sync::CancellationToken;

use crate::nudge::Nudge;

/// How long the listener waits before connecting again after a failure.
const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// `LISTEN`s on `channel` and nudges on every notification until `token` is cancelled.
/// Every (re)connection nudges too, since notifications sent while it was away are lost.
pub(super) async fn listen(pool: PgPool, channel: String, nudge: Nudge, token: CancellationToken) {
    loop {
        let connected = token
            .run_until_cancelled(async {
                let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
                listener.listen(&channel).await?;
                nudge.notify();
                loop {
                    // `None`: the connection was lost and sqlx re-established it; what was
                    // sent in between is lost, so wake the relay to look.
                    if listener.try_recv().await?.is_none() {
                        tracing::debug!(%channel, "outbox listener reconnected");
                    }
                    nudge.notify();
                }
                #[allow(unreachable_code, reason = "the loop ends only with an error")]
                Ok::<(), sqlx::Error>(())
            })
            .await;
        match connected {
            None => return,
            Some(Err(error)) => {
                tracing::warn!(%channel, %error, "outbox listener failed; relays poll until it is back");
                if token
                    .run_until_cancelled(tokio::time::sleep(LISTEN_RETRY))
                    .await
                    .is_none()
                {
                    return;
                }
            }
            Some(Ok(())) => {}
        }
    }
}
