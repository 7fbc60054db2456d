//! Length-prefixed frames: a little-endian `u32` length, then a postcard payload; read
//! and written here on blocking streams (the runtime's async reader and writer are
//! `weft_runtime::wire::frame`).
//!
//! Both ends refuse a frame longer than the limit before allocating for it, so a
//! length of 4 GiB or a stream of garbage costs nothing but the connection.

use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest frame a client may send to its server (cards are small; commits batch them).
pub const MAX_CLIENT_FRAME: usize = 64 << 20;
/// Largest frame between servers or between the launcher and a server.
pub const MAX_PEER_FRAME: usize = 1 << 30;

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("connection closed in the middle of a frame ({got} of {want} bytes)")]
    Truncated { got: usize, want: usize },
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLong { len: usize, max: usize },
    #[error("undecodable frame of {len} bytes: {source}")]
    Decode {
        len: usize,
        #[source]
        source: postcard::Error,
    },
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
}

/// Encodes `msg` as one frame (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut buf = vec![0u8; 4];
    // Serializing our own enums into a Vec cannot fail.
    let out = postcard::to_extend(msg, buf).expect("postcard encoding into a Vec");
    buf = out;
    let len = (buf.len() - 4) as u32;
    buf[..4].copy_from_slice(&len.to_le_bytes());
    buf
}

/// Decodes one frame's payload (the bytes after the length prefix).
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    postcard::from_bytes(payload).map_err(|source| FrameError::Decode {
        len: payload.len(),
        source,
    })
}

/// Refuses a frame length above `max`, before anything is allocated for it.
pub fn check_len(len: usize, max: usize) -> Result<(), FrameError> {
    if len > max {
        Err(FrameError::TooLong { len, max })
    } else {
        Ok(())
    }
}

/// Reads exactly `buf.len()` bytes, telling a clean EOF at offset 0 from a truncation.
fn read_full(r: &mut impl Read, buf: &mut [u8], want_total: usize) -> Result<(), FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 && want_total == 0 => return Err(FrameError::Closed),
            Ok(0) => {
                return Err(FrameError::Truncated {
                    got,
                    want: buf.len(),
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(())
}

/// Reads one frame from a blocking stream.
pub fn read_sync<T: DeserializeOwned>(r: &mut impl Read, max: usize) -> Result<T, FrameError> {
    decode(&read_sync_bytes(r, max)?)
}

/// Reads one frame's payload from a blocking stream, undecoded (for a reader that decodes
/// it more than one way, as a handshake does across protocol versions).
pub fn read_sync_bytes(r: &mut impl Read, max: usize) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    read_full(r, &mut len, 0)?;
    let len = u32::from_le_bytes(len) as usize;
    check_len(len, max)?;
    // Grown as the bytes arrive: a length prefix alone allocates at most one chunk.
    let mut payload = Vec::with_capacity(len.min(READ_CHUNK));
    loop {
        match r
            .by_ref()
            .take((len - payload.len()) as u64)
            .read_to_end(&mut payload)
        {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    if payload.len() < len {
        return Err(FrameError::Truncated {
            got: payload.len(),
            want: len,
        });
    }
    Ok(payload)
}

/// How much of a frame is allocated ahead of its bytes.
pub const READ_CHUNK: usize = 64 << 10;

/// Writes one frame to a blocking stream.
pub fn write_sync<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    w.write_all(&encode(msg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_oversized_length_before_allocating() {
        let mut bytes: &[u8] = &[0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        let e = read_sync::<u32>(&mut bytes, MAX_CLIENT_FRAME).unwrap_err();
        assert!(
            matches!(
                e,
                FrameError::TooLong {
                    len: 0xffff_ffff,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn tells_truncation_from_clean_close() {
        let mut empty: &[u8] = &[];
        assert!(matches!(
            read_sync::<u32>(&mut empty, 64),
            Err(FrameError::Closed)
        ));
        let mut short: &[u8] = &[10, 0, 0, 0, 1, 2];
        assert!(matches!(
            read_sync::<u32>(&mut short, 64),
            Err(FrameError::Truncated { got: 2, want: 10 })
        ));
        let mut half_len: &[u8] = &[10, 0];
        assert!(matches!(
            read_sync::<u32>(&mut half_len, 64),
            Err(FrameError::Truncated { .. })
        ));
    }

    #[test]
    fn garbage_payload_is_a_decode_error() {
        let mut bytes: &[u8] = &[3, 0, 0, 0, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_sync::<(u64, u64)>(&mut bytes, 64),
            Err(FrameError::Decode { .. })
        ));
    }

    proptest! {
        #[test]
        fn frames_round_trip(v in proptest::collection::vec(any::<(u32, String)>(), 0..20)) {
            let enc = encode(&v);
            let dec: Vec<(u32, String)> = read_sync(&mut enc.as_slice(), MAX_CLIENT_FRAME).unwrap();
            prop_assert_eq!(dec, v);
        }
    }
}
