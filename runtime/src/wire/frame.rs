//! The frame codec on async streams (the runtime's tokio sockets), beside the blocking
//! codec and the limits it shares with the client (`weft_wireup::frame`, re-exported here).

use std::io;

use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use weft_wireup::frame::*;

/// Reads one frame from an async stream.
pub async fn read_async<T: DeserializeOwned>(
    r: &mut (impl AsyncRead + Unpin),
    max: usize,
) -> Result<T, FrameError> {
    decode(&read_async_bytes(r, max).await?)
}

/// Reads one frame's payload from an async stream, undecoded (for a reader that decodes
/// it more than one way, as a handshake does across protocol versions).
pub async fn read_async_bytes(
    r: &mut (impl AsyncRead + Unpin),
    max: usize,
) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]).await? {
            0 if got == 0 => return Err(FrameError::Closed),
            0 => return Err(FrameError::Truncated { got, want: 4 }),
            n => got += n,
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    check_len(len, max)?;
    // Grown as the bytes arrive: a length prefix alone allocates at most one chunk.
    let mut payload = Vec::with_capacity(len.min(READ_CHUNK));
    r.take(len as u64).read_to_end(&mut payload).await?;
    if payload.len() < len {
        return Err(FrameError::Truncated {
            got: payload.len(),
            want: len,
        });
    }
    Ok(payload)
}

/// Writes one pre-encoded frame to an async stream.
pub async fn write_async(w: &mut (impl AsyncWrite + Unpin), frame: &[u8]) -> io::Result<()> {
    w.write_all(frame).await
}
