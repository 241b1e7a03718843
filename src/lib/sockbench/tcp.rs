//! `sockbench tcp`: seed 003's TCP transfers over loopback, done properly.
//!
//! One sample moves `--bytes` over each of `--concurrency` real, concurrent
//! connections (seed 003 only printed the number), written in `--chunk`
//! byte writes: one direction (half duplex, then the sender shuts down its
//! write side) or both at once (full duplex). Receivers read in buffers at
//! least as large as a chunk (the seed read 1024 bytes even with 4000-byte
//! chunks), and an early EOF is an error, never a busy loop. Every byte
//! count is checked: a sample that moved anything but `bytes ×
//! connections × directions` fails the run.
//!
//! Three implementations mirror the seed's runs: std blocking sockets
//! (one thread per connection and direction), tokio on a current-thread
//! runtime (the seed's non-threaded run) and tokio on a two-worker
//! multi-thread runtime (its `-N2`). Each cell runs one unmeasured warm-up
//! sample and then `--samples` measured ones, summarised by
//! [`crate::stats::samples`].

use crate::config::sockbench::{Duplex, Impl, TcpArgs, TcpSettings};
use crate::congestion::Congestion;
use crate::error::{Error, Result};
use crate::shutdown::Shutdown;
use crate::stats::samples::{summarize, OutlierEffect, Summary};
use serde::Serialize;
use std::io::{self, Read, Write};
use std::net::{Shutdown as Both, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Longest one sample may take before it is abandoned as hung.
pub const SAMPLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Most connections per sample.
pub const MAX_CONCURRENCY: usize = 256;

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpCase {
    pub implementation: Impl,
    pub duplex: Duplex,
    pub chunk: usize,
    pub concurrency: usize,
    pub bytes: u64,
    pub nodelay: bool,
    /// TCP_CONGESTION for both ends; None keeps the system default.
    pub congestion: Option<Congestion>,
}

impl TcpCase {
    /// Bytes every sample must move in total.
    pub fn expected(&self) -> u64 {
        let dirs = if self.duplex == Duplex::Full { 2 } else { 1 };
        self.bytes * self.concurrency as u64 * dirs
    }

    fn read_buf(&self) -> usize {
        self.chunk.max(64 * 1024)
    }
}

/// One row: a cell's samples, summarised.
#[derive(Debug, Clone, Serialize)]
pub struct TcpRow {
    #[serde(rename = "impl")]
    pub implementation: Impl,
    pub duplex: Duplex,
    pub chunk: usize,
    pub concurrency: usize,
    pub bytes_per_connection: u64,
    /// Bytes every sample moved (checked): bytes × connections × directions.
    pub bytes_per_sample: u64,
    pub nodelay: bool,
    /// The congestion control the sockets used ("unknown" where the
    /// platform cannot tell the system default).
    pub congestion: String,
    pub samples: usize,
    pub mean_ms: f64,
    pub std_dev_ms: f64,
    pub min_ms: f64,
    pub median_ms: f64,
    pub max_ms: f64,
    pub outliers_mild: usize,
    pub outliers_severe: usize,
    /// Criterion's "variance introduced by outliers", in percent.
    pub outlier_variance_percent: f64,
    pub noise: OutlierEffect,
    /// bytes_per_sample over the mean time.
    pub gbit_per_s: f64,
}

fn row(case: &TcpCase, s: &Summary) -> TcpRow {
    TcpRow {
        implementation: case.implementation,
        duplex: case.duplex,
        chunk: case.chunk,
        concurrency: case.concurrency,
        bytes_per_connection: case.bytes,
        bytes_per_sample: case.expected(),
        nodelay: case.nodelay,
        congestion: Congestion::effective(case.congestion).unwrap_or_else(|| "unknown".into()),
        samples: s.samples,
        mean_ms: s.mean * 1e3,
        std_dev_ms: s.std_dev * 1e3,
        min_ms: s.min * 1e3,
        median_ms: s.median * 1e3,
        max_ms: s.max * 1e3,
        outliers_mild: s.outliers.mild(),
        outliers_severe: s.outliers.severe(),
        outlier_variance_percent: s.outlier_variance * 100.0,
        noise: s.effect,
        gbit_per_s: crate::units::gbps(case.expected(), s.mean),
    }
}

/// Writes `bytes` in writes of `chunk` bytes (the last may be shorter).
fn write_chunks<W: Write>(w: &mut W, bytes: u64, chunk: usize) -> io::Result<()> {
    let buf = vec![0x3Cu8; chunk];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk as u64) as usize;
        w.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Reads to EOF; an EOF before `expect` bytes is an error (no retry loop).
fn read_all<R: Read>(r: &mut R, expect: u64, buf_size: usize) -> io::Result<u64> {
    let mut buf = vec![0u8; buf_size];
    let mut got = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if got != expect {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("connection ended after {got} of {expect} bytes"),
        ));
    }
    Ok(got)
}

