//! The PMI-1 wire protocol, the server's second front end: what MPICH and its derivatives
//! speak to their launcher (Hydra's "simple PMI": one text line per request, `cmd=NAME
//! key=value ...`). Every process gets one end of a socketpair as `PMI_FD` (with
//! `PMI_RANK` and `PMI_SIZE`); its lines become the core's operations:
//!
//! - `put` commits the key (as `pmi1/KEY`, scope Global) for the process, and records the
//!   key's owner in the server's index, which a barrier's data fills for other nodes;
//! - `barrier_in` is a Full fence of the whole job (`barrier_out` when it completes);
//! - `get` reads the key from its owner through the core's get (`PMI_process_mapping` is
//!   answered from the job's placement);
//! - `init`, `get_maxes`, `get_appnum`, `get_my_kvsname`, `get_universe_size` and
//!   `finalize` are answered here;
//! - `mcmd=spawn` (MPICH's `PMI_Spawn_multiple`: one block of lines per app, each ended by
//!   `endcmd`) asks the launcher for a new job; its processes get `PMI_SPAWNED=1` and read
//!   the spawner's "preput" keys (MPICH's `PARENT_ROOT_PORT_NAME`) as their job's. The
//!   answer is `spawn_result` with an error code per process. The info keys `wdir` and
//!   `path` are used; placement keys are not (the job starts on the spawner's node);
//! - `publish_name`, `unpublish_name`, `lookup_name` go to the runtime's name service
//!   (`published`): names of the session, kept until unpublished; a lookup does not wait.
//!
//! A process that never speaks PMI (a Weft program, a shell command) just inherits an
//! unused descriptor. A malformed or unknown request gets an error reply naming it.

use std::io::{BufRead, Read};
use std::os::fd::AsRawFd;

use std::collections::HashMap;

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use weft_wireup::{Rank, Scope, Value};

use super::published::{NameReply, PmiName};
use super::{pmi2, pmi_spawn, wire_to_text, JobEvent, JobEvents, State};
use crate::modex::{ConnId, GetFlags};
use crate::wire::proto::{
    CollId, CollKind, FenceMode, NameFailure, NameOp, NameRange, NameValue, Persistence, ProcData,
    Procs, Published, ServerMsg,
};

/// Connection ids of PMI clients: this bit, then the rank (native clients count up from 0).
pub(super) const PMI_CONN: ConnId = 1 << 62;
/// Longest request line accepted (MPICH's values are at most `vallen_max` = 1024 bytes).
const MAX_LINE: usize = 16 << 10;
/// `vallen_max` told to clients.
pub(super) const VALLEN_MAX: usize = 1024;
use super::pmi_keys::{PmiKeys, KEY_PREFIX};

/// The PMI-1 and PMI-2 front end: the local processes' connections, and who put each
/// key (with PMI-2's node attributes).
#[derive(Default)]
pub(super) struct PmiFront {
    /// The connections of local processes, by rank.
    pub(super) conns: HashMap<Rank, PmiConn>,
    /// Who put each PMI key, and PMI-2's node attributes (`pmi_keys`).
    pub(super) keys: PmiKeys,
}

/// A PMI client's state.
pub(super) struct PmiConn {
    pub(super) tx: UnboundedSender<Vec<u8>>,
    pub(super) barriers: u64,
    pub(super) next_req: u64,
    /// What each request sent to the core answers: a barrier or a get (replies come
    /// through `send_client`, which borrows the state shared).
    pub(super) waiting: std::cell::RefCell<HashMap<u64, Wait>>,
    /// The client asked for PMI-2 at init (`pmi2`): its later commands and their
    /// replies are PMI-2's.
    pub(super) v2: bool,
}

#[derive(Clone, Copy)]
pub(super) enum Wait {
    Barrier,
    Get,
}

/// The socketpair of rank `rank`'s PMI connection: the server's end, and the child's,
/// made inheritable, with the environment that names it added to `cmd`.
pub(super) fn prepare(
    cmd: &mut tokio::process::Command,
    rank: Rank,
    size: u32,
) -> Option<(
    std::os::unix::net::UnixStream,
    std::os::unix::net::UnixStream,
)> {
    let (ours, theirs) = match std::os::unix::net::UnixStream::pair() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("rank {rank}: no PMI connection (socketpair: {e})");
            return None;
        }
    };
    // The child inherits this end; the server closes its copy once the child started.
    if let Err(e) = rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty()) {
        tracing::warn!("rank {rank}: no PMI connection (fcntl: {e})");
        return None;
    }
    cmd.env("PMI_FD", theirs.as_raw_fd().to_string())
        .env("PMI_RANK", rank.to_string())
        .env("PMI_SIZE", size.to_string());
    Some((ours, theirs))
}

