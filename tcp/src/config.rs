//! Configuration: one table of tunables ([`TUNABLES`]) drives both [`Config::from_env`] and
//! [`Config::tunables`] (`weft info`).

use std::ffi::CStr;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use crate::Error;

pub use weft_tunables::Tunable;

/// Every `WEFT_TCP_*` tunable, in `weft_tunables`' syntax: sizes accept the suffixes `k`,
/// `m`, `g` (binary, also `KiB`...), durations `ms` or `s`; an empty value or `auto`
/// means the default.
pub const TUNABLES: &[Tunable] = &[
    Tunable {
        name: "WEFT_TCP_ADDR",
        default: "auto",
        meaning: "IP address to listen on (auto: WEFT_TCP_IF, else the address the node's wire-up server reaches the other nodes from)",
    },
    Tunable {
        name: "WEFT_TCP_IF",
        default: "auto",
        meaning: "interface whose first IPv4 address to listen on (if WEFT_TCP_ADDR is not set)",
    },
    Tunable {
        name: "WEFT_TCP_MAX_FRAME",
        default: "64k",
        meaning: "largest eager frame in bytes (must be equal on every rank; the fabric raises it to hold WEFT_TCP_EAGER_LIMIT)",
    },
    Tunable {
        name: "WEFT_TCP_QUEUE_BYTES",
        default: "4m",
        meaning: "bytes of frames queued per connection before try_send refuses",
    },
    Tunable {
        name: "WEFT_TCP_WRITE_CHUNK",
        default: "512k",
        meaning: "most bytes of a bulk transfer handed to one sendmsg (smaller writes let the kernel process ACKs between them; 0: no limit)",
    },
    Tunable {
        name: "WEFT_TCP_SNDBUF",
        default: "auto",
        meaning: "SO_SNDBUF of each connection in bytes (auto: the kernel's)",
    },
    Tunable {
        name: "WEFT_TCP_RCVBUF",
        default: "auto",
        meaning: "SO_RCVBUF of each connection in bytes (auto: the kernel's)",
    },
    Tunable {
        name: "WEFT_TCP_HANDSHAKE_TIMEOUT_MS",
        default: "10000",
        meaning: "a connection not established within this many ms fails (the fabric waits for a live peer for ever unless this is set)",
    },
    Tunable {
        name: "WEFT_TCP_HELLO_TIMEOUT_MS",
        default: "3000",
        meaning: "an accepted connection that sends no HELLO within this many ms is closed",
    },
    Tunable {
        name: "WEFT_TCP_BULK_WAIT_MS",
        default: "60000",
        meaning: "a bulk transfer arriving unexpected and not expected within this many ms is a protocol error (0: wait forever)",
    },
    Tunable {
        name: "WEFT_TCP_DIRECT_READS",
        default: "4",
        meaning: "with at most this many connections, poll reads each socket directly instead of asking epoll (0: always epoll)",
    },
];

