//! The native handshake: a process's hello to its node's server and the server's welcome.

use std::os::unix::net::UnixStream;

use super::InitError;
use crate::frame::{self, MAX_PEER_FRAME};
use crate::proto::{ClientMsg, ServerMsg, WelcomeHead, HELLO_TIMEOUT, MAGIC, PROTOCOL_VERSION};
use crate::ProcId;

/// Says hello on `s` as `me` with `token` and waits (`HELLO_TIMEOUT`) for the welcome: the
/// name of the node's datastore and the process that spawned the job, if one did. A refusal, a welcome of another protocol version or into
/// another namespace is an error naming it; `hs` makes a handshake error of a reason.
pub(super) fn hello(
    s: &mut UnixStream,
    me: ProcId,
    token: u64,
    hs: impl Fn(String) -> InitError,
) -> Result<(String, Option<ProcId>), InitError> {
    let ProcId { ns, rank } = me;
    let msg = ClientMsg::Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        rank,
        token,
        ns,
    };
    frame::write_sync(s, &msg).map_err(|e| hs(format!("cannot send hello: {e}")))?;
    // Held for a debugger (`env::HELD`), the welcome comes at the release, whenever that
    // is; a server that ends closes the socket, which ends the wait.
    let held = std::env::var_os(crate::env::HELD).is_some();
    s.set_read_timeout((!held).then_some(HELLO_TIMEOUT))
        .map_err(|e| hs(e.to_string()))?;
    let welcome = frame::read_sync_bytes(s, MAX_PEER_FRAME).map_err(|e| {
        hs(format!(
            "no welcome from the server ({e}; it is waited for {} s, HELLO_TIMEOUT)",
            HELLO_TIMEOUT.as_secs()
        ))
    })?;
    s.set_read_timeout(None).map_err(|e| hs(e.to_string()))?;
    // The field every version's welcome starts with first: a welcome of another version
    // need not decode whole, and is refused by its version.
    if let Ok(WelcomeHead::Welcome { version }) = frame::decode(&welcome) {
        if version != PROTOCOL_VERSION {
            return Err(hs(format!(
                "server speaks protocol version {version}, this client {PROTOCOL_VERSION}"
            )));
        }
    }
    match frame::decode::<ServerMsg>(&welcome) {
        Ok(ServerMsg::Welcome {
            datastore,
            ns: theirs,
            parent,
            ..
        }) if theirs == ns => Ok((datastore, parent)),
        Ok(ServerMsg::Welcome { ns: theirs, .. }) => Err(hs(format!(
            "the server took this process into namespace {theirs}, its hello named {ns}"
        ))),
        Ok(ServerMsg::Refused { reason }) => Err(InitError::Refused { rank, reason }),
        Ok(other) => Err(hs(format!("unexpected reply {other:?}"))),
        Err(e) => Err(hs(format!("undecodable welcome: {e}"))),
    }
}
