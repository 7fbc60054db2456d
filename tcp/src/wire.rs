//! Bytes on the wire: the card, the handshake messages and the record header (all
//! little-endian; layouts in the crate docs). Pure codecs, no IO.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::Error;

/// First bytes of every handshake message.
pub(crate) const MAGIC: [u8; 4] = *b"WTCP";
/// Handshake protocol version.
pub(crate) const VERSION: u16 = 1;
/// Bytes of a HELLO.
pub(crate) const HELLO_LEN: usize = 48;
/// Bytes of a reply (ACK, NACK, LOSE) before the reason text.
pub(crate) const REPLY_LEN: usize = 16;
/// Longest reason text of a NACK.
pub(crate) const MAX_REASON: usize = 255;
/// Bytes of a record header.
pub(crate) const REC_LEN: usize = 16;
/// Longest bulk transfer the record header can describe (56-bit length).
pub(crate) const MAX_BULK: u64 = (1 << 56) - 1;

const KIND_HELLO: u16 = 1;
const KIND_ACK: u16 = 2;
const KIND_NACK: u16 = 3;
const KIND_LOSE: u16 = 4;

const REC_FRAME: u8 = 1;
const REC_BULK: u8 = 2;

const CARD_MAGIC: [u8; 2] = *b"WT";
const CARD_VERSION: u8 = 1;
const CARD_HEAD: usize = 12;

/// How to reach an endpoint: what [`crate::Endpoint::card`] encodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Card {
    /// Rank of the endpoint's process.
    pub rank: u32,
    /// Address and port it listens on.
    pub addr: SocketAddr,
}

impl Card {
    /// The card's bytes (16 bytes for IPv4, 28 for IPv6).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(CARD_HEAD + 16);
        v.extend_from_slice(&CARD_MAGIC);
        v.push(CARD_VERSION);
        v.push(if self.addr.is_ipv4() { 4 } else { 6 });
        v.extend_from_slice(&self.addr.port().to_le_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&self.rank.to_le_bytes());
        match self.addr.ip() {
            IpAddr::V4(ip) => v.extend_from_slice(&ip.octets()),
            IpAddr::V6(ip) => v.extend_from_slice(&ip.octets()),
        }
        v
    }

    /// Parses and validates a card.
    pub fn decode(b: &[u8]) -> Result<Card, Error> {
        let bad = |reason: String| Error::Card { reason };
        if b.len() < CARD_HEAD {
            return Err(bad(format!(
                "{} bytes, shorter than the {CARD_HEAD}-byte header",
                b.len()
            )));
        }
        if b[0..2] != CARD_MAGIC {
            return Err(bad("not a Weft TCP card (bad magic)".into()));
        }
        if b[2] != CARD_VERSION {
            return Err(bad(format!(
                "card version {} is not supported (this build reads version {CARD_VERSION})",
                b[2]
            )));
        }
        let port = u16::from_le_bytes([b[4], b[5]]);
        if b[6..8] != [0, 0] {
            return Err(bad("reserved bytes are not zero".into()));
        }
        let rank = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        let ip_bytes = &b[CARD_HEAD..];
        let ip = match (b[3], ip_bytes.len()) {
            (4, 4) => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(ip_bytes).expect("4"))),
            (6, 16) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(ip_bytes).expect("16"))),
            (4 | 6, n) => {
                return Err(bad(format!(
                    "an IPv{} card carries {n} address bytes",
                    b[3]
                )))
            }
            (f, _) => return Err(bad(format!("unknown address family {f}"))),
        };
        if port == 0 || ip.is_unspecified() {
            return Err(bad(format!("unusable address {ip}:{port}")));
        }
        Ok(Card {
            rank,
            addr: SocketAddr::new(ip, port),
        })
    }
}

/// The initiator's first message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) job: u64,
    pub(crate) secret: [u64; 2],
    pub(crate) from: u32,
    pub(crate) to: u32,
    pub(crate) max_frame: u32,
}

/// Why a HELLO could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HelloError {
    Magic,
    Version(u16),
    Kind(u16),
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&KIND_HELLO.to_le_bytes());
        b[8..16].copy_from_slice(&self.job.to_le_bytes());
        b[16..24].copy_from_slice(&self.secret[0].to_le_bytes());
        b[24..32].copy_from_slice(&self.secret[1].to_le_bytes());
        b[32..36].copy_from_slice(&self.from.to_le_bytes());
        b[36..40].copy_from_slice(&self.to.to_le_bytes());
        b[40..44].copy_from_slice(&self.max_frame.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; HELLO_LEN]) -> Result<Hello, HelloError> {
        if b[0..4] != MAGIC {
            return Err(HelloError::Magic);
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(HelloError::Version(version));
        }
        let kind = u16::from_le_bytes([b[6], b[7]]);
        if kind != KIND_HELLO {
            return Err(HelloError::Kind(kind));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4"));
        Ok(Hello {
            job: u64_at(8),
            secret: [u64_at(16), u64_at(24)],
            from: u32_at(32),
            to: u32_at(36),
            max_frame: u32_at(40),
        })
    }
}

