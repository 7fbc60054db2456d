//! Geometry of an inbox and its `WEFT_SHM_*` tunables.

use weft_tunables::Tunable;

use crate::error::ShmError;
use crate::layout::{
    CLAIM_BYTES, FASTBOX_CTL_BYTES, FASTBOX_CTL_OFFSET, FASTBOX_MIN_BYTES, PAIR_LINE_BYTES,
    QUEUE_SLOT_ALIGN, RING_ALIGN,
};

/// Most fastboxes one inbox may have.
pub(crate) const MAX_FASTBOX_PEERS: u32 = 1 << 16;
/// Largest fastbox ring (bytes).
pub(crate) const MAX_FASTBOX_BYTES: u32 = 1 << 30;
/// Most queue slots.
pub(crate) const MAX_QUEUE_SLOTS: u32 = 1 << 24;
/// Largest queue slot (bytes).
pub(crate) const MAX_QUEUE_SLOT_BYTES: u32 = 1 << 24;
/// Most pair lines (one per sender id, and sender ids are below 2^24).
pub(crate) const MAX_PAIR_LINES: u32 = 1 << 24;

const ENV_FASTBOX_PEERS: &str = "WEFT_SHM_FASTBOX_PEERS";
const ENV_FASTBOX_BYTES: &str = "WEFT_SHM_FASTBOX_BYTES";
const ENV_QUEUE_SLOTS: &str = "WEFT_SHM_QUEUE_SLOTS";
const ENV_QUEUE_SLOT_BYTES: &str = "WEFT_SHM_QUEUE_SLOT_BYTES";
const ENV_PAIR_LINES: &str = "WEFT_SHM_PAIR_LINES";

/// The tunables of the shared-memory transport, for `weft info` and
/// [`InboxConfig::from_env`] (sizes in `weft_tunables`' syntax: `16k`, `1m`).
pub const TUNABLES: &[Tunable] = &[
    Tunable::new(
        ENV_FASTBOX_PEERS,
        "32",
        "senders per inbox that get a fastbox (a private ring); later ones share the queue",
    ),
    Tunable::new(
        ENV_FASTBOX_BYTES,
        "65536",
        "bytes of each fastbox ring, a power of two >= 4096; largest frame is a quarter of it",
    ),
    Tunable::new(
        ENV_QUEUE_SLOTS,
        "1024",
        "slots of each inbox's shared multi-producer queue, a power of two >= 2",
    ),
    Tunable::new(
        ENV_QUEUE_SLOT_BYTES,
        "1024",
        "bytes of each queue slot, a multiple of 64; largest queued frame is this minus 16",
    ),
    Tunable::new(
        ENV_PAIR_LINES,
        "0",
        "pair lines per inbox (64 bytes each): local ranks below it share one cache line per \
         pair for frames of at most 24 bytes; 0 = off (the default: no gain measured yet \
         behind the fabric's matching)",
    ),
    Tunable::new(
        "WEFT_SHM_EAGER_LIMIT",
        "8192",
        "largest eager message (bytes), capped at the ring's largest frame minus 32 (16352 with 64 KiB fastboxes)",
    ),
    Tunable::new(
        "WEFT_SHM_SINGLE_COPY",
        "cma",
        "rendezvous copy: cma (process_vm_readv, one copy; falls back to none where the kernel refuses it) or none (pipelined through the rings, two copies on two cores)",
    ),
    Tunable::new(
        "WEFT_SHM_CMA_SPLIT",
        "65536",
        "single-copy rendezvous of at least this many bytes are split: the receiver reads the first half while the sender writes the second into the receiver (both cores copy); 0: the receiver copies everything",
    ),
];

/// How messages travel over shared memory, which the fabric's engine applies:
/// `WEFT_SHM_EAGER_LIMIT`, `WEFT_SHM_SINGLE_COPY` and `WEFT_SHM_CMA_SPLIT` (see
/// [`TUNABLES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathConfig {
    /// Largest message sent eagerly, in bytes.
    pub eager_limit: usize,
    /// Rendezvous by one copy (CMA, `process_vm_readv`) rather than pipelined through
    /// the rings. Measured default (weft bench bw/latency, 2 cores, 2026-11-22): CMA beat
    /// the pipelined copy at every rendezvous size, 1.4-4x at 16 KiB-1 MiB and 12.0
    /// against 8.6 GB/s at 4 MiB; it is also what Open MPI and MPICH use when the kernel
    /// allows it. An earlier host, a VM where page pinning cost ~2 us per message,
    /// measured the opposite: set `none` on such machines.
    pub single_copy: bool,
    /// Single-copy rendezvous of at least this many bytes are split between receiver and
    /// sender; 0: never.
    pub cma_split: usize,
}

