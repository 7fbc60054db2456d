//! Setting a process's fabric up: the tunables, which transports a job may use, the
//! cards a process publishes (shared memory, verbs, TCP), and which one reaches each peer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weft_shm::{Inbox, InboxConfig, Outbox, PairHost, ShmError};
use weft_tunables::Tunable;
use weft_wireup::{Client, GetOpts, Scope, Value};

use crate::engine::{self, Config, Engine, Resolved, SingleCopy};
use crate::{Fabric, InitError, Inner, Prefetch};

/// The key under which a process publishes its shared-memory inbox (Local scope).
pub const SHM_CARD_KEY: &str = "weft.shm.inbox";
/// The key under which a process publishes its verbs card (Global scope, so that
/// `WEFT_TRANSPORTS=verbs` works between processes of one node too).
pub const VERBS_CARD_KEY: &str = "weft.verbs.card";
/// The key under which a process publishes its TCP card (Global scope), or, as a string,
/// why its TCP transport cannot open.
pub const TCP_CARD_KEY: &str = "weft.tcp.card";

/// The shared-memory card: the inbox segment's name and the layout version it speaks.
fn shm_card(name: &str) -> String {
    format!("{name}#{}", weft_shm::layout::LAYOUT_VERSION)
}

/// Reads a shared-memory card; a card of another layout version is a clear error.
fn parse_shm_card(card: &str) -> Result<&str, String> {
    let malformed = || format!("malformed shared-memory card {card:?}");
    let (name, v) = card.rsplit_once('#').ok_or_else(malformed)?;
    let v: u32 = v.parse().map_err(|_| malformed())?;
    if v != weft_shm::layout::LAYOUT_VERSION {
        return Err(format!(
            "its shared-memory layout version is {v}, this process speaks {} (mixed Weft builds?)",
            weft_shm::layout::LAYOUT_VERSION
        ));
    }
    Ok(name)
}

/// Tunables of the fabric, listed by `weft info` (in `weft_tunables`' syntax).
pub const TUNABLES: &[Tunable] = &[
    Tunable::new(
        "WEFT_CARD_TIMEOUT",
        "60s",
        "how long the first send to a peer waits for its card (the peer has not started its fabric yet); a peer without one by then is unreachable",
    ),
    Tunable::new(
        "WEFT_FINALIZE_TIMEOUT",
        "10s",
        "how long a finalize (Fabric, Session) or a communicator's disconnect keeps pushing out frames the peers have not taken yet",
    ),
    Tunable::new(
        "WEFT_TRANSPORTS",
        "shm,verbs,tcp",
        "transports to use, in this order of preference: shm for peers on the node, then verbs (when both ends have a usable RDMA device), then tcp for the others; without shm, peers on the node use the others too; `shm` alone refuses other nodes",
    ),
    Tunable::new(
        "WEFT_OVERSUBSCRIBED",
        "auto",
        "whether waiting loops hand the CPU to other processes after a few polls (on) or spin for a while first (off); auto: on when the job's processes on this host outnumber the CPUs of its cgroup cpuset (else the online CPUs)",
    ),
    Tunable::new(
        "WEFT_TCP_EAGER_LIMIT",
        "65536",
        "largest message sent eagerly over TCP (bytes); larger ones go by rendezvous, written straight from the sender's buffer into the receiver's",
    ),
];

/// The entry of `name`.
fn t(name: &str) -> &'static Tunable {
    weft_tunables::find(TUNABLES, name)
}

impl From<weft_tunables::BadTunable> for InitError {
    fn from(e: weft_tunables::BadTunable) -> InitError {
        InitError::Tunable {
            var: e.name,
            reason: e.reason(),
            value: e.value,
        }
    }
}

/// `WEFT_OVERSUBSCRIBED`: `None` for auto.
pub(crate) fn oversubscribed_tunable() -> Result<Option<bool>, weft_tunables::BadTunable> {
    let t = t("WEFT_OVERSUBSCRIBED");
    t.if_set(&weft_tunables::env, Tunable::switch)
}

/// Longest `WEFT_CARD_TIMEOUT` and `WEFT_FINALIZE_TIMEOUT` (a year: "for ever").
const LONGEST_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// `WEFT_CARD_TIMEOUT`.
pub(crate) fn card_wait() -> Result<Duration, InitError> {
    Ok(t("WEFT_CARD_TIMEOUT").millis(Duration::from_millis(1), LONGEST_WAIT)?)
}

