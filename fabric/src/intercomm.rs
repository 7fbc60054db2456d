//! Intercommunicators: two groups of processes of different jobs, connected (a parent
//! communicator and the job it spawned: [`Communicator::spawn`], [`Fabric::parent`]).
//!
//! A connect gives the processes of both groups a context id (a PGCID no other group or
//! connect of the runtime has) and the list of processes connected; each process then
//! builds a second engine over that list (its own inbox, TCP and verbs endpoints, cards
//! published under keys of that PGCID), so that the job's own engine, its ranks and its
//! 8-byte path are untouched. An [`InterComm`] addresses the remote group by rank, as
//! MPI's intercommunicators do. See `docs/design/native-connect.md`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weft_wireup::{
    Client, Connection, LookupOptions, NameRange, NameValue, NsId, Persistence, ProcId, ProcSel,
    SpawnApp,
};

use crate::sched::COLL_PLANE;
use crate::setup::{build_engine, Spec};
use crate::{
    Backoff, CommShared, Communicator, Fabric, InitError, Inner, P2pError, Pod, RankMap, Source,
    Status, Tag,
};

/// How long the processes of a spawn or a connect wait for each other (the other
/// group's processes start, or the root's spawn completes).
const CONNECT_WAIT: Duration = Duration::from_secs(120);

