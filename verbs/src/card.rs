//! The card (what a peer needs to reach this endpoint) and the handshake messages sent over
//! the unreliable-datagram queue pair. Both are fixed-size little-endian byte layouts.

use crate::Error;

/// Bytes of a card.
pub const CARD_LEN: usize = 32;
const MAGIC: u8 = b'W';
const VERSION: u8 = 1;
/// The range of eager sizes a handshake may carry (`WEFT_VERBS_EAGER_SIZE`'s).
const MIN_EAGER: u32 = 64;
const MAX_EAGER: u32 = 1 << 20;
/// Most credits a handshake may grant (what the immediate data's 24 bits can return).
const MAX_CREDITS: u32 = 0x00ff_ffff;

/// A decoded card: address of one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Card {
    pub(crate) port: u8,
    /// Active MTU as `ibv_mtu` value.
    pub(crate) mtu: u8,
    pub(crate) lid: u16,
    /// QP number of the endpoint's UD queue pair (handshakes).
    pub(crate) ud_qpn: u32,
    /// Random per-endpoint value; a restarted process has another one.
    pub(crate) nonce: u32,
    pub(crate) gid: [u8; 16],
}

impl Card {
    pub(crate) fn encode(&self) -> [u8; CARD_LEN] {
        let mut b = [0u8; CARD_LEN];
        b[0] = MAGIC;
        b[1] = VERSION;
        b[2] = self.port;
        b[3] = self.mtu;
        b[4..6].copy_from_slice(&self.lid.to_le_bytes());
        b[8..12].copy_from_slice(&self.ud_qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..32].copy_from_slice(&self.gid);
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Card, Error> {
        let bad = |reason: String| Error::BadCard { reason };
        if b.len() != CARD_LEN {
            return Err(bad(format!("{} bytes, expected {CARD_LEN}", b.len())));
        }
        if b[0] != MAGIC {
            return Err(bad(format!("magic {:#x}, expected {MAGIC:#x}", b[0])));
        }
        if b[1] != VERSION {
            return Err(bad(format!(
                "card version {}, this process speaks {VERSION} (mixed Weft builds?)",
                b[1]
            )));
        }
        if !(1..=5).contains(&b[3]) {
            return Err(bad(format!("MTU code {} is not an ibv_mtu", b[3])));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(Card {
            port: b[2],
            mtu: b[3],
            lid: u16::from_le_bytes([b[4], b[5]]),
            ud_qpn: u32_at(8),
            nonce: u32_at(12),
            gid,
        })
    }
}

/// Bytes of a handshake message.
pub(crate) const HS_LEN: usize = 32 + CARD_LEN + 16;

/// Handshake message kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HsKind {
    /// "Connect to me": carries the requester's RC QP and card.
    Req = 1,
    /// "Done": carries the responder's RC QP; `echo_qpn` names the request answered.
    Rep = 2,
}

/// A connection handshake message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handshake {
    pub(crate) kind: HsKind,
    /// Peer id of the sender.
    pub(crate) from: u32,
    /// The sender's RC QP number.
    pub(crate) qpn: u32,
    /// The first PSN the sender will send with.
    pub(crate) psn: u32,
    /// Eager sends the receiver of this message may post to the sender before it returns
    /// credits.
    pub(crate) credits: u32,
    /// REP: the requester's QP number this answers (0 in a REQ).
    pub(crate) echo_qpn: u32,
    /// The sender's eager buffer size (largest frame it can receive).
    pub(crate) eager_size: u32,
    /// The sender's active MTU (`ibv_mtu`); the path uses the smaller one.
    pub(crate) mtu: u8,
    /// The sender's card (so a request from an unknown peer can be answered).
    pub(crate) card: Card,
    /// Address and rkey of the sender's probe word (8 bytes the peer may RDMA-read to
    /// check that the connection is alive).
    pub(crate) probe_addr: u64,
    /// See `probe_addr`.
    pub(crate) probe_rkey: u32,
}

