//! Hostile input for the wire-up layer: a seed corpus of valid frames of every message
//! kind, a deterministic mutator, and (in tests) fuzz loops that run for a time budget
//! (`WEFT_FUZZ_SECS`, default 1 s per target; `ci/fuzz.sh` gives each more) against the
//! frame decoders, the server's data state machine and the server's request handlers
//! through the real decoding path. Inputs that once broke something are kept under
//! `wireup/fuzz/corpus/` and replayed by every test run.
//!
//! The live-server fuzz scenario of the `wireup_probe` program uses [`client_corpus`],
//! [`hello`], [`is_client_request`] and [`Mutator`] to send hostile requests to a real
//! server over its real socket; the server fuzz tests of `weft-runtime` use the same
//! corpus.

use weft_wireup::frame;
use weft_wireup::proto::{
    ClientMsg, CollId, CollKind, FenceMode, GroupDirectives, Procs, MAGIC, PROTOCOL_VERSION,
};
use weft_wireup::{NsId, ProcId, Rank};
use weft_wireup::{Scope, Value};

pub use weft_fuzz::Mutator;

/// The hello frame of `rank` of namespace `ns` with `token`.
pub fn hello(ns: NsId, rank: Rank, token: u64) -> Vec<u8> {
    frame::encode(&ClientMsg::Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        rank,
        token,
        ns,
    })
}

/// Whether `frame` (length prefix included) decodes as one client message.
pub fn is_client_frame(frame: &[u8]) -> bool {
    let mut r = frame;
    frame::read_sync::<ClientMsg>(&mut r, frame::MAX_CLIENT_FRAME).is_ok() && r.is_empty()
}

/// Whether `frame` decodes as one client request other than a hello (a second hello
/// drops the connection, as an undecodable frame does) or a job control (a valid one
/// signals or kills the processes it names, the other ranks of a live server's job
/// included: a hostile client's mutations must not stumble into that right).
pub fn is_client_request(frame: &[u8]) -> bool {
    let mut r = frame;
    matches!(
        frame::read_sync::<ClientMsg>(&mut r, frame::MAX_CLIENT_FRAME),
        Ok(m) if !matches!(m, ClientMsg::Hello { .. } | ClientMsg::JobControl { .. })
    ) && r.is_empty()
}

/// Valid client frames of every request kind (no hello, no finalize), naming ranks
/// below `size + 2` (so some are outside the job) as rank `rank` would send them.
pub fn client_corpus(rank: Rank, size: u32) -> Vec<Vec<u8>> {
    client_msgs(rank, size).iter().map(frame::encode).collect()
}

