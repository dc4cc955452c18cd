//! Connections: how many may be open, and how long a client may hold one without moving. A client that
//! trickles its request's head, keeps an idle connection, or stops taking its streamed answer holds a
//! connection for at most [`Limits::client_timeout`](super::Limits::client_timeout); at most
//! [`Limits::max_connections`](super::Limits::max_connections) are open, the rest wait in the listen
//! queue. (The body's deadline is the handler's: it answers 408.)

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Sleep;

/// The send buffer of each connection (Linux gives twice this).
const SEND_BUFFER: usize = 64 << 10;

/// Serves `app` on `listener` until `stop` resolves; then stops accepting, and gives open connections
/// `grace` to finish.
pub(super) async fn serve(
    listener: TcpListener,
    app: axum::Router,
    timeout: Duration,
    max_connections: usize,
    stop: impl Future<Output = ()>,
    grace: Duration,
) {
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s,
            () = &mut stop => break,
        };
        let Ok(slot) = slot else { break };
        let tcp = tokio::select! {
            a = listener.accept() => a,
            () = &mut stop => break,
        };
        let tcp = match tcp {
            Ok((tcp, _)) => tcp,
            // Out of file descriptors, or a connection reset before it was accepted: try again shortly.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        // The kernel's buffer for what the client has not taken yet, fixed rather than grown up to
        // megabytes: a stalled client is then noticed within a few hundred tokens of its answer (and
        // hundreds of connections cannot pin gigabytes). Answers stream at kilobytes a second.
        let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(SEND_BUFFER);
        let io = TokioIo::new(Stalls { inner: tcp, limit: timeout, stalled: None });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            // Counted from when the server waits for a request's head: a trickled head, and a kept-alive
            // connection with no next request, are closed after it.
            .header_read_timeout(timeout)
            .serve_connection(io, TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(grace, graceful.shutdown()).await;
}

/// A stream whose writes fail once the peer has taken nothing for `limit`: the response it stopped
/// reading is dropped (and with it the generation, [`CancelOnDrop`](super::http)).
struct Stalls<T> {
    inner: T,
    limit: Duration,
    /// Since when a write has been waiting.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> Stalls<T> {
    /// `poll` a write; pending past the limit, an error.
    fn write<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut T, &mut Context<'_>) -> Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match poll(&mut self.inner, cx) {
            Poll::Pending => {
                let limit = self.limit;
                let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client took nothing for {} s", limit.as_secs_f64()),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Stalls<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Stalls<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.write(cx, |t, cx| Pin::new(t).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.write(cx, |t, cx| Pin::new(t).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.write(cx, |t, cx| Pin::new(t).poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.write(cx, |t, cx| Pin::new(t).poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn a_write_the_peer_never_takes_fails_after_the_limit() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            // A pipe of 64 bytes that nobody reads.
            let (ours, _theirs) = tokio::io::duplex(64);
            let mut s = Stalls { inner: ours, limit: Duration::from_millis(50), stalled: None };
            let started = std::time::Instant::now();
            let e = s.write_all(&[0u8; 4096]).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
            assert!(started.elapsed() >= Duration::from_millis(50));
            // A peer that reads keeps it going: each write that completes restarts the wait.
            let (ours, mut theirs) = tokio::io::duplex(64);
            let mut s = Stalls { inner: ours, limit: Duration::from_millis(200), stalled: None };
            let reader = tokio::spawn(async move {
                let mut buf = [0u8; 64];
                let mut got = 0;
                while got < 4096 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    got += tokio::io::AsyncReadExt::read(&mut theirs, &mut buf).await.unwrap();
                }
                got
            });
            s.write_all(&[0u8; 4096]).await.unwrap();
            assert_eq!(reader.await.unwrap(), 4096);
        });
    }
}
