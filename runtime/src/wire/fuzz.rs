//! Hostile input for the runtime's messages: one of every peer message (the seeds of the
//! server's fuzz tests, `server::fuzz_tests`), and the decoders of the peer and launcher
//! messages under mutated frames (`ci/fuzz.sh` runs the `fuzz_` tests of this crate).

use weft_testkit::corpus::inputs::id;
use weft_wireup::Value;

use super::proto::{
    CollId, CollKind, FenceMode, GroupDirectives, GroupInfo, GroupSpec, JobMsg, ModexData, PeerMsg,
    Procs, WireError, MAGIC, RUNTIME_PROTOCOL_VERSION,
};
use weft_wireup::NsId;

/// One of every peer message, for mutation: the hello, and every job message in the
/// envelope of the first namespace (and one in another namespace's).
pub(crate) fn peer_msgs() -> Vec<PeerMsg> {
    let hello = PeerMsg::Hello {
        magic: MAGIC,
        version: RUNTIME_PROTOCOL_VERSION,
        secret: [1, 2],
        node: 1,
    };
    let jobs = job_msgs();
    let other = PeerMsg::Job {
        ns: NsId(2),
        msg: jobs[0].clone(),
    };
    let first = jobs.into_iter().map(|msg| PeerMsg::Job {
        ns: NsId::FIRST,
        msg,
    });
    std::iter::once(hello)
        .chain(first)
        .chain(std::iter::once(other))
        .collect()
}

