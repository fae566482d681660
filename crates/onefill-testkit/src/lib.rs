//! Test support for onefill: private `redis-server` processes and clusters.
//!
//! Modelled on redis-rs's own test harness: every server gets a free port
//! on 127.0.0.1, persistence off (`--save ''`, `--appendonly no`), a private
//! temporary directory holding its log, a readiness loop (`PING` until
//! `+PONG`), and is killed when dropped. Nothing here ever touches a shared
//! Redis.
//!
//! ```no_run
//! use onefill_testkit::RedisServer;
//!
//! let server = RedisServer::start();
//! assert_eq!(server.command(&["SET", "k", "v"]), "OK");
//! assert_eq!(server.command(&["GET", "k"]), "v");
//! server.pause(); // SIGSTOP: the server hangs, connections stay open
//! server.resume(); // SIGCONT
//! server.restart(); // SIGKILL, then a new process on the same port
//! assert_eq!(server.command(&["GET", "k"]), "(nil)"); // no persistence
//! ```
//!
//! This is test support: failures (a server that never comes up, an I/O
//! error talking to it) panic with a message that includes the server log.

#![warn(missing_docs)]

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a server may take to answer `PING` after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cluster may take to reach `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(20);
/// Timeout of a single raw command (connect, write and read).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// A private `redis-server` process on a free port of 127.0.0.1.
///
/// Killed (SIGKILL) and reaped when dropped; its temporary directory (log,
/// `nodes.conf`) is removed then too.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    args: Vec<String>,
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
        if let Some(mut child) = self.child().take() {
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
        *self.child() = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self
                .child()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child().take();
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

/// A Redis Cluster of private servers (masters only, no replicas).
///
/// Every node is a [`RedisServer`] started with `--cluster-enabled yes`;
/// the slots are spread by `redis-cli --cluster create`. All nodes are
/// killed when the cluster is dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 3, as `redis-cli --cluster create`
    /// requires), joins them and waits until every node reports
    /// `cluster_state:ok`.
    ///
    /// # Panics
    /// If `masters < 3`, or the cluster does not form within 20 s.
    pub fn start(masters: usize) -> RedisCluster {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for node in &nodes {
            cmd.arg(format!("127.0.0.1:{}", node.port()));
        }
        cmd.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli (is it on PATH?): {e}"));
        if !out.status.success() {
            panic!(
                "redis-cli --cluster create failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok();
        cluster
    }

    /// Waits (up to 20 s) until every running node reports
    /// `cluster_state:ok` and knows every node; for instance after a
    /// [`RedisServer::restart`] of one node.
    ///
    /// # Panics
    /// If that does not happen in time.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        loop {
            let infos: Vec<String> = self
                .nodes
                .iter()
                .map(
                    |n| match raw_command(n.addr(), &[b"CLUSTER", b"INFO"], COMMAND_TIMEOUT) {
                        Ok(reply) => reply.to_string(),
                        Err(e) => e.to_string(),
                    },
                )
                .collect();
            if infos
                .iter()
                .all(|i| i.contains("cluster_state:ok") && i.contains(&known))
            {
                return;
            }
            if Instant::now() >= deadline {
                panic!("the cluster did not reach cluster_state:ok within {CLUSTER_TIMEOUT:?}:\n{infos:#?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node that owns `key`'s slot (found with `CLUSTER KEYSLOT` and
    /// `CLUSTER SLOTS`), for raw commands on a key.
    ///
    /// # Panics
    /// If no node owns the slot.
    pub fn node_for_key(&self, key: &str) -> &RedisServer {
        let first = self
            .nodes
            .iter()
            .find(|n| n.is_running())
            .expect("no node of the cluster is running");
        let slot = match first.query(&["CLUSTER", "KEYSLOT", key]) {
            Reply::Int(slot) => slot,
            other => panic!("CLUSTER KEYSLOT answered {other:?}"),
        };
        let Reply::Array(Some(ranges)) = first.query(&["CLUSTER", "SLOTS"]) else {
            panic!("CLUSTER SLOTS did not answer an array");
        };
        for range in ranges {
            let Reply::Array(Some(fields)) = range else {
                continue;
            };
            let (Some(Reply::Int(start)), Some(Reply::Int(end)), Some(Reply::Array(Some(master)))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                continue;
            };
            if (*start..=*end).contains(&slot) {
                let Some(Reply::Int(port)) = master.get(1) else {
                    continue;
                };
                if let Some(node) = self.nodes.iter().find(|n| i64::from(n.port()) == *port) {
                    return node;
                }
            }
        }
        panic!("no node owns slot {slot} of {key:?}");
    }
}

/// A parsed RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Status(String),
    /// `-ERR message` (without the `-`).
    Error(String),
    /// `:42`
    Int(i64),
    /// `$3\r\nabc`, or `None` for the nil bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n...`, or `None` for the nil array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The integer, if this is an integer reply (or a bulk string holding one).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// The bytes of a bulk or simple string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            Reply::Status(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// Whether this is a nil bulk string or nil array.
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Bulk(None) | Reply::Array(None))
    }
}

