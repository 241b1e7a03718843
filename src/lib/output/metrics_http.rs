//! `udp_server --metrics ADDR`'s HTTP endpoint: hyper (HTTP/1.1) on a
//! current-thread tokio runtime of its own thread. It never touches the
//! receive threads, and it stops through the server's [`Shutdown`] flag
//! like everything else.

use super::metrics::{exposition, CONTENT_TYPE_OPENMETRICS, PATH};
use crate::error::{Error, Result};
use crate::server::metrics::{Board, SNAPSHOT_WAIT};
use crate::shutdown::{Shutdown, POLL};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Connections served at once; more are closed at once. A scraper uses one.
const MAX_CONNECTIONS: usize = 32;
/// A client that has not sent its request headers by then is dropped, and
/// no connection lives longer than [`CONNECTION_LIFE`].
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECTION_LIFE: Duration = Duration::from_secs(300);

/// The running HTTP endpoint.
pub struct Endpoint {
    /// The address bound (port 0 resolved).
    pub addr: SocketAddr,
    thread: std::thread::JoinHandle<()>,
}

impl Endpoint {
    /// Waits for the endpoint's thread, which ends within
    /// [`crate::shutdown::POLL`] of the shutdown flag being set.
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

/// Binds `addr` (a failure is an error now, before the server starts) and
/// serves `board` on a thread of its own until `shutdown` is set.
pub fn start(addr: SocketAddr, board: Arc<Board>, shutdown: Shutdown) -> Result<Endpoint> {
    let cannot =
        |e: std::io::Error| Error::runtime(format!("cannot serve --metrics on {addr}: {e}"));
    let listener = std::net::TcpListener::bind(addr).map_err(cannot)?;
    listener.set_nonblocking(true).map_err(cannot)?;
    let bound = listener.local_addr().map_err(cannot)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::runtime(format!("cannot start the --metrics runtime: {e}")))?;
    let thread = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || runtime.block_on(accept_loop(listener, board, shutdown)))
        .map_err(|e| Error::runtime(format!("cannot start the --metrics thread: {e}")))?;
    Ok(Endpoint {
        addr: bound,
        thread,
    })
}

async fn accept_loop(listener: std::net::TcpListener, board: Arc<Board>, shutdown: Shutdown) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let open = Arc::new(AtomicUsize::new(0));
    while !shutdown.is_triggered() {
        let stream = match tokio::time::timeout(POLL, listener.accept()).await {
            Err(_) => continue,
            Ok(Ok((stream, _))) => stream,
            // Out of descriptors, say: try again a little later.
            Ok(Err(_)) => {
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        if open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            continue;
        }
        open.fetch_add(1, Ordering::Relaxed);
        let (board, open) = (Arc::clone(&board), Arc::clone(&open));
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| respond(req, Arc::clone(&board)));
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFE, connection).await;
            open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

async fn respond(
    req: Request<Incoming>,
    board: Arc<Board>,
) -> std::result::Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if req.uri().path() != PATH {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            "not found: udp_server serves its metrics at /metrics\n",
        ));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(response);
    }
    // Waiting for the server's snapshot blocks: not on the runtime's thread.
    let text = tokio::task::spawn_blocking(move || exposition(&board.view(SNAPSHOT_WAIT))).await;
    Ok(match text {
        Ok(text) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(CONTENT_TYPE_OPENMETRICS),
            );
            response
        }
        Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "no metrics\n"),
    })
}
