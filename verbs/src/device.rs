//! Device and port discovery, GID selection, and the `WEFT_VERBS_*` configuration.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::sys::{self, Context, Cq, GidKind, Pd, Qp, QpCaps, QpType};
use crate::Error;
use weft_tunables::Tunable;

/// Tunables of the verbs transport, listed by `weft info` and read by
/// [`Config::from_env`] (in `weft_tunables`' syntax).
pub const TUNABLES: &[Tunable] = &[
    Tunable::new(
        "WEFT_VERBS_DEVICE",
        "first device",
        "verbs device to use (e.g. rxe0, mlx5_0)",
    ),
    Tunable::new(
        "WEFT_VERBS_PORT",
        "1",
        "port number of the device",
    ),
    Tunable::new(
        "WEFT_VERBS_GID_INDEX",
        "auto",
        "GID index; auto picks the first RoCE v2 IPv4 GID (else RoCE v2, else index 0 on InfiniBand)",
    ),
    Tunable::new(
        "WEFT_VERBS_EAGER_SIZE",
        "8192",
        "bytes of one eager buffer: the largest frame (32-byte header + payload) sent eagerly",
    ),
    Tunable::new(
        "WEFT_VERBS_CREDITS",
        "32",
        "eager receives granted to each connected peer (flow-control credits)",
    ),
    Tunable::new(
        "WEFT_VERBS_SRQ_SIZE",
        "1024",
        "most eager receive buffers posted to the shared receive queue",
    ),
    Tunable::new(
        "WEFT_VERBS_SEND_BUFS",
        "256",
        "registered send buffers for frames too large to send inline",
    ),
    Tunable::new(
        "WEFT_VERBS_SQ_DEPTH",
        "128",
        "send queue depth of each RC queue pair",
    ),
    Tunable::new(
        "WEFT_VERBS_SIGNAL_EVERY",
        "16",
        "request a send completion every N sends (selective signaling)",
    ),
    Tunable::new(
        "WEFT_VERBS_MAX_INLINE",
        "device max",
        "largest frame sent inline (copied by the CPU into the work request); 0 disables inline",
    ),
    Tunable::new(
        "WEFT_VERBS_ACK_TIMEOUT",
        "14",
        "RC ACK timeout exponent (4.096 us * 2^N); a dead peer is an error after (retries + 1) x that",
    ),
    Tunable::new(
        "WEFT_VERBS_RETRY_CNT",
        "6",
        "RC transport retries before a send to a silent peer fails (0..=7; rxe treats 7 as infinite)",
    ),
    Tunable::new(
        "WEFT_VERBS_RCACHE",
        "auto",
        "keep the registrations of user buffers between uses (on: faster for reused buffers, but the program must not free and reuse such memory while the endpoint is open) or register per use (off); auto: on for a bare Endpoint, off under the fabric",
    ),
    Tunable::new(
        "WEFT_VERBS_KEEP_REGISTRATIONS",
        "auto",
        "the same knob as WEFT_VERBS_RCACHE, under the name the fabric gave it (WEFT_VERBS_RCACHE wins when both are set)",
    ),
    Tunable::new(
        "WEFT_VERBS_RCACHE_MAX",
        "256",
        "most cached registrations; the least recently used is evicted",
    ),
    Tunable::new(
        "WEFT_VERBS_HANDSHAKE_TIMEOUT_MS",
        "10000",
        "a connection handshake without an answer fails after this many milliseconds (under the fabric: a warning, and it goes on while the peer lives)",
    ),
];

/// Endpoint configuration; [`Config::from_env`] reads the `WEFT_VERBS_*` tunables.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// This process's peer id as the others know it (its rank): carried in handshakes.
    pub id: u32,
    /// Device name; `None` takes the first.
    pub device: Option<String>,
    /// Port number.
    pub port: u8,
    /// GID index; `None` picks one (see [`TUNABLES`]).
    pub gid_index: Option<u32>,
    /// Bytes of one eager buffer (largest eager frame).
    pub eager_size: usize,
    /// Eager receives granted to each peer.
    pub credits: u32,
    /// Most receive buffers in the shared receive queue.
    pub srq_size: u32,
    /// Registered send buffers.
    pub send_bufs: u32,
    /// Send queue depth per RC queue pair.
    pub sq_depth: u32,
    /// Selective signaling interval.
    pub signal_every: u32,
    /// Largest inline frame; `None` uses the device's maximum.
    pub max_inline: Option<u32>,
    /// RC ACK timeout exponent.
    pub ack_timeout: u8,
    /// RC retry count.
    pub retry_cnt: u8,
    /// Cache registrations.
    pub rcache: bool,
    /// Most cached registrations.
    pub rcache_max: usize,
    /// Handshake timeout: a connection whose handshake has no answer this long fails
    /// with [`crate::Error::HandshakeTimeout`], unless `patient_handshakes`.
    pub handshake_timeout: Duration,
    /// Never fail a handshake for want of an answer: keep asking (every 800 ms once
    /// past the first tries) and log a warning every `handshake_timeout`. For owners
    /// that know by other means whether the peer is alive (the fabric asks wire-up), so
    /// that a peer busy outside any call for a long time is not taken for a dead one.
    pub patient_handshakes: bool,
}