/// `WEFT_FINALIZE_TIMEOUT` (its default when set to what it cannot be: `Fabric::init`
/// refused that already).
pub(crate) fn finalize_wait() -> Duration {
    let t = t("WEFT_FINALIZE_TIMEOUT");
    t.millis(Duration::ZERO, LONGEST_WAIT).unwrap_or_else(|_| {
        t.millis_in(&|_: &str| None, Duration::ZERO, LONGEST_WAIT)
            .unwrap_or(Duration::from_secs(10))
    })
}

/// Why a card did not come: the get's error, and how long it was waited for (none when
/// the get only looked), naming the tunable that sets the wait.
fn no_card(what: &str, e: &weft_wireup::GetError, waited: Option<Duration>) -> String {
    match waited {
        Some(w) => format!("no {what} card after waiting {w:?} (WEFT_CARD_TIMEOUT): {e}"),
        None => format!("no {what} card: {e}"),
    }
}

fn config() -> Result<Config, InitError> {
    // The shared-memory path's protocol knobs are shm's (`weft_shm::PathConfig`).
    let path = weft_shm::PathConfig::from_env()?;
    let eager_limit = path.eager_limit;
    let single_copy = if path.single_copy {
        SingleCopy::Cma
    } else {
        SingleCopy::None
    };
    // The verbs endpoint's registration cache decides it (`WEFT_VERBS_RCACHE`, verbs').
    let keep_registrations = false;
    let cma_split = path.cma_split;
    let tcp_eager_limit = t("WEFT_TCP_EAGER_LIMIT").size(0, MAX_TCP_EAGER_LIMIT as u64)? as usize;
    Ok(Config {
        eager_limit,
        single_copy,
        keep_registrations,
        cma_split,
        tcp_eager_limit,
    })
}

/// Default of `WEFT_TCP_EAGER_LIMIT` (bytes).
pub(crate) const DEFAULT_TCP_EAGER_LIMIT: usize = 64 * 1024;
/// Largest `WEFT_TCP_EAGER_LIMIT`: an eager frame is read whole into the endpoint's
/// buffer before it is matched.
const MAX_TCP_EAGER_LIMIT: usize = 1 << 20;

/// The TCP endpoint's largest frame for an eager limit: the message and a full header.
#[cfg(feature = "tcp")]
fn tcp_max_frame(eager_limit: usize) -> usize {
    (eager_limit + engine::HDR).max(64 * 1024)
}

/// A 64-bit identity of the job for transport handshakes (FNV-1a of its namespace).
#[cfg(feature = "tcp")]
fn job_hash(nspace: &str) -> u64 {
    nspace.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Which transports `WEFT_TRANSPORTS` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Transports {
    shm: bool,
    verbs: bool,
    tcp: bool,
    /// Shm was asked for but this build has no shared-memory path (so `shm` is false).
    shm_not_built: bool,
}

fn transports() -> Result<Transports, InitError> {
    let value = std::env::var("WEFT_TRANSPORTS").unwrap_or_else(|_| "shm,verbs,tcp".into());
    let mut t = Transports {
        shm: false,
        verbs: false,
        tcp: false,
        shm_not_built: false,
    };
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "shm" => t.shm = true,
            "verbs" => t.verbs = true,
            "tcp" => t.tcp = true,
            other => {
                return Err(InitError::Tunable {
                    var: "WEFT_TRANSPORTS",
                    value: value.clone(),
                    reason: format!("unknown transport {other:?} (shm, verbs, tcp)"),
                })
            }
        }
    }
    if !t.shm && !t.verbs && !t.tcp {
        return Err(InitError::Tunable {
            var: "WEFT_TRANSPORTS",
            value,
            reason: "names no transport".into(),
        });
    }
    // Without the shm path, peers on the node use the other transports.
    #[cfg(not(feature = "shm"))]
    if t.shm {
        t.shm = false;
        t.shm_not_built = true;
        if !t.verbs && !t.tcp {
            return Err(InitError::ShmNotBuilt);
        }
    }
    Ok(t)
}

