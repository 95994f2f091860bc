//! Raft RPCs between members: a TCP port of their own (the member's wire
//! port + [`RAFT_PORT_OFFSET`]), one request and one reply at a time per
//! connection, each a frame `len u32 LE | bincode(message)`.
//!
//! A separate port rather than commands on the MongoDB port: the Raft
//! traffic then needs no wire-protocol framing, authentication or
//! connection slots, and a client can never send it. It is loopback or a
//! private network's business; it carries no authentication of its own
//! (docs/design.md "Replication": bind members to addresses only members
//! reach).
//!
//! Every request carries the sender's set name and set id
//! (`log_store::Identity`); a member refuses requests of another set — of
//! another name, or of the same name and another id (two sets started with
//! the same name and addresses, or a data directory of an old set reused)
//! — with [`RpcReply::Refused`], logged on both sides. A member that does
//! not know the set id yet, or whose Raft log is empty (new, or wiped:
//! nothing of its own to protect), adopts the id of the leader's appends
//! and snapshots.
//!
//! Besides Raft's own RPCs the port carries the member-to-member requests
//! of the set: leadership transfer ([`RpcRequest::StepUp`]), removal
//! notices ([`RpcRequest::Removed`]) and named-snapshot digests
//! ([`RpcRequest::Digest`], `digest.rs`).
//!
//! The transport is TCP in production; a test can route the same
//! requests through an in-memory simulated network instead
//! ([`Transport::Sim`], `sim.rs`): the same envelopes, bytes and handler
//! ([`Handler`]), only the carrier differs.
//!
//! Limits: a frame above [`MAX_FRAME`] is refused (the connection is
//! closed), so a peer cannot make a member allocate without bound.
//!
//! A member with an empty Raft log (a new member, or one that lost its
//! disk) grants no vote to a candidate whose log holds entries: having lost
//! its log and its vote, it could otherwise help elect a candidate that
//! lacks entries committed while it held them (Raft's safety assumes stable
//! storage). Once it has received entries or a snapshot it votes normally;
//! a set forming (every log empty but the initial membership) still
//! elects. Nor does a member vote for a candidate that is not a voter of
//! the configuration it knows: a member removed from the set never hears
//! of its removal from the log (the leader stops replicating to it at
//! once) and keeps campaigning until told ([`RpcRequest::Removed`]) — by
//! the primary when it removes it, or, if it was down then, by the first
//! member that refuses it a vote while knowing a configuration without it.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::log_store::Identity;
use crate::state_machine::Shared;
use crate::types::{NodeId, Raft, TypeConfig};

/// A member's Raft port is its MongoDB wire port plus this.
pub const RAFT_PORT_OFFSET: u16 = 1000;
/// Largest RPC frame accepted (a batch of log entries; openraft sends at
/// most `max_payload_entries` entries per append).
pub const MAX_FRAME: usize = 512 << 20;

#[derive(Serialize, Deserialize)]
enum RpcRequest {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// Raft's TimeoutNow (leadership transfer, Ongaro's thesis §3.10): the
    /// stepping-down primary asks its most caught-up follower to stand for
    /// election now instead of after its election timeout plus the leader
    /// lease (7.5-10 s here).
    StepUp,
    /// The primary removed this member from the set; the configuration
    /// version that did (`member::mark_removed`).
    Removed(u64),
    /// The digest of collection `coll` of named snapshot `name` of `db`
    /// (`digest.rs`), once this member has applied the log up to `applied`
    /// (the asking member's applied index), waiting at most `wait_ms`.
    Digest {
        db: String,
        name: String,
        coll: String,
        applied: u64,
        wait_ms: u64,
    },
    /// Whether this member has applied the log up to `index`, waiting at
    /// most `wait_ms` for it (a `w: N` write concern counts members that
    /// applied the write, as MongoDB's).
    Applied {
        index: u64,
        wait_ms: u64,
    },
}

/// What goes on the wire: the request and who sends it.
#[derive(Serialize)]
struct EnvelopeOut<'a> {
    set: &'a str,
    set_id: Option<[u8; 12]>,
    /// The sender's wire address.
    from: &'a str,
    req: &'a RpcRequest,
}

