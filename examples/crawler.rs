//! A small crawler where four crates compose behind one error type: a rate limit per host
//! (`taskweave-limit`), a pool of fetchers (`taskweave-pool`), the pages in the order they
//! were asked for (`taskweave-reorder`), and a group that stops everything at the first
//! fatal error (`taskweave-group`). It depends on the single crates, not the umbrella.
//!
//! The "web" is a table in memory with latencies, so the example runs anywhere, in about a
//! second: the first crawl succeeds; in the second, one host answers 503 and the crawl fails
//! fast: the fetches in flight see the cancellation and nothing more is submitted.

#[path = "support.rs"]
mod support;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use taskweave_group::{PanicError, TaskFailure, TaskGroup};
use taskweave_limit::{KeyedRateLimiter, Quota, WaitError};
use taskweave_pool::{JobContext, JobError, SubmitError, WorkerPool};
use taskweave_reorder::{ReorderError, ReorderExt};
use tokio_util::sync::CancellationToken;

/// Everything that can go wrong in a crawl, in one type: each crate's error converts into it.
#[derive(Debug)]
enum CrawlError {
    /// A host answered with an error status.
    Status { url: String, status: u16 },
    /// A fetcher panicked (the pool caught it; the worker kept serving).
    Panicked(PanicError),
    /// The crawl was cancelled (by a sibling's failure or by the caller).
    Cancelled,
    /// A page was never fetched: the pool refused it, or its result went missing.
    NotFetched(String),
}

impl fmt::Display for CrawlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrawlError::Status { url, status } => write!(f, "{url}: HTTP {status}"),
            CrawlError::Panicked(panic) => write!(f, "fetcher panicked: {}", panic.message()),
            CrawlError::Cancelled => f.write_str("cancelled"),
            CrawlError::NotFetched(what) => write!(f, "not fetched: {what}"),
        }
    }
}

impl std::error::Error for CrawlError {}

impl From<WaitError> for CrawlError {
    fn from(error: WaitError) -> Self {
        match error {
            WaitError::Cancelled => CrawlError::Cancelled,
            other => CrawlError::NotFetched(other.to_string()),
        }
    }
}

impl From<JobError<CrawlError>> for CrawlError {
    fn from(error: JobError<CrawlError>) -> Self {
        match error {
            JobError::Failed(error) => error,
            JobError::Panicked(panic) => CrawlError::Panicked(panic),
            other => CrawlError::NotFetched(other.to_string()),
        }
    }
}

impl From<SubmitError<Url>> for CrawlError {
    fn from(error: SubmitError<Url>) -> Self {
        match error {
            SubmitError::Cancelled(_) | SubmitError::Closed(_) => CrawlError::Cancelled,
            other => CrawlError::NotFetched(other.into_inner().to_string()),
        }
    }
}

impl<T> From<ReorderError<T>> for CrawlError {
    fn from(error: ReorderError<T>) -> Self {
        CrawlError::NotFetched(error.to_string())
    }
}

#[derive(Clone, Debug)]
struct Url {
    host: &'static str,
    path: &'static str,
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "https://{}{}", self.host, self.path)
    }
}

/// The pretend web: how long each host takes, and which one is down.
struct Web {
    latency: HashMap<&'static str, Duration>,
    down: Option<&'static str>,
}

impl Web {
    async fn fetch(&self, context: &JobContext, url: &Url) -> Result<usize, CrawlError> {
        let latency = self.latency[url.host];
        tokio::select! {
            () = context.cancelled() => return Err(CrawlError::Cancelled),
            () = tokio::time::sleep(latency) => {}
        }
        if self.down == Some(url.host) {
            return Err(CrawlError::Status {
                url: url.to_string(),
                status: 503,
            });
        }
        Ok(url.path.len() * 100)
    }
}

fn urls() -> Vec<Url> {
    let mut urls = Vec::new();
    for path in ["/", "/about", "/blog", "/blog/1", "/blog/2", "/contact"] {
        for host in ["docs.example", "shop.example", "news.example"] {
            urls.push(Url { host, path });
        }
    }
    urls
}

