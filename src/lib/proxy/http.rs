//! The benchmark's two ends: a keep-alive HTTP/1.1 test server and a client
//! that times one request at a time over one connection.
//!
//! Only what the benchmark needs: `GET /test1` (a 64 KiB body) and
//! `GET /test2` (`Hello, world!`), Content-Length framing, keep-alive.
//!
//! Why the server writes each response in pieces (the header, then the
//! body in 16 KiB writes): that is how seed 004's upstream answered, and it
//! is what exposes Nagle's algorithm in a proxy. The server itself sets
//! TCP_NODELAY, as Go's and hyper's servers do, so the direct connection has
//! no stall; a proxy that leaves Nagle on holds back its second small write
//! until the client ACKs the first, and the client delays that ACK.
//!
//! Why the client checks the status line and the body length on every
//! request: seed 004's harness did not, so failed requests were counted as
//! fast ones (its "std::io::copy" row beat the direct connection).

use crate::error::{Error, Result};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `/test1`'s body size.
pub const TEST1_LEN: usize = 64 * 1024;
/// `/test2`'s body.
pub const TEST2_BODY: &[u8] = b"Hello, world!";
/// The size of each body write.
pub const WRITE_PIECE: usize = 16 * 1024;
/// Longest request head the server accepts.
const MAX_HEAD: usize = 8 * 1024;

use crate::config::proxy::Test;

/// What each request fetches.
impl Test {
    pub fn path(self) -> &'static str {
        match self {
            Test::Test1 => "/test1",
            Test::Test2 => "/test2",
        }
    }

    pub fn body_len(self) -> usize {
        match self {
            Test::Test1 => TEST1_LEN,
            Test::Test2 => TEST2_BODY.len(),
        }
    }
}

/// A running test server; stops and joins its threads on drop.
pub struct TestServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Binds `addr` (use port 0) and serves on background threads.
    pub fn start(addr: SocketAddr) -> io::Result<TestServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let accept = std::thread::Builder::new()
            .name("http-accept".into())
            .spawn(move || accept_loop(listener, flag))?;
        Ok(TestServer {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the blocking accept with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, stop: Arc<AtomicBool>) {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    for conn in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let Ok(conn) = conn else { continue };
        let flag = Arc::clone(&stop);
        if let Ok(h) = std::thread::Builder::new()
            .name("http-conn".into())
            .spawn(move || {
                let _ = serve(conn, &flag);
            })
        {
            handlers.push(h);
        }
        handlers.retain(|h| !h.is_finished());
    }
    for h in handlers {
        let _ = h.join();
    }
}

/// Serves one keep-alive connection until the client closes it, sends
/// garbage, or the server stops (checked every 100 ms).
fn serve(mut conn: TcpStream, stop: &AtomicBool) -> io::Result<()> {
    conn.set_nodelay(true)?;
    conn.set_read_timeout(Some(Duration::from_millis(100)))?;
    let test1_body: Vec<u8> = (0..TEST1_LEN).map(|i| (i % 251) as u8).collect();
    let mut buf = vec![0u8; MAX_HEAD];
    let mut filled = 0;
    loop {
        // Read one request head.
        let head_end = loop {
            if let Some(end) = find_head_end(&buf[..filled]) {
                break end;
            }
            if filled == buf.len() {
                return respond(&mut conn, "431 Request Header Fields Too Large", b"");
            }
            match conn.read(&mut buf[filled..]) {
                Ok(0) => return Ok(()),
                Ok(n) => filled += n,
                Err(e) if is_timeout(&e) => {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.copy_within(head_end..filled, 0);
        filled -= head_end;
        let mut words = head.split_whitespace();
        let (method, path) = (words.next(), words.next());
        match (method, path) {
            (Some("GET"), Some("/test1")) => respond(&mut conn, "200 OK", &test1_body)?,
            (Some("GET"), Some("/test2")) => respond(&mut conn, "200 OK", TEST2_BODY)?,
            (Some("GET"), Some(_)) => respond(&mut conn, "404 Not Found", b"not found\n")?,
            _ => return respond(&mut conn, "400 Bad Request", b""),
        }
        if head.to_ascii_lowercase().contains("connection: close") {
            return Ok(());
        }
    }
}

/// The header in one write, then the body in [`WRITE_PIECE`] writes.
fn respond(conn: &mut TcpStream, status: &str, body: &[u8]) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    for piece in body.chunks(WRITE_PIECE) {
        conn.write_all(piece)?;
    }
    Ok(())
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// A keep-alive client that sends one request at a time.
pub struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    /// Connects with TCP_NODELAY on (the client is not what is measured) and
    /// a read time-out, so a stuck proxy fails the request instead of
    /// hanging the benchmark.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Client {
            stream,
            buf: vec![0u8; 256 * 1024],
        })
    }

    /// One request: the time from the first byte written to the last body
    /// byte read. An error names what was wrong (status, length, time-out).
    pub fn request(&mut self, test: Test) -> Result<Duration> {
        let req = format!("GET {} HTTP/1.1\r\nHost: bench\r\n\r\n", test.path());
        let start = Instant::now();
        self.stream
            .write_all(req.as_bytes())
            .map_err(|e| Error::io("sending the request", e))?;
        let mut filled = 0;
        let head_end = loop {
            if let Some(end) = find_head_end(&self.buf[..filled]) {
                break end;
            }
            if filled == self.buf.len() {
                return Err(Error::runtime("response head too long"));
            }
            filled += self.read_some(filled)?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let status = head.lines().next().unwrap_or("");
        if !status.starts_with("HTTP/1.1 200 ") {
            return Err(Error::runtime(format!("unexpected status line '{status}'")));
        }
        let length = content_length(&head)
            .ok_or_else(|| Error::runtime("response has no Content-Length"))?;
        if length != test.body_len() {
            return Err(Error::runtime(format!(
                "body is {length} bytes, expected {}",
                test.body_len()
            )));
        }
        let total = head_end + length;
        if total > self.buf.len() {
            return Err(Error::runtime("response larger than the client buffer"));
        }
        while filled < total {
            filled += self.read_some(filled)?;
        }
        let elapsed = start.elapsed();
        if filled > total {
            return Err(Error::runtime(format!(
                "{} unexpected bytes after the body",
                filled - total
            )));
        }
        if test == Test::Test2 && &self.buf[head_end..total] != TEST2_BODY {
            return Err(Error::runtime("wrong body"));
        }
        Ok(elapsed)
    }

    fn read_some(&mut self, at: usize) -> Result<usize> {
        loop {
            match self.stream.read(&mut self.buf[at..]) {
                Ok(0) => return Err(Error::runtime("connection closed mid-response")),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_timeout(&e) => {
                    return Err(Error::runtime("no response within the time-out"))
                }
                Err(e) => return Err(Error::io("reading the response", e)),
            }
        }
    }
}

fn content_length(head: &str) -> Option<usize> {
    head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_requests_are_checked() {
        let server = TestServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut c = Client::connect(server.addr(), Duration::from_secs(5)).unwrap();
        for _ in 0..3 {
            c.request(Test::Test1).unwrap();
            c.request(Test::Test2).unwrap();
        }
    }

    #[test]
    fn parses_content_length() {
        assert_eq!(
            content_length("HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\n"),
            Some(13)
        );
        assert_eq!(content_length("HTTP/1.1 200 OK\r\n\r\n"), None);
        assert_eq!(find_head_end(b"ab\r\n\r\ncd"), Some(6));
    }
}
