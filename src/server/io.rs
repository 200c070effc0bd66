//! The socket as hyper sees it: a TCP stream that reports activity to its connection's watchdog,
//! gives up on a client that stops reading, and answers hyper's own error responses with a JSON
//! body.
//!
//! hyper answers a request it cannot parse (a malformed request line, method, header or
//! `Content-Length`, a head past its buffer, a URI too long) by itself, without calling the
//! service, with a bare head: `HTTP/1.1 400 Bad Request`, `content-length: 0`, and then closes
//! the connection. It has no hook to shape that answer, so [`ConnIo`] recognises it on the way
//! out and writes OpenAI's error shape instead. The recognition is exact because the service
//! never produces an error without a body (routes.rs gives every error status a JSON body):
//! a write that is one whole response head, status 400 or more, with `content-length: 0` and
//! nothing after it, can only be hyper's.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::conn::ConnState;
use super::error::ApiError;
use super::metrics::HttpMetrics;

pub(super) struct ConnIo<T> {
    tcp: T,
    conn: Arc<ConnState>,
    metrics: Arc<HttpMetrics>,
    /// How long one write may make no progress (a client that stopped reading).
    write_timeout: Duration,
    /// Running while a write waits on the client.
    stall: Option<Pin<Box<Sleep>>>,
    /// The JSON answer replacing hyper's bare one, and how much of it is written.
    replacement: Vec<u8>,
    replaced: usize,
}

impl<T: AsyncRead + AsyncWrite + Unpin> ConnIo<T> {
    pub fn new(
        tcp: T,
        conn: Arc<ConnState>,
        metrics: Arc<HttpMetrics>,
        write_timeout: Duration,
    ) -> ConnIo<T> {
        ConnIo {
            tcp,
            conn,
            metrics,
            write_timeout,
            stall: None,
            replacement: Vec::new(),
            replaced: 0,
        }
    }

    /// `Pending` from the client: start (or keep) the stall clock; past the write timeout the
    /// write fails and hyper closes the connection.
    fn on_write<R>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if r.is_ready() {
            self.stall = None;
            return r;
        }
        let limit = self.write_timeout;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if stall.as_mut().poll(cx).is_ready() {
            self.stall = None;
            self.metrics.timed_out("write");
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client stopped reading (--write-timeout)",
            )));
        }
        Poll::Pending
    }

    /// Write what is left of the replacement answer.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.replaced < self.replacement.len() {
            let r = Pin::new(&mut self.tcp).poll_write(cx, &self.replacement[self.replaced..]);
            let n = ready!(self.on_write(cx, r))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.replaced += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for ConnIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.bytes_in();
        }
        r
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ConnIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.drain(cx))?;
        if let Some(status) = bare_error_head(buf) {
            this.metrics.record("other", status.as_u16());
            this.replacement = raw_response(&hyper_error(status));
            this.replaced = 0;
            // Taken whole; the rest goes out on the flush or shutdown that follows.
            let _ = this.drain(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        let r = Pin::new(&mut this.tcp).poll_write(cx, buf);
        this.on_write(cx, r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.drain(cx))?;
        let r = Pin::new(&mut this.tcp).poll_flush(cx);
        this.on_write(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.drain(cx))?;
        let r = Pin::new(&mut this.tcp).poll_shutdown(cx);
        this.on_write(cx, r)
    }
}

/// The status of `buf` if it is exactly one response head with an error status and
/// `content-length: 0` (hyper's own answer to a request it could not parse).
fn bare_error_head(buf: &[u8]) -> Option<StatusCode> {
    if !(buf.starts_with(b"HTTP/1.1 ") || buf.starts_with(b"HTTP/1.0 ")) {
        return None;
    }
    let head = buf.strip_suffix(b"\r\n\r\n")?;
    if head.windows(4).any(|w| w == b"\r\n\r\n") {
        return None;
    }
    let code: u16 = std::str::from_utf8(head.get(9..12)?).ok()?.parse().ok()?;
    let bare = head
        .split(|&b| b == b'\n')
        .any(|line| line.trim_ascii().eq_ignore_ascii_case(b"content-length: 0"));
    if code < 400 || !bare {
        return None;
    }
    StatusCode::from_u16(code).ok()
}

