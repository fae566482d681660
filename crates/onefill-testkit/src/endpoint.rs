//! A stand-in for a managed service's primary endpoint: one address whose
//! server changes at a failover, new connections reaching the new server
//! while those made before stay with the old one.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A TCP proxy on a free port of 127.0.0.1, in front of one server at a
/// time.
///
/// Each connection made to it is forwarded to the server it
/// [points to](Endpoint::point_to) at that moment, and stays with that
/// server: the way a DNS name moved to a promoted replica leaves the
/// connections made before on the old primary. [`close_connections`]
/// closes them instead, as a proxy that drops its clients at a failover
/// does; [`blackhole`](Endpoint::blackhole) silences one of them without
/// closing it. Everything stops when it is dropped.
///
/// [`close_connections`]: Endpoint::close_connections
pub struct Endpoint {
    port: u16,
    target: Arc<AtomicU16>,
    stop: Arc<AtomicBool>,
    /// Both sides of every forwarded connection, to close them.
    open: Arc<Mutex<Vec<TcpStream>>>,
    /// The local port of each connection to a server, in order.
    upstreams: Arc<Mutex<Vec<u16>>>,
    /// Connections (by upstream port) whose bytes are dropped.
    blackholed: Blackholed,
    accept: Option<JoinHandle<()>>,
}

type Blackholed = Arc<Mutex<HashSet<u16>>>;

impl Endpoint {
    /// Starts forwarding new connections to `127.0.0.1:target`.
    pub fn start(target: u16) -> Endpoint {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the endpoint");
        let port = listener
            .local_addr()
            .expect("the endpoint's address")
            .port();
        let target = Arc::new(AtomicU16::new(target));
        let stop = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let upstreams: Arc<Mutex<Vec<u16>>> = Arc::default();
        let blackholed: Blackholed = Arc::default();
        let accept = {
            let (target, stop, open) = (target.clone(), stop.clone(), open.clone());
            let (upstreams, blackholed) = (upstreams.clone(), blackholed.clone());
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let to = target.load(Ordering::SeqCst);
                    let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                        let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
                        open.push(c);
                        open.push(s);
                    }
                    let upstream = server.local_addr().map_or(0, |a| a.port());
                    upstreams
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(upstream);
                    forward(&client, &server, upstream, &blackholed);
                    forward(&server, &client, upstream, &blackholed);
                }
            })
        };
        Endpoint {
            port,
            target,
            stop,
            open,
            upstreams,
            blackholed,
            accept: Some(accept),
        }
    }

    /// The local port of each connection made to a server so far, in the
    /// order they were made: the port the server's `CLIENT LIST` shows as
    /// the client's.
    pub fn upstream_ports(&self) -> Vec<u16> {
        self.upstreams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// From now on the bytes of the connection whose upstream port is
    /// `upstream` are dropped, both ways, and it stays open: a half-open
    /// connection, as a lost route or a firewall that drops a flow leaves
    /// it (no reset reaches either side).
    pub fn blackhole(&self, upstream: u16) {
        self.blackholed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(upstream);
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// New connections go to `127.0.0.1:target` from now on; those made
    /// before stay where they are.
    pub fn point_to(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
    }

    /// Closes every connection made so far (both sides).
    pub fn close_connections(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        for stream in open.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Copies `from` to `to` in a thread of its own until either side closes,
/// dropping what it reads once `upstream` is blackholed.
fn forward(from: &TcpStream, to: &TcpStream, upstream: u16, blackholed: &Blackholed) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let blackholed = blackholed.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_)
                    if blackholed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(&upstream) => {}
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        self.close_connections();
    }
}