/// Serves the server's end of rank `rank`'s PMI connection: lines to the actor, replies
/// back.
pub(super) fn serve(ours: std::os::unix::net::UnixStream, rank: Rank, ev: JobEvents) {
    let (tx, mut rx) = unbounded_channel::<Vec<u8>>();
    ev.send(JobEvent::PmiOpen { rank, tx });
    let writer = match ours.try_clone() {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("rank {rank}: PMI connection unusable: {e}");
            return;
        }
    };
    // Blocking IO on two plain threads: a PMI client sends a handful of lines in its life.
    let evr = ev.clone();
    std::thread::spawn(move || {
        let mut r = std::io::BufReader::new(ours);
        let mut line = Vec::new();
        loop {
            line.clear();
            // A PMI-2 command starts with its length (6 characters, a number): one after
            // the PMI-1 `init` that asked for version 2 (`pmi2`). A PMI-1 line starts
            // with `cmd=` (or `mcmd=`).
            match r.fill_buf() {
                Ok([]) | Err(_) => break,
                Ok(b) if b[0].is_ascii_digit() => {
                    let cmd = pmi2::read_command(&mut r, MAX_LINE);
                    let stop = cmd.is_err();
                    if !evr.send(JobEvent::Pmi2 { rank, cmd }) || stop {
                        break;
                    }
                    continue;
                }
                Ok(_) => {}
            }
            match r
                .by_ref()
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
            {
                Ok(0) | Err(_) => break,
                Ok(_) if line.len() > MAX_LINE => {
                    evr.send(JobEvent::Pmi {
                        rank,
                        line: Err(format!("a request line longer than {MAX_LINE} bytes")),
                    });
                    break;
                }
                Ok(_) => {
                    let mut text = String::from_utf8_lossy(&line).trim().to_string();
                    if text.starts_with("mcmd=") {
                        text = match read_mcmd(&mut r, text) {
                            Ok(t) => t,
                            Err(why) => {
                                evr.send(JobEvent::Pmi {
                                    rank,
                                    line: Err(why),
                                });
                                break;
                            }
                        };
                    }
                    if !text.is_empty()
                        && !evr.send(JobEvent::Pmi {
                            rank,
                            line: Ok(text),
                        })
                    {
                        break;
                    }
                }
            }
        }
        evr.send(JobEvent::PmiClosed { rank });
    });
    std::thread::spawn(move || {
        use std::io::Write;
        let mut w = writer;
        while let Some(bytes) = rx.blocking_recv() {
            if w.write_all(&bytes).is_err() {
                break;
            }
        }
    });
}

/// The rest of a multi-line command (`mcmd=spawn`, begun by `first`): blocks of one
/// `key=value` per line, each ended by `endcmd`, the last one's `spawnssofar` equal to its
/// `totspawns`. Returned whole, lines joined by newlines.
fn read_mcmd(r: &mut impl BufRead, first: String) -> Result<String, String> {
    let mut text = first;
    let (mut total, mut sofar) = (None::<String>, None::<String>);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r
            .by_ref()
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
        {
            Ok(0) => return Err("the connection ended inside a multi-line command".into()),
            Err(e) => return Err(format!("reading a multi-line command: {e}")),
            Ok(_) if line.len() > MAX_LINE => {
                return Err(format!("a request line longer than {MAX_LINE} bytes"))
            }
            Ok(_) => {}
        }
        let l = String::from_utf8_lossy(&line)
            .trim_end_matches(['\r', '\n'])
            .to_string();
        if let Some(v) = l.strip_prefix("totspawns=") {
            total = Some(v.trim().to_owned());
        } else if let Some(v) = l.strip_prefix("spawnssofar=") {
            sofar = Some(v.trim().to_owned());
        }
        text.push('\n');
        text.push_str(&l);
        if text.len() > MAX_MCMD {
            return Err(format!("a multi-line command longer than {MAX_MCMD} bytes"));
        }
        if l == "endcmd" && total == sofar {
            return Ok(text);
        }
    }
}

