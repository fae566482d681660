//! Talking RESP2 to a server over a plain socket (no client library, so
//! the kit works while the code under test is broken), and finding a free
//! port.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

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
    /// The text [`RedisServer::command`](crate::RedisServer::command) returns.
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
pub(crate) fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read the bound port: {e}"))
        .port()
}

/// Sends one command on a fresh connection and reads one reply.
pub(crate) fn raw_command(
    addr: SocketAddr,
    args: &[&[u8]],
    timeout: Duration,
) -> std::io::Result<Reply> {
    let mut replies = raw_commands(addr, &[args], timeout)?;
    replies
        .pop()
        .ok_or_else(|| invalid("no reply to the one command sent"))
}

/// Sends the commands in order on one fresh connection and reads a reply to
/// each.
pub(crate) fn raw_commands(
    addr: SocketAddr,
    commands: &[&[&[u8]]],
    timeout: Duration,
) -> std::io::Result<Vec<Reply>> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let mut request = Vec::new();
    for args in commands {
        request.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in *args {
            request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            request.extend_from_slice(arg);
            request.extend_from_slice(b"\r\n");
        }
    }
    stream.write_all(&request)?;
    let mut reader = BufReader::new(&stream);
    let replies = commands
        .iter()
        .map(|_| read_reply(&mut reader))
        .collect::<std::io::Result<Vec<Reply>>>()?;
    let _ = stream.shutdown(Shutdown::Both);
    Ok(replies)
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
