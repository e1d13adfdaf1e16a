//! An in-process wake-up from writers to relays, so a relay sharing a process with the
//! writer does not wait for its poll interval.

use tokio::sync::watch;

/// Wakes every relay of a store after a local commit. Cheap to clone; all clones wake the
/// same relays.
///
/// A nudge is a hint, never needed for correctness: a relay that misses one (another
/// process wrote the event) finds the event at its next poll.
#[derive(Clone, Debug)]
pub struct Nudge {
    sender: watch::Sender<u64>,
}

impl Nudge {
    /// A nudge nobody listens to yet.
    #[must_use]
    pub fn new() -> Self {
        Self {
            sender: watch::Sender::new(0),
        }
    }

    /// Wakes every listener, now or, for a listener that is busy, at its next wait.
    pub fn notify(&self) {
        self.sender
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    pub(crate) fn listen(&self) -> NudgeListener {
        NudgeListener {
            receiver: self.sender.subscribe(),
        }
    }
}

impl Default for Nudge {
    fn default() -> Self {
        Self::new()
    }
}

/// A relay's end of a [`Nudge`].
#[derive(Debug)]
pub(crate) struct NudgeListener {
    receiver: watch::Receiver<u64>,
}

impl NudgeListener {
    /// Forgets the nudges seen so far: called just before a claim, whose snapshot sees every
    /// commit that nudged before it.
    pub(crate) fn mark_seen(&mut self) {
        self.receiver.borrow_and_update();
    }

    /// Waits for a nudge newer than the last [`mark_seen`](Self::mark_seen). Cancel safe.
    pub(crate) async fn notified(&mut self) {
        // The sender lives in the store the relay holds, so `changed` errs only if it was
        // dropped, and then no nudge can come: wait for the poll instead.
        if self.receiver.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