impl std::fmt::Display for Reply {
    /// The text [`RedisServer::command`] returns.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::Status(s) => f.write_str(s),
            Reply::Error(e) => write!(f, "-{e}"),
            Reply::Int(i) => write!(f, "{i}"),
            Reply::Bulk(Some(b)) => f.write_str(&String::from_utf8_lossy(b)),
            Reply::Bulk(None) | Reply::Array(None) => f.write_str("(nil)"),
            Reply::Array(Some(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{item}")?;
                }
                Ok(())
            }
        }
    }
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read the bound port: {e}"))
        .port()
}

/// Sends one command on a fresh connection and reads one reply.
fn raw_command(addr: SocketAddr, args: &[&[u8]], timeout: Duration) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg);
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;
    let mut reader = BufReader::new(&stream);
    let reply = read_reply(&mut reader)?;
    let _ = stream.shutdown(Shutdown::Both);
    Ok(reply)
}

fn invalid(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed before a reply",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(invalid("reply line without CRLF"));
    }
    line.truncate(line.len() - 2);
    let (kind, rest) = (line[0], String::from_utf8_lossy(&line[1..]).into_owned());
    let number = |s: &str| -> std::io::Result<i64> {
        s.parse()
            .map_err(|_| invalid(format!("not a number in a reply: {s:?}")))
    };
    match kind {
        b'+' => Ok(Reply::Status(rest)),
        b'-' => Ok(Reply::Error(rest)),
        b':' => Ok(Reply::Int(number(&rest)?)),
        b'$' => {
            let len = number(&rest)?;
            if len < 0 {
                return Ok(Reply::Bulk(None));
            }
            let mut buf = vec![0u8; len as usize + 2];
            reader.read_exact(&mut buf)?;
            buf.truncate(len as usize);
            Ok(Reply::Bulk(Some(buf)))
        }
        b'*' => {
            let len = number(&rest)?;
            if len < 0 {
                return Ok(Reply::Array(None));
            }
            let items = (0..len)
                .map(|_| read_reply(reader))
                .collect::<std::io::Result<Vec<_>>>()?;
            Ok(Reply::Array(Some(items)))
        }
        other => Err(invalid(format!("unknown reply type {:?}", other as char))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_set_get_and_restart_on_the_same_port() {
        let server = RedisServer::start();
        assert_eq!(server.command(&["PING"]), "PONG");
        assert_eq!(server.command(&["SET", "k", "v", "PX", "60000"]), "OK");
        assert_eq!(server.command(&["GET", "k"]), "v");
        assert_eq!(server.command(&["GET", "missing"]), "(nil)");
        assert_eq!(server.query(&["INCR", "n"]), Reply::Int(1));
        assert!(server.query(&["PTTL", "k"]).as_int().unwrap() > 59_000);
        assert!(server.command(&["NOSUCHCOMMAND"]).starts_with("-ERR"));
        assert!(server
            .command(&["INFO", "server"])
            .contains("redis_version:"));

        let port = server.port();
        let pid = server.pid().unwrap();
        server.kill();
        assert!(!server.is_running());
        assert!(TcpStream::connect(server.addr()).is_err());
        server.restart();
        assert_eq!(server.port(), port);
        assert_ne!(server.pid().unwrap(), pid);
        assert_eq!(server.command(&["GET", "k"]), "(nil)", "no persistence");
        assert_eq!(server.url(), format!("redis://127.0.0.1:{port}"));
    }

    #[test]
    fn pause_makes_the_server_unresponsive_until_resumed() {
        let server = RedisServer::start();
        server.pause();
        let err = raw_command(server.addr(), &[b"PING"], Duration::from_millis(200));
        assert!(err.is_err(), "a paused server must not answer: {err:?}");
        server.resume();
        assert_eq!(server.command(&["PING"]), "PONG");
    }

    #[test]
    fn extra_arguments_are_passed() {
        let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
        assert!(server.command(&["GET", "k"]).starts_with("-NOAUTH"));
        assert_eq!(server.command(&["AUTH", "s3cret"]), "OK");
        assert!(server.log().contains("Ready to accept connections"));
    }

    #[test]
    fn drop_kills_the_server() {
        let server = RedisServer::start();
        let addr = server.addr();
        drop(server);
        assert!(TcpStream::connect(addr).is_err());
    }

    #[test]
    fn a_three_master_cluster_forms() {
        let cluster = RedisCluster::start(3);
        assert_eq!(cluster.nodes().len(), 3);
        assert_eq!(cluster.urls().len(), 3);
        for node in cluster.nodes() {
            let info = node.command(&["CLUSTER", "INFO"]);
            assert!(info.contains("cluster_state:ok"), "{info}");
            assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
        }
        let owner = cluster.node_for_key("ns:{k}");
        assert_eq!(owner.command(&["SET", "ns:{k}", "1"]), "OK");
        assert_eq!(owner.command(&["GET", "ns:{k}:lock"]), "(nil)");
        let other = cluster
            .nodes()
            .iter()
            .find(|n| n.port() != owner.port())
            .unwrap();
        assert!(other.command(&["GET", "ns:{k}"]).starts_with("-MOVED"));

        // A node restarted on its port keeps its nodes.conf and rejoins.
        owner.restart();
        cluster.wait_until_ok();
        assert_eq!(owner.command(&["GET", "ns:{k}"]), "(nil)");
    }
}