#[derive(Deserialize)]
struct EnvelopeIn {
    set: String,
    set_id: Option<[u8; 12]>,
    from: String,
    req: RpcRequest,
}

#[derive(Serialize, Deserialize)]
enum RpcReply {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    /// Whether the member started an election.
    StepUp(bool),
    Removed,
    /// The request came from another replica set (why).
    Refused(String),
    /// A snapshot digest, or why there is none (code, message).
    Digest(Result<crate::digest::Digest, (i32, String)>),
    /// Whether the member applied the log up to the index asked.
    Applied(bool),
}

/// The Raft address (`host:port`) of the member whose wire address is `wire`.
pub fn raft_address(wire: &str) -> Result<String, String> {
    let (host, port) = wire
        .rsplit_once(':')
        .ok_or_else(|| format!("member address '{wire}' is not host:port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("member address '{wire}' has no valid port"))?;
    let raft = port.checked_add(RAFT_PORT_OFFSET).ok_or_else(|| {
        format!(
            "member address '{wire}': its Raft port ({port} + {RAFT_PORT_OFFSET}) is above 65535"
        )
    })?;
    Ok(format!("{host}:{raft}"))
}

async fn write_frame(s: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    s.write_all(&(bytes.len() as u32).to_le_bytes()).await?;
    s.write_all(bytes).await?;
    s.flush().await
}

async fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "Raft frame of {len} bytes is above the limit of {MAX_FRAME}"
        )));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).await?;
    Ok(buf)
}

/// How Raft RPCs travel between members.
#[derive(Clone, Default)]
pub enum Transport {
    /// TCP to each member's Raft port (production).
    #[default]
    Tcp,
    /// An in-memory simulated network (deterministic simulation tests).
    Sim(Arc<crate::sim::SimNet>),
}

/// Makes one [`Peer`] per target member.
pub struct Network {
    pub identity: Arc<Identity>,
    pub transport: Transport,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer::new(&self.identity, &self.transport, target, &node.addr)
    }
}

/// How a [`Peer`] reaches its member.
enum Link {
    /// The connection (reconnected after any failure).
    Tcp {
        addr: Result<String, String>,
        conn: Option<TcpStream>,
    },
    /// The member's wire address on the simulated network.
    Sim {
        net: Arc<crate::sim::SimNet>,
        to: String,
    },
}

/// The link to one member.
pub struct Peer {
    target: NodeId,
    link: Link,
    identity: Arc<Identity>,
    /// Whether a refusal by this member was logged (once per peer).
    refusal_logged: bool,
}

type RpcErr<E = RaftError<NodeId>> = RPCError<NodeId, BasicNode, E>;

impl Peer {
    fn new(identity: &Arc<Identity>, transport: &Transport, target: NodeId, wire: &str) -> Peer {
        let link = match transport {
            Transport::Tcp => Link::Tcp {
                addr: raft_address(wire),
                conn: None,
            },
            Transport::Sim(net) => Link::Sim {
                net: net.clone(),
                to: wire.to_string(),
            },
        };
        Peer {
            target,
            link,
            identity: identity.clone(),
            refusal_logged: false,
        }
    }

