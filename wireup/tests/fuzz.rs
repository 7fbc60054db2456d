//! Hostile input for the wire-up layer's frame decoders: the client corpus of every message
//! kind (`weft_testkit::corpus`), mutated for a time budget (`WEFT_FUZZ_SECS`, default 1 s
//! per target; `ci/fuzz.sh` gives each more), and the saved inputs under
//! `wireup/fuzz/corpus/` replayed by every run.

use weft_testkit::corpus::inputs::*;
use weft_testkit::corpus::*;
use weft_wireup::frame::{self, MAX_CLIENT_FRAME, MAX_PEER_FRAME};
use weft_wireup::proto::{ClientMsg, ServerMsg, WireError, PROTOCOL_VERSION};
use weft_wireup::{NsId, Value};

fn server_msgs() -> Vec<ServerMsg> {
    vec![
        ServerMsg::Welcome {
            version: PROTOCOL_VERSION,
            datastore: "/weft-x".into(),
            nspace: "n".into(),
            ns: NsId(2),
            parent: Some(weft_wireup::ProcId::new(NsId(1), 3)),
        },
        ServerMsg::Refused { reason: "r".into() },
        ServerMsg::Done { req: 1 },
        ServerMsg::Value {
            req: 2,
            value: Value::Bytes(vec![1; 40]),
        },
        ServerMsg::Missing {
            req: 3,
            reason: "m".into(),
        },
        ServerMsg::Failed {
            req: 4,
            error: WireError::Timeout {
                op: "fence".into(),
                missing: vec![1, 2],
            },
        },
    ]
}

#[test]
fn fuzz_frame_decoders() {
    // The servers' and the launcher's messages are fuzzed beside their definitions
    // (weft-runtime's wire::fuzz).
    let client: Vec<Vec<u8>> = client_corpus(0, 4)
        .into_iter()
        .chain([hello(NsId::FIRST, 0, 5), hello(NsId(7), 3, 5)])
        .chain(saved("client"))
        .collect();
    let server: Vec<Vec<u8>> = server_msgs().iter().map(frame::encode).collect();
    // The seeds decode.
    for f in &client {
        assert!(read_all::<ClientMsg>(f, MAX_CLIENT_FRAME) >= 1 || f.is_empty());
    }
    for f in &server {
        assert_eq!(read_all::<ServerMsg>(f, MAX_PEER_FRAME), 1);
    }
    let mut decoded = 0u64;
    let n = run("frame-decoders", 1, |m| {
        let which = m.below(2);
        let (corpus, max) = match which {
            0 => (&client, MAX_CLIENT_FRAME),
            _ => (&server, MAX_PEER_FRAME),
        };
        let bytes = input(m, corpus);
        decoded += match which {
            0 => read_all::<ClientMsg>(&bytes, max),
            _ => read_all::<ServerMsg>(&bytes, max),
        } as u64;
    });
    println!("fuzz frame-decoders: {decoded} of the frames decoded");
    assert!(n >= 16);
}