/// Endpoint configuration; [`Config::from_env`] reads the `WEFT_TCP_*` tunables.
#[derive(Clone)]
pub struct Config {
    /// This process's rank.
    pub me: u32,
    /// Job identity (a hash of the job's namespace).
    pub job: u64,
    /// Per-job secret: a connection must present it.
    pub secret: [u64; 2],
    /// Address to listen on (the port is chosen by the kernel); not unspecified.
    pub addr: IpAddr,
    /// Largest eager frame (header plus payload).
    pub max_frame: usize,
    /// Bytes of frames queued per connection before `try_send` says no.
    pub queue_bytes: usize,
    /// Most bytes of a bulk transfer written by one `sendmsg` (`usize::MAX`: no limit).
    /// Each `sendmsg` holds the socket lock while it copies; ACKs arriving meanwhile wait
    /// in the socket's backlog, and on loopback their processing (which delivers the next
    /// segments) then lands on the sender's core in one burst. 512 KiB measured best on
    /// loopback (docs/benchmarks.md).
    pub write_chunk: usize,
    /// `SO_SNDBUF` when set.
    pub sndbuf: Option<usize>,
    /// `SO_RCVBUF` when set.
    pub rcvbuf: Option<usize>,
    /// A connection whose handshake is not done this long after `connect` fails.
    pub handshake_timeout: Duration,
    /// An accepted connection without a HELLO this long is closed.
    pub hello_timeout: Duration,
    /// A bulk transfer that arrived without `expect_bulk` and is still not expected this
    /// long later is a protocol error; `None` waits forever.
    pub bulk_wait: Option<Duration>,
    /// With at most this many established connections, `poll` reads each socket directly
    /// (one `recv` per connection) and asks epoll only now and then (for accepts) or when
    /// something waits to be written or handshaken; 0 always asks epoll.
    pub direct_reads: usize,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("me", &self.me)
            .field("job", &format_args!("{:#x}", self.job))
            .field("secret", &"<redacted>")
            .field("addr", &self.addr)
            .field("max_frame", &self.max_frame)
            .field("queue_bytes", &self.queue_bytes)
            .field("write_chunk", &self.write_chunk)
            .field("sndbuf", &self.sndbuf)
            .field("rcvbuf", &self.rcvbuf)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("hello_timeout", &self.hello_timeout)
            .field("bulk_wait", &self.bulk_wait)
            .field("direct_reads", &self.direct_reads)
            .finish()
    }
}

const MAX_FRAME_LIMIT: u64 = 256 << 20;

impl Config {
    /// Defaults (the ones in [`TUNABLES`]), listening on `addr`.
    pub fn new(me: u32, job: u64, secret: [u64; 2], addr: IpAddr) -> Config {
        Config {
            me,
            job,
            secret,
            addr,
            max_frame: 64 << 10,
            queue_bytes: 4 << 20,
            write_chunk: 512 << 10,
            sndbuf: None,
            rcvbuf: None,
            handshake_timeout: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(3),
            bulk_wait: Some(Duration::from_secs(60)),
            direct_reads: 4,
        }
    }

    /// Defaults with `addr` as given, then the environment: `WEFT_TCP_ADDR` (an IP address)
    /// or `WEFT_TCP_IF` (an interface name: its first IPv4 address), `WEFT_TCP_SNDBUF`,
    /// `WEFT_TCP_RCVBUF`, `WEFT_TCP_MAX_FRAME` and the rest of [`TUNABLES`]. A bad value is
    /// an error naming the variable, the value and why.
    pub fn from_env(me: u32, job: u64, secret: [u64; 2], addr: IpAddr) -> Result<Config, Error> {
        Config::from_lookup(me, job, secret, addr, |name| std::env::var(name).ok())
    }

