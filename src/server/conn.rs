//! Connections: accepting them under a limit, HTTP/1.1 through hyper, the per-connection
//! timeouts, and a shutdown bounded in time.
//!
//! - `--max-connections`: a connection past the limit is answered 503 (JSON, `Retry-After`)
//!   and closed; at most [`REFUSING`] such answers are in progress at once, connections beyond
//!   those are closed unanswered, so a flood cannot take more than `max + REFUSING` descriptors.
//! - Each connection has a watchdog: while no request is in the service, it closes the
//!   connection `--header-timeout` after it opened or after the first byte of a request head
//!   (a head that never completes: slowloris), or `--idle-timeout` after the last response when
//!   no new request starts (idle keep-alive). The body has `--body-timeout` (routes.rs), a write
//!   that makes no progress `--write-timeout` (io.rs).
//! - Shutdown: no more accepts; a connection whose request has not all arrived closes at once
//!   (an idle one, one still sending a head or a body); the others finish their response
//!   (generation included) and then close. When `--shutdown-timeout` ends, the streams still
//!   running are ended with a last error event in their protocol's shape (`cut`, given by the
//!   caller); what is still open [`CUT_LINGER`] later is dropped.
//! - A client that stops reading: the kernel holds at most [`UNSENT`] bytes it has not sent yet
//!   (`TCP_NOTSENT_LOWAT`) besides what the client's own buffer took, so that a write blocks,
//!   and the write timeout (io.rs) starts, after some hundred kilobytes rather than the
//!   megabytes a send buffer grows to; the request's job is cancelled when the connection
//!   closes.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::Request;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;

use super::error::ApiError;
use super::io::{raw_response, ConnIo};
use super::metrics::HttpMetrics;
use super::HttpLimits;

/// Refusals (503 to a connection past the limit) in progress at once.
const REFUSING: usize = 64;
/// How long a refusal waits for the client to take its answer.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// How long the streams cut at the end of the shutdown grace have to send their last event.
const CUT_LINGER: Duration = Duration::from_secs(2);
/// Bytes a connection's socket may hold that the kernel has not sent yet.
const UNSENT: usize = 16 * 1024;