/// How a peer's card is read: `get(peer, key, opts)`.
pub(crate) type CardGet =
    Arc<dyn Fn(u32, &str, GetOpts) -> Result<Value, weft_wireup::GetError> + Send + Sync>;

/// What one engine is built over: the world's job, or the processes of a connect. Peers
/// are numbered `0..size` (job ranks, or positions in the connect's sorted processes).
pub(crate) struct Spec {
    pub(crate) me: u32,
    pub(crate) size: u32,
    /// The peers on this node, ascending (`me` among them).
    pub(crate) local: Vec<u32>,
    /// This process's sender id in the node's inboxes (and its own inbox's owner id).
    pub(crate) my_local: u32,
    /// Each peer's node; `None` for one outside `0..size`.
    pub(crate) node_of: Arc<dyn Fn(u32) -> Option<u32> + Send + Sync>,
    /// The name of this process's inbox segment, if it makes one.
    pub(crate) inbox_name: String,
    /// The keys of the cards (shared memory, verbs, TCP).
    pub(crate) keys: [String; 3],
    /// The identity TCP handshakes check (peers of another engine are refused).
    pub(crate) job: String,
    /// Reads a peer's card.
    pub(crate) get: CardGet,
    /// Why a peer cannot be reached, if it cannot (dead, or this node's server lost).
    pub(crate) gone: Box<dyn Fn(u32) -> Option<String> + Send + Sync>,
}

impl Spec {
    /// The world's: the job's ranks, its cards under the plain keys.
    fn world(wire: &Arc<Client>) -> Spec {
        let (w, g, n) = (wire.clone(), wire.clone(), wire.clone());
        Spec {
            me: wire.rank(),
            size: wire.size(),
            local: wire.local_peers().to_vec(),
            my_local: wire.local_rank(),
            node_of: Arc::new(move |rank| n.job().node_of(rank)),
            inbox_name: format!("{}r{}", wire.segment_prefix(), wire.rank()),
            keys: [SHM_CARD_KEY, VERBS_CARD_KEY, TCP_CARD_KEY].map(str::to_owned),
            job: wire.nspace().to_owned(),
            get: Arc::new(move |rank, key, opts| w.get(rank, key, opts)),
            // A peer is gone when its server says so, and every peer is when our own
            // server is (its datastore will never say so then).
            gone: Box::new(move |rank| g.unreachable(rank)),
        }
    }
}

/// An engine built by [`build_engine`], with what its `Inner` needs.
pub(crate) struct Built {
    pub(crate) engine: Engine,
    pub(crate) shm: bool,
    pub(crate) prefetch: Prefetch,
}

impl Fabric {
    pub(crate) fn build(wire: Arc<Client>) -> Result<Inner, InitError> {
        // The job's processes on this machine (logical nodes share its CPUs: the
        // launcher says how many), else this node's.
        let on_host = std::env::var(weft_wireup::env::HOST_PROCS)
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0);
        crate::note_oversubscription(on_host.max(wire.local_size()))?;
        let spec = Spec::world(&wire);
        let (me, size) = (spec.me, spec.size);
        let built = build_engine(&wire, spec)?;
        let world_ctx = wire.job().world_pgcid;
        Ok(Inner::new(
            built.engine,
            Some(wire),
            me,
            size,
            world_ctx,
            built.shm,
            Some(built.prefetch),
        ))
    }
}