/// Longest multi-line command accepted (a spawn of many apps).
const MAX_MCMD: usize = 1 << 20;

/// `cmd=NAME k=v ...` as (NAME, pairs); `None` without a `cmd`.
pub(super) fn parse(line: &str) -> Option<(&str, HashMap<&str, &str>)> {
    let mut kv = HashMap::new();
    for word in line.split_ascii_whitespace() {
        let (k, v) = word.split_once('=')?;
        kv.insert(k, v);
    }
    let cmd = kv.remove("cmd")?;
    Some((cmd, kv))
}

/// A PMI `msg` value: no spaces.
pub(super) fn msg(text: &str) -> String {
    text.replace(|c: char| c.is_ascii_whitespace() || c == '=', "_")
}

/// MPICH's `PMI_process_mapping` of ranks to nodes: `(vector,(first node, nodes, ranks
/// per node),...)`, each triple a run of nodes given the same count of consecutive ranks.
pub(super) fn process_mapping(node_of_rank: &[u32]) -> String {
    // Runs of consecutive ranks on one node: (node, count).
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &n in node_of_rank {
        match runs.last_mut() {
            Some((node, count)) if *node == n => *count += 1,
            _ => runs.push((n, 1)),
        }
    }
    // Runs on consecutive nodes with the same count make one triple.
    let mut triples: Vec<(u32, u32, u32)> = Vec::new();
    for (node, count) in runs {
        match triples.last_mut() {
            Some((first, nodes, per)) if *per == count && *first + *nodes == node => *nodes += 1,
            _ => triples.push((node, 1, count)),
        }
    }
    let body: Vec<String> = triples
        .iter()
        .map(|(a, b, c)| format!("({a},{b},{c})"))
        .collect();
    format!("(vector,{})", body.join(","))
}

impl State {
    pub(super) fn pmi_open(&mut self, rank: Rank, tx: UnboundedSender<Vec<u8>>) {
        self.job.pmi.conns.insert(
            rank,
            PmiConn {
                tx,
                barriers: 0,
                next_req: 0,
                waiting: std::cell::RefCell::new(HashMap::new()),
                v2: false,
            },
        );
    }

    pub(super) fn pmi_closed(&mut self, rank: Rank) {
        // The process's exit decides how it ended (as for a process that never spoke PMI).
        self.job.pmi.conns.remove(&rank);
        let acts = self.job.modex.conn_closed(PMI_CONN | ConnId::from(rank));
        self.apply(acts);
    }

    pub(super) fn pmi_send(&self, rank: Rank, text: &str) {
        if let Some(c) = self.job.pmi.conns.get(&rank) {
            let _ = c.tx.send(format!("{text}\n").into_bytes());
        }
    }

    pub(super) fn pmi_req(&mut self, rank: Rank, wait: Wait) -> Option<u64> {
        let c = self.job.pmi.conns.get_mut(&rank)?;
        c.next_req += 1;
        c.waiting.borrow_mut().insert(c.next_req, wait);
        Some(c.next_req)
    }

    /// Commits `key` = `value` for rank `rank` (PMI-1's `put`, PMI-2's `kvs-put`: they
    /// share keys) and records its owner.
    pub(super) fn pmi_put(&mut self, rank: Rank, key: &str, value: &str) {
        self.job.pmi.keys.on_put(rank, key);
        let entry = (
            Scope::Global,
            format!("{KEY_PREFIX}{key}"),
            Value::Str(value.to_string()),
        );
        self.commit(rank, vec![entry]);
    }

    /// Rank `rank` joins its next PMI barrier (a Full fence of the job named `name`);
    /// its end reaches the client through `pmi_reply`.
    pub(super) fn pmi_barrier(&mut self, rank: Rank, name: &str) {
        let Some(req) = self.pmi_req(rank, Wait::Barrier) else {
            return;
        };
        let seq = self.job.pmi.conns.get_mut(&rank).map_or(0, |c| {
            c.barriers += 1;
            c.barriers
        });
        let id = CollId {
            kind: CollKind::Fence,
            procs: Procs::All,
            seq,
            name: name.into(),
        };
        let conn = PMI_CONN | ConnId::from(rank);
        self.coll_arrive(rank, conn, req, id, FenceMode::Full, None, None);
    }