    /// [`Config::from_env`] with the variables read through `get` (for tests).
    pub fn from_lookup(
        me: u32,
        job: u64,
        secret: [u64; 2],
        addr: IpAddr,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, Error> {
        let mut c = Config::new(me, job, secret, addr);
        let get: weft_tunables::Lookup<'_> = &get;
        let t = |name| weft_tunables::find(TUNABLES, name);
        let var = |name: &'static str| t(name).set_in(get);
        let size = |name: &'static str, min: u64, max: u64| -> Result<Option<u64>, Error> {
            Ok(t(name).if_set(get, |t| t.size_in(get, min, max))?)
        };
        let ms = |name: &'static str, min: u64| -> Result<Option<Duration>, Error> {
            let (min, max) = (Duration::from_millis(min), Duration::from_millis(1 << 32));
            Ok(t(name).if_set(get, |t| t.millis_in(get, min, max))?)
        };
        if let Some(v) = var("WEFT_TCP_ADDR") {
            c.addr = v.parse().map_err(|_| Error::Config {
                name: "WEFT_TCP_ADDR",
                value: v.clone(),
                reason: "not an IP address".into(),
            })?;
        } else if let Some(v) = var("WEFT_TCP_IF") {
            c.addr = IpAddr::V4(interface_ipv4(&v).map_err(|reason| Error::Config {
                name: "WEFT_TCP_IF",
                value: v.clone(),
                reason,
            })?);
        }
        if c.addr.is_unspecified() {
            return Err(Error::Config {
                name: "WEFT_TCP_ADDR",
                value: c.addr.to_string(),
                reason: "an unspecified address cannot be published in a card; \
                         set WEFT_TCP_ADDR or WEFT_TCP_IF"
                    .into(),
            });
        }
        if let Some(n) = size("WEFT_TCP_MAX_FRAME", 64, MAX_FRAME_LIMIT)? {
            c.max_frame = n as usize;
        }
        if let Some(n) = size("WEFT_TCP_QUEUE_BYTES", 1024, 1 << 40)? {
            c.queue_bytes = n as usize;
        }
        if let Some(n) = size("WEFT_TCP_WRITE_CHUNK", 0, 1 << 40)? {
            c.write_chunk = if n == 0 {
                usize::MAX
            } else {
                n.max(4096) as usize
            };
        }
        c.sndbuf = size("WEFT_TCP_SNDBUF", 4096, 1 << 30)?.map(|n| n as usize);
        c.rcvbuf = size("WEFT_TCP_RCVBUF", 4096, 1 << 30)?.map(|n| n as usize);
        if let Some(d) = ms("WEFT_TCP_HANDSHAKE_TIMEOUT_MS", 1)? {
            c.handshake_timeout = d;
        }
        if let Some(d) = ms("WEFT_TCP_HELLO_TIMEOUT_MS", 1)? {
            c.hello_timeout = d;
        }
        if let Some(d) = ms("WEFT_TCP_BULK_WAIT_MS", 0)? {
            c.bulk_wait = (!d.is_zero()).then_some(d);
        }
        let direct = t("WEFT_TCP_DIRECT_READS");
        if let Some(n) = direct.if_set(get, |t| t.count_in(get, 0, 1 << 16))? {
            c.direct_reads = n as usize;
        }
        Ok(c)
    }

    /// `(name, value, meaning)` of each tunable, for `weft info`.
    pub fn tunables(&self) -> Vec<(&'static str, String, &'static str)> {
        let ms = |d: Duration| d.as_millis().to_string();
        let opt = |v: Option<usize>| v.map_or_else(|| "auto".to_string(), |n| n.to_string());
        TUNABLES
            .iter()
            .map(|t| {
                let value = match t.name {
                    "WEFT_TCP_ADDR" => self.addr.to_string(),
                    "WEFT_TCP_IF" => "auto".to_string(),
                    "WEFT_TCP_MAX_FRAME" => self.max_frame.to_string(),
                    "WEFT_TCP_QUEUE_BYTES" => self.queue_bytes.to_string(),
                    "WEFT_TCP_WRITE_CHUNK" if self.write_chunk == usize::MAX => "0".into(),
                    "WEFT_TCP_WRITE_CHUNK" => self.write_chunk.to_string(),
                    "WEFT_TCP_SNDBUF" => opt(self.sndbuf),
                    "WEFT_TCP_RCVBUF" => opt(self.rcvbuf),
                    "WEFT_TCP_HANDSHAKE_TIMEOUT_MS" => ms(self.handshake_timeout),
                    "WEFT_TCP_HELLO_TIMEOUT_MS" => ms(self.hello_timeout),
                    "WEFT_TCP_BULK_WAIT_MS" => self.bulk_wait.map_or_else(|| "0".into(), ms),
                    "WEFT_TCP_DIRECT_READS" => self.direct_reads.to_string(),
                    _ => t.default.to_string(),
                };
                (t.name, value, t.meaning)
            })
            .collect()
    }
}