/// Opens the transports `spec`'s peers need, publishes their cards under its keys and
/// commits them, and makes the engine that reaches each peer by its card.
pub(crate) fn build_engine(wire: &Arc<Client>, spec: Spec) -> Result<Built, InitError> {
    let Spec {
        me,
        size,
        local,
        my_local,
        node_of,
        inbox_name,
        keys,
        job,
        get,
        gone,
    } = spec;
    let [shm_key, verbs_key, tcp_key] = keys;
    #[cfg(not(feature = "tcp"))]
    let _ = &job;
    let t = transports()?;
    #[cfg_attr(not(feature = "verbs"), allow(unused_mut))]
    let mut cfg = config()?;
    let card_wait = card_wait()?;
    self::t("WEFT_FINALIZE_TIMEOUT").millis(Duration::ZERO, LONGEST_WAIT)?;
    let remote_peers = size as usize > local.len();
    let inbox = if t.shm && local.len() > 1 {
        let inbox = Inbox::create_for(&inbox_name, &InboxConfig::from_env()?, my_local)?;
        wire.put(Scope::Local, &shm_key, shm_card(&inbox_name))?;
        Some(inbox)
    } else {
        None
    };
    // Verbs when some peer needs it: another node, or every peer when shm is off.
    let want_verbs = t.verbs && size > 1 && (remote_peers || !t.shm);
    let mut verbs_down = None;
    #[cfg(feature = "verbs")]
    let verbs = if want_verbs {
        let mut base = weft_verbs::Config::new(me);
        // Registrations are kept between messages only when the program promises not
        // to free and reuse its buffers (WEFT_VERBS_RCACHE=on): off unless set.
        base.rcache = false;
        let vcfg = base.apply_env().map(|mut c| {
            cfg.keep_registrations = c.rcache;
            // A live peer is never given up for a slow handshake: the fabric asks
            // wire-up whether it lives (a dead one is named by how it ended).
            c.patient_handshakes = true;
            c
        });
        match vcfg.and_then(weft_verbs::Endpoint::open) {
            Ok(ep) => {
                wire.put(Scope::Global, &verbs_key, ep.card())?;
                Some(ep)
            }
            Err(e) if !t.shm && !t.tcp => return Err(InitError::Verbs(e)),
            Err(e) => {
                // Said once per process at info level: a send to another node fails
                // with this reason (NoPath), which is where a user needs it.
                tracing::info!(
                    "the verbs transport cannot open ({e}); peers on other nodes are unreachable"
                );
                // Peers wait for a card until it is committed: a string tells them
                // at once why there is none.
                wire.put(Scope::Global, &verbs_key, format!("{e}"))?;
                verbs_down = Some(e.to_string());
                None
            }
        }
    } else {
        None
    };
    #[cfg(not(feature = "verbs"))]
    let verbs: Option<crate::engine::VerbsEndpoint> = if want_verbs {
        if !t.shm && !t.tcp {
            return Err(InitError::VerbsNotBuilt);
        }
        let why = "this build has no verbs transport (the `verbs` feature of weft-fabric is off)";
        // Peers wait for a card until it is committed: a string tells them at once
        // why there is none.
        wire.put(Scope::Global, &verbs_key, why.to_string())?;
        verbs_down = Some(why.to_string());
        None
    } else {
        None
    };
    let verbs_open = verbs.is_some();
    // TCP when some peer may need it: another node, or every peer when shm is off
    // (verbs is preferred where both ends have it; TCP reaches the others).
    let want_tcp = t.tcp && size > 1 && (remote_peers || !t.shm);
    let mut tcp_down = None;
    #[cfg(feature = "tcp")]
    let tcp = if want_tcp {
        let opened = match (wire.transport_secret(), wire.node_addr()) {
            (Some(secret), addr) => {
                let addr = addr.unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
                weft_tcp::Config::from_env(me, job_hash(&job), secret, addr)
                    .map(|mut c| {
                        c.max_frame = c.max_frame.max(tcp_max_frame(cfg.tcp_eager_limit));
                        // A live peer is never given up for a slow handshake (it may be
                        // busy outside any Weft call): the fabric asks wire-up whether
                        // it lives, and a dead one is named by how it ended.
                        if std::env::var_os("WEFT_TCP_HANDSHAKE_TIMEOUT_MS").is_none() {
                            c.handshake_timeout = Duration::from_secs(365 * 24 * 3600);
                        }
                        c
                    })
                    .and_then(weft_tcp::Endpoint::open)
                    .map_err(|e| e.to_string())
            }
            (None, _) => Err("the wire-up server gives no transport secret".to_string()),
        };
        match opened {
            Ok(ep) => {
                wire.put(Scope::Global, &tcp_key, ep.card())?;
                Some(ep)
            }
            Err(e) if !t.shm && !verbs_open => return Err(InitError::Tcp(e)),
            Err(e) => {
                tracing::info!("the TCP transport cannot open ({e})");
                wire.put(Scope::Global, &tcp_key, e.clone())?;
                tcp_down = Some(e);
                None
            }
        }
    } else {
        None
    };
    #[cfg(not(feature = "tcp"))]
    let tcp: Option<crate::engine::TcpEndpoint> = if want_tcp {
        if !t.shm && !verbs_open {
            return Err(InitError::TcpNotBuilt);
        }
        let why = "this build has no TCP transport (the `tcp` feature of weft-fabric is off)";
        // Peers wait for a card until it is committed: a string tells them at once
        // why there is none.
        wire.put(Scope::Global, &tcp_key, why.to_string())?;
        tcp_down = Some(why.to_string());
        None
    } else {
        None
    };
    let tcp_open = tcp.is_some();
    wire.commit()?;
    let pairs = inbox.as_ref().map(Inbox::pair_host);
    let my_node = wire.node();
    let [shm_key, verbs_key, tcp_key]: [Arc<str>; 3] = [shm_key, verbs_key, tcp_key].map(Arc::from);
    // Which card reaches a peer first: the shared-memory one on this node (when shm
    // is on), else the verbs one (when verbs opened), else the TCP one; none
    // otherwise. (A process commits its verbs and TCP cards together: once one is
    // on the node, so is the other.)
    let card_key = {
        let (node_of, shm_key, verbs_key, tcp_key) = (
            node_of.clone(),
            shm_key.clone(),
            verbs_key.clone(),
            tcp_key.clone(),
        );
        move |rank: u32| -> Option<Arc<str>> {
            let on_node = node_of(rank) == Some(my_node);
            if on_node && t.shm {
                Some(shm_key.clone())
            } else if t.verbs && verbs_open {
                Some(verbs_key.clone())
            } else if t.tcp && tcp_open {
                Some(tcp_key.clone())
            } else {
                None
            }
        }
    };
    let prefetched: Arc<Vec<AtomicBool>> =
        Arc::new((0..size).map(|_| AtomicBool::new(false)).collect());
    let prefetch: Box<dyn Fn(u32) + Send + Sync> = {
        let get = get.clone();
        Box::new(move |rank: u32| {
            if let Some(key) = card_key(rank) {
                // The outcome is the resolver's to report (from the datastore then).
                let _ = get(rank, &key, GetOpts::default().timeout(card_wait));
            }
        })
    };
    let done = prefetched.clone();
    let resolve = Box::new(move |rank: u32| -> Resolved {
        let node = node_of(rank).unwrap_or(u32::MAX);
        let on_node = node == my_node;
        // Once prefetched (it waited up to WEFT_CARD_TIMEOUT) the card is on the node,
        // or never comes: under the engine lock, only look.
        let timeout = if done
            .get(rank as usize)
            .is_some_and(|d| d.load(Ordering::Relaxed))
        {
            GetOpts::default().immediate()
        } else {
            GetOpts::default().timeout(card_wait)
        };
        let waited = Some(card_wait);
        if on_node && t.shm {
            return match get(rank, &shm_key, timeout) {
                Ok(v) => match v.as_str().map(parse_shm_card) {
                    Some(Err(why)) => Resolved::Unreachable(why),
                    Some(Ok(name)) => {
                        connect_shm(name, my_local, pairs.as_ref()).unwrap_or_else(|e| {
                            Resolved::Unreachable(format!(
                                "cannot connect to its inbox {name}: {e}"
                            ))
                        })
                    }
                    None => {
                        Resolved::Unreachable(format!("its card {shm_key} is not a string: {v:?}"))
                    }
                },
                Err(e) => Resolved::Unreachable(no_card("shared-memory", &e, waited)),
            };
        }
        // Verbs where both ends have it, else TCP; if neither, every reason.
        let mut why = Vec::new();
        if !t.verbs {
            why.push("WEFT_TRANSPORTS excludes verbs".to_string());
        } else if !verbs_open {
            let down = verbs_down.as_deref().unwrap_or("not opened");
            why.push(format!("the verbs transport cannot open here: {down}"));
        } else {
            match get(rank, &verbs_key, timeout) {
                #[cfg(feature = "verbs")]
                Ok(Value::Bytes(card)) => return Resolved::VerbsCard(card),
                Ok(Value::Str(down)) => {
                    why.push(format!("its verbs transport cannot open: {down}"))
                }
                Ok(v) => why.push(format!("its card {verbs_key} is not bytes: {v:?}")),
                Err(e) => why.push(no_card("verbs", &e, waited)),
            }
        }
        if !t.tcp {
            why.push("WEFT_TRANSPORTS excludes tcp".to_string());
        } else if !tcp_open {
            let down = tcp_down.as_deref().unwrap_or("not opened");
            why.push(format!("the TCP transport cannot open here: {down}"));
        } else {
            // Committed with the verbs card: no second wait once that one was found.
            let (timeout, waited) = if t.verbs && verbs_open {
                (GetOpts::default().immediate(), None)
            } else {
                (timeout, waited)
            };
            match get(rank, &tcp_key, timeout) {
                #[cfg(feature = "tcp")]
                Ok(Value::Bytes(card)) => return Resolved::TcpCard(card),
                Ok(Value::Str(down)) => why.push(format!("its TCP transport cannot open: {down}")),
                Ok(v) => why.push(format!("its card {tcp_key} is not bytes: {v:?}")),
                Err(e) => why.push(no_card("TCP", &e, waited)),
            }
        }
        let place = if on_node && t.shm_not_built {
            "it runs on this node, and this build has no shared-memory path (the `shm` feature of weft-fabric is off)".to_string()
        } else if on_node {
            "it runs on this node, WEFT_TRANSPORTS excludes shm".to_string()
        } else {
            format!("it runs on node {node}")
        };
        Resolved::Unreachable(format!("{place}; {}", why.join("; ")))
    });
    let shm_cfg = InboxConfig::from_env()?;
    let largest = (shm_cfg.fastbox_bytes as usize / 4).saturating_sub(engine::HDR);
    if cfg.eager_limit > largest {
        tracing::warn!(
            "WEFT_SHM_EAGER_LIMIT={} exceeds the largest eager payload a fastbox frame holds ({largest} with WEFT_SHM_FASTBOX_BYTES={}); messages above {largest} bytes use rendezvous",
            cfg.eager_limit,
            shm_cfg.fastbox_bytes
        );
    }
    let engine = Engine::new(me, size, inbox, local, cfg, resolve, gone, verbs, tcp);
    Ok(Built {
        engine,
        shm: t.shm,
        prefetch: Prefetch {
            fetch: prefetch,
            done: prefetched,
        },
    })
}