/// Why an intercommunicator could not be made or ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InterCommError {
    /// The fabric does not run under Weft's own servers (a PMIx host such as `mpirun`, or
    /// a fabric of explicit pieces), or the communicator is not one of the job's own (a
    /// merged one): the reason says which.
    #[error("{0}")]
    NoWireup(String),
    /// The root's spawn failed (the reason is the runtime's).
    #[error("spawn at root {root}: {reason}")]
    Spawn {
        /// The root's rank.
        root: u32,
        /// Why.
        reason: String,
    },
    /// The processes could not connect (one ended, the wait ran out).
    #[error(transparent)]
    Connect(#[from] weft_wireup::ConnectError),
    /// The processes could not learn each other's groups through the name service.
    #[error(transparent)]
    Names(#[from] weft_wireup::NameError),
    /// A message of the exchange failed (a process of the other group ended).
    #[error(transparent)]
    P2p(#[from] P2pError),
    /// The transports of the connected processes could not open.
    #[error(transparent)]
    Init(#[from] InitError),
    /// A root outside the communicator, or data of the name service that is not a
    /// group.
    #[error("{0}")]
    Invalid(String),
}

/// An intercommunicator: this process's group (local) and another (remote), of
/// different jobs. Sends and receives address the remote group's ranks; the status of a
/// receive names the sender's remote rank.
pub struct InterComm {
    p2p: Communicator,
    local: Arc<[ProcId]>,
    remote: Arc<[ProcId]>,
    /// The connect's processes as named to the wire-up service (for the disconnect).
    named: Vec<ProcSel>,
    /// Every process connected, sorted: the union engine's ranks.
    union_procs: Vec<ProcId>,
    /// The connects of these processes this intercommunicator made (one, and one per
    /// merge): a disconnect undoes each.
    connects: std::sync::atomic::AtomicU32,
    wire: Arc<Client>,
    /// Set by [`InterComm::disconnect`]: a drop without it is logged.
    disconnected: bool,
}

impl std::fmt::Debug for InterComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterComm")
            .field("ctx", &self.p2p.ctx)
            .field("rank", &self.p2p.rank)
            .field("size", &self.local.len())
            .field("remote_size", &self.remote.len())
            .finish()
    }
}

impl InterComm {
    /// This process's rank in the local group.
    pub fn rank(&self) -> u32 {
        self.p2p.rank
    }
    /// The size of the local group.
    pub fn size(&self) -> u32 {
        self.local.len() as u32
    }
    /// The size of the remote group.
    pub fn remote_size(&self) -> u32 {
        self.remote.len() as u32
    }
    /// The local group's processes, in rank order.
    pub fn local_procs(&self) -> &[ProcId] {
        &self.local
    }
    /// The remote group's processes, in rank order.
    pub fn remote_procs(&self) -> &[ProcId] {
        &self.remote
    }
    /// The context id of the connect (a PGCID unique in the runtime).
    pub fn context_id(&self) -> u64 {
        self.p2p.ctx
    }

    /// Sends `buf` to rank `dest` of the remote group.
    pub fn send<T: Pod>(&self, buf: &[T], dest: u32, tag: Tag) -> Result<(), P2pError> {
        self.p2p.send(buf, dest, tag)
    }

    /// Receives into `buf` a message from rank `src` of the remote group (or any).
    pub fn recv<T: Pod>(&self, buf: &mut [T], src: Source, tag: Tag) -> Result<Status, P2pError> {
        self.p2p.recv(buf, src, tag)
    }

    /// Waits for a message from the remote group matching `src` and `tag`, without
    /// receiving it.
    pub fn probe(&self, src: Source, tag: Tag) -> Result<Status, P2pError> {
        self.p2p.probe(src, tag)
    }

    /// The intracommunicator of both groups (MPI's `MPI_Intercomm_merge`), a collective
    /// of both: the group that passes `high = false` comes first (both the same: the group
    /// whose first process has the lower namespace id and rank). It has a context id of its
    /// own; it runs point-to-point and `weft-collectives`' operations like any
    /// communicator, over this intercommunicator's connections: use it before
    /// [`disconnect`](Self::disconnect), which closes them.
    pub fn merge(&self, high: bool) -> Result<Communicator, InterCommError> {
        // Every process tells every remote one its flag (they must agree within a group),
        // on the connect's collective plane: no receive of the application's matches them.
        let flags = Communicator {
            ctx: self.p2p.ctx | COLL_PLANE,
            ..self.p2p.clone()
        };
        for r in 0..self.remote_size() {
            flags.send(&[u8::from(high)], r, Tag(0))?;
        }
        let mut remote_high = None;
        for r in 0..self.remote_size() {
            let mut f = [0u8];
            flags.recv(&mut f, Source::Rank(r), Tag(0))?;
            match remote_high {
                None => remote_high = Some(f[0] == 1),
                Some(h) if h != (f[0] == 1) => {
                    return Err(InterCommError::Invalid(
                        "merge: the remote group's processes passed different `high`".into(),
                    ))
                }
                Some(_) => {}
            }
        }
        let remote_high = remote_high.unwrap_or(!high);
        // A second connect of the same processes: a barrier, and the merged context id.
        let conn = self.wire.connect(&self.named, Some(CONNECT_WAIT))?;
        // SYNC: a count the disconnect reads; merges and the disconnect are collectives of
        // the same processes, in the same order.
        self.connects.fetch_add(1, Ordering::Relaxed);
        let local_first = if high == remote_high {
            self.local.first() < self.remote.first()
        } else {
            !high
        };
        let (a, b) = if local_first {
            (&self.local, &self.remote)
        } else {
            (&self.remote, &self.local)
        };
        let order: Vec<ProcId> = a.iter().chain(b.iter()).copied().collect();
        let to_union: Option<Vec<u32>> = order
            .iter()
            .map(|p| self.union_procs.binary_search(p).ok().map(|i| i as u32))
            .collect();
        let to_union = to_union.ok_or_else(|| {
            InterCommError::Invalid("merge: a process is not among those connected".into())
        })?;
        let me = self.wire.me();
        let rank =
            order.iter().position(|&p| p == me).ok_or_else(|| {
                InterCommError::Invalid(format!("merge: {me} is in neither group"))
            })? as u32;
        Ok(Communicator {
            inner: self.p2p.inner.clone(),
            ctx: conn.pgcid,
            rank,
            size: order.len() as u32,
            map: Some(Arc::new(RankMap::new(&to_union))),
            origin: None,
            shared: Arc::new(CommShared {
                derived: true,
                ..CommShared::default()
            }),
        })
    }

    /// Disconnects, a collective of both groups: pushes out what this process sent,
    /// then waits until every process of both groups disconnected (so nothing sent
    /// before is lost), and closes the connections.
    pub fn disconnect(mut self) -> Result<(), InterCommError> {
        self.disconnected = true;
        let wait = self.p2p.inner.finalize_wait;
        let deadline = Instant::now() + wait;
        let mut backoff = Backoff::default();
        loop {
            let mut e = self.p2p.inner.engine();
            e.progress();
            if e.backlog() == 0 {
                break;
            }
            if Instant::now() > deadline {
                tracing::error!(
                    "intercommunicator disconnect: {} frames could not be delivered within \
                     {wait:?} (WEFT_FINALIZE_TIMEOUT)",
                    e.backlog()
                );
                break;
            }
            drop(e);
            backoff.snooze();
        }
        // SYNC: see `merge`.
        for _ in 0..self.connects.load(Ordering::Relaxed) {
            self.wire.disconnect(&self.named, Some(CONNECT_WAIT))?;
        }
        Ok(())
    }
}

impl Drop for InterComm {
    /// Dropped without [`InterComm::disconnect`]: the connections stay open until
    /// [`Fabric::finalize`] (which still pushes out what was sent), and the runtime keeps the
    /// jobs connected until one of them ends. Logged as a warning: MPI programs must
    /// disconnect too.
    fn drop(&mut self) {
        if !self.disconnected && !std::thread::panicking() {
            tracing::warn!(
                "an intercommunicator (context {}, {} local and {} remote processes) was \
                 dropped without disconnect: its jobs stay connected until one ends",
                self.p2p.ctx,
                self.local.len(),
                self.remote.len()
            );
        }
    }
}

/// The variable that gives the processes of a job spawned by [`Communicator::spawn`]
/// their parent group ([`encode_group`]).
const PARENT_GROUP_VAR: &str = "WEFT_PARENT_GROUP";

/// Refuses `op` outside Weft's own servers (under a PMIx host, MPI's own calls serve it).
fn native(wire: &Client, op: &str) -> Result<(), InterCommError> {
    if wire.is_native() {
        return Ok(());
    }
    Err(InterCommError::NoWireup(format!(
        "{op}: needs Weft's own servers (weft run); under a PMIx host such as mpirun, use \
         its MPI's calls"
    )))
}

/// The name the root of a spawn publishes the children's job under, for the other
/// members of its communicator (`seq`: the communicator's spawns so far).
fn child_key(root: ProcId, ctx: u64, seq: u64) -> String {
    format!("weft.dpm.child.{}.{}.{ctx}.{seq}", root.ns.0, root.rank)
}

/// A group as text (published, or in [`PARENT_GROUP_VAR`]): `W` or `L` (its job's whole
/// namespace, or listed processes), then each process as `ns.rank`, space-separated.
fn encode_group(whole: bool, procs: &[ProcId]) -> String {
    let mut v = String::from(if whole { "W" } else { "L" });
    for p in procs {
        v.push_str(&format!(" {}.{}", p.ns.0, p.rank));
    }
    v
}

fn decode_group(text: &str) -> Option<(bool, Vec<ProcId>)> {
    let mut parts = text.split(' ');
    let whole = match parts.next()? {
        "W" => true,
        "L" => false,
        _ => return None,
    };
    let procs: Option<Vec<ProcId>> = parts
        .map(|p| {
            let (ns, rank) = p.split_once('.')?;
            Some(ProcId::new(NsId(ns.parse().ok()?), rank.parse().ok()?))
        })
        .collect();
    let procs = procs?;
    (!procs.is_empty()).then_some((whole, procs))
}

/// How a group is named to the wire-up service: its whole namespace, or each process.
fn selectors(whole: bool, procs: &[ProcId]) -> Vec<ProcSel> {
    match (whole, procs.first()) {
        (true, Some(p)) => vec![ProcSel::All(p.ns)],
        _ => procs.iter().copied().map(ProcSel::One).collect(),
    }
}

/// The one value of a lookup of `key`.
fn looked_up(wire: &Client, key: &str) -> Result<String, InterCommError> {
    let opts = LookupOptions {
        range: NameRange::Global,
        wait: Some(CONNECT_WAIT),
    };
    let found = wire.lookup(&[key], opts)?;
    match found.into_iter().next().map(|p| p.value) {
        Some(NameValue::Bytes(b)) => {
            String::from_utf8(b).map_err(|e| InterCommError::Invalid(format!("name {key:?}: {e}")))
        }
        other => Err(InterCommError::Invalid(format!(
            "name {key:?} holds {other:?}, not a group"
        ))),
    }
}

impl Communicator {
    /// What a spawn, accept or connect (`op`) of this communicator starts from: the wire-up
    /// client, the members as processes (in rank order), whether they are their job's
    /// whole namespace, and the number of such calls the communicator made before.
    fn dpm_start(
        &self,
        op: &'static str,
        root: u32,
    ) -> Result<(Arc<Client>, Vec<ProcId>, bool, u64), InterCommError> {
        let wire = self.inner.wire.clone().ok_or_else(|| {
            InterCommError::NoWireup(format!(
                "{op}: this communicator is not one of the job's own (a merged one, or a \
                 fabric of explicit pieces): use one made from the job's world"
            ))
        })?;
        native(&wire, op)?;
        if root >= self.size {
            return Err(InterCommError::Invalid(format!(
                "{op}: root {root} is not a rank of the communicator (size {})",
                self.size
            )));
        }
        let ns = wire.ns();
        let members: Vec<ProcId> = (0..self.size)
            .map(|r| ProcId::new(ns, self.job_rank(r)))
            .collect();
        // SYNC: a count of this communicator's spawns, accepts and connects, collectives:
        // every member's calls come in the same order, so the counts agree (no other data
        // hangs on it).
        let seq = self.shared.spawns.fetch_add(1, Ordering::Relaxed);
        Ok((wire, members, self.map.is_none(), seq))
    }
}

impl Communicator {
    /// Starts the processes of `apps` as a new job and connects them with this
    /// communicator's members: a collective of this communicator (`root` spawns; every
    /// member gets the intercommunicator whose remote group is the new job, in rank
    /// order). The new job's processes get theirs from [`Fabric::parent`]. Like MPI's
    /// `MPI_Comm_spawn`; the new job runs where a spawn from `root` runs
    /// ([`Client::spawn`]).
    pub fn spawn(&self, apps: &[SpawnApp], root: u32) -> Result<InterComm, InterCommError> {
        let (wire, members, whole, seq) = self.dpm_start("spawn", root)?;
        let key = child_key(members[root as usize], self.ctx, seq);
        let child = if self.rank == root {
            // The children learn their parents' group from their environment.
            let group = encode_group(whole, &members);
            let apps: Vec<SpawnApp> = apps
                .iter()
                .cloned()
                .map(|mut a| {
                    a.env.push((PARENT_GROUP_VAR.into(), group.clone()));
                    a
                })
                .collect();
            let (outcome, result) = match wire.spawn(&apps) {
                Ok(s) => (format!("ok {}", s.ns.0), Ok(s.ns)),
                Err(e) => {
                    let reason = e.to_string();
                    (
                        format!("err {reason}"),
                        Err(InterCommError::Spawn { root, reason }),
                    )
                }
            };
            if self.size > 1 {
                wire.publish(
                    &[(&key, outcome.as_bytes())],
                    NameRange::Global,
                    Persistence::Job,
                )?;
            }
            result?
        } else {
            let b = looked_up(&wire, &key)?;
            match b.split_once(' ') {
                Some(("ok", ns)) => NsId(
                    ns.parse()
                        .map_err(|_| InterCommError::Invalid(format!("name {key:?}: {b:?}")))?,
                ),
                Some(("err", reason)) => {
                    return Err(InterCommError::Spawn {
                        root,
                        reason: reason.to_owned(),
                    })
                }
                _ => return Err(InterCommError::Invalid(format!("name {key:?}: {b:?}"))),
            }
        };
        let mut named = selectors(whole, &members);
        named.push(ProcSel::All(child));
        let conn = wire.connect(&named, Some(CONNECT_WAIT));
        if self.rank == root && self.size > 1 {
            let _ = wire.unpublish(&[&key], NameRange::Global);
        }
        let conn = conn?;
        let remote = of_ns(&conn, child);
        intercomm(&wire, &conn, members, remote, self.rank, named)
    }
}

/// A port (MPI's `MPI_Open_port`): a name that one communicator accepts on and another,
/// of another job of the runtime, connects to ([`Communicator::accept`],
/// [`Communicator::connect`]). Pass it between jobs as text (a published name, a file).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Port(String);

impl Port {
    /// Reads a port from its text ([`Port::as_str`]); text that is not a port is refused.
    pub fn parse(text: &str) -> Result<Port, InterCommError> {
        if text.starts_with("weft-port:") && text.len() > "weft-port:".len() {
            Ok(Port(text.to_owned()))
        } else {
            Err(InterCommError::Invalid(format!(
                "{text:?} is not a Weft port (weft-port:...)"
            )))
        }
    }
    /// The port's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which end of a port a communicator is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Accept,
    Connect,
}

/// The names of a port's meeting: each accept publishes `{port}:accept` = `{nonce}
/// {group}`; the connector that takes it publishes `{port}:connect:{nonce}` = its group,
/// which the acceptor waits for and then removes its own name (the next accept on the port
/// publishes a new nonce, so no connector meets a finished accept).
fn accept_key(port: &Port) -> String {
    format!("{port}:accept")
}

/// The accepting root's side of the meeting: the connector's group.
fn accept_meet(wire: &Client, port: &Port, group: &str) -> Result<String, InterCommError> {
    let mut r = [0u8; 8];
    rustix::rand::getrandom(&mut r, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| InterCommError::Invalid(format!("accept: getrandom: {e}")))?;
    let nonce = format!("{:016x}", u64::from_le_bytes(r));
    let key = accept_key(port);
    let offer = format!("{nonce} {group}");
    wire.publish(
        &[(&key, offer.as_bytes())],
        NameRange::Global,
        Persistence::Job,
    )?;
    let theirs = looked_up(wire, &format!("{port}:connect:{nonce}"));
    let _ = wire.unpublish(&[&key], NameRange::Global);
    theirs
}

/// The connecting root's side: the acceptor's group, and the name to remove once
/// connected. An accept already taken by another connector (its name not removed yet) is
/// waited out.
fn connect_meet(
    wire: &Client,
    port: &Port,
    group: &str,
) -> Result<(String, String), InterCommError> {
    let deadline = Instant::now() + CONNECT_WAIT;
    loop {
        let offer = looked_up(wire, &accept_key(port))?;
        let (nonce, theirs) = offer
            .split_once(' ')
            .ok_or_else(|| InterCommError::Invalid(format!("port {port}: offer {offer:?}")))?;
        let key = format!("{port}:connect:{nonce}");
        match wire.publish(
            &[(&key, group.as_bytes())],
            NameRange::Global,
            Persistence::Job,
        ) {
            Ok(()) => return Ok((key, theirs.to_owned())),
            Err(weft_wireup::NameError::Refused {
                failure: weft_wireup::NameFailure::Duplicate(_),
                ..
            }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

impl Communicator {
    /// Waits for a communicator of another job to connect to `port`
    /// ([`Communicator::connect`]) and returns the intercommunicator to it: a collective of
    /// this communicator (`port` counts at `root` only, as in MPI; every member waits up
    /// to 120 s). Like MPI's `MPI_Comm_accept`.
    pub fn accept(&self, port: &Port, root: u32) -> Result<InterComm, InterCommError> {
        self.port_end(port, root, End::Accept)
    }

    /// Connects to the communicator accepting on `port` ([`Communicator::accept`]): a
    /// collective of this communicator. Like MPI's `MPI_Comm_connect`.
    pub fn connect(&self, port: &Port, root: u32) -> Result<InterComm, InterCommError> {
        self.port_end(port, root, End::Connect)
    }

    fn port_end(&self, port: &Port, root: u32, end: End) -> Result<InterComm, InterCommError> {
        let op = match end {
            End::Accept => "accept",
            End::Connect => "connect",
        };
        let (wire, members, whole, seq) = self.dpm_start(op, root)?;
        // The port counts at the root only (as in MPI); the root hands the other end's
        // group to the other members under a name of this communicator's.
        let members_key = format!(
            "weft.dpm.{op}.{}.{}.{}.{seq}",
            members[root as usize].ns.0, members[root as usize].rank, self.ctx
        );
        let group = encode_group(whole, &members);
        // The root's name to remove once connected (the connect end's), if any.
        let mut mine = None;
        let b = if self.rank == root {
            let b = match end {
                End::Accept => accept_meet(&wire, port, &group)?,
                End::Connect => {
                    let (key, b) = connect_meet(&wire, port, &group)?;
                    mine = Some(key);
                    b
                }
            };
            if self.size > 1 {
                wire.publish(
                    &[(&members_key, b.as_bytes())],
                    NameRange::Global,
                    Persistence::Job,
                )?;
            }
            b
        } else {
            looked_up(&wire, &members_key)?
        };
        let (their_whole, remote) = decode_group(&b)
            .ok_or_else(|| InterCommError::Invalid(format!("{op}: {b:?} is not a group")))?;
        let mut named = selectors(whole, &members);
        named.extend(selectors(their_whole, &remote));
        let conn = wire.connect(&named, Some(CONNECT_WAIT));
        if self.rank == root {
            if let Some(key) = mine {
                let _ = wire.unpublish(&[&key], NameRange::Global);
            }
            if self.size > 1 {
                let _ = wire.unpublish(&[&members_key], NameRange::Global);
            }
        }
        let conn = conn?;
        let remote = expand(&conn, their_whole, remote);
        intercomm(&wire, &conn, members, remote, self.rank, named)
    }
}

impl Fabric {
    /// A new port for [`Communicator::accept`]: unique in the runtime (it names this
    /// process and a random number). Like MPI's `MPI_Open_port`; nothing needs closing.
    pub fn open_port(&self) -> Result<Port, InterCommError> {
        let wire = self.inner.wire.as_ref().ok_or_else(|| {
            InterCommError::NoWireup("open_port: a fabric of explicit pieces has none".into())
        })?;
        native(wire, "open_port")?;
        let mut r = [0u8; 8];
        rustix::rand::getrandom(&mut r, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| InterCommError::Invalid(format!("open_port: getrandom: {e}")))?;
        Ok(Port(format!(
            "weft-port:{}.{}:{:016x}",
            wire.ns().0,
            wire.rank(),
            u64::from_le_bytes(r)
        )))
    }
}

impl Fabric {
    /// The intercommunicator to the communicator that spawned this job
    /// ([`Communicator::spawn`]); `None` for a job not spawned that way (by `weft run`, or
    /// by `Client::spawn`). A collective of the job's processes (every one of them
    /// connects with the parents); a process makes it once (a second call is an error).
    pub fn parent(&self) -> Result<Option<InterComm>, InterCommError> {
        let Ok(text) = std::env::var(PARENT_GROUP_VAR) else {
            return Ok(None);
        };
        let wire = self.inner.wire.clone().ok_or_else(|| {
            InterCommError::NoWireup("parent: a fabric of explicit pieces has none".into())
        })?;
        native(&wire, "parent")?;
        // SYNC: one caller makes it; the flag orders nothing else.
        if PARENT_TAKEN.swap(true, Ordering::Relaxed) {
            return Err(InterCommError::Invalid(
                "parent: this process made its parent intercommunicator already (keep the \
                 first: a second would connect again, alone)"
                    .into(),
            ));
        }
        let (whole, parents) = decode_group(&text).ok_or_else(|| {
            InterCommError::Invalid(format!("{PARENT_GROUP_VAR}={text:?} is not a group"))
        })?;
        let mut named = selectors(whole, &parents);
        named.push(ProcSel::All(wire.ns()));
        let conn = wire.connect(&named, Some(CONNECT_WAIT))?;
        let local = of_ns(&conn, wire.ns());
        let remote = expand(&conn, whole, parents);
        let rank = wire.rank();
        intercomm(&wire, &conn, local, remote, rank, named).map(Some)
    }
}

/// Whether this process made its parent intercommunicator ([`Fabric::parent`]).
static PARENT_TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The processes of namespace `ns` among those connected, in rank order.
fn of_ns(conn: &Connection, ns: NsId) -> Vec<ProcId> {
    conn.procs.iter().copied().filter(|p| p.ns == ns).collect()
}

/// A group as its processes: a whole namespace's from the connection, else as listed.
fn expand(conn: &Connection, whole: bool, listed: Vec<ProcId>) -> Vec<ProcId> {
    match listed.first() {
        Some(p) if whole => of_ns(conn, p.ns),
        _ => listed,
    }
}

/// The intercommunicator of connection `conn` between `local` (where this process has
/// rank `rank`) and `remote`: an engine over the connection's processes.
fn intercomm(
    wire: &Arc<Client>,
    conn: &Connection,
    local: Vec<ProcId>,
    remote: Vec<ProcId>,
    rank: u32,
    named: Vec<ProcSel>,
) -> Result<InterComm, InterCommError> {
    let inner = Arc::new(union_inner(wire, conn)?);
    crate::register_engine(&inner);
    let index = |p: &ProcId| conn.procs.binary_search(p).ok().map(|i| i as u32);
    let to_union: Option<Vec<u32>> = remote.iter().map(index).collect();
    let to_union = to_union.ok_or_else(|| {
        InterCommError::Invalid("a remote process is not among those connected".into())
    })?;
    let p2p = Communicator {
        inner,
        ctx: conn.pgcid,
        rank,
        size: remote.len() as u32,
        map: Some(Arc::new(RankMap::new(&to_union))),
        origin: None,
        shared: Arc::new(CommShared {
            derived: true,
            ..CommShared::default()
        }),
    };
    Ok(InterComm {
        p2p,
        local: local.into(),
        remote: remote.into(),
        named,
        union_procs: conn.procs.clone(),
        connects: std::sync::atomic::AtomicU32::new(1),
        wire: wire.clone(),
        disconnected: false,
    })
}

/// The engine over the processes of `conn` (indexed by their sorted order), its cards
/// published under keys of the connect's PGCID.
fn union_inner(wire: &Arc<Client>, conn: &Connection) -> Result<Inner, InterCommError> {
    let me = wire.me();
    let at = conn.procs.binary_search(&me).map_err(|_| {
        InterCommError::Invalid(format!("{me} is not among the processes connected"))
    })? as u32;
    let node = wire.node();
    let local: Vec<u32> = (0..conn.procs.len() as u32)
        .filter(|&i| conn.nodes[i as usize] == node)
        .collect();
    let my_local = local.iter().position(|&i| i == at).unwrap_or(0) as u32;
    let pgcid = conn.pgcid;
    let procs: Arc<[ProcId]> = conn.procs.clone().into();
    let nodes: Arc<[u32]> = conn.nodes.clone().into();
    let (w, g, p2, p3) = (wire.clone(), wire.clone(), procs.clone(), procs.clone());
    let spec = Spec {
        me: at,
        size: procs.len() as u32,
        local,
        my_local,
        node_of: Arc::new(move |i| nodes.get(i as usize).copied()),
        inbox_name: format!("{}c{pgcid}r{}", wire.segment_prefix(), wire.rank()),
        keys: [
            crate::SHM_CARD_KEY,
            crate::VERBS_CARD_KEY,
            crate::TCP_CARD_KEY,
        ]
        .map(|k| format!("{k}@{pgcid}")),
        job: format!("weft.connect/{pgcid}"),
        get: Arc::new(move |i, key, opts| match p2.get(i as usize) {
            Some(&p) => w.get_proc(p, key, opts),
            None => Err(weft_wireup::GetError::InvalidRank {
                rank: i,
                size: p2.len() as u32,
            }),
        }),
        gone: Box::new(move |i| {
            let p = *p3.get(i as usize)?;
            g.gone_proc(p).or_else(|| g.server_lost())
        }),
    };
    let size = spec.size;
    let built = build_engine(wire, spec)?;
    let mut inner = Inner::new(
        built.engine,
        None,
        at,
        size,
        pgcid,
        built.shm,
        Some(built.prefetch),
    );
    inner.procs = Some(procs);
    Ok(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_group_reads_back_and_garbage_is_refused() {
        let procs = vec![ProcId::new(NsId(1), 0), ProcId::new(NsId(1), 3)];
        let b = encode_group(false, &procs);
        assert_eq!(decode_group(&b), Some((false, procs.clone())));
        assert!(decode_group(&encode_group(true, &procs)).unwrap().0);
        assert_eq!(decode_group(&b[..b.len() - 2]), None);
        assert_eq!(decode_group("X 1.0"), None);
        assert_eq!(decode_group("W"), None);
        assert_eq!(decode_group(""), None);
        assert_eq!(selectors(true, &procs), vec![ProcSel::All(NsId(1))]);
        assert_eq!(selectors(false, &procs).len(), 2);
    }
}