/// Crawls `urls` and prints each page in the order it was asked for; the first fatal error
/// stops the whole crawl.
async fn crawl(
    token: CancellationToken,
    web: Arc<Web>,
    urls: Vec<Url>,
) -> Result<usize, CrawlError> {
    // At most 10 requests a second per host, bursts of 2: polite to every host, whatever the
    // other hosts do.
    let per_host = Arc::new(KeyedRateLimiter::<&'static str>::new(
        Quota::per_second(10).with_burst(2),
    ));
    // The error type is named once, here: the tasks below use `?`.
    let group = TaskGroup::<CrawlError>::new(token);
    let fetchers = WorkerPool::builder(4, 8).name("fetcher").results(8).spawn(
        group.token(),
        move |context: JobContext, url: Url| {
            let (web, per_host) = (Arc::clone(&web), Arc::clone(&per_host));
            async move {
                per_host.wait(context.token(), &url.host).await?;
                web.fetch(&context, &url).await.map(|bytes| (url, bytes))
            }
        },
    );
    let submitter = fetchers.clone();
    // The results stream ends once nobody can submit any more: this handle is given up with
    // it, and the submitter below closes the pool when it is done.
    let results = fetchers.into_results().expect("results are enabled");

    // A result can come back at most this far ahead of the one the reader waits for: every
    // page is asked for before the first is in, so the window is the whole crawl.
    let window = urls.len();
    let token = group.token();
    group
        .spawn(async move {
            let mut submitted = Ok(());
            for url in urls {
                submitted = submitter.submit(&token, url).await.map(drop);
                if submitted.is_err() {
                    break;
                }
            }
            // Closed on every path: the fetches in flight finish (or see the cancellation)
            // before the crawl returns.
            let report = submitter.close().await;
            println!(
                "  fetchers: {} fetched, {} failed, {} handed back",
                report.metrics.completed,
                report.metrics.failed,
                report.handed_back.len()
            );
            Ok(submitted?)
        })
        .await
        .map_err(|_| CrawlError::Cancelled)?;

    let ordering_token = group.token();
    let total = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&total);
    group
        .spawn(async move {
            // The pool hands results back in completion order with their submission index;
            // the reorder adapter puts them back in the order they were asked for.
            let mut pages = results.reorder(ordering_token, window);
            while let Some(page) = pages.next().await {
                let (url, bytes) = page??;
                println!("  {:<32} {bytes:>5} bytes", url.to_string());
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        })
        .await
        .map_err(|_| CrawlError::Cancelled)?;

    match group.wait().await {
        Ok(()) => Ok(total.load(std::sync::atomic::Ordering::Relaxed)),
        Err(TaskFailure::Failed(error)) => Err(error),
        Err(TaskFailure::Panicked(panic)) => Err(CrawlError::Panicked(panic)),
        Err(other) => Err(CrawlError::NotFetched(other.to_string())),
    }
}

#[tokio::main]
async fn main() {
    support::init_logging("error");
    let latency = HashMap::from([
        ("docs.example", Duration::from_millis(20)),
        ("shop.example", Duration::from_millis(60)),
        ("news.example", Duration::from_millis(35)),
    ]);

    println!("1. a crawl of three hosts, 10 requests a second per host, 4 fetchers:");
    let web = Arc::new(Web {
        latency: latency.clone(),
        down: None,
    });
    match crawl(CancellationToken::new(), web, urls()).await {
        Ok(pages) => println!("  done: {pages} pages, in the order asked for\n"),
        Err(error) => println!("  failed: {error}\n"),
    }

    println!("2. the same crawl while shop.example answers 503: the first error stops it:");
    let web = Arc::new(Web {
        latency,
        down: Some("shop.example"),
    });
    match crawl(CancellationToken::new(), web, urls()).await {
        Ok(pages) => println!("  done: {pages} pages"),
        Err(error) => println!("  failed fast: {error}"),
    }
}
