//! Connections: the accept loop that stands between the socket and the router, so slow or
//! idle clients cannot hold the server. axum's own `serve` waits for a request's headers
//! forever and accepts connections until file descriptors run out; here
//!
//! - a request's headers must arrive within the header timeout of the connection opening
//!   (or of the previous response, so it is also the keep-alive idle timeout);
//! - a response write that makes no progress for the idle timeout ends the connection (a
//!   client that stopped reading);
//! - at most `max_connections` connections are served; one more makes the oldest connection
//!   close: at once when it has no request in flight (waiting for headers, or idle), after
//!   its response otherwise, so half-open connections cannot lock normal clients out.
//!
//! The request body's deadline is [`crate::guard`]'s (a whole body within the body timeout).
//! Each request carries its peer's address as axum's `ConnectInfo<SocketAddr>`.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tower::ServiceExt;

/// How long clients may take, and how many may be connected.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// The live connections, oldest first, each with the signal that asks it to close.
#[derive(Default)]
struct Live {
    count: AtomicUsize,
    /// Connections not yet asked to close, by accept order.
    open: Mutex<BTreeMap<u64, Arc<Notify>>>,
}

impl Live {
    fn open(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Notify>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the count falls below `ceiling` within [`CEILING_WAIT`]: idle connections
    /// asked to close do so at once, but on a busy machine their tasks may not have run yet
    /// when the next client connects, and refusing it then would lock a normal client out
    /// behind half-open ones (the kernel's backlog holds new connections meanwhile).
    async fn settles_below(&self, ceiling: usize) -> bool {
        let deadline = tokio::time::Instant::now() + CEILING_WAIT;
        while self.count.load(Ordering::SeqCst) >= ceiling {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }
}

/// How long a connection over the hard ceiling waits for evicted ones to close before it
/// is refused.
const CEILING_WAIT: Duration = Duration::from_millis(200);

/// Ends a connection's bookkeeping when its task ends, however it ends.
struct Registered {
    live: Arc<Live>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.live.open().remove(&self.id);
        self.live.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts and serves connections until `stop` turns true, then asks every connection to
/// close once idle and returns when all are closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let live = Arc::new(Live::default());
    let (closing_tx, closing_rx) = watch::channel(false);
    let max = limits.max_connections.max(1);
    let mut next_id = 0u64;
    loop {
        // No await inside select's arms: the watch guard in its output is not Send.
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => None,
            accepted = listener.accept() => Some(accepted),
        };
        let Some(accepted) = accepted else { break };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors (or a connection reset before accept): retry
                // shortly instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let n = live.count.load(Ordering::SeqCst);
        if n >= max {
            // Make room: the oldest connection closes once idle. Busy ones finish first, so a
            // hard ceiling a quarter above the limit keeps file descriptors bounded.
            if let Some((_, oldest)) = live.open().pop_first() {
                oldest.notify_one();
            }
            if n >= max + max / 4 && !live.settles_below(max + max / 4).await {
                tracing::warn!(connections = n, "connection limit reached: refusing one");
                drop(stream);
                continue;
            }
        }
        let _ = stream.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        let evict = Arc::new(Notify::new());
        live.open().insert(id, Arc::clone(&evict));
        live.count.fetch_add(1, Ordering::SeqCst);
        let registered = Registered {
            live: Arc::clone(&live),
            id,
        };
        let app = app.clone();
        let closing = closing_rx.clone();
        tokio::spawn(async move {
            serve_one(stream, peer, app, limits, evict, closing).await;
            drop(registered);
        });
    }
    drop(listener);
    closing_tx.send_replace(true);
    while live.count.load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn serve_one(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: ConnLimits,
    evict: Arc<Notify>,
    mut closing: watch::Receiver<bool>,
) {
    // Requests in flight on this connection: from their headers to their response's end.
    let busy = Arc::new(AtomicUsize::new(0));
    let (on_request, on_response) = (Arc::clone(&busy), Arc::clone(&busy));
    let service = TowerToHyperService::new(
        app.map_request(move |req: hyper::Request<Incoming>| {
            on_request.fetch_add(1, Ordering::SeqCst);
            let mut req = req.map(Body::new);
            req.extensions_mut().insert(ConnectInfo(peer));
            req
        })
        .map_response(move |resp: axum::response::Response| {
            let guard = Busy(Arc::clone(&on_response));
            resp.map(|inner| {
                Body::new(Tracked {
                    inner,
                    _busy: guard,
                })
            })
        }),
    );
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let io = TokioIo::new(StallGuard::new(stream, limits.idle_timeout));
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    // Asked to close (evicted, or the server stops): at once when no request is in flight,
    // else once the response is done. Not hyper's graceful shutdown, which stalls a
    // streaming response in flight.
    let mut asked = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            _ = evict.notified(), if !asked => asked = true,
            _ = closing.wait_for(|c| *c), if !asked => asked = true,
            _ = tokio::time::sleep(Duration::from_millis(50)), if asked => {}
        }
        if asked && busy.load(Ordering::SeqCst) == 0 {
            return;
        }
    }
}

/// Counts a response as in flight until its body is done with (sent or dropped).
struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that holds its connection's [`Busy`] count.
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A socket whose writes fail once they have made no progress for `idle`: a client that
/// stops reading a response cannot hold its connection (and its sequence) forever.
struct StallGuard {
    inner: TcpStream,
    idle: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl StallGuard {
    fn new(inner: TcpStream, idle: Duration) -> StallGuard {
        StallGuard {
            inner,
            idle,
            stalled: None,
        }
    }

    /// Ready(error) once a write has been pending for the idle timeout.
    fn check_stall<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => {
                let idle = self.idle;
                let sleep = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client read nothing for the idle timeout",
                    )));
                }
                Poll::Pending
            }
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl AsyncRead for StallGuard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallGuard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.check_stall(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.check_stall(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.check_stall(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `max` connections, lowered to what the open-file limit allows (raised first to its hard
/// limit): a quarter above the limit is the hard ceiling (see [`serve`]), and some
/// descriptors are the process's own (model files, the listener, upstream connections).
pub fn fit_to_fds(max: usize) -> usize {
    match raise_fd_limit() {
        Some(fds) => max.min((fds.saturating_sub(64) * 4 / 5) as usize).max(1),
        None => max,
    }
}

/// Raises this process's open-file limit to its hard limit (many connections need many
/// descriptors) and returns the soft limit now in force, or `None` where it is unknown.
pub fn raise_fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return None;
            }
            if lim.rlim_cur < lim.rlim_max {
                let want = libc::rlimit {
                    rlim_cur: lim.rlim_max,
                    rlim_max: lim.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                    lim.rlim_cur = lim.rlim_max;
                }
            }
        }
        // rlim_t is u64 here but not on every unix.
        #[allow(clippy::unnecessary_cast)]
        Some(lim.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}