impl Default for PathConfig {
    fn default() -> PathConfig {
        PathConfig::from_lookup(&|_: &str| None)
            .unwrap_or_else(|e| panic!("the shared-memory path's defaults: {e}"))
    }
}

impl PathConfig {
    /// The table's defaults, overridden by the variables that are set; a value that is
    /// not valid is a [`ShmError::BadEnv`] naming it.
    pub fn from_env() -> Result<PathConfig, ShmError> {
        PathConfig::from_lookup(&weft_tunables::env)
    }

    fn from_lookup(get: weft_tunables::Lookup<'_>) -> Result<PathConfig, ShmError> {
        let t = |name| weft_tunables::find(TUNABLES, name);
        let bad = |e: weft_tunables::BadTunable| ShmError::BadEnv {
            var: e.name,
            reason: e.reason(),
            value: e.value,
        };
        let max = u64::from(u32::MAX);
        Ok(PathConfig {
            eager_limit: t("WEFT_SHM_EAGER_LIMIT")
                .size_in(get, 0, max)
                .map_err(bad)? as usize,
            single_copy: t("WEFT_SHM_SINGLE_COPY")
                .choice_in(get, &["cma", "none"])
                .map_err(bad)?
                == "cma",
            cma_split: t("WEFT_SHM_CMA_SPLIT").size_in(get, 0, max).map_err(bad)? as usize,
        })
    }
}

/// Geometry of an [`Inbox`](crate::Inbox): how many fastboxes, how big, and
/// the shared queue behind them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxConfig {
    /// How many senders get a fastbox (default 32; `WEFT_SHM_FASTBOX_PEERS`).
    pub fastbox_peers: u32,
    /// Ring bytes per fastbox, a power of two >= 4096 (default 65536;
    /// `WEFT_SHM_FASTBOX_BYTES`).
    pub fastbox_bytes: u32,
    /// Slots of the shared multi-producer fallback queue, a power of two
    /// >= 2 (default 1024; `WEFT_SHM_QUEUE_SLOTS`).
    pub queue_slots: u32,
    /// Bytes per queue slot including its 16-byte header, a multiple of 64
    /// (default 1024; `WEFT_SHM_QUEUE_SLOT_BYTES`).
    pub queue_slot_bytes: u32,
    /// Pair lines: senders with ids below this share one cache line with
    /// the inbox's owner for small frames (default 0 = none;
    /// `WEFT_SHM_PAIR_LINES`).
    pub pair_lines: u32,
}

impl Default for InboxConfig {
    fn default() -> InboxConfig {
        InboxConfig {
            fastbox_peers: 32,
            fastbox_bytes: 65536,
            queue_slots: 1024,
            queue_slot_bytes: 1024,
            pair_lines: 0,
        }
    }
}

/// Where the parts of an inbox segment start (all offsets in bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) ctl_offset: usize,
    pub(crate) pair_offset: usize,
    pub(crate) ring_offset: usize,
    pub(crate) queue_offset: usize,
    pub(crate) claims_offset: usize,
    pub(crate) total_bytes: usize,
}

fn check_fastbox_peers(v: u32) -> Result<(), String> {
    if v > MAX_FASTBOX_PEERS {
        return Err(format!("must be at most {MAX_FASTBOX_PEERS}"));
    }
    Ok(())
}

fn check_fastbox_bytes(v: u32) -> Result<(), String> {
    if !v.is_power_of_two() || !(FASTBOX_MIN_BYTES..=MAX_FASTBOX_BYTES).contains(&v) {
        return Err(format!(
            "must be a power of two between {FASTBOX_MIN_BYTES} and {MAX_FASTBOX_BYTES}"
        ));
    }
    Ok(())
}

fn check_queue_slots(v: u32) -> Result<(), String> {
    if !v.is_power_of_two() || !(2..=MAX_QUEUE_SLOTS).contains(&v) {
        return Err(format!(
            "must be a power of two between 2 and {MAX_QUEUE_SLOTS}"
        ));
    }
    Ok(())
}

