//! A throwaway PostgreSQL for a test binary, started from the installed server binaries at the
//! first use: `initdb` in a temp dir, `wal_level = logical`, a unix socket in that dir only (no
//! TCP port to collide on), stopped and removed by a watchdog when the test process exits.
//! `LANESTREAM_PG_URL` names an existing server instead. Without the binaries: one loud
//! `SKIPPED` line naming the package to install, and under `CI=true` a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The server the tests of this binary run against.
#[derive(Debug)]
pub struct Server {
    /// A superuser's connection string (libpq key=value, a unix socket directory as `host`).
    pub url: String,
    /// The directory of the server's programs (`pg_recvlogical`), when known.
    pub bin: Option<PathBuf>,
    /// A shell command that restarts the server at once (`pg_ctl restart -m immediate`).
    pub restart: Option<String>,
    /// A user that logs in with a password, given the wrong one.
    pub wrong_password_url: Option<String>,
}

/// The server (started at the first call), or `None` after one loud `SKIPPED` line for `test`
/// (a failure under `CI=true`). `LANESTREAM_PG_URL` names an existing server instead, with
/// `LANESTREAM_PG_BIN`, `LANESTREAM_PG_RESTART` and `LANESTREAM_PG_PASSWORD_URL` for the extras.
pub fn server(test: &str) -> Option<&'static Server> {
    static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
    let server = SERVER.get_or_init(|| match std::env::var("LANESTREAM_PG_URL") {
        Ok(url) => Ok(Server {
            url,
            bin: std::env::var_os("LANESTREAM_PG_BIN").map(PathBuf::from).or_else(|| bin_dir().ok()),
            restart: std::env::var("LANESTREAM_PG_RESTART").ok(),
            wrong_password_url: std::env::var("LANESTREAM_PG_PASSWORD_URL").ok(),
        }),
        Err(_) => start(),
    });
    match server {
        Ok(server) => Some(server),
        Err(why) => {
            let line = format!(
                "SKIPPED {test}: no PostgreSQL to start ({why}); install the Debian package postgresql-15 \
                 (or set LANESTREAM_PG_URL to a server with wal_level = logical)"
            );
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{line} (CI=true: a skipped server test fails)");
            }
            eprintln!("{line}");
            None
        }
    }
}

/// How to reach the server: a libpq key=value string (a unix socket directory as `host`).
pub fn url_or_skip(test: &str) -> Option<String> {
    server(test).map(|s| s.url.clone())
}

/// The directory of `initdb`, `pg_ctl` and `postgres`.
fn bin_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("LANESTREAM_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            candidates.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev());
    }
    candidates
        .into_iter()
        .find(|d| d.join("initdb").is_file() && d.join("postgres").is_file() && d.join("pg_ctl").is_file())
        .ok_or_else(|| {
            "no initdb, pg_ctl and postgres found (pg_config --bindir, /usr/lib/postgresql/*/bin)".into()
        })
}

/// Whether this process runs as root: the server's commands then run as the user `postgres`.
fn as_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn run(root: bool, program: &Path, args: &[&str]) -> Result<(), String> {
    let mut command = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    let out = command.args(args).output().map_err(|e| format!("{}: {e}", program.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {}: {}{}",
            program.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn start() -> Result<Server, String> {
    let bin = bin_dir()?;
    let root = as_root();
    let dir = std::env::temp_dir().join(format!("lanestream-test-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir_text = dir.to_str().ok_or("a temp dir that is not UTF-8")?.to_owned();
    if root {
        Command::new("chown").args(["postgres:", &dir_text]).status().map_err(|e| format!("chown: {e}"))?;
    }
    let data = dir.join("data");
    let data_text = data.to_str().ok_or("not UTF-8")?;
    run(
        root,
        &bin.join("initdb"),
        &["-D", data_text, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
    )?;
    // A port number names the socket file only (no TCP): any one will do in a private dir.
    let port = 50_000 + std::process::id() % 10_000;
    let mut conf = format!(
        "listen_addresses = ''\nport = {port}\nunix_socket_directories = '{dir_text}'\nwal_level = logical\n\
         max_replication_slots = 32\nmax_wal_senders = 16\nfsync = off\nfull_page_writes = off\n\
         synchronous_commit = on\n"
    );
    // `output_plugin_libraries`: servers that know it refuse every output plugin it does not
    // list; older 15.x builds refuse the parameter itself. Set it where the server knows it.
    let knows = Command::new(bin.join("postgres"))
        .args(["--describe-config"])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("output_plugin_libraries"));
    if knows {
        conf.push_str("output_plugin_libraries = 'pgoutput, wal2json'\n");
    }
    let hba = data.join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).map_err(|e| e.to_string())?;
    std::fs::write(&hba, format!("local all lanestream_pw scram-sha-256\n{rules}"))
        .map_err(|e| e.to_string())?;
    let conf_path = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf_path).map_err(|e| e.to_string())?;
    text.push_str(&conf);
    std::fs::write(&conf_path, text).map_err(|e| e.to_string())?;
    let log = dir.join("server.log");
    run(
        root,
        &bin.join("pg_ctl"),
        &["-D", data_text, "-l", log.to_str().ok_or("not UTF-8")?, "-w", "-t", "60", "start"],
    )
    .map_err(|e| format!("{e}; {}", std::fs::read_to_string(&log).unwrap_or_default()))?;
    // The watchdog: when this test process is gone, stop the server and remove its dir.
    let stop = if root {
        format!("runuser -u postgres -- {} -D {data_text} -m immediate -w stop", bin.join("pg_ctl").display())
    } else {
        format!("{} -D {data_text} -m immediate -w stop", bin.join("pg_ctl").display())
    };
    let watchdog = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop} >/dev/null 2>&1; rm -rf '{dir_text}'",
        pid = std::process::id()
    );
    Command::new("sh")
        .args(["-c", &watchdog])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("the watchdog: {e}"))?;
    let url = format!("host={dir_text} port={port} user=postgres dbname=postgres");
    // A user that logs in with a password (scram on the socket), for the wrong-password test.
    let mut c = postgres::Client::connect(&url, postgres::NoTls).map_err(|e| e.to_string())?;
    c.batch_execute("CREATE ROLE lanestream_pw LOGIN PASSWORD 'right'").map_err(|e| e.to_string())?;
    let pg_ctl = bin.join("pg_ctl").display().to_string();
    let restart = if root {
        format!("runuser -u postgres -- {pg_ctl} -D {data_text} -l {log} -m immediate -w -t 60 restart >/dev/null", log = log.display())
    } else {
        format!(
            "{pg_ctl} -D {data_text} -l {log} -m immediate -w -t 60 restart >/dev/null",
            log = log.display()
        )
    };
    Ok(Server {
        url,
        bin: Some(bin),
        restart: Some(restart),
        wrong_password_url: Some(format!(
            "host={dir_text} port={port} user=lanestream_pw password=wrong dbname=postgres"
        )),
    })
}