/// The error for a status hyper chose.
fn hyper_error(status: StatusCode) -> ApiError {
    let message = match status {
        StatusCode::BAD_REQUEST => {
            "malformed HTTP request (request line, method, version, a header or Content-Length)"
        }
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "the request head is too large",
        StatusCode::URI_TOO_LONG => "the request URI is too long",
        _ => "the HTTP request could not be processed",
    };
    ApiError {
        close: true,
        ..ApiError::with_status(status, message)
    }
}

/// A whole HTTP/1.1 response for `err`, written without hyper (hyper's own error answers,
/// connections past the limit). It closes the connection.
pub(super) fn raw_response(err: &ApiError) -> Vec<u8> {
    let body = err.body().to_string();
    let mut head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        err.status.as_u16(),
        err.status.canonical_reason().unwrap_or("Error"),
        body.len()
    );
    if let Some(s) = err.retry_after {
        head.push_str(&format!("retry-after: {s}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_only_bare_error_heads() {
        let bare = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(bare_error_head(bare), Some(StatusCode::BAD_REQUEST));
        let big = b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            bare_error_head(big),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        for not in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 10\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
            b"data: HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nHTTP/1.1 400 x\r\n\r\n",
        ] {
            assert_eq!(
                bare_error_head(not),
                None,
                "{}",
                String::from_utf8_lossy(not)
            );
        }
    }

    #[test]
    fn raw_response_is_json_with_length() {
        let r = raw_response(&ApiError::unavailable("busy"));
        let text = String::from_utf8(r).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(head.contains("retry-after: 1") && head.contains("connection: close"));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["message"], "busy");
        assert_eq!(v["error"]["type"], "server_error");
    }

    fn pipe(write_timeout: Duration) -> (ConnIo<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
        let (ours, client) = tokio::io::duplex(64);
        let io = ConnIo::new(
            ours,
            Arc::new(ConnState::new()),
            Arc::new(HttpMetrics::default()),
            write_timeout,
        );
        (io, client)
    }

    /// Everything the client end reads until the connection closes, read in a task.
    fn read_all(mut client: tokio::io::DuplexStream) -> tokio::task::JoinHandle<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        tokio::spawn(async move {
            let mut out = Vec::new();
            client.read_to_end(&mut out).await.unwrap();
            out
        })
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_times_out() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut io, mut client) = pipe(Duration::from_secs(1));
        // Progress, however slow, keeps the connection: the client reads every 100 ms.
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = client.read(&mut buf).await;
            }
            client
        });
        io.write_all(&[b'x'; 64 + 16 * 19]).await.unwrap();
        let _client = reader.await.unwrap();
        // Now it reads nothing: the write fails after the timeout.
        let write = io.write_all(&[b'y'; 1000]);
        let err = tokio::time::timeout(Duration::from_secs(20), write)
            .await
            .expect("the stalled write never timed out")
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn hyper_bare_error_goes_out_as_json() {
        use tokio::io::AsyncWriteExt;
        let (mut io, client) = pipe(Duration::from_secs(5));
        let bare = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let reading = read_all(client);
        // hyper writes the head, flushes, shuts down; the replacement (longer than the pipe's
        // buffer) goes out across those calls.
        assert_eq!(io.write(bare).await.unwrap(), bare.len());
        io.flush().await.unwrap();
        io.shutdown().await.unwrap();
        drop(io);
        let out = String::from_utf8(reading.await.unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        // A service answer passes through untouched.
        let (mut io, client) = pipe(Duration::from_secs(5));
        let ok = b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}";
        let reading = read_all(client);
        io.write_all(ok).await.unwrap();
        drop(io);
        assert_eq!(reading.await.unwrap(), ok);
    }
}