fn check_queue_slot_bytes(v: u32) -> Result<(), String> {
    if v as usize % QUEUE_SLOT_ALIGN != 0 || v == 0 || v > MAX_QUEUE_SLOT_BYTES {
        return Err(format!(
            "must be a multiple of {QUEUE_SLOT_ALIGN} between {QUEUE_SLOT_ALIGN} and \
             {MAX_QUEUE_SLOT_BYTES}"
        ));
    }
    Ok(())
}

/// Parses a tunable: a decimal integer, optionally followed by `k`, `m` or
/// `g` (binary multiples, so `64k` is 65536).
fn check_pair_lines(v: u32) -> Result<(), String> {
    if v > MAX_PAIR_LINES {
        return Err(format!("must be at most {MAX_PAIR_LINES}"));
    }
    Ok(())
}

impl InboxConfig {
    /// The defaults, overridden by any of `WEFT_SHM_FASTBOX_PEERS`,
    /// `WEFT_SHM_FASTBOX_BYTES`, `WEFT_SHM_QUEUE_SLOTS`,
    /// `WEFT_SHM_QUEUE_SLOT_BYTES` and `WEFT_SHM_PAIR_LINES` that is set. A value that does not parse
    /// or is out of range is a [`ShmError::BadEnv`] naming the variable and
    /// the value.
    pub fn from_env() -> Result<InboxConfig, ShmError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// [`from_env`](Self::from_env) with a custom variable lookup.
    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<InboxConfig, ShmError> {
        let mut cfg = InboxConfig::default();
        type Check = fn(u32) -> Result<(), String>;
        let fields: [(&'static str, &mut u32, Check); 5] = [
            (
                ENV_FASTBOX_PEERS,
                &mut cfg.fastbox_peers,
                check_fastbox_peers,
            ),
            (
                ENV_FASTBOX_BYTES,
                &mut cfg.fastbox_bytes,
                check_fastbox_bytes,
            ),
            (ENV_QUEUE_SLOTS, &mut cfg.queue_slots, check_queue_slots),
            (
                ENV_QUEUE_SLOT_BYTES,
                &mut cfg.queue_slot_bytes,
                check_queue_slot_bytes,
            ),
            (ENV_PAIR_LINES, &mut cfg.pair_lines, check_pair_lines),
        ];
        for (var, field, check) in fields {
            let t = weft_tunables::find(TUNABLES, var);
            let bad = |value: String, reason: String| ShmError::BadEnv { var, value, reason };
            let parsed = t
                .if_set(&lookup, |t| t.size_in(&lookup, 0, u64::from(u32::MAX)))
                .map_err(|e| bad(e.value.clone(), e.reason()))?;
            let Some(v) = parsed else { continue };
            let v = v as u32;
            match check(v) {
                Ok(()) => *field = v,
                Err(reason) => return Err(bad(t.set_in(&lookup).unwrap_or_default(), reason)),
            }
        }
        cfg.geometry()?;
        Ok(cfg)
    }

    /// Validates every field and computes where the parts of the segment go.
    pub(crate) fn geometry(&self) -> Result<Geometry, ShmError> {
        let checks = [
            (
                "fastbox_peers",
                self.fastbox_peers,
                check_fastbox_peers as fn(u32) -> _,
            ),
            ("fastbox_bytes", self.fastbox_bytes, check_fastbox_bytes),
            ("queue_slots", self.queue_slots, check_queue_slots),
            (
                "queue_slot_bytes",
                self.queue_slot_bytes,
                check_queue_slot_bytes,
            ),
            ("pair_lines", self.pair_lines, check_pair_lines),
        ];
        for (field, v, check) in checks {
            check(v).map_err(|why| ShmError::InvalidConfig {
                reason: format!("{field} = {v}: {why}"),
            })?;
        }
        let too_big = || ShmError::InvalidConfig {
            reason: format!("{self:?} does not fit the address space"),
        };
        let peers = self.fastbox_peers as usize;
        let pair_offset = FASTBOX_CTL_OFFSET + peers * FASTBOX_CTL_BYTES;
        let pair_end = pair_offset + self.pair_lines as usize * PAIR_LINE_BYTES;
        let ring_offset = pair_end.next_multiple_of(RING_ALIGN);
        let queue_offset = (self.fastbox_bytes as usize)
            .checked_mul(peers)
            .and_then(|b| b.checked_add(ring_offset))
            .ok_or_else(too_big)?;
        let claims_offset = (self.queue_slots as usize)
            .checked_mul(self.queue_slot_bytes as usize)
            .and_then(|b| b.checked_add(queue_offset))
            .ok_or_else(too_big)?;
        let total_bytes = claims_offset
            .checked_add(CLAIM_BYTES)
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or_else(too_big)?;
        Ok(Geometry {
            ctl_offset: FASTBOX_CTL_OFFSET,
            pair_offset,
            ring_offset,
            queue_offset,
            claims_offset,
            total_bytes,
        })
    }

    /// Largest frame a fastbox carries.
    pub(crate) fn fastbox_max_frame(&self) -> usize {
        self.fastbox_bytes as usize / 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_tunables() {
        let cfg = InboxConfig::default();
        let g = cfg.geometry().unwrap();
        // 256 + 32 * 256 bytes of headers and controls, no pair lines.
        assert_eq!(g.pair_offset, 256 + 32 * 256);
        assert_eq!(g.ring_offset, 12288);
        assert_eq!(g.queue_offset, 12288 + 32 * 65536);
        assert_eq!(
            g.total_bytes,
            12288 + 32 * 65536 + 1024 * 1024 + CLAIM_BYTES
        );
        let lines = InboxConfig {
            pair_lines: 256,
            ..cfg.clone()
        };
        assert_eq!(lines.geometry().unwrap().ring_offset, 28672);
        let defaults: Vec<u32> = TUNABLES[..5]
            .iter()
            .map(|t| weft_tunables::parse_size(t.default).unwrap() as u32)
            .collect();
        assert_eq!(
            defaults,
            [
                cfg.fastbox_peers,
                cfg.fastbox_bytes,
                cfg.queue_slots,
                cfg.queue_slot_bytes,
                cfg.pair_lines
            ]
        );
        assert_eq!(cfg.fastbox_max_frame(), 16384);
    }

    #[test]
    fn env_overrides_and_errors_name_variable_and_value() {
        let cfg = InboxConfig::from_lookup(|v| match v {
            "WEFT_SHM_FASTBOX_BYTES" => Some("16k".into()),
            "WEFT_SHM_FASTBOX_PEERS" => Some("4".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(cfg.fastbox_bytes, 16384);
        assert_eq!(cfg.fastbox_peers, 4);
        assert_eq!(cfg.queue_slots, 1024);

        for (var, value) in [
            ("WEFT_SHM_FASTBOX_BYTES", "5000"),
            ("WEFT_SHM_FASTBOX_BYTES", "2048"),
            ("WEFT_SHM_QUEUE_SLOTS", "1000"),
            ("WEFT_SHM_QUEUE_SLOT_BYTES", "100"),
            ("WEFT_SHM_FASTBOX_PEERS", "lots"),
            ("WEFT_SHM_FASTBOX_PEERS", "-1"),
            ("WEFT_SHM_QUEUE_SLOT_BYTES", "99999999999"),
        ] {
            let err =
                InboxConfig::from_lookup(|v| (v == var).then(|| value.to_owned())).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, ShmError::BadEnv { .. }), "{msg}");
            assert!(msg.contains(var) && msg.contains(value), "{msg}");
        }
    }

    #[test]
    fn the_paths_defaults_and_its_errors() {
        let d = PathConfig::default();
        assert_eq!(
            (d.eager_limit, d.single_copy, d.cma_split),
            (8192, true, 65536)
        );
        let set = |n: &'static str, v: &'static str| move |k: &str| (k == n).then(|| v.to_owned());
        let none = PathConfig::from_lookup(&set("WEFT_SHM_SINGLE_COPY", "none")).unwrap();
        assert!(!none.single_copy);
        let e = PathConfig::from_lookup(&set("WEFT_SHM_SINGLE_COPY", "dma")).unwrap_err();
        assert!(e.to_string().contains("WEFT_SHM_SINGLE_COPY"), "{e}");
        assert!(e.to_string().contains("cma, none"), "{e}");
        let big = PathConfig::from_lookup(&set("WEFT_SHM_EAGER_LIMIT", "16k")).unwrap();
        assert_eq!(big.eager_limit, 16384);
    }

    #[test]
    fn invalid_config_is_rejected() {
        let bad = InboxConfig {
            queue_slot_bytes: 1000,
            ..InboxConfig::default()
        };
        let err = bad.geometry().unwrap_err();
        assert!(err.to_string().contains("queue_slot_bytes = 1000"), "{err}");
    }
}