impl Config {
    /// Defaults (the ones in [`TUNABLES`]) for peer id `id`.
    pub fn new(id: u32) -> Config {
        Config {
            id,
            device: None,
            port: 1,
            gid_index: None,
            eager_size: 8192,
            credits: 32,
            srq_size: 1024,
            send_bufs: 256,
            sq_depth: 128,
            signal_every: 16,
            max_inline: None,
            ack_timeout: 14,
            retry_cnt: 6,
            rcache: true,
            rcache_max: 256,
            handshake_timeout: Duration::from_secs(10),
            patient_handshakes: false,
        }
    }

    /// Defaults overridden by the `WEFT_VERBS_*` environment variables.
    pub fn from_env(id: u32) -> Result<Config, Error> {
        Config::new(id).apply_env()
    }

    /// This configuration overridden by the `WEFT_VERBS_*` variables that are set (the
    /// fabric starts from its own defaults: registrations not kept).
    pub fn apply_env(self) -> Result<Config, Error> {
        let mut c = self;
        fn var(name: &'static str) -> Option<String> {
            weft_tunables::find(TUNABLES, name).set()
        }
        fn num<T: TryFrom<u64>>(
            name: &'static str,
            min: u64,
            max: u64,
        ) -> Result<Option<T>, Error> {
            let t = weft_tunables::find(TUNABLES, name);
            let bad = |value: String, reason: String| Error::Config {
                name,
                value,
                reason,
            };
            let Some(n) = t
                .if_set(&weft_tunables::env, |t| t.count(min, max))
                .map_err(|e| bad(e.value.clone(), e.reason()))?
            else {
                return Ok(None);
            };
            T::try_from(n)
                .map(Some)
                .map_err(|_| bad(n.to_string(), "out of range".into()))
        }
        fn size(name: &'static str, min: u64, max: u64) -> Result<Option<usize>, Error> {
            let t = weft_tunables::find(TUNABLES, name);
            t.if_set(&weft_tunables::env, |t| t.size(min, max))
                .map(|n| n.map(|n| n as usize))
                .map_err(|e| Error::Config {
                    name,
                    reason: e.reason(),
                    value: e.value,
                })
        }
        c.device = var("WEFT_VERBS_DEVICE");
        if let Some(v) = num("WEFT_VERBS_PORT", 1, 255)? {
            c.port = v;
        }
        c.gid_index = num("WEFT_VERBS_GID_INDEX", 0, 1 << 16)?;
        if let Some(v) = size("WEFT_VERBS_EAGER_SIZE", 64, 1 << 20)? {
            c.eager_size = v;
        }
        if let Some(v) = num("WEFT_VERBS_CREDITS", 2, 4096)? {
            c.credits = v;
        }
        if let Some(v) = num("WEFT_VERBS_SRQ_SIZE", 8, 1 << 20)? {
            c.srq_size = v;
        }
        if let Some(v) = num("WEFT_VERBS_SEND_BUFS", 2, 1 << 16)? {
            c.send_bufs = v;
        }
        if let Some(v) = num("WEFT_VERBS_SQ_DEPTH", 8, 1 << 16)? {
            c.sq_depth = v;
        }
        if let Some(v) = num("WEFT_VERBS_SIGNAL_EVERY", 1, 1 << 16)? {
            c.signal_every = v;
        }
        c.max_inline = num("WEFT_VERBS_MAX_INLINE", 0, 1 << 16)?;
        if let Some(v) = num("WEFT_VERBS_ACK_TIMEOUT", 1, 31)? {
            c.ack_timeout = v;
        }
        if let Some(v) = num("WEFT_VERBS_RETRY_CNT", 0, 7)? {
            c.retry_cnt = v;
        }
        // WEFT_VERBS_KEEP_REGISTRATIONS: the name the fabric gave the same knob.
        for name in ["WEFT_VERBS_KEEP_REGISTRATIONS", "WEFT_VERBS_RCACHE"] {
            if var(name).is_some() {
                let t = weft_tunables::find(TUNABLES, name);
                c.rcache = t.switch().map_err(|e| Error::Config {
                    name,
                    reason: e.reason(),
                    value: e.value,
                })?;
            }
        }
        if let Some(v) = num("WEFT_VERBS_RCACHE_MAX", 1, 1 << 20)? {
            c.rcache_max = v;
        }
        let t = weft_tunables::find(TUNABLES, "WEFT_VERBS_HANDSHAKE_TIMEOUT_MS");
        let (lo, hi) = (Duration::from_millis(1), Duration::from_millis(1 << 32));
        if let Some(d) = t
            .if_set(&weft_tunables::env, |t| t.millis(lo, hi))
            .map_err(|e| Error::Config {
                name: t.name,
                reason: e.reason(),
                value: e.value,
            })?
        {
            c.handshake_timeout = d;
        }
        Ok(c)
    }
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the table.
    pub index: u32,
    /// The GID.
    pub gid: [u8; 16],
    /// RoCE v2 (else InfiniBand or RoCE v1).
    pub roce_v2: bool,
}