/// Connects to the inbox `name` as local sender `my_local`, giving the outbox this
/// process's pair lines when it has them (`pairs`).
pub(crate) fn connect_shm(
    name: &str,
    my_local: u32,
    pairs: Option<&PairHost>,
) -> Result<Resolved, ShmError> {
    let mut o = Outbox::connect(name, my_local)?;
    if let Some(p) = pairs {
        p.pair(&mut o);
    }
    Ok(Resolved::Shm(Box::new(o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_cards_carry_the_layout_version() {
        let card = shm_card("/weft-j-n0-r3");
        assert_eq!(parse_shm_card(&card), Ok("/weft-j-n0-r3"));
        let old = format!("/weft-j-n0-r3#{}", weft_shm::layout::LAYOUT_VERSION + 1);
        assert!(parse_shm_card(&old).unwrap_err().contains("layout version"));
        assert!(parse_shm_card("nohash").unwrap_err().contains("malformed"));
    }

    /// The table's defaults are the ones the fabric uses.
    #[test]
    fn the_tables_defaults_are_the_fabrics() {
        let none = |_: &str| None;
        let size = |n| t(n).size_in(&none, 0, u64::MAX).unwrap() as usize;
        assert_eq!(size("WEFT_TCP_EAGER_LIMIT"), DEFAULT_TCP_EAGER_LIMIT);
        let wait = |n| t(n).millis_in(&none, Duration::ZERO, LONGEST_WAIT).unwrap();
        assert_eq!(wait("WEFT_CARD_TIMEOUT"), Duration::from_secs(60));
        assert_eq!(wait("WEFT_FINALIZE_TIMEOUT"), Duration::from_secs(10));
        let bad = |v: &'static str| move |_: &str| Some(v.to_owned());
        let e = t("WEFT_TCP_EAGER_LIMIT").size_in(&bad("2m"), 0, MAX_TCP_EAGER_LIMIT as u64);
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("WEFT_TCP_EAGER_LIMIT=\"2m\""));
    }
}
