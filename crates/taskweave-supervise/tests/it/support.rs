//! Helpers shared by the test modules: task-leak checks and log capture.

use std::io;
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) use taskweave_testkit::{alive_tasks, assert_no_leaked_tasks};
use tracing_subscriber::fmt::MakeWriter;

/// The log sink of this test binary: every `tracing` event of every test, from every thread.
///
/// One global subscriber rather than one scoped subscriber per test: `tracing` caches each
/// callsite's interest process-wide, and scoped subscribers on concurrently running test
/// threads make that cache (and so the capture) flaky. Tests look for their own task names.
#[derive(Clone, Default)]
pub(crate) struct LogCapture {
    buffer: Arc<Mutex<Vec<u8>>>,
}

static GLOBAL: OnceLock<LogCapture> = OnceLock::new();

impl LogCapture {
    /// The global capture, installed on first use.
    pub(crate) fn global() -> &'static LogCapture {
        GLOBAL.get_or_init(|| {
            let capture = LogCapture::default();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(capture.clone())
                .with_ansi(false)
                .with_max_level(tracing::Level::DEBUG)
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("only LogCapture sets the global subscriber");
            capture
        })
    }

    /// Everything logged so far.
    pub(crate) fn contents(&self) -> String {
        String::from_utf8_lossy(&self.buffer.lock().unwrap()).into_owned()
    }

    /// The lines logged so far that mention `needle`.
    pub(crate) fn lines_with(&self, needle: &str) -> String {
        self.contents()
            .lines()
            .filter(|line| line.contains(needle))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl io::Write for LogCapture {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buffer.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