impl Handshake {
    pub(crate) fn encode(&self) -> [u8; HS_LEN] {
        let mut b = [0u8; HS_LEN];
        b[0] = MAGIC;
        b[1] = self.kind as u8;
        for (i, v) in [
            self.from,
            self.qpn,
            self.psn,
            self.credits,
            self.echo_qpn,
            self.eager_size,
        ]
        .into_iter()
        .enumerate()
        {
            b[4 + 4 * i..8 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        b[28] = self.mtu;
        b[32..32 + CARD_LEN].copy_from_slice(&self.card.encode());
        b[64..72].copy_from_slice(&self.probe_addr.to_le_bytes());
        b[72..76].copy_from_slice(&self.probe_rkey.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Handshake> {
        if b.len() < HS_LEN || b[0] != MAGIC {
            return None;
        }
        let kind = match b[1] {
            1 => HsKind::Req,
            2 => HsKind::Rep,
            _ => return None,
        };
        let u =
            |i: usize| u32::from_le_bytes([b[4 + 4 * i], b[5 + 4 * i], b[6 + 4 * i], b[7 + 4 * i]]);
        // Values a healthy peer never sends are refused here rather than handed to the
        // queue pair (an MTU outside IBV_MTU_256..4096, an eager size below the smallest
        // configurable one, no credits or more than the immediate data can return).
        let (credits, eager_size, mtu) = (u(3), u(5), b[28]);
        if !(1..=5).contains(&mtu)
            || !(MIN_EAGER..=MAX_EAGER).contains(&eager_size)
            || !(1..=MAX_CREDITS).contains(&credits)
        {
            return None;
        }
        Some(Handshake {
            kind,
            from: u(0),
            qpn: u(1),
            psn: u(2),
            credits: u(3),
            echo_qpn: u(4),
            eager_size: u(5),
            mtu: b[28],
            card: Card::decode(&b[32..32 + CARD_LEN]).ok()?,
            probe_addr: u64::from_le_bytes(b[64..72].try_into().ok()?),
            probe_rkey: u(17),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card() -> Card {
        Card {
            port: 1,
            mtu: 3,
            lid: 0x1234,
            ud_qpn: 0x00ab_cdef,
            nonce: 77,
            gid: [7; 16],
        }
    }

    #[test]
    fn card_round_trips_and_is_small() {
        let c = card();
        let b = c.encode();
        assert_eq!(b.len(), 32);
        assert_eq!(Card::decode(&b).unwrap(), c);
    }

    #[test]
    fn malformed_cards_are_clear_errors() {
        let b = card().encode();
        assert!(Card::decode(&b[..31])
            .unwrap_err()
            .to_string()
            .contains("31 bytes"));
        let mut v = b;
        v[1] = 9;
        assert!(Card::decode(&v)
            .unwrap_err()
            .to_string()
            .contains("version 9"));
        let mut m = b;
        m[0] = 0;
        assert!(Card::decode(&m).unwrap_err().to_string().contains("magic"));
        let mut t = b;
        t[3] = 0;
        assert!(Card::decode(&t).unwrap_err().to_string().contains("MTU"));
    }

    #[test]
    fn handshake_round_trips() {
        let h = Handshake {
            kind: HsKind::Rep,
            from: 5,
            qpn: 17,
            psn: 0xabcdef,
            credits: 32,
            echo_qpn: 18,
            eager_size: 8192,
            mtu: 3,
            card: card(),
            probe_addr: 0x7f00_1234_5678,
            probe_rkey: 0xabcd,
        };
        assert_eq!(Handshake::decode(&h.encode()), Some(h));
        assert_eq!(Handshake::decode(&h.encode()[..40]), None);
        let mut bad = h.encode();
        bad[1] = 3;
        assert_eq!(Handshake::decode(&bad), None);
    }

    /// Hostile handshakes and cards: random bytes and mutated valid encodings never
    /// panic the decoders, and what decodes is within the ranges a healthy peer sends.
    #[test]
    fn fuzz_handshake_and_card_decoders() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let secs: f64 = std::env::var("WEFT_FUZZ_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1.0);
        let valid = Handshake {
            kind: HsKind::Req,
            from: 1,
            qpn: 17,
            psn: 5,
            credits: 32,
            echo_qpn: 0,
            eager_size: 8192,
            mtu: 3,
            card: card(),
            probe_addr: 1,
            probe_rkey: 2,
        }
        .encode();
        let cases = (secs * 30_000.0) as u32;
        let mut runner = TestRunner::new(Config {
            cases: cases.max(256),
            failure_persistence: None,
            ..Config::default()
        });
        let input = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..120),
            proptest::collection::vec((0..HS_LEN, any::<u8>()), 1..6).prop_map(move |edits| {
                let mut b = valid.to_vec();
                for (at, v) in edits {
                    b[at] = v;
                }
                b
            }),
        ];
        let decoded = std::cell::Cell::new(0u64);
        runner
            .run(&input, |b| {
                if let Some(h) = Handshake::decode(&b) {
                    decoded.set(decoded.get() + 1);
                    prop_assert!((1..=5).contains(&h.mtu));
                    prop_assert!(h.eager_size >= MIN_EAGER && h.credits >= 1);
                    prop_assert_eq!(Handshake::decode(&h.encode()), Some(h));
                }
                if let Ok(c) = Card::decode(&b[..b.len().min(CARD_LEN)]) {
                    prop_assert_eq!(Card::decode(&c.encode()).ok(), Some(c));
                }
                Ok(())
            })
            .unwrap();
        println!(
            "fuzz verbs-handshake: {} executions, {} decoded",
            cases.max(256),
            decoded.get()
        );
    }
}