    /// Rank `rank` gets `key` from `owner` (what it has committed now); the value
    /// reaches the client through `pmi_reply`.
    pub(super) fn pmi_get(&mut self, rank: Rank, owner: Rank, key: &str) {
        let Some(req) = self.pmi_req(rank, Wait::Get) else {
            return;
        };
        let flags = GetFlags {
            immediate: true,
            ..GetFlags::default()
        };
        let conn = PMI_CONN | ConnId::from(rank);
        self.get(conn, req, owner, format!("{KEY_PREFIX}{key}"), flags, None);
    }

    /// A request line from rank `rank` (or why its connection failed).
    pub(super) fn on_pmi(&mut self, rank: Rank, line: Result<String, String>) {
        let line = match line {
            Ok(l) => l,
            Err(why) => {
                tracing::warn!("rank {rank}: PMI: {why}; closing its PMI connection");
                return self.pmi_send(rank, &format!("cmd=error rc=-1 msg={}", msg(&why)));
            }
        };
        if line.starts_with("mcmd=") {
            return match pmi_spawn::parse_v1(&line) {
                Ok((apps, preput)) => self.pmi_spawn(rank, apps, preput),
                Err(why) => {
                    tracing::warn!("rank {rank}: PMI spawn refused: {why}");
                    self.pmi_send(rank, &format!("cmd=spawn_result rc=-1 msg={}", msg(&why)));
                }
            };
        }
        let Some((cmd, kv)) = parse(&line) else {
            tracing::warn!("rank {rank}: malformed PMI request {line:?}");
            return self.pmi_send(
                rank,
                "cmd=error rc=-1 msg=malformed_request_(expected_cmd=NAME_key=value...)",
            );
        };
        let size = self.job.plan.job.size();
        match cmd {
            "init" => {
                let v = kv.get("pmi_version").copied().unwrap_or("1");
                match v {
                    "1" => self.pmi_send(
                        rank,
                        "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0",
                    ),
                    // The client's next commands are PMI-2's (`pmi2`).
                    "2" => {
                        if let Some(c) = self.job.pmi.conns.get_mut(&rank) {
                            c.v2 = true;
                        }
                        self.pmi_send(
                            rank,
                            "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0",
                        );
                    }
                    _ => self.pmi_send(
                        rank,
                        "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1",
                    ),
                }
            }
            "get_maxes" => self.pmi_send(
                rank,
                &format!("cmd=maxes rc=0 kvsname_max=256 keylen_max=256 vallen_max={VALLEN_MAX}"),
            ),
            "get_appnum" => {
                let app = self.job.app_of(rank);
                self.pmi_send(rank, &format!("cmd=appnum rc=0 appnum={app}"));
            }
            "get_my_kvsname" => {
                let name = msg(&self.job.plan.job.nspace);
                self.pmi_send(rank, &format!("cmd=my_kvsname rc=0 kvsname={name}"));
            }
            "get_universe_size" => {
                self.pmi_send(rank, &format!("cmd=universe_size rc=0 size={size}"));
            }
            "put" => {
                let (Some(key), Some(value)) = (kv.get("key"), kv.get("value")) else {
                    return self.pmi_send(rank, "cmd=put_result rc=-1 msg=put_needs_key_and_value");
                };
                if value.len() > VALLEN_MAX {
                    return self.pmi_send(
                        rank,
                        &format!("cmd=put_result rc=-1 msg=value_longer_than_{VALLEN_MAX}_bytes"),
                    );
                }
                self.pmi_put(rank, key, value);
                self.pmi_send(rank, "cmd=put_result rc=0 msg=success");
            }
            "get" => {
                let Some(key) = kv.get("key").copied() else {
                    return self.pmi_send(rank, "cmd=get_result rc=-1 msg=get_needs_a_key");
                };
                if key == "PMI_process_mapping" {
                    let nodes: Vec<u32> = self.job.plan.job.procs.iter().map(|p| p.node).collect();
                    let v = process_mapping(&nodes);
                    return self
                        .pmi_send(rank, &format!("cmd=get_result rc=0 msg=success value={v}"));
                }
                if let Some(v) = self.preput(key) {
                    return self
                        .pmi_send(rank, &format!("cmd=get_result rc=0 msg=success value={v}"));
                }
                let Some(owner) = self.job.pmi.keys.owner(key) else {
                    return self.pmi_send(rank, "cmd=get_result rc=-1 msg=key_not_found");
                };
                self.pmi_get(rank, owner, key);
            }
            "barrier_in" => self.pmi_barrier(rank, "pmi1"),
            "publish_name" => match (kv.get("service"), kv.get("port")) {
                (Some(s), Some(p)) => self.pmi_name(rank, PmiName::Publish, s, Some(p)),
                _ => self.pmi_send(
                    rank,
                    "cmd=publish_result rc=-1 msg=publish_name_needs_service_and_port",
                ),
            },
            "unpublish_name" | "lookup_name" => {
                let what = if cmd == "lookup_name" {
                    PmiName::Lookup
                } else {
                    PmiName::Unpublish
                };
                match kv.get("service") {
                    Some(s) => self.pmi_name(rank, what, s, None),
                    None => {
                        let reply = what.pmi1_reply();
                        self.pmi_send(
                            rank,
                            &format!("cmd={reply} rc=-1 msg={cmd}_needs_a_service"),
                        )
                    }
                }
            }
            "finalize" => {
                // As a native client's finalize at exit: its exit status decides.
                self.job.procs.on_finalize_at_exit(rank);
                self.pmi_send(rank, "cmd=finalize_ack rc=0");
            }
            "abort" => {
                let code = kv.get("exitcode").and_then(|c| c.parse().ok()).unwrap_or(1);
                self.proc_aborted(rank, code, &format!("called PMI abort (exit code {code})"));
            }
            other => {
                tracing::warn!("rank {rank}: unsupported PMI request {other:?}");
                self.pmi_send(
                    rank,
                    &format!("cmd={} rc=-1 msg=unsupported_PMI-1_request", msg(other)),
                );
            }
        }
    }

