//! A unix-socket proxy in front of the test server that cuts one request (its reply lost, or
//! the request itself), for the Redis fan-out's adversarial tests, and the request patterns
//! they cut.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// An armed cut: the pattern, whether the server runs the request first, whether new
/// connections are refused after it.
type Cut = (Vec<u8>, bool, bool);

/// A unix-socket proxy in front of the test server. Armed with a byte pattern, it cuts the
/// connection of the next request that contains it: `after` lets the server run the request
/// first and swallows its reply (a lost reply), else the request never reaches the server (a
/// lost request). Connections made later pass through, unless armed to refuse them until healed
/// (so that the pool's one fresh retry of a never-waiting call fails too).
pub struct CutProxy {
    /// The proxy's URL (`redis+unix://...`), for the streams under test.
    pub url: String,
    arm: Arc<Mutex<Option<Cut>>>,
    cuts: Arc<AtomicUsize>,
    refusing: Arc<AtomicBool>,
    _dir: tempfile::TempDir,
}

impl CutProxy {
    /// `None` unless the server is on a unix socket.
    pub fn start(server_url: &str) -> Option<CutProxy> {
        use std::io::{Read, Write};
        use std::os::unix::net::{UnixListener, UnixStream};
        let server = server_url.strip_prefix("redis+unix://")?.to_owned();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let arm: Arc<Mutex<Option<Cut>>> = Arc::new(Mutex::new(None));
        let cuts = Arc::new(AtomicUsize::new(0));
        let refusing = Arc::new(AtomicBool::new(false));
        let (a, k, r) = (arm.clone(), cuts.clone(), refusing.clone());
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                if r.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let Ok(mut upstream) = UnixStream::connect(&server) else { return };
                let swallow = Arc::new(AtomicBool::new(false));
                let (mut c2, mut u2, sw) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap(), swallow.clone());
                thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n @ 1..) = u2.read(&mut buf) {
                        if sw.load(Ordering::SeqCst) || c2.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
                let (a, k, r) = (a.clone(), k.clone(), r.clone());
                thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n @ 1..) = client.read(&mut buf) {
                        let chunk = &buf[..n];
                        let cut = {
                            let mut arm = a.lock().unwrap();
                            let hit = arm.as_ref().is_some_and(|(pat, _, _)| {
                                chunk.windows(pat.len()).any(|w| w == pat.as_slice())
                            });
                            if hit {
                                arm.take().map(|(_, after, refuse)| (after, refuse))
                            } else {
                                None
                            }
                        };
                        match cut {
                            None => {
                                if upstream.write_all(chunk).is_err() {
                                    return;
                                }
                            }
                            Some((after, refuse)) => {
                                swallow.store(true, Ordering::SeqCst);
                                if refuse {
                                    r.store(true, Ordering::SeqCst);
                                }
                                if after {
                                    let _ = upstream.write_all(chunk);
                                    thread::sleep(Duration::from_millis(80)); // the server runs it
                                }
                                k.fetch_add(1, Ordering::SeqCst);
                                let _ = client.shutdown(std::net::Shutdown::Both);
                                let _ = upstream.shutdown(std::net::Shutdown::Both);
                                return;
                            }
                        }
                    }
                });
            }
        });
        Some(CutProxy { url: format!("redis+unix://{}", path.display()), arm, cuts, refusing, _dir: dir })
    }

    /// Cuts the next request holding `pattern` (`after`: the server ran it), then lets new
    /// connections through.
    pub fn arm(&self, pattern: &[u8], after: bool) {
        *self.arm.lock().unwrap() = Some((pattern.to_vec(), after, false));
    }

    /// As [`arm`](CutProxy::arm), then refuses new connections until [`heal`](CutProxy::heal).
    pub fn arm_refusing(&self, pattern: &[u8], after: bool) {
        *self.arm.lock().unwrap() = Some((pattern.to_vec(), after, true));
    }

    /// Lets connections through again, and waits out the pool's reconnect backoff (a
    /// never-waiting call during it errs at once).
    pub fn heal(&self) {
        if self.refusing.swap(false, Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(250));
        }
    }

    pub fn disarm(&self) {
        *self.arm.lock().unwrap() = None;
        self.heal();
    }

    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

/// The fan-out's publish: its `XADD` to the log (the only `XADD` to the log with `NOMKSTREAM`
/// right after the key: the consumers' `XRANGE`s of the log carry entry numbers there).
pub const APPEND: &[u8] = b":log\r\n$10\r\nNOMKSTREAM";
/// The gate's `EVALSHA` (its arguments hold the meta field `trim`; so do `RedisStream::trim`'s).
pub const GATE: &[u8] = b"\r\n$4\r\ntrim\r\n";

/// A [`CutProxy`] in front of the server at `$url`, or an early return (with a word) when the
/// server is not on a unix socket.
#[allow(unused_macros)] // used by the test binaries that cut requests
macro_rules! proxy {
    ($url:expr) => {
        match $crate::redis_support::cut_proxy::CutProxy::start(&$url) {
            Some(p) => p,
            None => {
                eprintln!("the server is not on a unix socket: this test needs one");
                return;
            }
        }
    };
}