/// The acceptor's answer to a HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Accepted: records may follow.
    Ack,
    /// Refused; `reason_len` bytes of UTF-8 text follow.
    Nack,
    /// Both sides connected at once and the acceptor's own connection wins.
    Lose,
}

pub(crate) fn encode_reply(kind: Reply, rank: u32, reason: &str) -> Vec<u8> {
    let mut r = reason.as_bytes();
    if r.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        r = &r[..end];
    }
    let k = match kind {
        Reply::Ack => KIND_ACK,
        Reply::Nack => KIND_NACK,
        Reply::Lose => KIND_LOSE,
    };
    let mut b = Vec::with_capacity(REPLY_LEN + r.len());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&k.to_le_bytes());
    b.extend_from_slice(&rank.to_le_bytes());
    b.extend_from_slice(&(r.len() as u16).to_le_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(r);
    b
}

/// Parses a reply header: (kind, acceptor's rank, bytes of reason text that follow).
pub(crate) fn decode_reply(b: &[u8; REPLY_LEN]) -> Result<(Reply, u32, usize), String> {
    if b[0..4] != MAGIC {
        return Err("its answer is not a Weft TCP handshake (bad magic)".into());
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != VERSION {
        return Err(format!(
            "it answered with protocol version {version} (this build speaks {VERSION})"
        ));
    }
    let kind = match u16::from_le_bytes([b[6], b[7]]) {
        KIND_ACK => Reply::Ack,
        KIND_NACK => Reply::Nack,
        KIND_LOSE => Reply::Lose,
        k => return Err(format!("its answer has unknown kind {k}")),
    };
    let rank = u32::from_le_bytes(b[8..12].try_into().expect("4"));
    let len = u16::from_le_bytes([b[12], b[13]]) as usize;
    if len > MAX_REASON || (kind != Reply::Nack && len != 0) || b[14..16] != [0, 0] {
        return Err("its answer is malformed".into());
    }
    Ok((kind, rank, len))
}

/// A parsed record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rec {
    /// An eager frame of this many bytes follows.
    Frame(usize),
    /// A bulk transfer follows.
    Bulk { token: u64, len: u64 },
}

pub(crate) fn rec_frame(len: usize) -> [u8; REC_LEN] {
    let mut b = [0u8; REC_LEN];
    b[0..8].copy_from_slice(&(REC_FRAME as u64 | (len as u64) << 8).to_le_bytes());
    b
}

pub(crate) fn rec_bulk(token: u64, len: u64) -> [u8; REC_LEN] {
    debug_assert!(len <= MAX_BULK);
    let mut b = [0u8; REC_LEN];
    b[0..8].copy_from_slice(&(REC_BULK as u64 | len << 8).to_le_bytes());
    b[8..16].copy_from_slice(&token.to_le_bytes());
    b
}