/// Serve `app` on `listener` until `shutdown` resolves, then close down within
/// `limits.shutdown_grace`, calling `cut` if responses are still running when it ends.
/// Returns when every connection is gone.
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    metrics: Arc<HttpMetrics>,
    shutdown: impl Future<Output = ()>,
    cut: impl FnOnce(),
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusing = Arc::new(Semaphore::new(REFUSING));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    let mut failing = false;
    loop {
        while tasks.try_join_next().is_some() {}
        let tcp = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok((tcp, _peer)) => {
                    failing = false;
                    tcp
                }
                Err(e) => {
                    // Out of descriptors (EMFILE) and the like: the pending connection stays
                    // in the backlog; wait rather than spin (and say so once per episode).
                    if !failing {
                        log::warn!("accept: {e} (lower --max-connections below `ulimit -n`?)");
                    }
                    failing = true;
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    }
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        limit_unsent(&tcp);
        match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => {
                let conn = connection(
                    tcp,
                    app.clone(),
                    limits.clone(),
                    Arc::clone(&metrics),
                    stop_rx.clone(),
                    slot,
                );
                tasks.spawn(conn);
            }
            Err(_) => {
                metrics.connections_refused.fetch_add(1, Relaxed);
                if let Ok(permit) = Arc::clone(&refusing).try_acquire_owned() {
                    tokio::spawn(refuse(tcp, permit));
                }
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        log::warn!(
            "shutdown: {} connections still open after {:?}; ending their responses",
            tasks.len(),
            limits.shutdown_grace
        );
        cut();
        let ended = tokio::time::timeout(CUT_LINGER, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if ended.is_err() {
            log::warn!("shutdown: closing {} connections", tasks.len());
            tasks.shutdown().await;
        }
    }
}

/// Keep what the kernel buffers for a client small ([`UNSENT`] not yet sent), so that one
/// that stops reading blocks the writes soon. What is sent and not yet acknowledged is left to
/// TCP: the throughput to a reading client is unchanged.
fn limit_unsent(tcp: &TcpStream) {
    let sock = socket2::SockRef::from(tcp);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = sock.set_tcp_notsent_lowat(UNSENT as u32);
    // (Elsewhere a fixed send buffer, which bounds the unacknowledged bytes too.)
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = sock.set_send_buffer_size(4 * UNSENT);
}

/// Answer 503 to a connection past the limit, then close it. Reads (and drops) what the
/// client sends for a moment, so that closing does not reset the connection before the client
/// has read the answer.
async fn refuse(mut tcp: TcpStream, _permit: OwnedSemaphorePermit) {
    let err = ApiError::unavailable("too many connections (--max-connections); retry shortly");
    let answer = raw_response(&err);
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        tcp.write_all(&answer).await?;
        tcp.shutdown().await?;
        let mut sink = [0u8; 4096];
        while tcp.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// One connection, from accept to close.
async fn connection(
    tcp: TcpStream,
    app: Router,
    limits: HttpLimits,
    metrics: Arc<HttpMetrics>,
    mut stop: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    metrics.connections_open.fetch_add(1, Relaxed);
    let _open = OnDrop(|| {
        metrics.connections_open.fetch_sub(1, Relaxed);
    });
    let state = Arc::new(ConnState::new());
    let arrived = tcp.local_addr().ok().map(Arrived);
    let io = ConnIo::new(
        tcp,
        Arc::clone(&state),
        Arc::clone(&metrics),
        limits.write_timeout,
    );
    let service = {
        let state = Arc::clone(&state);
        hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let guard = RequestGuard::new(Arc::clone(&state));
            if let Some(a) = arrived {
                req.extensions_mut().insert(a);
            }
            let req = req.map(|body| Body::new(Receiving::new(body, Arc::clone(&state))));
            let answer = app.clone().oneshot(req);
            async move {
                let Ok(resp) = answer.await;
                Ok::<_, Infallible>(resp.map(|body| Tracked {
                    body,
                    _guard: guard,
                }))
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service);
    let mut conn = pin!(conn);
    loop {
        let changed = state.changed.notified();
        let deadline = state.deadline(&limits);
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = changed => {}
            _ = sleep_until(deadline) => {
                if let Some(kind) = state.expired(&limits) {
                    metrics.timed_out(kind);
                    return;
                }
            }
            _ = stop.wait_for(|&s| s) => break,
        }
    }
    // Shutting down: a connection with a whole request in the service finishes its response
    // first; one still receiving its request's body closes now.
    if state.busy() && !state.receiving() {
        conn.as_mut().graceful_shutdown();
        let _ = conn.await;
    }
}

/// The local address a connection arrived on (a request extension): on a server bound to
/// every address, whether this one came over loopback.
#[derive(Clone, Copy, Debug)]
pub(super) struct Arrived(pub std::net::SocketAddr);

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// What the watchdog of one connection knows.
pub(super) struct ConnState {
    inner: Mutex<Activity>,
    /// Woken when the deadline may have moved.
    changed: Notify,
}

struct Activity {
    /// Requests in the service whose response has not finished.
    busy: usize,
    /// Since when the connection has had no request in the service.
    since: Instant,
    /// A request head is on its way (bytes arrived since `since`), or the connection is new:
    /// the header timeout applies, else the idle one.
    head: bool,
    /// Requests in the service whose body has not all arrived (and that still read it).
    receiving: usize,
}

impl ConnState {
    pub fn new() -> ConnState {
        ConnState {
            inner: Mutex::new(Activity {
                busy: 0,
                since: Instant::now(),
                head: true,
                receiving: 0,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Activity> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived from the client.
    pub fn bytes_in(&self) {
        let mut a = self.lock();
        if a.busy == 0 && !a.head {
            a.head = true;
            a.since = Instant::now();
            drop(a);
            self.changed.notify_one();
        }
    }

    fn busy(&self) -> bool {
        self.lock().busy > 0
    }

    fn receiving(&self) -> bool {
        self.lock().receiving > 0
    }

    fn deadline(&self, limits: &HttpLimits) -> Option<Instant> {
        let a = self.lock();
        if a.busy > 0 {
            return None;
        }
        let limit = if a.head {
            limits.header_timeout
        } else {
            limits.idle_timeout
        };
        Some(a.since + limit)
    }

    /// The timeout that has run out, if one has.
    fn expired(&self, limits: &HttpLimits) -> Option<&'static str> {
        let head = self.lock().head;
        let due = self.deadline(limits)?;
        (Instant::now() >= due).then_some(if head { "header" } else { "idle" })
    }
}

/// Held from the moment hyper hands a request to the service until its response body is done
/// (or dropped: the connection closed).
struct RequestGuard(Arc<ConnState>);

impl RequestGuard {
    fn new(state: Arc<ConnState>) -> RequestGuard {
        state.lock().busy += 1;
        state.changed.notify_one();
        RequestGuard(state)
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let mut a = self.0.lock();
        a.busy -= 1;
        if a.busy == 0 {
            a.head = false;
            a.since = Instant::now();
        }
        drop(a);
        self.0.changed.notify_one();
    }
}

/// A request body that tells its connection when it has all arrived: from then on, shutdown
/// lets the request finish. Dropped unread (the service answered without it), it no longer
/// counts as arriving either.
struct Receiving {
    body: Incoming,
    state: Arc<ConnState>,
    open: bool,
}

impl Receiving {
    fn new(body: Incoming, state: Arc<ConnState>) -> Receiving {
        let open = !body.is_end_stream();
        if open {
            state.lock().receiving += 1;
        }
        Receiving { body, state, open }
    }

    fn arrived(&mut self) {
        if std::mem::take(&mut self.open) {
            self.state.lock().receiving -= 1;
        }
    }
}

impl HttpBody for Receiving {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let r = ready!(Pin::new(&mut self.body).poll_frame(cx));
        if !matches!(r, Some(Ok(_))) || self.body.is_end_stream() {
            self.arrived();
        }
        Poll::Ready(r)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.arrived();
    }
}

/// A response body that holds its request's [`RequestGuard`].
struct Tracked {
    body: Body,
    _guard: RequestGuard,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Runs a closure when dropped.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}