impl GidEntry {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        std::net::Ipv6Addr::from(self.gid).to_ipv4_mapped()
    }
}

impl fmt::Display for GidEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ip = std::net::Ipv6Addr::from(self.gid);
        let kind = if self.roce_v2 {
            "RoCE v2"
        } else {
            "IB/RoCE v1"
        };
        write!(f, "[{}] {ip} ({kind})", self.index)
    }
}

/// What discovery found about the device and port an endpoint uses.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// Device name.
    pub device: String,
    /// Port number.
    pub port: u8,
    /// Port state (`ACTIVE`, `DOWN`, ...).
    pub port_state: &'static str,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: &'static str,
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Non-empty GID table entries.
    pub gids: Vec<GidEntry>,
    /// The GID index in use.
    pub gid_index: u32,
    /// Active MTU in bytes.
    pub active_mtu: u32,
    /// Largest MTU of the port in bytes.
    pub max_mtu: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Active MTU as `ibv_mtu` value (1 = 256 ... 5 = 4096).
    pub(crate) active_mtu_enum: u32,
    /// Largest inline send of an RC queue pair.
    pub max_inline: u32,
    /// Largest message (send or RDMA read) of the port.
    pub max_msg_size: u64,
    /// Send/receive queue depth limit.
    pub max_qp_wr: u32,
    /// Completion queue size limit.
    pub max_cqe: u32,
    /// Shared receive queue size limit.
    pub max_srq_wr: u32,
    /// Largest registration.
    pub max_mr_size: u64,
    /// Outstanding RDMA reads per queue pair (as initiator).
    pub max_rd_atomic: u32,
    /// Outstanding RDMA reads per queue pair (as target).
    pub max_dest_rd_atomic: u32,
}

impl DeviceInfo {
    /// The GID in use.
    pub fn gid(&self) -> [u8; 16] {
        self.gids
            .iter()
            .find(|g| g.index == self.gid_index)
            .map(|g| g.gid)
            .unwrap_or([0; 16])
    }

    /// Whether the link layer is Ethernet (RoCE: global routing always on).
    pub fn is_roce(&self) -> bool {
        self.link_layer == "Ethernet"
    }
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "device          {} port {}", self.device, self.port)?;
        writeln!(f, "port state      {}", self.port_state)?;
        writeln!(f, "link layer      {}", self.link_layer)?;
        writeln!(f, "LID             {}", self.lid)?;
        writeln!(f, "GID in use      index {}", self.gid_index)?;
        for g in &self.gids {
            writeln!(f, "  gid           {g}")?;
        }
        writeln!(
            f,
            "active MTU      {} bytes (max {})",
            self.active_mtu, self.max_mtu
        )?;
        writeln!(f, "max inline      {} bytes", self.max_inline)?;
        writeln!(f, "max message     {} bytes", self.max_msg_size)?;
        writeln!(f, "max QP WRs      {}", self.max_qp_wr)?;
        writeln!(f, "max SGEs        {}", self.max_sge)?;
        writeln!(f, "max CQEs        {}", self.max_cqe)?;
        writeln!(f, "max SRQ WRs     {}", self.max_srq_wr)?;
        writeln!(f, "max MR size     {} bytes", self.max_mr_size)?;
        write!(
            f,
            "max RDMA reads  {} out / {} in",
            self.max_rd_atomic, self.max_dest_rd_atomic
        )
    }
}