fn prepare(s: &TcpStream, case: &TcpCase) -> io::Result<()> {
    s.set_nodelay(case.nodelay)?;
    if let Some(algo) = case.congestion {
        algo.apply(&socket2::SockRef::from(s))?;
    }
    s.set_read_timeout(Some(SAMPLE_TIMEOUT))?;
    s.set_write_timeout(Some(SAMPLE_TIMEOUT))
}

/// One end of a std connection. `sends`/`receives` say which directions it
/// runs; full duplex writes on a clone in a second thread.
fn std_end(stream: TcpStream, case: &TcpCase, sends: bool, receives: bool) -> io::Result<u64> {
    prepare(&stream, case)?;
    let expect = if receives { case.bytes } else { 0 };
    std::thread::scope(|s| {
        let writer = sends.then(|| {
            let mut w = stream.try_clone();
            s.spawn(move || -> io::Result<()> {
                let w = w
                    .as_mut()
                    .map_err(|e| io::Error::new(e.kind(), e.to_string()))?;
                write_chunks(w, case.bytes, case.chunk)?;
                w.shutdown(Both::Write)
            })
        });
        let mut r = &stream;
        let got = read_all(&mut r, expect, case.read_buf());
        let wrote = match writer {
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("writer panicked"))),
            None => Ok(()),
        };
        wrote?;
        got
    })
}

fn std_sample(listener: &TcpListener, addr: SocketAddr, case: &TcpCase) -> io::Result<(f64, u64)> {
    let full = case.duplex == Duplex::Full;
    let start = Instant::now();
    let total = std::thread::scope(|s| {
        let server = s.spawn(|| -> io::Result<u64> {
            let deadline = Instant::now() + SAMPLE_TIMEOUT;
            std::thread::scope(|s2| {
                let mut handles = Vec::new();
                while handles.len() < case.concurrency {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            stream.set_nonblocking(false)?;
                            handles.push(s2.spawn(move || std_end(stream, case, full, true)));
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if Instant::now() > deadline {
                                return Err(io::Error::new(
                                    io::ErrorKind::TimedOut,
                                    "connections never arrived",
                                ));
                            }
                            std::thread::sleep(Duration::from_micros(50));
                        }
                        Err(e) => return Err(e),
                    }
                }
                let mut sum = 0;
                for h in handles {
                    sum += h
                        .join()
                        .unwrap_or_else(|_| Err(io::Error::other("server end panicked")))?;
                }
                Ok(sum)
            })
        });
        let clients: Vec<_> = (0..case.concurrency)
            .map(|_| {
                s.spawn(move || -> io::Result<u64> {
                    let stream = TcpStream::connect(addr)?;
                    std_end(stream, case, true, full)
                })
            })
            .collect();
        let mut sum = 0u64;
        let mut first_err = None;
        for h in clients {
            match h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("client panicked")))
            {
                Ok(n) => sum += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let server = server
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("server panicked")));
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(sum + server?)
    })?;
    Ok((start.elapsed().as_secs_f64(), total))
}

mod tokioimpl {
    //! The tokio ends: the same protocol with tokio's TcpStream, split
    //! into halves for full duplex.
    use super::*;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::net::{TcpListener as TokioListener, TcpStream as TokioStream};