/// The messages of [`client_corpus`], before encoding.
pub fn client_msgs(rank: Rank, size: u32) -> Vec<ClientMsg> {
    let other = (rank + 1) % size.max(1);
    let id = |kind, procs, seq, name: &str| CollId {
        kind,
        procs,
        seq,
        name: name.to_owned(),
    };
    let dirs = GroupDirectives {
        leader: Some(rank),
        assign_context_id: true,
        ..GroupDirectives::default()
    };
    vec![
        ClientMsg::Commit {
            entries: vec![
                (Scope::Global, "k".into(), Value::U64(7)),
                (Scope::Local, "l".into(), Value::Str("s".into())),
                (Scope::Remote, "r".into(), Value::Bytes(vec![1, 2, 3])),
            ],
        },
        ClientMsg::Fence {
            req: 1,
            id: id(CollKind::Fence, Procs::List(vec![rank]), 1, ""),
            mode: FenceMode::Full,
            timeout_ms: Some(50),
        },
        ClientMsg::Fence {
            req: 2,
            id: id(CollKind::Fence, Procs::All, 1, ""),
            mode: FenceMode::Sparse,
            timeout_ms: Some(50),
        },
        ClientMsg::Get {
            req: 3,
            proc: ProcId::new(NsId::FIRST, other),
            key: "k".into(),
            refresh: false,
            local_only: false,
            immediate: false,
            timeout_ms: Some(50),
        },
        ClientMsg::Get {
            req: 4,
            proc: ProcId::new(NsId::FIRST, size + 1),
            key: "k".into(),
            refresh: true,
            local_only: true,
            immediate: true,
            timeout_ms: None,
        },
        ClientMsg::Group {
            req: 5,
            id: id(CollKind::GroupConstruct, Procs::List(vec![rank]), 1, "g"),
            directives: dirs.clone(),
            timeout_ms: Some(50),
        },
        ClientMsg::Group {
            req: 6,
            id: id(CollKind::GroupDestruct, Procs::List(vec![rank]), 1, "g"),
            directives: GroupDirectives::default(),
            timeout_ms: Some(50),
        },
        ClientMsg::GroupQuery { req: 7 },
        ClientMsg::GroupLeave {
            req: 8,
            id: "g".into(),
        },
        ClientMsg::LeaderClaim {
            req: 9,
            id: "g".into(),
        },
        ClientMsg::PsetDefine {
            req: 10,
            name: "p".into(),
            members: vec![ProcId::new(NsId::FIRST, rank), ProcId::new(NsId(2), other)],
        },
        ClientMsg::PsetDelete {
            req: 11,
            name: "p".into(),
        },
        ClientMsg::GroupInvite {
            req: 12,
            id: "inv".into(),
            procs: vec![ProcId::new(NsId::FIRST, other)],
            directives: dirs,
            timeout_ms: Some(50),
        },
        ClientMsg::GroupJoin {
            req: 13,
            id: "inv".into(),
            leader: ProcId::new(NsId::FIRST, other),
            accept: true,
        },
        ClientMsg::Spawn {
            req: 14,
            apps: vec![weft_wireup::SpawnApp {
                program: "/bin/true".into(),
                args: vec!["a".into()],
                np: 2,
                env: vec![("K".into(), "V".into())],
                cwd: None,
            }],
            opts: weft_wireup::SpawnOptions {
                session: Some(weft_wireup::SessionRef::AllocId("a".into())),
                separate: true,
            },
        },
        ClientMsg::JobControl {
            req: 15,
            // A rank beyond the job and a namespace of none: refused, naming them (a
            // request a live server carries out would signal the other processes).
            targets: vec![
                weft_wireup::ProcSel::One(ProcId::new(NsId::FIRST, size + 1)),
                weft_wireup::ProcSel::All(NsId(7)),
            ],
            action: weft_wireup::JobAction::Signal(10),
        },
        ClientMsg::Allocate {
            req: 16,
            // More nodes than a runtime may have: refused.
            request: weft_wireup::AllocRequest::new(u32::MAX).alloc_id("fuzz"),
        },
        ClientMsg::Connect {
            req: 17,
            // Its own job and a namespace of none: refused, naming it.
            procs: vec![
                weft_wireup::ProcSel::One(ProcId::new(NsId::FIRST, rank)),
                weft_wireup::ProcSel::All(NsId(7)),
            ],
            disconnect: false,
            timeout_ms: Some(50),
        },
    ]
}

/// Inputs and helpers the fuzz tests of this crate and of `weft-runtime` share.
pub mod inputs {
    use super::*;

    /// Runs a fuzz target (see `weft_fuzz::run`).
    pub use weft_fuzz::run;

    /// Saved inputs of `target` (files under `wireup/fuzz/corpus/<target>/`).
    pub fn saved(target: &str) -> Vec<Vec<u8>> {
        weft_fuzz::saved(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../wireup/fuzz/corpus")
                .join(target),
        )
    }

    /// A fence id over ranks 0 and 2.
    pub fn id() -> CollId {
        CollId {
            kind: CollKind::Fence,
            procs: Procs::List(vec![0, 2]),
            seq: 3,
            name: String::new(),
        }
    }
}

/// Reads every frame of `bytes` as `T` with the real reader and limit: decode errors
/// are fine, a panic is the finding.
pub fn read_all<T: serde::de::DeserializeOwned>(bytes: &[u8], max: usize) -> usize {
    let mut r = bytes;
    let mut n = 0;
    while frame::read_sync::<T>(&mut r, max).is_ok() {
        n += 1;
    }
    n
}

/// One generated input from `corpus`: a mutated seed, a splice of two, or noise.
pub fn input(m: &mut Mutator, corpus: &[Vec<u8>]) -> Vec<u8> {
    match m.below(10) {
        0 => (0..m.below(64)).map(|_| m.next_u64() as u8).collect(),
        1 => {
            let (a, b) = (m.below(corpus.len()), m.below(corpus.len()));
            let mut v = m.mutate(&corpus[a]);
            v.extend(m.mutate(&corpus[b]));
            v
        }
        _ => {
            let i = m.below(corpus.len());
            m.mutate(&corpus[i])
        }
    }
}