/// Picks the GID: an explicit index (validated), else the first RoCE v2 IPv4-mapped one,
/// else the first RoCE v2 one, else index 0 on InfiniBand.
pub(crate) fn pick_gid(
    device: &str,
    port: u8,
    ib: bool,
    gids: &[GidEntry],
    forced: Option<u32>,
) -> Result<u32, Error> {
    if let Some(i) = forced {
        return if gids.iter().any(|g| g.index == i) {
            Ok(i)
        } else {
            Err(Error::Config {
                name: "WEFT_VERBS_GID_INDEX",
                value: i.to_string(),
                reason: format!("{device} port {port} has no GID at that index"),
            })
        };
    }
    let pick = gids
        .iter()
        .find(|g| g.roce_v2 && g.ipv4().is_some())
        .or_else(|| gids.iter().find(|g| g.roce_v2))
        .or_else(|| {
            if ib {
                gids.iter().find(|g| g.index == 0)
            } else {
                None
            }
        });
    pick.map(|g| g.index).ok_or_else(|| Error::NoDevice {
        reason: format!(
            "{device} port {port} has no RoCE v2 GID (is an IP address assigned to its network \
             interface?); set WEFT_VERBS_GID_INDEX to choose one"
        ),
    })
}

/// Largest inline data an RC queue pair of this device accepts (probed by creating one).
fn probe_max_inline(ctx: &Arc<Context>, pd: &Arc<Pd>) -> Result<u32, Error> {
    let cq = Cq::new(ctx, 16)?;
    let mut want = 1024;
    loop {
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_inline: want,
        };
        match Qp::create(pd, QpType::Rc, &cq, &cq, None, caps) {
            Ok(qp) => return Ok(qp.max_inline()),
            Err(e) if want == 0 => return Err(e),
            Err(_) => want /= 2,
        }
    }
}

/// Discovers the device, port and GID an endpoint with `cfg` uses.
pub(crate) fn discover(
    ctx: &Arc<Context>,
    pd: &Arc<Pd>,
    cfg: &Config,
) -> Result<DeviceInfo, Error> {
    let dev = ctx.query_device()?;
    if cfg.port == 0 || cfg.port > dev.phys_port_cnt {
        return Err(Error::Config {
            name: "WEFT_VERBS_PORT",
            value: cfg.port.to_string(),
            reason: format!("{} has ports 1..={}", ctx.name(), dev.phys_port_cnt),
        });
    }
    let port = ctx.query_port(cfg.port)?;
    if port.state != sys::PORT_ACTIVE {
        return Err(Error::NoDevice {
            reason: format!(
                "{} port {} is {}, not ACTIVE",
                ctx.name(),
                cfg.port,
                sys::port_state_name(port.state)
            ),
        });
    }
    let table = ctx
        .query_gid_table(cfg.port, port.gid_tbl_len)
        .unwrap_or_else(|| {
            (0..port.gid_tbl_len)
                .filter_map(|index| {
                    let (gid, kind) = ctx.query_gid(cfg.port, index).ok()?;
                    Some((index, gid, kind))
                })
                .collect()
        });
    let mut gids: Vec<GidEntry> = table
        .into_iter()
        .filter(|(_, gid, _)| *gid != [0; 16])
        .map(|(index, gid, kind)| GidEntry {
            index,
            gid,
            roce_v2: kind == GidKind::RoceV2,
        })
        .collect();
    gids.sort_by_key(|g| g.index);
    let ib = port.link_layer == sys::LINK_LAYER_INFINIBAND;
    let gid_index = pick_gid(ctx.name(), cfg.port, ib, &gids, cfg.gid_index)?;
    let probed = probe_max_inline(ctx, pd)?;
    Ok(DeviceInfo {
        device: ctx.name().to_string(),
        port: cfg.port,
        port_state: sys::port_state_name(port.state),
        link_layer: match port.link_layer {
            sys::LINK_LAYER_INFINIBAND => "InfiniBand",
            sys::LINK_LAYER_ETHERNET => "Ethernet",
            _ => "unspecified",
        },
        lid: port.lid,
        gids,
        gid_index,
        active_mtu: sys::mtu_bytes(port.active_mtu),
        active_mtu_enum: port.active_mtu,
        max_mtu: sys::mtu_bytes(port.max_mtu),
        max_sge: dev.max_sge,
        max_inline: cfg.max_inline.map_or(probed, |m| m.min(probed)),
        max_msg_size: u64::from(port.max_msg_sz),
        max_qp_wr: dev.max_qp_wr,
        max_cqe: dev.max_cqe,
        max_srq_wr: dev.max_srq_wr,
        max_mr_size: dev.max_mr_size,
        max_rd_atomic: dev.max_qp_init_rd_atom,
        max_dest_rd_atomic: dev.max_qp_rd_atom,
    })
}