    async fn write_chunks<W: AsyncWrite + Unpin>(
        w: &mut W,
        bytes: u64,
        chunk: usize,
    ) -> io::Result<()> {
        let buf = vec![0x3Cu8; chunk];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk as u64) as usize;
            w.write_all(&buf[..n]).await?;
            left -= n as u64;
        }
        w.shutdown().await
    }

    async fn read_all<R: AsyncRead + Unpin>(
        r: &mut R,
        expect: u64,
        buf_size: usize,
    ) -> io::Result<u64> {
        let mut buf = vec![0u8; buf_size];
        let mut got = 0u64;
        loop {
            let n = r.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        if got != expect {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("connection ended after {got} of {expect} bytes"),
            ));
        }
        Ok(got)
    }

    async fn end(
        stream: TokioStream,
        case: TcpCase,
        sends: bool,
        receives: bool,
    ) -> io::Result<u64> {
        stream.set_nodelay(case.nodelay)?;
        if let Some(algo) = case.congestion {
            algo.apply(&socket2::SockRef::from(&stream))?;
        }
        let (mut r, mut w) = stream.into_split();
        let expect = if receives { case.bytes } else { 0 };
        let writing = async {
            if sends {
                write_chunks(&mut w, case.bytes, case.chunk).await
            } else {
                Ok(())
            }
        };
        let (wrote, got) = tokio::join!(writing, read_all(&mut r, expect, case.read_buf()));
        wrote?;
        got
    }

    pub(super) async fn sample(
        listener: &TokioListener,
        addr: SocketAddr,
        case: TcpCase,
    ) -> io::Result<(f64, u64)> {
        let full = case.duplex == Duplex::Full;
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..case.concurrency {
            tasks.spawn(async move {
                let s = TokioStream::connect(addr).await?;
                end(s, case, true, full).await
            });
        }
        for _ in 0..case.concurrency {
            let (s, _) = listener.accept().await?;
            tasks.spawn(end(s, case, full, true));
        }
        let mut total = 0;
        while let Some(r) = tasks.join_next().await {
            total += r.map_err(|e| io::Error::other(format!("task failed: {e}")))??;
        }
        Ok((start.elapsed().as_secs_f64(), total))
    }

    /// Runs warm-up plus `samples` samples on the cell's runtime.
    pub(super) fn run(case: &TcpCase, samples: usize, shutdown: &Shutdown) -> Result<Vec<f64>> {
        let rt = match case.implementation {
            Impl::TokioCt => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
            _ => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build(),
        }
        .map_err(|e| Error::io("tokio: cannot start a runtime", e))?;
        let (listener, addr) = rt.block_on(async {
            let listener = TokioListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| Error::io("tcp: cannot listen on 127.0.0.1", e))?;
            let addr = listener.local_addr().map_err(|e| Error::io("tcp", e))?;
            Ok::<_, Error>((listener, addr))
        })?;
        super::sample_cell(case, samples, shutdown, || {
            // The timer is made inside the runtime, which owns the clock.
            rt.block_on(async {
                tokio::time::timeout(SAMPLE_TIMEOUT, sample(&listener, addr, *case)).await
            })
            .map_err(|_| {
                Error::runtime(format!(
                    "{}: a sample took over {SAMPLE_TIMEOUT:?}",
                    describe(case)
                ))
            })?
            .map_err(|e| Error::io(describe(case), e))
        })
    }
}

fn check(case: &TcpCase, moved: u64) -> Result<()> {
    if moved != case.expected() {
        return Err(Error::runtime(format!(
            "{}: moved {moved} bytes, expected {}",
            describe(case),
            case.expected()
        )));
    }
    Ok(())
}

/// A cell in words.
pub fn describe(c: &TcpCase) -> String {
    format!(
        "impl={} duplex={:?} chunk={} concurrency={}",
        c.implementation.name(),
        c.duplex,
        c.chunk,
        c.concurrency
    )
    .to_lowercase()
}