    /// Rank `rank`'s PMI name-service request `what` about `service` (`port`: what a
    /// publish publishes). Names are published for the session (every job of the
    /// runtime), until unpublished or the runtime ends, as MPICH's `MPI_Publish_name`
    /// expects; a lookup does not wait.
    pub(super) fn pmi_name(
        &mut self,
        rank: Rank,
        what: PmiName,
        service: &str,
        port: Option<&str>,
    ) {
        let range = NameRange::Session;
        let keys = vec![service.to_owned()];
        let op = match what {
            PmiName::Publish => NameOp::Publish {
                range,
                persist: Persistence::Session,
                entries: vec![(
                    service.to_owned(),
                    NameValue::Str(port.unwrap_or_default().to_owned()),
                )],
            },
            PmiName::Unpublish => NameOp::Unpublish { range, keys },
            PmiName::Lookup => NameOp::Lookup {
                range,
                keys,
                wait_ms: None,
            },
        };
        let to = NameReply::Pmi {
            ns: self.job.ns,
            rank,
            what,
        };
        self.names_request(rank, to, op);
    }

    /// The name service's answer to rank `rank`'s request `what`, in PMI-1's or PMI-2's
    /// words.
    pub(super) fn pmi_named(
        &self,
        rank: Rank,
        what: PmiName,
        result: Result<Vec<Published>, NameFailure>,
    ) {
        let port = match (&result, what) {
            (Ok(found), PmiName::Lookup) => match found.first().map(|p| &p.value) {
                Some(NameValue::Str(s)) => Ok(Some(s.clone())),
                Some(NameValue::Bytes(b)) => Ok(Some(String::from_utf8_lossy(b).into_owned())),
                Some(NameValue::Pmix(_)) => Err("the name's value is not a string".to_owned()),
                None => Err("not found".to_owned()),
            },
            (Ok(_), _) => Ok(None),
            (Err(f), _) => Err(f.to_string()),
        };
        if self.job.pmi.conns.get(&rank).is_some_and(|c| c.v2) {
            return self.pmi2_named(rank, what.pmi2_command(), port);
        }
        let reply = what.pmi1_reply();
        let line = match port {
            Ok(Some(p)) => format!("cmd={reply} rc=0 msg=success port={p}"),
            Ok(None) => format!("cmd={reply} rc=0 msg=success"),
            Err(why) => format!("cmd={reply} rc=-1 msg={}", msg(&why)),
        };
        self.pmi_send(rank, &line);
    }

