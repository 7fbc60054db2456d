//! The connections with the other nodes' servers (TCP): tasks that parse their frames
//! and forward them to the server's actor, and write what it sends them.

use super::*;

pub(super) async fn peer_reader(s: TcpStream, secret: [u64; 2], ev: UnboundedSender<Event>) {
    s.set_nodelay(true).ok();
    let (mut r, _w) = s.into_split();
    let node = match frame::read_async::<PeerMsg>(&mut r, MAX_PEER_FRAME).await {
        Ok(PeerMsg::Hello {
            magic,
            version,
            secret: s2,
            node,
        }) if magic == MAGIC && version == PROTOCOL_VERSION && s2 == secret => node,
        Ok(PeerMsg::Hello { version, .. }) if version != PROTOCOL_VERSION => {
            tracing::warn!("dropping peer connection: it speaks protocol version {version}, this server {PROTOCOL_VERSION}");
            return;
        }
        Ok(_) => {
            tracing::warn!("dropping peer connection: bad hello (wrong magic or job secret)");
            return;
        }
        Err(e) => {
            tracing::warn!("dropping peer connection: {e}");
            return;
        }
    };
    loop {
        match frame::read_async::<PeerMsg>(&mut r, MAX_PEER_FRAME).await {
            Ok(msg) => {
                if ev.send(Event::Peer { msg }).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = ev.send(Event::PeerLost {
                    node,
                    reason: e.to_string(),
                });
                return;
            }
        }
    }
}

pub(super) async fn peer_writer(
    addr: SocketAddr,
    hello: Vec<u8>,
    node: u32,
    mut rx: UnboundedReceiver<Vec<u8>>,
    ev: UnboundedSender<Event>,
) {
    let mut s = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => {
            let _ = ev.send(Event::PeerLost {
                node,
                reason: format!("cannot connect to {addr}: {e}"),
            });
            return;
        }
    };
    s.set_nodelay(true).ok();
    if let Err(e) = frame::write_async(&mut s, &hello).await {
        let _ = ev.send(Event::PeerLost {
            node,
            reason: e.to_string(),
        });
        return;
    }
    while let Some(f) = rx.recv().await {
        if let Err(e) = frame::write_async(&mut s, &f).await {
            let _ = ev.send(Event::PeerLost {
                node,
                reason: e.to_string(),
            });
            return;
        }
    }
}