/// Discovers the device the `WEFT_VERBS_*` settings select.
pub fn query_device() -> Result<DeviceInfo, Error> {
    let cfg = Config::from_env(0)?;
    let ctx = Context::open(cfg.device.as_deref())?;
    let pd = Pd::new(&ctx)?;
    discover(&ctx, &pd, &cfg)
}

/// A printable description of the verbs device in use (for `weft info`), or why there is
/// none (`Error::NoDevice`).
pub fn describe() -> Result<String, Error> {
    let names = sys::device_names()?;
    let info = query_device()?;
    Ok(format!("devices         {}\n{info}", names.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(index: u32, gid: [u8; 16], roce_v2: bool) -> GidEntry {
        GidEntry {
            index,
            gid,
            roce_v2,
        }
    }

    const V6: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    const V4: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2];

    #[test]
    fn picks_roce_v2_ipv4_first() {
        let gids = [
            g(0, V6, false),
            g(1, V6, true),
            g(2, V4, false),
            g(3, V4, true),
        ];
        assert_eq!(pick_gid("d", 1, false, &gids, None).unwrap(), 3);
        assert_eq!(gids[3].ipv4(), Some(std::net::Ipv4Addr::new(127, 0, 0, 2)));
        // Without an IPv4 RoCE v2 GID the first RoCE v2 one.
        assert_eq!(pick_gid("d", 1, false, &gids[..3], None).unwrap(), 1);
        // RoCE without any v2 GID is an error naming the way out; InfiniBand takes index 0.
        let e = pick_gid("rxe9", 1, false, &gids[..1], None).unwrap_err();
        assert!(e.to_string().contains("WEFT_VERBS_GID_INDEX"), "{e}");
        assert_eq!(pick_gid("d", 1, true, &gids[..1], None).unwrap(), 0);
    }

    #[test]
    fn forced_gid_index_is_validated() {
        let gids = [g(0, V6, false), g(1, V4, true)];
        assert_eq!(pick_gid("d", 1, false, &gids, Some(0)).unwrap(), 0);
        assert!(matches!(
            pick_gid("d", 1, false, &gids, Some(7)),
            Err(Error::Config { .. })
        ));
    }

    #[test]
    fn every_config_field_has_a_tunable() {
        for name in [
            "WEFT_VERBS_DEVICE",
            "WEFT_VERBS_PORT",
            "WEFT_VERBS_GID_INDEX",
            "WEFT_VERBS_EAGER_SIZE",
            "WEFT_VERBS_CREDITS",
            "WEFT_VERBS_SRQ_SIZE",
            "WEFT_VERBS_SEND_BUFS",
            "WEFT_VERBS_SQ_DEPTH",
            "WEFT_VERBS_SIGNAL_EVERY",
            "WEFT_VERBS_MAX_INLINE",
            "WEFT_VERBS_ACK_TIMEOUT",
            "WEFT_VERBS_RETRY_CNT",
            "WEFT_VERBS_RCACHE",
            "WEFT_VERBS_RCACHE_MAX",
            "WEFT_VERBS_HANDSHAKE_TIMEOUT_MS",
        ] {
            assert!(
                TUNABLES.iter().any(|t| t.name == name),
                "{name} missing from TUNABLES"
            );
        }
        let c = Config::new(0);
        assert_eq!(c.eager_size.to_string(), TUNABLES[3].default);
        assert_eq!(c.credits.to_string(), TUNABLES[4].default);
    }
}