/// Parses and validates a record header; `Err` says what is wrong in words.
pub(crate) fn parse_rec(b: &[u8; REC_LEN], max_frame: usize) -> Result<Rec, String> {
    let w0 = u64::from_le_bytes(b[0..8].try_into().expect("8"));
    let w1 = u64::from_le_bytes(b[8..16].try_into().expect("8"));
    let len = w0 >> 8;
    match (w0 & 0xff) as u8 {
        REC_FRAME => {
            if w1 != 0 {
                return Err("a frame record header has non-zero reserved bytes".into());
            }
            if len > max_frame as u64 {
                return Err(format!(
                    "a frame of {len} bytes exceeds the largest frame ({max_frame} bytes)"
                ));
            }
            Ok(Rec::Frame(len as usize))
        }
        REC_BULK => Ok(Rec::Bulk { token: w1, len }),
        k => Err(format!("unknown record kind {k:#04x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn card_round_trip_v4_and_v6() {
        for addr in ["127.0.0.1:4242", "[::1]:65535", "127.0.0.2:1"] {
            let c = Card {
                rank: 77,
                addr: addr.parse().unwrap(),
            };
            let b = c.encode();
            assert_eq!(b.len(), if c.addr.is_ipv4() { 16 } else { 28 });
            assert_eq!(Card::decode(&b).unwrap(), c);
        }
    }

    #[test]
    fn malformed_cards_are_errors() {
        let good = Card {
            rank: 3,
            addr: "127.0.0.1:9000".parse().unwrap(),
        }
        .encode();
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "shorter"),
            (good[..11].to_vec(), "shorter"),
            (good[..15].to_vec(), "address bytes"),
            ([good.clone(), vec![0]].concat(), "address bytes"),
        ];
        let mut m = good.clone();
        m[0] = b'X';
        cases.push((m, "magic"));
        let mut m = good.clone();
        m[2] = 9;
        cases.push((m, "version 9"));
        let mut m = good.clone();
        m[3] = 5;
        cases.push((m, "family 5"));
        let mut m = good.clone();
        m[4..6].copy_from_slice(&[0, 0]);
        cases.push((m, "unusable"));
        let mut m = good.clone();
        m[12..16].copy_from_slice(&[0, 0, 0, 0]);
        cases.push((m, "unusable"));
        let mut m = good.clone();
        m[6] = 1;
        cases.push((m, "reserved"));
        for (bytes, want) in cases {
            let e = Card::decode(&bytes).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should mention {want:?}");
        }
    }

    #[test]
    fn hello_round_trip_and_checks() {
        let h = Hello {
            job: 0xdead_beef,
            secret: [1, 2],
            from: 5,
            to: 9,
            max_frame: 65536,
        };
        let b = h.encode();
        assert_eq!(Hello::decode(&b), Ok(h));
        let mut m = b;
        m[1] ^= 1;
        assert_eq!(Hello::decode(&m), Err(HelloError::Magic));
        let mut m = b;
        m[4] = 7;
        assert_eq!(Hello::decode(&m), Err(HelloError::Version(7)));
        let mut m = b;
        m[6] = 2;
        assert_eq!(Hello::decode(&m), Err(HelloError::Kind(2)));
    }

    #[test]
    fn reply_round_trip() {
        let b = encode_reply(Reply::Nack, 4, "wrong job secret");
        let (k, r, n) = decode_reply(b[..REPLY_LEN].try_into().unwrap()).unwrap();
        assert_eq!((k, r, n), (Reply::Nack, 4, 16));
        assert_eq!(&b[REPLY_LEN..], b"wrong job secret");
        let long = "é".repeat(200);
        let b = encode_reply(Reply::Nack, 4, &long);
        assert!(b.len() - REPLY_LEN <= MAX_REASON);
        assert!(std::str::from_utf8(&b[REPLY_LEN..]).is_ok());
        let b = encode_reply(Reply::Ack, 1, "");
        assert_eq!(
            decode_reply(b[..].try_into().unwrap()),
            Ok((Reply::Ack, 1, 0))
        );
    }

    #[test]
    fn record_headers() {
        assert_eq!(parse_rec(&rec_frame(0), 10), Ok(Rec::Frame(0)));
        assert_eq!(parse_rec(&rec_frame(10), 10), Ok(Rec::Frame(10)));
        assert!(parse_rec(&rec_frame(11), 10)
            .unwrap_err()
            .contains("11 bytes"));
        assert_eq!(
            parse_rec(&rec_bulk(u64::MAX, MAX_BULK), 10),
            Ok(Rec::Bulk {
                token: u64::MAX,
                len: MAX_BULK
            })
        );
        let mut b = rec_frame(1);
        b[0] = 9;
        assert!(parse_rec(&b, 10).unwrap_err().contains("kind"));
        let mut b = rec_frame(1);
        b[9] = 1;
        assert!(parse_rec(&b, 10).unwrap_err().contains("reserved"));
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Card::decode(&bytes);
            if bytes.len() >= HELLO_LEN {
                let _ = Hello::decode(bytes[..HELLO_LEN].try_into().unwrap());
            }
            if bytes.len() >= REC_LEN {
                if let Ok(Rec::Frame(n)) = parse_rec(bytes[..REC_LEN].try_into().unwrap(), 1000) {
                    prop_assert!(n <= 1000);
                }
                let _ = decode_reply(bytes[..REPLY_LEN].try_into().unwrap());
            }
        }

        #[test]
        fn records_round_trip(len in 0usize..1 << 20, token: u64, blen in 0u64..=MAX_BULK) {
            prop_assert_eq!(parse_rec(&rec_frame(len), 1 << 20), Ok(Rec::Frame(len)));
            prop_assert_eq!(parse_rec(&rec_bulk(token, blen), 0), Ok(Rec::Bulk { token, len: blen }));
        }
    }
}