/// Runs one cell: a warm-up sample, then `samples` timed ones (seconds).
pub fn run_cell(case: &TcpCase, samples: usize, shutdown: &Shutdown) -> Result<Vec<f64>> {
    if case.implementation != Impl::Std {
        return tokioimpl::run(case, samples, shutdown);
    }
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::io("tcp: cannot listen on 127.0.0.1", e))?;
    let addr = listener.local_addr().map_err(|e| Error::io("tcp", e))?;
    // Non-blocking accept, so that a failed client cannot hang the server.
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("tcp", e))?;
    sample_cell(case, samples, shutdown, || {
        std_sample(&listener, addr, case).map_err(|e| Error::io(describe(case), e))
    })
}

/// A warm-up sample, then `samples` timed ones (seconds), each checked to
/// have moved exactly what the cell asks for.
fn sample_cell(
    case: &TcpCase,
    samples: usize,
    shutdown: &Shutdown,
    mut sample: impl FnMut() -> Result<(f64, u64)>,
) -> Result<Vec<f64>> {
    let mut times = Vec::with_capacity(samples);
    for i in 0..=samples {
        if shutdown.is_triggered() {
            break;
        }
        let (secs, moved) = sample()?;
        check(case, moved)?;
        if i > 0 {
            times.push(secs);
        }
    }
    Ok(times)
}

/// The validated cells, in the seed's order: chunk, concurrency, duplex,
/// implementation innermost.
pub fn cases(a: &TcpSettings) -> Result<Vec<TcpCase>> {
    if a.samples == 0 || a.samples > 10_000 {
        return Err(Error::usage(format!(
            "--samples {}: must be between 1 and 10000",
            a.samples
        )));
    }
    if a.bytes == 0 {
        return Err(Error::usage("--bytes must be at least 1"));
    }
    for &c in &a.chunk {
        if c == 0 || c > 64 << 20 {
            return Err(Error::usage(format!(
                "--chunk {c}: must be between 1 byte and 64 MiB"
            )));
        }
    }
    for &n in &a.concurrency {
        if n == 0 || n > MAX_CONCURRENCY {
            return Err(Error::usage(format!(
                "--concurrency {n}: must be between 1 and {MAX_CONCURRENCY}"
            )));
        }
    }
    let mut out = Vec::new();
    for &chunk in &a.chunk {
        for &concurrency in &a.concurrency {
            for &duplex in &a.duplex {
                for &implementation in &a.implementation {
                    out.push(TcpCase {
                        implementation,
                        duplex,
                        chunk: chunk as usize,
                        concurrency,
                        bytes: a.bytes,
                        nodelay: a.nodelay,
                        congestion: a.congestion,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// What `sockbench tcp` measured, and the settings it ran with.
#[derive(Debug, Clone)]
pub struct TcpReport {
    pub rows: Vec<TcpRow>,
    pub samples: usize,
    /// `--congestion`; None is the system's default.
    pub congestion: Option<Congestion>,
}

/// `sockbench tcp`: validate, then run every cell.
pub fn run(
    a: &TcpArgs,
    progress: &mut dyn crate::matrix::Progress,
    shutdown: &Shutdown,
) -> Result<TcpReport> {
    let a = &a.settings()?;
    let cells = cases(a)?;
    if let Some(algo) = a.congestion {
        algo.check_available()?;
    }
    let rows = crate::matrix::run_matrix("tcp", &cells, None, progress, shutdown, describe, |c| {
        run_cell(c, a.samples, shutdown).map(|times| row(c, &summarize(&times)))
    })?;
    Ok(TcpReport {
        rows,
        samples: a.samples,
        congestion: a.congestion,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_writes_and_exact_reads() {
        let mut out = Vec::new();
        write_chunks(&mut out, 10_001, 40).unwrap();
        assert_eq!(out.len(), 10_001);
        assert_eq!(read_all(&mut &out[..], 10_001, 4096).unwrap(), 10_001);
        // An early EOF is an error, at once.
        let err = read_all(&mut &out[..100], 10_001, 4096).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn expected_bytes_count_connections_and_directions() {
        let c = TcpCase {
            implementation: Impl::Std,
            duplex: Duplex::Full,
            chunk: 40,
            concurrency: 5,
            bytes: 1000,
            nodelay: false,
            congestion: None,
        };
        assert_eq!(c.expected(), 10_000);
        assert!(c.read_buf() >= c.chunk);
    }
}