    /// One request and its reply. The connection is taken out of `self`
    /// for the exchange and put back only after the whole reply was read:
    /// openraft drops this future when its own deadline passes (one
    /// heartbeat interval for an append), and a connection left with a
    /// reply still in flight would hand that stale reply to the next
    /// request — a reply to another range of entries (seen as openraft's
    /// "prev_log_id=None never conflict" panic under load).
    async fn call(&mut self, req: &RpcRequest, ttl: Duration) -> std::io::Result<RpcReply> {
        let envelope = EnvelopeOut {
            set: &self.identity.set,
            set_id: self.identity.set_id(),
            from: &self.identity.address,
            req,
        };
        let bytes = bincode::serialize(&envelope).map_err(std::io::Error::other)?;
        let (addr, taken) = match &mut self.link {
            Link::Tcp { addr, conn } => (addr.clone(), conn.take()),
            Link::Sim { net, to } => {
                let net = net.clone();
                let to = to.clone();
                let reply = net.call(&self.identity.address, &to, bytes, ttl).await?;
                return self.decode(&reply).map_err(|(e, _)| e);
            }
        };
        let exchange = async move {
            let mut s = match taken {
                Some(s) => s,
                None => {
                    let addr = addr.map_err(std::io::Error::other)?;
                    let s = TcpStream::connect(addr).await?;
                    s.set_nodelay(true)?;
                    s
                }
            };
            write_frame(&mut s, &bytes).await?;
            let reply = read_frame(&mut s).await?;
            Ok::<_, std::io::Error>((s, reply))
        };
        let (s, reply) = match tokio::time::timeout(ttl, exchange).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "Raft RPC timed out",
                ));
            }
        };
        let decoded = self.decode(&reply);
        // An undecodable reply leaves the stream's framing in doubt.
        if !matches!(decoded, Err((_, true))) {
            if let Link::Tcp { conn, .. } = &mut self.link {
                *conn = Some(s);
            }
        }
        decoded.map_err(|(e, _)| e)
    }

    /// A reply's bytes decoded; an error says whether the bytes were
    /// undecodable.
    fn decode(&mut self, reply: &[u8]) -> Result<RpcReply, (std::io::Error, bool)> {
        match bincode::deserialize(reply) {
            Ok(RpcReply::Refused(why)) => {
                if !self.refusal_logged {
                    self.refusal_logged = true;
                    tracing::error!(member = self.target, "{why}");
                }
                Err((std::io::Error::other(why), false))
            }
            Ok(r) => Ok(r),
            Err(e) => Err((std::io::Error::other(e), true)),
        }
    }

    fn unreachable<E: std::error::Error>(e: std::io::Error) -> RpcErr<E> {
        RPCError::Unreachable(Unreachable::new(&e))
    }

    fn unexpected<E: std::error::Error>() -> RpcErr<E> {
        RPCError::Network(NetworkError::new(&std::io::Error::other(
            "a Raft reply of the wrong kind",
        )))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        match self.call(&RpcRequest::Append(rpc), option.hard_ttl()).await {
            Ok(RpcReply::Append(Ok(r))) => Ok(r),
            Ok(RpcReply::Append(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(Self::unexpected()),
            Err(e) => Err(Self::unreachable(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<RaftError<NodeId, InstallSnapshotError>>>
    {
        match self
            .call(&RpcRequest::Snapshot(rpc), option.hard_ttl())
            .await
        {
            Ok(RpcReply::Snapshot(Ok(r))) => Ok(r),
            Ok(RpcReply::Snapshot(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(Self::unexpected()),
            Err(e) => Err(Self::unreachable(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        match self.call(&RpcRequest::Vote(rpc), option.hard_ttl()).await {
            Ok(RpcReply::Vote(Ok(r))) => Ok(r),
            Ok(RpcReply::Vote(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(Self::unexpected()),
            Err(e) => Err(Self::unreachable(e)),
        }
    }
}

/// Ask the member whose wire address is `addr` to stand for election now
/// (see [`RpcRequest::StepUp`]); whether it did.
pub async fn ask_to_step_up(identity: &Arc<Identity>, transport: &Transport, addr: &str) -> bool {
    let mut peer = Peer::new(identity, transport, 0, addr);
    matches!(
        peer.call(&RpcRequest::StepUp, Duration::from_secs(2)).await,
        Ok(RpcReply::StepUp(true))
    )
}

/// Tell the member whose wire address is `addr` that configuration
/// `version` removed it from the set; whether it heard.
pub async fn tell_removed(
    identity: &Arc<Identity>,
    transport: &Transport,
    addr: &str,
    version: u64,
) -> bool {
    let mut peer = Peer::new(identity, transport, 0, addr);
    matches!(
        peer.call(&RpcRequest::Removed(version), Duration::from_secs(2))
            .await,
        Ok(RpcReply::Removed)
    )
}

/// Ask the member whose wire address is `addr` for its digest of collection
/// `coll` of named snapshot `name` of `db` (see [`RpcRequest::Digest`]);
/// `Err` when it cannot be reached or answers with an error.
pub async fn ask_digest(
    identity: &Arc<Identity>,
    transport: &Transport,
    addr: &str,
    req: (&str, &str, &str),
    applied: u64,
    wait: Duration,
) -> Result<crate::digest::Digest, String> {
    let (db, name, coll) = req;
    let mut peer = Peer::new(identity, transport, 0, addr);
    let rpc = RpcRequest::Digest {
        db: db.to_string(),
        name: name.to_string(),
        coll: coll.to_string(),
        applied,
        wait_ms: wait.as_millis().min(u128::from(u64::MAX)) as u64,
    };
    // The member's own wait, then the digest's scan and the round trip.
    match peer.call(&rpc, wait + Duration::from_secs(5)).await {
        Ok(RpcReply::Digest(Ok(d))) => Ok(d),
        Ok(RpcReply::Digest(Err((code, msg)))) => Err(format!("error {code}: {msg}")),
        Ok(RpcReply::Refused(why)) => Err(why),
        Ok(_) => Err("an unexpected reply".into()),
        Err(e) => Err(format!("unreachable: {e}")),
    }
}

/// Whether the member whose wire address is `addr` has applied the log up
/// to `index`, waiting at most `wait` for it (see [`RpcRequest::Applied`]);
/// `false` when it cannot be reached or has not.
pub async fn ask_applied(
    identity: &Arc<Identity>,
    transport: &Transport,
    addr: &str,
    index: u64,
    wait: Duration,
) -> bool {
    let mut peer = Peer::new(identity, transport, 0, addr);
    let rpc = RpcRequest::Applied {
        index,
        wait_ms: wait.as_millis().min(u128::from(u64::MAX)) as u64,
    };
    matches!(
        peer.call(&rpc, wait + Duration::from_secs(5)).await,
        Ok(RpcReply::Applied(true))
    )
}

/// Wait until this member has applied the log up to `index`, at most
/// `wait_ms`; whether it has.
pub(crate) async fn applied_here(shared: &Arc<Shared>, index: u64, wait_ms: u64) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    loop {
        if shared
            .applied_index
            .load(std::sync::atomic::Ordering::Acquire)
            >= index
        {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// This member's answer to [`RpcRequest::Digest`].
async fn digest_here(
    shared: &Arc<Shared>,
    db: String,
    name: String,
    coll: String,
    applied: u64,
    wait_ms: u64,
) -> Result<crate::digest::Digest, (i32, String)> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    while shared
        .applied_index
        .load(std::sync::atomic::Ordering::Acquire)
        < applied
    {
        if tokio::time::Instant::now() >= deadline {
            return Err((
                50,
                format!("this member has not applied the log up to index {applied} yet"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let engine = shared
        .engine
        .upgrade()
        .ok_or_else(|| (91, "the server is shutting down".to_string()))?;
    tokio::task::spawn_blocking(move || crate::digest::of_named(&engine, &db, &name, &coll))
        .await
        .map_err(|e| (1, e.to_string()))?
}

/// Whether `candidate` may get this member's vote: a voter of the
/// configuration it knows (any, while it knows none: a set forming).
fn may_vote_for(raft: &Raft, candidate: Option<NodeId>) -> bool {
    let rx = raft.metrics();
    let m = rx.borrow();
    let mut voters = m.membership_config.voter_ids().peekable();
    voters.peek().is_none() || candidate.is_some_and(|c| voters.any(|v| v == c))
}

/// The version of this member's configuration when `candidate` is not in
/// it at all (it was removed: tell it so). A candidate added by a later
/// configuration than this member knows is told too, harmlessly: its own
/// configuration, newer and listing it, cancels that at once
/// (`member::watch_readmission`).
fn removed_version(raft: &Raft, candidate: Option<NodeId>) -> Option<u64> {
    let rx = raft.metrics();
    let m = rx.borrow();
    let mc = &m.membership_config;
    let known = mc.nodes().next().is_some();
    let listed = candidate.is_some_and(|c| mc.nodes().any(|(n, _)| *n == c));
    (known && !listed).then(|| mc.log_id().map_or(0, |l| l.index + 1))
}

/// Whether a request from set `set` / `set_id` may be served here; adopts
/// the leader's set id when this member has none or nothing of its own
/// (see the module documentation).
fn same_set(raft: &Raft, me: &Identity, env: &EnvelopeIn) -> Result<(), String> {
    if env.set != me.set {
        return Err(format!(
            "refused a Raft request from a member of replica set '{}': this member belongs to \
             replica set '{}'",
            env.set, me.set
        ));
    }
    let from_leader = matches!(env.req, RpcRequest::Append(_) | RpcRequest::Snapshot(_));
    match (me.set_id(), env.set_id) {
        (Some(mine), Some(theirs)) if mine != theirs => {
            if from_leader && amnesiac(raft) {
                return adopt(me, theirs);
            }
            Err(format!(
                "refused a Raft request from another replica set named '{}' (set id {}; this \
                 member's data belongs to set id {}): a data directory of another set was \
                 reused, or two sets share a name and addresses; start this member with an \
                 empty data directory to join the other set",
                me.set,
                crate::log_store::hex(&theirs),
                crate::log_store::hex(&mine)
            ))
        }
        (None, Some(theirs)) if from_leader => adopt(me, theirs),
        _ => Ok(()),
    }
}

fn adopt(me: &Identity, id: [u8; 12]) -> Result<(), String> {
    tracing::info!(set_id = %crate::log_store::hex(&id), "replica set id learned from the primary");
    me.adopt(id)
        .map_err(|e| format!("cannot record the replica set's id: {e}"))
}

/// Whether this member's log holds nothing but (at most) the initial
/// membership, and no snapshot (see the module documentation).
fn amnesiac(raft: &Raft) -> bool {
    let rx = raft.metrics();
    let m = rx.borrow();
    m.last_log_index.unwrap_or(0) == 0 && m.snapshot.is_none()
}

/// Answers the requests of one connection (one simulated message on the
/// simulated network): what a member does with a request's bytes.
pub(crate) struct Handler {
    raft: Raft,
    shared: Arc<Shared>,
    /// Who sends (for the log).
    peer: String,
    refusal_logged: bool,
    told_removed: bool,
}

impl Handler {
    pub(crate) fn new(raft: Raft, shared: Arc<Shared>, peer: String) -> Handler {
        Handler {
            raft,
            shared,
            peer,
            refusal_logged: false,
            told_removed: false,
        }
    }

    /// [`Handler::handle`] as a boxed future (what the simulated network
    /// spawns: a concrete type breaks the cycle handle → tell_removed →
    /// call → spawn(handle) that the compiler cannot prove `Send` through).
    pub(crate) fn handle_owned(
        mut self,
        bytes: Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Vec<u8>>> + Send>> {
        Box::pin(async move { self.handle(&bytes).await })
    }

    /// The reply's bytes to request `bytes`; `None`: the request is
    /// undecodable (or the reply unencodable) and the connection is closed.
    pub(crate) async fn handle(&mut self, bytes: &[u8]) -> Option<Vec<u8>> {
        let (raft, shared, peer) = (&self.raft, &self.shared, &self.peer);
        let env: EnvelopeIn = match bincode::deserialize(bytes) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "undecodable Raft request; closing");
                return None;
            }
        };
        let checked = same_set(raft, &shared.identity, &env);
        let reply = match env.req {
            _ if checked.is_err() => {
                let why = checked.err().unwrap_or_default();
                if !self.refusal_logged {
                    self.refusal_logged = true;
                    tracing::error!(%peer, "{why}");
                }
                RpcReply::Refused(why)
            }
            RpcRequest::Append(r) => RpcReply::Append(raft.append_entries(r).await),
            RpcRequest::Vote(r) if amnesiac(raft) && r.last_log_id.is_some_and(|l| l.index > 0) => {
                tracing::info!(%peer, "no vote: this member's Raft log is empty");
                RpcReply::Vote(Ok(VoteResponse {
                    vote: r.vote,
                    vote_granted: false,
                    last_log_id: None,
                }))
            }
            RpcRequest::Vote(r) if !may_vote_for(raft, r.vote.leader_id().voted_for()) => {
                tracing::info!(%peer, "no vote: the candidate is not a voting member");
                let candidate = r.vote.leader_id().voted_for();
                if let Some(version) = removed_version(raft, candidate) {
                    if !self.told_removed && !env.from.is_empty() {
                        self.told_removed = true;
                        let (identity, to) = (shared.identity.clone(), env.from.clone());
                        let transport = shared.transport.clone();
                        tokio::spawn(async move {
                            tell_removed(&identity, &transport, &to, version).await;
                        });
                    }
                }
                RpcReply::Vote(Ok(VoteResponse {
                    vote: r.vote,
                    vote_granted: false,
                    last_log_id: None,
                }))
            }
            RpcRequest::Vote(r) => RpcReply::Vote(raft.vote(r).await),
            RpcRequest::Snapshot(r) => RpcReply::Snapshot(raft.install_snapshot(r).await),
            RpcRequest::StepUp => {
                tracing::info!(%peer, "asked to stand for election (primary stepping down)");
                RpcReply::StepUp(raft.trigger().elect().await.is_ok())
            }
            RpcRequest::Removed(version) => {
                crate::member::mark_removed(raft, shared, version);
                RpcReply::Removed
            }
            RpcRequest::Digest {
                db,
                name,
                coll,
                applied,
                wait_ms,
            } => RpcReply::Digest(digest_here(shared, db, name, coll, applied, wait_ms).await),
            RpcRequest::Applied { index, wait_ms } => {
                RpcReply::Applied(applied_here(shared, index, wait_ms).await)
            }
        };
        bincode::serialize(&reply).ok()
    }
}

/// Answer Raft RPCs arriving on `listener` until the task is dropped
/// (which also ends every connection it serves).
pub async fn serve(listener: TcpListener, raft: Raft, shared: Arc<Shared>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let (mut s, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "Raft listener accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = s.set_nodelay(true);
        let mut handler = Handler::new(raft.clone(), shared.clone(), peer.to_string());
        conns.spawn(async move {
            loop {
                let bytes = match read_frame(&mut s).await {
                    Ok(b) => b,
                    Err(e) => {
                        if e.kind() != std::io::ErrorKind::UnexpectedEof {
                            tracing::debug!(%peer, error = %e, "Raft connection closed");
                        }
                        return;
                    }
                };
                let Some(out) = handler.handle(&bytes).await else {
                    return;
                };
                if write_frame(&mut s, &out).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::Vote;

    fn vote(term: u64) -> RpcRequest {
        RpcRequest::Vote(VoteRequest {
            vote: Vote::new(term, 0),
            last_log_id: None,
        })
    }

    /// A caller that gives up on a request (openraft's deadline drops the
    /// call) must not get that request's late reply for its next one.
    #[tokio::test]
    async fn an_abandoned_call_leaves_no_reply_for_the_next() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    while let Ok(b) = read_frame(&mut s).await {
                        let Ok(EnvelopeIn {
                            req: RpcRequest::Vote(r),
                            ..
                        }) = bincode::deserialize(&b)
                        else {
                            return;
                        };
                        if r.vote.leader_id().term == 1 {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        let reply = RpcReply::Vote(Ok(VoteResponse {
                            vote: r.vote,
                            vote_granted: true,
                            last_log_id: None,
                        }));
                        let out = bincode::serialize(&reply).expect("encode");
                        if write_frame(&mut s, &out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let dir = tempfile::tempdir().expect("tmp");
        let identity =
            Arc::new(crate::log_store::claim_identity(dir.path(), "rs0", 0).expect("id"));
        let mut peer = Peer::new(&identity, &Transport::Tcp, 1, "127.0.0.1:1");
        peer.link = Link::Tcp {
            addr: Ok(addr),
            conn: None,
        };
        let first = tokio::time::timeout(
            Duration::from_millis(50),
            peer.call(&vote(1), Duration::from_secs(5)),
        )
        .await;
        assert!(first.is_err(), "the first call is abandoned");
        tokio::time::sleep(Duration::from_millis(300)).await;
        match peer.call(&vote(2), Duration::from_secs(5)).await {
            Ok(RpcReply::Vote(Ok(r))) => assert_eq!(r.vote.leader_id().term, 2),
            _ => panic!("no reply to the second call"),
        }
    }
}
