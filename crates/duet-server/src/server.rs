//! The listener: accept connections (loopback or whatever `--bind` names),
//! enforce the connection limit, run the reaper, and shut down gracefully.
//!
//! Invariants:
//! - at most `max_connections` connections are served at once, plus at most
//!   `admin_connections` more from loopback peers (a reserve so the
//!   administrator can get in when other clients hold every ordinary slot;
//!   taken only when the ordinary slots are full); one more gets a clear
//!   refusal (its first command is answered with an error naming the limit,
//!   then it is closed), and at most [`MAX_REFUSALS_IN_FLIGHT`] such
//!   refusals are in progress — beyond that a connection is closed at once;
//! - a connection's TLS detection and handshake (`tls`) run in its own task,
//!   after it took its slot and within `tls_handshake_timeout` (abandoned at
//!   shutdown): the accept loop never waits on a client;
//! - a reaper closes idle cursors, aborts transactions past their lifetime
//!   and forgets idle sessions;
//! - shutdown (a signal, or the `shutdown` command) stops accepting, cancels the commands in flight (reads stop
//!   within a page with InterruptedAtShutdown, submitted writes commit),
//!   lets each connection finish its command, waits at most
//!   `shutdown_grace`, and returns.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::error::CommandError;
use crate::state::{ConnInfo, ServerState};
use crate::tls::{self, Stream};
use crate::{opmsg, opquery, wire};

/// Refusals (over the connection limit) being answered at once.
pub const MAX_REFUSALS_IN_FLIGHT: usize = 16;

/// A bound server, ready to run.
pub struct Server {
    state: Arc<ServerState>,
    listener: TcpListener,
}

impl Server {
    /// Bind the listening socket.
    pub async fn bind(state: Arc<ServerState>) -> std::io::Result<Server> {
        let addr = format!("{}:{}", state.config.bind, state.config.port);
        let listener = TcpListener::bind(&addr).await?;
        *state.local_addr.lock() = listener.local_addr().ok();
        Ok(Server { state, listener })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Serve until `shutdown` completes, then shut down gracefully.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        let state = self.state;
        let max = state.config.max_connections.max(1);
        let slots = Arc::new(Semaphore::new(max));
        let admin_max = state.config.admin_connections;
        let admin_slots = Arc::new(Semaphore::new(admin_max));
        let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
        let (stop_tx, stop_rx) = watch::channel(false);
        let reaper = tokio::spawn(reap(state.clone(), stop_rx.clone()));
        let mut next_id: u64 = 1;
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                _ = &mut shutdown => break,
                _ = state.shutdown_requested.notified() => {
                    tracing::info!("shutdown requested by the shutdown command");
                    break;
                }
                r = self.listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // E.g. out of file descriptors: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let permit = match slots.clone().try_acquire_owned() {
                Ok(p) => p,
                // Every ordinary slot is taken: a loopback peer may use the
                // administrator's reserve.
                Err(_) if peer.ip().is_loopback() => {
                    match admin_slots.clone().try_acquire_owned() {
                        Ok(p) => {
                            tracing::info!(peer = %peer, "connection accepted on a reserved administrator slot");
                            p
                        }
                        Err(_) => {
                            refuse_over_limit(&state, &refusals, stream, peer, max);
                            continue;
                        }
                    }
                }
                Err(_) => {
                    refuse_over_limit(&state, &refusals, stream, peer, max);
                    continue;
                }
            };
            let local = stream
                .local_addr()
                .ok()
                .or(*state.local_addr.lock())
                .unwrap_or(peer);
            let _ = stream.set_nodelay(true);
            let conn = ConnInfo::new(next_id, peer, local);
            next_id += 1;
            state.connections_total.fetch_add(1, Ordering::Relaxed);
            state.connections_current.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(conn = conn.id, peer = %peer, "connection accepted");
            let st = state.clone();
            let mut rx = stop_rx.clone();
            tokio::spawn(async move {
                // The handshake runs here, not in the accept loop: a slow
                // client holds its own slot for at most the handshake
                // timeout, and shutdown does not wait for it.
                let tls = st.config.tls.as_deref();
                let timeout = st.config.tls_handshake_timeout;
                let stream = tokio::select! {
                    s = tls::accept_logged(stream, tls, timeout, peer) => s,
                    _ = rx.changed() => None,
                };
                if let Some(stream) = stream {
                    crate::connection::serve(st.clone(), stream, conn, rx).await;
                }
                st.connections_current.fetch_sub(1, Ordering::Relaxed);
                drop(permit);
            });
        }
        tracing::info!("shutting down: no new connections; cancelling commands in flight");
        drop(self.listener);
        let _ = stop_tx.send(true);
        // Reads in flight stop at their next page; writes already submitted
        // to the writer still commit.
        let cancelled = state.operations.kill_all(duetdb::CancelReason::Shutdown);
        if cancelled > 0 {
            tracing::info!(
                cancelled,
                "cancelled commands in flight (InterruptedAtShutdown)"
            );
        }
        let all = u32::try_from(max).unwrap_or(u32::MAX);
        let all_admin = u32::try_from(admin_max).unwrap_or(u32::MAX);
        let drained = async {
            let a = slots.acquire_many(all).await;
            let b = admin_slots.acquire_many(all_admin).await;
            (a, b)
        };
        match tokio::time::timeout(state.config.shutdown_grace, drained).await {
            Ok(_) => tracing::info!("all connections closed"),
            Err(_) => tracing::warn!(
                grace = ?state.config.shutdown_grace,
                "some connections did not finish in time; exiting anyway"
            ),
        }
        reaper.abort();
        Ok(())
    }
}

