//! `TaskName`: the cheap-to-clone name every supervised task carries.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// The name of a supervised task, used in logs, errors and drain reports.
///
/// Built from a `&'static str` without allocating, or from a `String` (allocated once and then
/// shared). Cloning never allocates, so names can be copied into errors and reports freely.
///
/// # Examples
///
/// ```
/// use taskweave_supervise::TaskName;
///
/// let fixed = TaskName::from("poller");
/// let dynamic = TaskName::from(format!("consumer-{}", 3));
/// assert_eq!(&*fixed, "poller");
/// assert_eq!(dynamic.to_string(), "consumer-3");
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskName(Repr);

// Two representations so that the common case, a literal name, costs no allocation per spawn.
#[derive(Clone)]
enum Repr {
    Static(&'static str),
    Shared(Arc<str>),
}

impl TaskName {
    /// The name as a string slice.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Static(name) => name,
            Repr::Shared(name) => name,
        }
    }
}

impl PartialEq for Repr {
    fn eq(&self, other: &Self) -> bool {
        self.as_ref() == other.as_ref()
    }
}

impl Eq for Repr {}

impl PartialOrd for Repr {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Repr {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_ref().cmp(other.as_ref())
    }
}

impl std::hash::Hash for Repr {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state);
    }
}

impl AsRef<str> for Repr {
    fn as_ref(&self) -> &str {
        match self {
            Repr::Static(name) => name,
            Repr::Shared(name) => name,
        }
    }
}

impl Deref for TaskName {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for TaskName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for TaskName {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&'static str> for TaskName {
    fn from(name: &'static str) -> Self {
        TaskName(Repr::Static(name))
    }
}

impl From<String> for TaskName {
    fn from(name: String) -> Self {
        TaskName(Repr::Shared(name.into()))
    }
}

impl From<Arc<str>> for TaskName {
    fn from(name: Arc<str>) -> Self {
        TaskName(Repr::Shared(name))
    }
}

impl PartialEq<str> for TaskName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for TaskName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for TaskName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for TaskName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}
