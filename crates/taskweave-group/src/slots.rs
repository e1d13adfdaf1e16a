//! `Slots`: the optional concurrency limit shared by the group types.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::SpawnError;

/// A claimed slot: a permit, or nothing when there is no limit.
pub(crate) type Slot = Option<OwnedSemaphorePermit>;

/// A concurrency limit (or none). A slot is an owned semaphore permit that the task holds
/// until it ends, however it ends (a panic is caught inside the task, an abort drops it).
#[derive(Debug, Default)]
pub(crate) struct Slots {
    semaphore: Option<Arc<Semaphore>>,
    limit: Option<usize>,
}

/// Why no slot was had.
pub(crate) enum NoSlot {
    /// All taken.
    Full,
    /// The token was cancelled while waiting.
    Cancelled,
}

impl Slots {
    pub(crate) fn limited(limit: usize) -> Self {
        debug_assert!(limit > 0, "the groups refuse a zero limit");
        Slots {
            semaphore: Some(Arc::new(Semaphore::new(limit))),
            limit: Some(limit),
        }
    }

    pub(crate) fn limit(&self) -> Option<usize> {
        self.limit
    }

    /// A slot without waiting.
    pub(crate) fn try_take(&self) -> Result<Option<OwnedSemaphorePermit>, NoSlot> {
        match &self.semaphore {
            None => Ok(None),
            Some(semaphore) => Arc::clone(semaphore)
                .try_acquire_owned()
                .map(Some)
                .map_err(|_| NoSlot::Full),
        }
    }

    /// A slot, waiting for one unless `token` is cancelled first. (The groups refuse a zero
    /// limit when it is set, so a wait here always ends.)
    pub(crate) async fn take(
        &self,
        token: &CancellationToken,
    ) -> Result<Option<OwnedSemaphorePermit>, NoSlot> {
        let Some(semaphore) = &self.semaphore else {
            return Ok(None);
        };
        if let Ok(permit) = Arc::clone(semaphore).try_acquire_owned() {
            return Ok(Some(permit));
        }
        tokio::select! {
            biased;
            () = token.cancelled() => Err(NoSlot::Cancelled),
            // The semaphore is never closed, so acquiring only fails if it were.
            permit = Arc::clone(semaphore).acquire_owned() => permit.map(Some).map_err(|_| NoSlot::Full),
        }
    }
}

impl Slots {
    /// What `spawn` does before starting a task: refuse when `token` is cancelled, then wait
    /// for a slot. The future comes back in every refusal.
    pub(crate) async fn claim<F>(
        &self,
        token: &CancellationToken,
        future: F,
    ) -> Result<(F, Slot), SpawnError<F>> {
        if token.is_cancelled() {
            return Err(SpawnError::Cancelled(future));
        }
        match self.take(token).await {
            // The slot may have been freed by a task that failed and cancelled the group.
            Ok(_slot) if token.is_cancelled() => Err(SpawnError::Cancelled(future)),
            Ok(slot) => Ok((future, slot)),
            Err(NoSlot::Full) => Err(SpawnError::Full(future)),
            Err(NoSlot::Cancelled) => Err(SpawnError::Cancelled(future)),
        }
    }

    /// What `try_spawn` does: the same without waiting.
    pub(crate) fn try_claim<F>(
        &self,
        token: &CancellationToken,
        future: F,
    ) -> Result<(F, Slot), SpawnError<F>> {
        if token.is_cancelled() {
            return Err(SpawnError::Cancelled(future));
        }
        match self.try_take() {
            Ok(slot) => Ok((future, slot)),
            Err(_) => Err(SpawnError::Full(future)),
        }
    }
}