    /// Key `key` of the spawner's "preput", when the focused job was spawned through PMI.
    pub(super) fn preput(&self, key: &str) -> Option<&str> {
        let pre = self.job.plan.pmi_preput.as_ref()?;
        pre.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The answer to rank `rank`'s PMI spawn of `procs` processes: the new job's
    /// namespace, or why there is none.
    pub(super) fn pmi_spawned(&self, rank: Rank, procs: u32, result: Result<String, String>) {
        if self.job.pmi.conns.get(&rank).is_some_and(|c| c.v2) {
            return self.pmi2_spawned(rank, result);
        }
        match result {
            Ok(nspace) => {
                let codes = vec!["0"; procs as usize].join(",");
                tracing::debug!("rank {rank}: PMI spawn started {nspace}");
                self.pmi_send(rank, &format!("cmd=spawn_result rc=0 errcodes={codes}"));
            }
            Err(why) => {
                tracing::warn!("rank {rank}: PMI spawn failed: {why}");
                self.pmi_send(rank, &format!("cmd=spawn_result rc=-1 msg={}", msg(&why)));
            }
        }
    }

    /// The core's reply `msg` to PMI client `conn`, in PMI's words.
    pub(super) fn pmi_reply(&self, conn: ConnId, msg_: &ServerMsg) {
        let rank = (conn & !PMI_CONN) as Rank;
        let (req, text) = match msg_ {
            ServerMsg::Done { req } => (*req, None),
            ServerMsg::Value { req, value } => (*req, Some(Ok(value.clone()))),
            ServerMsg::Missing { req, reason } => (*req, Some(Err(reason.clone()))),
            ServerMsg::Failed { req, error } => (*req, Some(Err(wire_to_text(error)))),
            _ => return, // events and the rest: not part of PMI-1
        };
        let Some(wait) = self
            .job
            .pmi
            .conns
            .get(&rank)
            .and_then(|c| c.waiting.borrow_mut().remove(&req))
        else {
            return;
        };
        if self.job.pmi.conns.get(&rank).is_some_and(|c| c.v2) {
            return self.pmi2_reply(rank, wait, text);
        }
        let line = match (wait, text) {
            (Wait::Barrier, None) => "cmd=barrier_out rc=0".to_string(),
            (Wait::Barrier, Some(Err(why))) => format!("cmd=barrier_out rc=-1 msg={}", msg(&why)),
            (Wait::Get, Some(Ok(Value::Str(v)))) => {
                format!("cmd=get_result rc=0 msg=success value={v}")
            }
            (Wait::Get, Some(Err(_))) => "cmd=get_result rc=-1 msg=key_not_found".to_string(),
            (w, _) => {
                let what = match w {
                    Wait::Barrier => "barrier_out",
                    Wait::Get => "get_result",
                };
                format!("cmd={what} rc=-1 msg=unexpected_reply")
            }
        };
        self.pmi_send(rank, &line);
    }

    /// Records the owners of the PMI keys in data of other nodes' processes.
    pub(super) fn pmi_learn(&mut self, data: &ProcData) {
        self.job.pmi.keys.on_learn(data);
    }
}

#[cfg(test)]
mod tests {
    use super::{msg, parse, process_mapping};

    #[test]
    fn process_mappings_are_mpichs() {
        assert_eq!(process_mapping(&[0, 0, 0, 0]), "(vector,(0,1,4))");
        assert_eq!(process_mapping(&[0, 0, 1, 1]), "(vector,(0,2,2))");
        assert_eq!(process_mapping(&[0, 1, 0, 1]), "(vector,(0,2,1),(0,2,1))");
        assert_eq!(process_mapping(&[0, 0, 0, 1]), "(vector,(0,1,3),(1,1,1))");
    }

    #[test]
    fn requests_parse_or_are_refused() {
        let (cmd, kv) = parse("cmd=put kvsname=k key=a value=b").expect("parses");
        assert_eq!((cmd, kv["key"], kv["value"]), ("put", "a", "b"));
        assert!(parse("put key=a").is_none(), "a word without =");
        assert!(parse("key=a value=b").is_none(), "no cmd");
        assert_eq!(msg("rank 3 is gone"), "rank_3_is_gone");
    }
}
