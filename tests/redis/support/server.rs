//! A throwaway redis-server of the test's own, with persistence (`appendonly yes`), on a unix
//! socket in a temp dir, that the test can restart on the same socket and dir: the restart
//! tests (a server restart keeps the streams, but not its client ids).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A redis-server child process (`appendonly yes`, no RDB snapshots, logging to its stdout,
/// which the tests read for its "ready" lines).
pub struct Server {
    /// `redis+unix://<dir>/redis.sock`.
    pub url: String,
    socket: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
    lines: Option<mpsc::Receiver<String>>,
}

/// How long a start or a restart (with its loading) may take.
const START_TIMEOUT: Duration = Duration::from_secs(30);

impl Server {
    /// Starts a server, or `None` (after saying so) when there is no `redis-server` to run and
    /// this is not CI (`CI=true`, where it fails the test instead), as for the shared server.
    pub fn start() -> Option<Server> {
        let found = Command::new("redis-server").arg("--version").stdout(Stdio::null()).status().is_ok();
        if !found {
            if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
                panic!("redis-server is not on PATH: CI must run the Redis restart tests");
            }
            eprintln!("SKIPPED: no redis-server on PATH: the restart test did not run");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("redis.sock").display().to_string();
        let mut server =
            Server { url: format!("redis+unix://{socket}"), socket, dir, child: None, lines: None };
        server.spawn(&[]);
        server.wait_for("ready to accept connections");
        Some(server)
    }

    fn spawn(&mut self, extra: &[&str]) {
        let mut child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket", &self.socket, "--unixsocketperm", "700"])
            .args(["--appendonly", "yes", "--save", "", "--logfile", ""])
            .arg("--dir")
            .arg(self.dir.path())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        self.child = Some(child);
        self.lines = Some(rx);
    }

    /// Waits until the server's log prints a line holding `what`.
    fn wait_for(&self, what: &str) {
        let deadline = Instant::now() + START_TIMEOUT;
        let lines = self.lines.as_ref().unwrap();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(what) => return,
                Ok(_) => {}
                Err(e) => panic!("redis-server did not log {what:?}: {e}"),
            }
        }
    }

    /// A new plain connection to the server.
    pub fn admin(&self) -> redis::Connection {
        redis::Client::open(self.url.as_str()).unwrap().get_connection().unwrap()
    }

    /// `SHUTDOWN` (the append-only file is flushed first) and waits for the process to end:
    /// every connection is dropped.
    pub fn stop(&mut self) {
        let _ = redis::cmd("SHUTDOWN").query::<()>(&mut self.admin());
        if let Some(mut child) = self.child.take() {
            child.wait().unwrap();
        }
    }

    /// Starts the server again on the same socket and dir (so with its data), with `extra`
    /// arguments, and waits until it listens (`Server initialized`: it may still be loading).
    pub fn start_again(&mut self, extra: &[&str]) {
        self.spawn(extra);
        self.wait_for("Server initialized");
    }

    /// Waits until the server has loaded its data and accepts commands.
    pub fn wait_ready(&self) {
        self.wait_for("ready to accept connections");
    }

    /// Stops the server and starts it again, ready (its data loaded).
    pub fn restart(&mut self) {
        self.stop();
        self.start_again(&[]);
        self.wait_ready();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
