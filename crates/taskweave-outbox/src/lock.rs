//! `lock`: a mutex guard that carries on after a panic elsewhere. The mutexes it is used on
//! hold plain books (counters, lists, handles) that a panic cannot leave half-written.

use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
