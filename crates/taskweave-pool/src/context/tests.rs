use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_util::sync::CancellationToken;

use super::CancelState;

#[test]
fn cancelling_the_token_sets_the_flag_before_cancel_returns() {
    let token = CancellationToken::new();
    let state = CancelState::new(token.clone());
    assert!(!state.is_cancelled());
    token.cancel();
    assert!(state.is_cancelled());
}

#[test]
fn cancelling_an_ancestor_sets_the_flag_and_runs_the_hook_once() {
    let root = CancellationToken::new();
    let child = root.child_token().child_token();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let state = CancelState::with_hook(child, move || {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    root.cancel();
    assert!(state.is_cancelled());
    state.cancel();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn an_already_cancelled_token_starts_cancelled() {
    let token = CancellationToken::new();
    token.cancel();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let state = CancelState::with_hook(token, move || {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    assert!(state.is_cancelled());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn cancel_from_another_thread_is_seen() {
    let token = CancellationToken::new();
    let state = CancelState::new(token.clone());
    std::thread::spawn(move || token.cancel()).join().unwrap();
    assert!(state.is_cancelled());
}