/// One of every message between the servers of a job.
fn job_msgs() -> Vec<JobMsg> {
    let err = WireError::ProcGone {
        op: "get".into(),
        rank: 1,
        reason: "x".into(),
    };
    let gid = CollId {
        kind: CollKind::GroupConstruct,
        procs: Procs::All,
        seq: 1,
        name: "g".into(),
    };
    let block = postcard::to_stdvec(&vec![(
        1u32,
        2u64,
        Some(vec![("k".to_owned(), Value::U64(1))]),
    )])
    .unwrap();
    vec![
        JobMsg::Gather {
            id: id(),
            mode: FenceMode::Full,
            step: 0,
            blocks: vec![(1, block.clone())],
            group: None,
        },
        JobMsg::Gather {
            id: gid.clone(),
            mode: FenceMode::Full,
            step: 0,
            blocks: vec![(1, block)],
            group: Some(GroupSpec {
                directives: GroupDirectives::default(),
                timeout_ms: Some(20),
            }),
        },
        JobMsg::Abort {
            id: id(),
            error: err.clone(),
        },
        JobMsg::ArrivalQuery {
            id: id(),
            qid: 1 << 48,
        },
        JobMsg::ArrivalReply {
            qid: 5,
            node: 1,
            missing: vec![1],
        },
        JobMsg::ModexReq {
            qid: 1 << 48,
            rank: 0,
            key: "k".into(),
            wait: true,
        },
        JobMsg::ModexResp {
            qid: (1 << 47) | 1,
            rank: 2,
            result: Ok(ModexData {
                gen: 1,
                entries: vec![("k".into(), Value::U64(1))],
                finalized: false,
            }),
        },
        JobMsg::ModexResp {
            qid: 3,
            rank: 2,
            result: Err(err),
        },
        JobMsg::ModexCancel { qid: 1 << 48 },
        JobMsg::ProcGone {
            rank: 3,
            reason: "r".into(),
            joined: vec![1, 2],
            finalized: false,
        },
        JobMsg::GroupLeft {
            id: "g".into(),
            rank: 2,
        },
        JobMsg::LeaderClaim {
            id: "g".into(),
            rank: 2,
            from: 1,
            nodes: vec![0, 1],
        },
        JobMsg::LeaderDecision {
            id: "g".into(),
            claimant: 0,
            winner: 2,
        },
        JobMsg::LeaderSelected {
            id: "g".into(),
            rank: 2,
        },
        JobMsg::PsetChange {
            name: "p".into(),
            members: Some(vec![0, 3]),
            from: 1,
            qid: 9,
        },
        JobMsg::Invite {
            id: "i".into(),
            leader: 2,
            rank: 0,
            procs: vec![0, 1],
        },
        JobMsg::InviteReply {
            id: "i".into(),
            rank: 2,
            accept: true,
        },
        JobMsg::PgcidReq { qid: 4, from: 1 },
        JobMsg::PgcidResp { qid: 4, pgcid: 77 },
        JobMsg::GroupFormed {
            group: GroupInfo {
                id: "i".into(),
                members: vec![0, 2],
                pgcid: Some(5),
                leader: Some(2),
                left_out: vec![],
                directives: GroupDirectives::default(),
            },
        },
        JobMsg::PsetChanged {
            name: "p".into(),
            members: None,
            qid: 9,
            error: None,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::{self, MAX_PEER_FRAME};
    use crate::wire::proto::{ExitKind, ToLauncher, ToServer};
    use weft_fuzz::run;
    use weft_testkit::corpus::inputs::saved;
    use weft_testkit::corpus::{input, read_all};

    fn launcher_msgs() -> (Vec<ToLauncher>, Vec<ToServer>) {
        (
            vec![
                ToLauncher::Ready {
                    peer_addr: "127.0.0.1:4000".parse().unwrap(),
                },
                ToLauncher::ProcExit {
                    proc: weft_wireup::ProcId::new(NsId::FIRST, 1),
                    how: ExitKind::Signal(9),
                },
                ToLauncher::Failed { reason: "f".into() },
                ToLauncher::Spawn {
                    qid: 3,
                    from: weft_wireup::ProcId::new(NsId::FIRST, 0),
                    req: crate::wire::proto::SpawnReq {
                        apps: vec![weft_wireup::SpawnApp {
                            program: "p".into(),
                            args: vec!["a".into()],
                            np: 2,
                            env: vec![("K".into(), "V".into())],
                            cwd: Some("/".into()),
                        }],
                        pmi_preput: Some(vec![("k".into(), "v".into())]),
                        session: Some(crate::wire::proto::SessionSel::AllocId("A".into())),
                        separate: false,
                        debug: Default::default(),
                    },
                },
                ToLauncher::Launched {
                    ns: NsId(2),
                    error: Some("e".into()),
                    set_up: false,
                },
            ],
            vec![
                ToServer::Start {
                    peers: vec!["127.0.0.1:4000".parse().unwrap()],
                },
                ToServer::Terminate { grace_ms: 10 },
                ToServer::Shutdown,
                ToServer::TerminateJob {
                    ns: NsId(2),
                    grace_ms: 10,
                },
                ToServer::EndJob { ns: NsId(2) },
                ToServer::SpawnDone {
                    qid: 3,
                    result: Ok((NsId(2), "n.2".into())),
                },
            ],
        )
    }

    #[test]
    fn fuzz_peer_and_launcher_decoders() {
        let peer: Vec<Vec<u8>> = peer_msgs()
            .iter()
            .map(frame::encode)
            .chain(saved("peer"))
            .collect();
        let (tl, ts) = launcher_msgs();
        let launcher: Vec<Vec<u8>> = tl.iter().map(frame::encode).collect();
        let to_server: Vec<Vec<u8>> = ts.iter().map(frame::encode).collect();
        let mut decoded = 0u64;
        let n = run("peer-launcher-decoders", 1, |m| {
            let which = m.below(3);
            let corpus = match which {
                0 => &peer,
                1 => &launcher,
                _ => &to_server,
            };
            let bytes = input(m, corpus);
            decoded += match which {
                0 => read_all::<PeerMsg>(&bytes, MAX_PEER_FRAME),
                1 => read_all::<ToLauncher>(&bytes, MAX_PEER_FRAME),
                _ => read_all::<ToServer>(&bytes, MAX_PEER_FRAME),
            } as u64;
        });
        println!("fuzz peer-launcher-decoders: {decoded} of the frames decoded");
        assert!(n >= 16);
    }
}
