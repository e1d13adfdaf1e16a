//! Process tests of `examples/order_service.rs`: the built example runs as a child process
//! and receives real signals. `cargo test` builds the examples before it runs the tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

fn example_binary() -> PathBuf {
    // target/<profile>/deps/order_service-<hash> → target/<profile>/examples/order_service
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let binary = profile_dir
        .join("examples")
        .join(format!("order_service{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} is missing: run `cargo test` (which builds the examples) or `cargo build --example order_service`",
        binary.display()
    );
    binary
}

struct Service {
    child: Child,
    addr: String,
    // Read on threads from the start, so that a full pipe never blocks the child.
    stdout: Option<thread::JoinHandle<String>>,
    stderr: Option<thread::JoinHandle<String>>,
}

impl Service {
    fn start(args: &[&str]) -> Service {
        let mut child = Command::new(example_binary())
            .args(["--addr", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the example starts");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut stderr = child.stderr.take().expect("piped stderr");
        let stderr = thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the first line");
        let stdout = thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_string();
        Service {
            child,
            addr,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits for the process to exit (at most `limit`), returning its status, the time it
    /// took, its stdout after the first line and its stderr.
    fn wait(mut self, limit: Duration) -> (ExitStatus, Duration, String, String) {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                started.elapsed() <= limit,
                "the service did not exit within {limit:?}"
            );
            thread::sleep(Duration::from_millis(10));
        };
        let elapsed = started.elapsed();
        let out = self
            .stdout
            .take()
            .map(|t| t.join().unwrap())
            .unwrap_or_default();
        let err = self
            .stderr
            .take()
            .map(|t| t.join().unwrap())
            .unwrap_or_default();
        (status, elapsed, out, err)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // A test that failed half-way leaves no server behind.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.1 request on its own connection: the status code and the body.
fn request(addr: &str, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// The step names of the printed report, in order.
fn report_steps(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .skip_while(|line| !line.starts_with("shutdown ("))
        .skip(2)
        .take_while(|line| !line.trim().is_empty())
        .map(|row| row.to_string())
        .collect()
}

fn position(rows: &[String], name: &str) -> usize {
    rows.iter()
        .position(|row| row.contains(name))
        .unwrap_or_else(|| panic!("{name} is not in the report: {rows:#?}"))
}

#[test]
fn sigterm_drains_in_flight_requests_and_exits_0_with_the_phases_in_order() {
    let service = Service::start(&["--budget-ms", "6000", "--delay-ms", "1500"]);
    let addr = service.addr.clone();
    assert_eq!(request(&addr, "GET", "/readyz").unwrap().0, 200);

    // Three orders in flight, each taking 1.2 s.
    let in_flight: Vec<_> = (0..3)
        .map(|_| {
            let addr = addr.clone();
            thread::spawn(move || request(&addr, "POST", "/orders?work_ms=1200"))
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let signalled = Instant::now();
    service.signal("TERM");

    // Readiness flips first; the other endpoints still answer during the delay.
    let mut readyz = 0;
    while signalled.elapsed() < Duration::from_millis(1000) {
        readyz = request(&addr, "GET", "/readyz").unwrap().0;
        if readyz == 503 {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(readyz, 503, "/readyz answers 503 during the delay");
    assert!(
        signalled.elapsed() < Duration::from_millis(1500),
        "still inside the delay"
    );
    assert_eq!(
        request(&addr, "GET", "/healthz").unwrap(),
        (200, "ok".to_string())
    );
    assert_eq!(request(&addr, "GET", "/orders").unwrap().0, 200);

    for order in in_flight {
        let (status, body) = order.join().unwrap().expect("the request completes");
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("processed"), "{body}");
    }

    let (status, elapsed, stdout, stderr) = service.wait(Duration::from_secs(15));
    assert_eq!(
        status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // Delay + budget, with a margin for the process itself.
    assert!(
        signalled.elapsed() < Duration::from_millis(1500 + 6000 + 1000),
        "exited {elapsed:?} after waiting"
    );
    let rows = report_steps(&stdout);
    let order: Vec<usize> = [
        "readiness delay",
        "http drain",
        "worker pool",
        "cleaner",
        "critical sections",
        "order store",
        "metrics exporter",
    ]
    .iter()
    .map(|name| position(&rows, name))
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{rows:#?}");
    assert!(
        rows.iter().all(|row| row.contains("completed")),
        "{rows:#?}"
    );
    assert!(stdout.contains("shutdown (SIGTERM): clean"), "{stdout}");
}

#[test]
fn sigterm_then_sigint_exits_at_once_with_130() {
    let service = Service::start(&["--budget-ms", "10000", "--delay-ms", "5000"]);
    service.signal("TERM");
    thread::sleep(Duration::from_millis(300));
    let second = Instant::now();
    service.signal("INT");
    let (status, _, _, stderr) = service.wait(Duration::from_secs(10));
    assert!(second.elapsed() < Duration::from_secs(3), "not at once");
    assert_eq!(status.code(), Some(130), "stderr:\n{stderr}");
    // What was known so far: the readiness delay, interrupted.
    assert!(
        stderr.contains("SIGINT during the shutdown: exiting now with code 130"),
        "{stderr}"
    );
    assert!(stderr.contains("readiness delay"), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
}

#[test]
fn a_hanging_phase_is_cut_off_and_the_process_still_exits_within_the_budget() {
    let service = Service::start(&[
        "--budget-ms",
        "2000",
        "--delay-ms",
        "200",
        "--hang-phase",
        "--json",
    ]);
    let signalled = Instant::now();
    service.signal("TERM");
    let (status, _, stdout, stderr) = service.wait(Duration::from_secs(15));
    assert!(
        signalled.elapsed() < Duration::from_millis(200 + 2000 + 1500),
        "took {:?}",
        signalled.elapsed()
    );
    assert_eq!(
        status.code(),
        Some(1),
        "not clean: stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let rows = report_steps(&stdout);
    let stuck = &rows[position(&rows, "stuck exporter")];
    assert!(
        stuck.contains("timed out") && stuck.contains("cut off at its deadline"),
        "{stuck}"
    );
    assert!(
        rows[position(&rows, "order store")].contains("completed"),
        "{rows:#?}"
    );
    assert!(
        stdout.contains(r#""name":"stuck exporter","#),
        "the JSON report: {stdout}"
    );
}

#[test]
fn a_full_queue_answers_429_and_the_accepted_orders_still_complete() {
    let service = Service::start(&["--workers", "1", "--queue", "1", "--delay-ms", "100"]);
    let addr = service.addr.clone();
    // One order runs, one waits in the queue; the rest find the queue full.
    let orders: Vec<_> = (0..4)
        .map(|_| {
            let addr = addr.clone();
            let order = thread::spawn(move || request(&addr, "POST", "/orders?work_ms=600"));
            thread::sleep(Duration::from_millis(50));
            order
        })
        .collect();
    let mut statuses: Vec<u16> = orders
        .into_iter()
        .map(|o| o.join().unwrap().unwrap().0)
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 429, 429]);
    service.signal("TERM");
    let (status, _, stdout, stderr) = service.wait(Duration::from_secs(15));
    assert_eq!(
        status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
}
