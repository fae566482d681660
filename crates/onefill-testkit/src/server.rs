//! One private `redis-server` process: start, commands, pause, kill, restart.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::resp::{free_port, raw_command, raw_commands, Reply};

/// How long a server may take to answer `PING` after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout of a single raw command (connect, write and read).
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// A private `redis-server` process on a free port of 127.0.0.1.
///
/// Killed (SIGKILL) and reaped when dropped; its temporary directory (log,
/// `nodes.conf`) is removed then too.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    args: Vec<String>,
    /// A Sentinel's configuration: the server runs as
    /// `redis-server <dir>/sentinel.conf --sentinel`, from this text when first started
    /// (a restart keeps the file as the Sentinel rewrote it).
    sentinel_conf: Option<String>,
    dir: TempDir,
    child: Mutex<Option<Child>>,
}

impl RedisServer {
    /// Starts a standalone server on a free port and waits until it answers
    /// `PING`.
    ///
    /// # Panics
    /// If `redis-server` cannot be spawned or does not come up within 10 s.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments
    /// appended to the defaults, e.g. `&["--requirepass", "secret"]`.
    /// Paths in the arguments are relative to the server's private
    /// directory ([`dir`](Self::dir)).
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        Self::start_mode(extra_args, None)
    }

    /// A replica of `primary` (`--replicaof`), returned once its
    /// replication link is up.
    ///
    /// # Panics
    /// If the link is not up within 20 s.
    pub fn start_replica_of(primary: &RedisServer) -> RedisServer {
        let port = primary.port().to_string();
        let replica = Self::start_with(&["--replicaof", "127.0.0.1", &port]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !replica
            .command(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the replica did not link up\n{}",
                replica.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        replica
    }

    /// A Redis Sentinel (`redis-server <conf> --sentinel`) on a free port,
    /// its configuration file written from `conf` into its private
    /// directory (a Sentinel needs a file it can rewrite). Ready when it
    /// answers `PING`.
    pub fn start_sentinel(conf: &str) -> RedisServer {
        Self::start_mode(&[], Some(conf.to_owned()))
    }

    fn start_mode(extra_args: &[&str], sentinel_conf: Option<String>) -> RedisServer {
        let args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        // A port found free can be taken by someone else before the server
        // binds it; try a few ports before giving up.
        let mut last_error = String::new();
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("onefill-redis-")
                .tempdir()
                .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
            let server = RedisServer {
                port: free_port(),
                args: args.clone(),
                sentinel_conf: sentinel_conf.clone(),
                dir,
                child: Mutex::new(None),
            };
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(e) if e.contains("Address already in use") => last_error = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("redis-server could not bind a free port: {last_error}");
    }

    /// The TCP port the server listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Creates (or redefines) the ACL user of an `ACL SETUSER` line, e.g.
    /// `ACL SETUSER app on >secret ~users:* +get`, and answers
    /// `redis://<user>:<password>@127.0.0.1:<port>`, the password being the
    /// line's first `>password`. The default user keeps every right, so
    /// the test's own [`command`](Self::command)s are not limited. Users
    /// live in memory: a [`restart`](Self::restart) forgets them.
    ///
    /// # Panics
    /// If the line is not `ACL SETUSER <user> ...` with a `>password`, or
    /// the server refuses it.
    pub fn acl_user(&self, line: &str) -> String {
        let args: Vec<&str> = line.split_whitespace().collect();
        let (user, password) = match args.as_slice() {
            [acl, setuser, user, rules @ ..]
                if acl.eq_ignore_ascii_case("ACL") && setuser.eq_ignore_ascii_case("SETUSER") =>
            {
                let password = rules.iter().find_map(|r| r.strip_prefix('>'));
                (
                    *user,
                    password.unwrap_or_else(|| panic!("no >password in {line:?}")),
                )
            }
            _ => panic!("not an ACL SETUSER line: {line:?}"),
        };
        let reply = self.command(&args);
        assert_eq!(reply.trim(), "OK", "ACL SETUSER refused: {reply}");
        format!("redis://{user}:{password}@127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's private directory (working directory, log, `nodes.conf`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log so far (empty if it cannot be read).
    pub fn log(&self) -> String {
        let mut out = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let stderr = std::fs::read_to_string(self.stderr_path()).unwrap_or_default();
        if !stderr.trim().is_empty() {
            out.push_str("\n--- stderr ---\n");
            out.push_str(&stderr);
        }
        out
    }

    /// The process id, or `None` after [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        self.child().as_ref().map(|c| c.id())
    }

    /// Whether a server process is running (not killed; a paused one counts).
    pub fn is_running(&self) -> bool {
        let mut child = self.child();
        match child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Freezes the server with SIGSTOP: it keeps its connections open but
    /// answers nothing until [`resume`](Self::resume). Use it to provoke
    /// timeouts.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a [paused](Self::pause) server run again (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Kills the server (SIGKILL) and reaps it. Its data is gone (there is no
    /// persistence); [`restart`](Self::restart) starts it again on the same
    /// port. Does nothing if it is not running.
    pub fn kill(&self) {
        // Taken out of the lock first, so the lock is not held while the
        // process is reaped.
        let child = self.forget_child();
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs, then starts a new one on the **same port**
    /// (and directory, so a cluster node keeps its `nodes.conf`) and waits
    /// until it answers `PING`.
    ///
    /// # Panics
    /// If the new server does not come up within 10 s (for instance because
    /// something else took the port meanwhile).
    pub fn restart(&self) {
        self.kill();
        if let Err(e) = self.spawn_and_wait() {
            panic!("{e}");
        }
    }

    /// Sends one command on a fresh connection and returns its reply as text:
    /// simple strings and bulk strings as their content (lossy UTF-8),
    /// integers in decimal, a nil reply as `(nil)`, errors as `-` followed by
    /// the message (e.g. `-ERR unknown command`), arrays as their elements
    /// joined with `\n`.
    ///
    /// # Panics
    /// On I/O errors or a timeout (5 s), with the server log.
    pub fn command(&self, args: &[&str]) -> String {
        self.query(args).to_string()
    }

    /// Sends the commands in order on one fresh connection and returns
    /// their replies as text (as [`command`](Self::command) does). One
    /// connection matters for `WAIT`: it counts the replicas that have
    /// what *its* connection wrote, so a `WAIT` sent on a connection of its
    /// own returns at once without waiting for anything.
    ///
    /// # Panics
    /// On I/O errors or a timeout (5 s), with the server log.
    pub fn commands(&self, commands: &[&[&str]]) -> Vec<String> {
        let bytes: Vec<Vec<&[u8]>> = commands
            .iter()
            .map(|args| args.iter().map(|a| a.as_bytes()).collect())
            .collect();
        let slices: Vec<&[&[u8]]> = bytes.iter().map(Vec::as_slice).collect();
        match raw_commands(self.addr(), &slices, COMMAND_TIMEOUT) {
            Ok(replies) => replies.iter().map(ToString::to_string).collect(),
            Err(e) => panic!(
                "commands {commands:?} to redis on port {} failed: {e}\n--- log ---\n{}",
                self.port,
                self.log()
            ),
        }
    }

    /// The node's id in its cluster (`CLUSTER MYID`).
    pub fn cluster_id(&self) -> String {
        self.command(&["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// Sends one command on a fresh connection and returns the parsed reply.
    ///
    /// # Panics
    /// On I/O errors or a timeout (5 s), with the server log.
    pub fn query(&self, args: &[&str]) -> Reply {
        let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.query_bytes(&bytes)
    }

    /// Like [`query`](Self::query), with binary arguments.
    pub fn query_bytes(&self, args: &[&[u8]]) -> Reply {
        match raw_command(self.addr(), args, COMMAND_TIMEOUT) {
            Ok(reply) => reply,
            Err(e) => panic!(
                "command {:?} to redis on port {} failed: {e}\n--- log ---\n{}",
                args.iter()
                    .map(|a| String::from_utf8_lossy(a))
                    .collect::<Vec<_>>(),
                self.port,
                self.log()
            ),
        }
    }

    fn child(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the child out (no longer ours to kill when a time limit
    /// ends the test binary).
    fn forget_child(&self) -> Option<Child> {
        let child = self.child().take();
        if let Some(c) = &child {
            crate::limit::untrack(c.id());
        }
        child
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn stderr_path(&self) -> PathBuf {
        self.dir.path().join("stderr.log")
    }

    fn signal(&self, signal: libc::c_int) {
        let Some(pid) = self.pid() else {
            panic!("redis on port {} is not running", self.port);
        };
        // SAFETY: `kill` has no memory-safety preconditions; `pid` is our own
        // child, which has not been reaped (we hold its `Child`), so the pid
        // cannot have been reused by another process.
        let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}) failed: {}",
            std::io::Error::last_os_error()
        );
    }

    fn spawn_and_wait(&self) -> Result<(), String> {
        let dir = self.dir.path();
        let stderr = File::create(self.stderr_path())
            .map_err(|e| format!("cannot create {}: {e}", self.stderr_path().display()))?;
        let _ = std::fs::remove_file(self.log_path());
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        if let Some(conf) = &self.sentinel_conf {
            // The file comes first on the command line, as redis-server
            // requires; written once, so a restart keeps what the Sentinel
            // learnt (and rewrote into it).
            let path = dir.join("sentinel.conf");
            if !path.exists() {
                std::fs::write(&path, conf)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
            cmd.arg(&path).arg("--sentinel");
        }
        cmd.args([
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(self.log_path())
        .args(&self.args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot spawn redis-server (is it on PATH?): {e}"))?;
        crate::limit::track(child.id());
        *self.child() = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            // The guard must be gone before the branch below locks the
            // child again: kept in an `if let` scrutinee it would live to the
            // end of the block (edition 2021), and a server that exits before
            // answering (a port someone else took, a bad directive) would
            // deadlock the test instead of failing it.
            let exited = self
                .child()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.forget_child();
                return Err(format!(
                    "redis-server on port {} exited with {status} before answering PING\n--- log ---\n{}",
                    self.port,
                    self.log()
                ));
            }
            match raw_command(self.addr(), &[b"PING"], Duration::from_millis(500)) {
                Ok(Reply::Status(s)) if s == "PONG" => return Ok(()),
                // Up, but password-protected (`--requirepass`): ready too.
                Ok(Reply::Error(e)) if e.starts_with("NOAUTH") => return Ok(()),
                _ => {}
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "redis-server on port {} did not answer PING within {READY_TIMEOUT:?}\n--- log ---\n{}",
                    self.port,
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