/// Count and log a refused connection, and answer it if few refusals are in flight.
fn refuse_over_limit(
    state: &Arc<ServerState>,
    refusals: &Arc<Semaphore>,
    stream: TcpStream,
    peer: SocketAddr,
    max: usize,
) {
    state.connections_refused.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(peer = %peer, limit = max, "connection refused: too many open connections");
    if let Ok(p) = refusals.clone().try_acquire_owned() {
        let st = state.clone();
        tokio::spawn(async move {
            let tls = st.config.tls.as_deref();
            let timeout = st.config.tls_handshake_timeout;
            if let Some(stream) = tls::accept_logged(stream, tls, timeout, peer).await {
                refuse(&st, stream, max).await;
            }
            drop(p);
        });
    }
}

/// Answer the first message of a connection over the limit with an error, then close.
async fn refuse(state: &ServerState, mut stream: Stream, limit: usize) {
    let msg =
        format!("connection refused: the server already serves its limit of {limit} connections");
    let reply = CommandError::new(20, "IllegalOperation", msg).to_reply();
    let mut body = Vec::new();
    if reply.to_writer(&mut body).is_err() {
        return;
    }
    let quick = wire::Timeouts {
        idle: Duration::from_secs(2),
        message: Duration::from_secs(2),
    };
    if let Ok(Ok(frame)) = tokio::time::timeout(
        Duration::from_secs(2),
        wire::read_frame(&mut stream, quick, &state.incomplete),
    )
    .await
    {
        let (op, payload) = match frame.header.op_code {
            wire::OP_QUERY => (
                wire::OP_REPLY,
                opquery::encode_reply(opquery::REPLY_QUERY_FAILURE, &body),
            ),
            _ => (wire::OP_MSG, opmsg::encode_reply(&body)),
        };
        let bytes = wire::frame_reply(1, frame.header.request_id, op, &payload);
        let _ = stream.write_all(&bytes).await;
        let _ = stream.flush().await;
    }
    let _ = stream.shutdown().await;
}

/// Close idle cursors, abort transactions past their lifetime and forget
/// idle sessions, a few times per shortest timeout. The work runs on a
/// blocking thread: aborting a transaction frees its write buffer.
async fn reap(state: Arc<ServerState>, mut stop: watch::Receiver<bool>) {
    let shortest = state
        .config
        .cursor_idle_timeout
        .min(state.config.transaction_lifetime)
        .min(state.config.session_idle_timeout);
    let period = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.changed() => return,
        }
        let st = state.clone();
        let work = tokio::task::spawn_blocking(move || {
            let reaped = (
                st.cursors.reap_idle(),
                st.sessions.reap(std::time::Instant::now()),
            );
            crate::memory::release_if_asked();
            reaped
        });
        let Ok((cursors, (txns, sessions))) = work.await else {
            tracing::error!("reaper panicked (a bug); reaping continues");
            continue;
        };
        if cursors > 0 {
            tracing::info!(closed = cursors, "closed idle cursors");
        }
        if txns > 0 {
            tracing::info!(
                aborted = txns,
                "aborted transactions past their lifetime limit"
            );
        }
        if sessions > 0 {
            tracing::info!(ended = sessions, "forgot idle sessions");
        }
    }
}