/// The first IPv4 address of interface `name` (getifaddrs).
fn interface_ipv4(name: &str) -> Result<Ipv4Addr, String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(format!(
            "getifaddrs failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut names = Vec::new();
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let n = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        if !names.contains(&n.to_string()) {
            names.push(n.to_string());
        }
        if n != name || ifa.ifa_addr.is_null() || found.is_some() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr owned by the list.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        if family == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    match found {
        Some(ip) => Ok(ip),
        None if names.iter().any(|n| n == name) => Err("interface has no IPv4 address".into()),
        None => Err(format!(
            "no such interface (there are: {})",
            names.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, Error> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(1, 2, [3, 4], "127.0.0.1".parse().unwrap(), |n| {
            vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
        })
    }

    /// The table's defaults are the configuration's: each set to its default text reads
    /// as unset.
    #[test]
    fn the_tables_defaults_are_the_configs() {
        let unset = format!("{:?}", cfg(&[]).unwrap());
        for t in TUNABLES.iter().filter(|t| t.default != "auto") {
            let set = format!("{:?}", cfg(&[(t.name, t.default)]).unwrap());
            assert_eq!(set, unset, "{} = {}", t.name, t.default);
        }
    }

    #[test]
    fn env_overrides_and_errors() {
        let c = cfg(&[
            ("WEFT_TCP_MAX_FRAME", "128k"),
            ("WEFT_TCP_SNDBUF", "1m"),
            ("WEFT_TCP_ADDR", "127.0.0.2"),
            ("WEFT_TCP_BULK_WAIT_MS", "0"),
            ("WEFT_TCP_WRITE_CHUNK", "1m"),
        ])
        .unwrap();
        assert_eq!(c.write_chunk, 1 << 20);
        assert_eq!(cfg(&[]).unwrap().write_chunk, 512 << 10);
        let unlimited = cfg(&[("WEFT_TCP_WRITE_CHUNK", "0")]).unwrap();
        assert_eq!(unlimited.write_chunk, usize::MAX);
        assert!(unlimited
            .tunables()
            .iter()
            .any(|(n, v, _)| *n == "WEFT_TCP_WRITE_CHUNK" && v == "0"));
        assert_eq!(c.max_frame, 128 << 10);
        assert_eq!(c.sndbuf, Some(1 << 20));
        assert_eq!(c.rcvbuf, None);
        assert_eq!(c.addr, "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(c.bulk_wait, None);
        let e = cfg(&[("WEFT_TCP_MAX_FRAME", "lots")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("WEFT_TCP_MAX_FRAME") && e.contains("lots"),
            "{e}"
        );
        let e = cfg(&[("WEFT_TCP_ADDR", "1.2.3")]).unwrap_err().to_string();
        assert!(e.contains("not an IP address"), "{e}");
        let e = cfg(&[("WEFT_TCP_IF", "nonexistent0")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("nonexistent0") && e.contains("no such interface"),
            "{e}"
        );
        let e = cfg(&[("WEFT_TCP_RCVBUF", "1")]).unwrap_err().to_string();
        assert!(
            e.contains("WEFT_TCP_RCVBUF") && e.contains("4096..="),
            "{e}"
        );
        let e = cfg(&[("WEFT_TCP_ADDR", "0.0.0.0")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unspecified"), "{e}");
    }

    #[test]
    fn loopback_interface() {
        let c = cfg(&[("WEFT_TCP_IF", "lo")]).unwrap();
        assert_eq!(c.addr, "127.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn tunables_listed_and_secret_hidden() {
        let c = cfg(&[]).unwrap();
        let t = c.tunables();
        assert_eq!(t.len(), TUNABLES.len());
        assert!(t
            .iter()
            .any(|(n, v, _)| *n == "WEFT_TCP_MAX_FRAME" && v == "65536"));
        let dbg = format!("{c:?}");
        assert!(dbg.contains("redacted") && !dbg.contains("[3, 4]"));
    }
}
