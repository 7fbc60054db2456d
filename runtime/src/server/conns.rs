//! Connection tasks: clients over the node's Unix socket, peer servers over TCP. They
//! parse frames and forward events to the server's actor.

use super::*;

pub(super) async fn client_conn(s: UnixStream, conn: ConnId, uid: u32, ev: UnboundedSender<Event>) {
    match s.peer_cred() {
        Ok(c) if c.uid() == uid => {}
        Ok(c) => {
            tracing::warn!(
                "dropping client connection: peer uid {} is not the job owner's uid {uid}",
                c.uid()
            );
            return;
        }
        Err(e) => {
            tracing::warn!("dropping client connection: cannot read peer credentials: {e}");
            return;
        }
    }
    let (mut r, mut w) = s.into_split();
    let hello = tokio::time::timeout(
        Duration::from_secs(30),
        frame::read_async::<ClientMsg>(&mut r, MAX_CLIENT_FRAME),
    )
    .await;

    let (rank, token) = match hello {
        Err(_) => return refuse(&mut w, "no hello within 30 s".into()).await,
        Ok(Err(e)) => return refuse(&mut w, format!("bad hello: {e}")).await,
        Ok(Ok(ClientMsg::Hello {
            magic,
            version,
            rank,
            token,
        })) => {
            if magic != MAGIC {
                return refuse(&mut w, format!("bad magic {magic:?} in hello")).await;
            }
            if version != PROTOCOL_VERSION {
                return refuse(&mut w, format!("client speaks protocol version {version}, this server speaks {PROTOCOL_VERSION}")).await;
            }
            (rank, token)
        }
        Ok(Ok(other)) => {
            return refuse(
                &mut w,
                format!("first message is not a hello: {}", msg_name(&other)),
            )
            .await
        }
    };
    let (tx, mut rx) = unbounded_channel::<Out>();
    tokio::spawn(async move {
        while let Some(o) = rx.recv().await {
            match o {
                Out::Frame(f) => {
                    if frame::write_async(&mut w, &f).await.is_err() {
                        break;
                    }
                }
                Out::Close => break,
            }
        }
    });
    if ev
        .send(Event::ClientHello {
            conn,
            rank,
            token,
            tx,
        })
        .is_err()
    {
        return;
    }
    loop {
        match frame::read_async::<ClientMsg>(&mut r, MAX_CLIENT_FRAME).await {
            Ok(msg) => {
                if ev.send(Event::Client { conn, msg }).is_err() {
                    return;
                }
            }
            Err(e) => {
                let reason = match e {
                    FrameError::Closed => String::new(),
                    FrameError::Io(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                        String::new()
                    }
                    e => {
                        tracing::warn!("dropping client connection of rank {rank}: {e}");
                        e.to_string()
                    }
                };
                let _ = ev.send(Event::ClientGone { conn, reason });
                return;
            }
        }
    }
}

pub(super) async fn refuse(w: &mut tokio::net::unix::OwnedWriteHalf, reason: String) {
    tracing::warn!("dropping client connection: {reason}");
    let _ = frame::write_async(w, &frame::encode(&ServerMsg::Refused { reason })).await;
}

pub(super) fn msg_name(m: &ClientMsg) -> &'static str {
    match m {
        ClientMsg::Hello { .. } => "hello",
        ClientMsg::Commit { .. } => "commit",
        ClientMsg::Fence { .. } => "fence",
        ClientMsg::Get { .. } => "get",
        ClientMsg::Finalize { .. } => "finalize",
        ClientMsg::Group { .. } => "group",
        ClientMsg::GroupQuery { .. } => "group query",
        ClientMsg::GroupLeave { .. } => "group leave",
        ClientMsg::LeaderClaim { .. } => "leader claim",
        ClientMsg::PsetDefine { .. } => "pset define",
        ClientMsg::PsetDelete { .. } => "pset delete",
        ClientMsg::GroupInvite { .. } => "group invite",
        ClientMsg::GroupJoin { .. } => "group join",
    }
}

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
