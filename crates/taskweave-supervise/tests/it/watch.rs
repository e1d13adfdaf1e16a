//! `TokenWatch`: the flag follows the token; the registered waker is woken; the hook runs once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::task::{Wake, Waker};

use taskweave_supervise::TokenWatch;
use tokio_util::sync::CancellationToken;

#[test]
fn the_flag_follows_the_token_and_its_ancestors() {
    let root = CancellationToken::new();
    let child = root.child_token().child_token();
    let watch = TokenWatch::new(&child);
    assert!(!watch.is_cancelled());
    root.cancel();
    assert!(watch.is_cancelled(), "set inside the ancestor's cancel()");
}

#[test]
fn the_hook_runs_once_and_the_registered_waker_is_woken() {
    let token = CancellationToken::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let watch = TokenWatch::with_hook(&token, move || {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    let woken = Arc::new(CountWakes(AtomicUsize::new(0)));
    watch.register(&Waker::from(Arc::clone(&woken)));
    token.cancel();
    watch.set();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(woken.0.load(Ordering::SeqCst), 1);
}

#[test]
fn an_already_cancelled_token_is_seen_at_once() {
    let token = CancellationToken::new();
    token.cancel();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let watch = TokenWatch::with_hook(&token, move || {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    assert!(watch.is_cancelled());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_cancel_from_another_thread_is_seen() {
    let token = CancellationToken::new();
    let watch = TokenWatch::new(&token);
    std::thread::spawn(move || token.cancel()).join().unwrap();
    assert!(watch.is_cancelled());
}

struct CountWakes(AtomicUsize);

impl Wake for CountWakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_panicking_cancel_hook_does_not_unwind_into_cancel_or_break_the_token_tree() {
    let parent = CancellationToken::new();
    let child = parent.child_token();
    let sibling = parent.child_token();
    let watch = TokenWatch::with_hook(&child, || panic!("hook exploded"));
    parent.cancel(); // must not unwind
    assert!(watch.is_cancelled());
    assert!(
        sibling.is_cancelled(),
        "the other children are cancelled too"
    );
    // The tree's locks are not poisoned: the tokens still work.
    let _grandchild = parent.child_token();
    assert!(parent.is_cancelled());
}
