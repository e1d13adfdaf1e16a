//! `Readiness`: the flag behind a `/readyz` endpoint.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the service should receive new traffic: the flag behind a `/readyz` endpoint.
///
/// A [`Shutdown`](crate::Shutdown) flips it to not-ready as the very first step of a
/// shutdown, then keeps serving for its readiness delay, so that load balancers stop sending
/// traffic before the drain starts. Cheap to clone; every clone reads and sets the same flag.
///
/// # Examples
///
/// ```
/// use taskweave_shutdown::Readiness;
///
/// let readiness = Readiness::new(false); // not ready while starting up
/// assert_eq!(readiness.probe(), (503, "not ready"));
/// readiness.set_ready();
/// assert_eq!(readiness.probe(), (200, "ready"));
/// ```
#[derive(Clone)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
}

impl Readiness {
    /// A flag that starts as `ready`.
    #[must_use]
    pub fn new(ready: bool) -> Self {
        Readiness {
            ready: Arc::new(AtomicBool::new(ready)),
        }
    }

    /// `true` while the service should receive traffic.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Marks the service ready (startup finished).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Marks the service not ready (a shutdown began, or a dependency is down).
    pub fn set_not_ready(&self) {
        self.ready.store(false, Ordering::Release);
    }

    /// What a `/readyz` endpoint answers: `(200, "ready")` or `(503, "not ready")`, for
    /// any HTTP framework.
    #[must_use]
    pub fn probe(&self) -> (u16, &'static str) {
        if self.is_ready() {
            (200, "ready")
        } else {
            (503, "not ready")
        }
    }

    /// A ready-made axum route for `/readyz`: `200 ready` or `503 not ready`.
    ///
    /// # Examples
    ///
    /// ```
    /// use taskweave_shutdown::Readiness;
    ///
    /// let readiness = Readiness::new(true);
    /// let app: axum::Router = axum::Router::new().route("/readyz", readiness.axum_handler());
    /// # drop(app);
    /// ```
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn axum_handler<S>(&self) -> axum::routing::MethodRouter<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let readiness = self.clone();
        axum::routing::get(move || {
            let (status, body) = readiness.probe();
            let status = axum::http::StatusCode::from_u16(status)
                .unwrap_or(axum::http::StatusCode::SERVICE_UNAVAILABLE);
            std::future::ready((status, body))
        })
    }
}

impl Default for Readiness {
    /// Ready.
    fn default() -> Self {
        Readiness::new(true)
    }
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readiness")
            .field("ready", &self.is_ready())
            .finish()
    }
}
