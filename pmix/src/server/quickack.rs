//! Prompt acknowledgements on the clients' connections.
//!
//! OpenPMIx 4.2's client never sets `TCP_NODELAY` on its connection to the server, so a
//! small request written while an earlier one is still unacknowledged waits in the
//! client's kernel (Nagle) until the server's delayed ACK, up to 40 ms on Linux, when the
//! server had nothing to answer the earlier one with. Every hosted Open MPI program met
//! that stall once or more in `MPI_Init`, under any launcher.
//!
//! The server cannot set the client's socket options, but it can acknowledge at once: a
//! watcher thread holds the server's end of every client connection in an epoll set
//! (edge-triggered, beside the library's own poller, which still reads everything), and
//! each time data arrives it sets `TCP_QUICKACK` on that end, which sends the pending
//! ACK as soon as the library reads the data (and leaves the delayed-ACK mode the kernel
//! enters for request-answer traffic). The connections are found when the library says
//! a client connected: the process's sockets whose local port is the one the library
//! listens on (from the `PMIX_SERVER_URI*` it hands the clients) and that have a peer.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::OnceLock;

use libc::c_int;

/// Whether the watcher runs (`Server::ack_promptly`).
static ON: AtomicBool = AtomicBool::new(false);
/// The port the library listens on (0: not known yet).
static PORT: AtomicU16 = AtomicU16::new(0);
/// Arrivals the watcher acted on (for the tests).
static ACTED: AtomicU64 = AtomicU64::new(0);
/// The watcher's epoll set, made with its thread on first use (`None`: it could not be).
static WATCHER: OnceLock<Option<Watcher>> = OnceLock::new();

#[derive(Debug)]
struct Watcher {
    epfd: c_int,
}

/// Turns the watcher on (before clients connect).
pub(super) fn enable() {
    // Relaxed: a flag read by the library's callbacks; nothing else is published by it.
    ON.store(true, Ordering::Relaxed);
}

/// Notes the port of the library's listener from the environment it gives a client.
pub(super) fn note_env(env: &[(String, String)]) {
    // Relaxed: as above.
    if !ON.load(Ordering::Relaxed) || PORT.load(Ordering::Relaxed) != 0 {
        return;
    }
    if let Some(p) = env
        .iter()
        .filter(|(k, _)| k.starts_with("PMIX_SERVER_URI"))
        .find_map(|(_, v)| port_of(v))
    {
        // Relaxed: read by `client_connected` on the library's thread, which comes after
        // the client was started with this environment.
        PORT.store(p, Ordering::Relaxed);
    }
}

/// The TCP port of a server URI such as `pmix-server.12;tcp4://127.0.0.1:40857`.
fn port_of(uri: &str) -> Option<u16> {
    let (_, addr) = uri.split_once("://")?;
    addr.rsplit_once(':')?.1.parse().ok().filter(|&p| p != 0)
}

/// A client connected: watch the server's ends of the connections not watched yet (a
/// descriptor in the set already is refused with `EEXIST`; a closed one left the set, so
/// its number may come back with another connection).
pub(super) fn client_connected() {
    // Relaxed: as above.
    let port = PORT.load(Ordering::Relaxed);
    if !ON.load(Ordering::Relaxed) || port == 0 {
        return;
    }
    let Some(w) = WATCHER.get_or_init(Watcher::start) else {
        return;
    };
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<c_int>().ok()) else {
            continue;
        };
        if fd == w.epfd || !is_client_end(fd, port) {
            continue;
        }
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET | libc::EPOLLRDHUP) as u32,
            u64: fd as u64,
        };
        // SAFETY: `ev` is a valid event for the call; `fd` is an open descriptor of this
        // process (just listed), and adding it does not change it.
        if unsafe { libc::epoll_ctl(w.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } == 0 {
            quickack(fd);
        }
    }
}

/// Whether `fd` is a connected TCP socket whose local port is `port`.
fn is_client_end(fd: c_int, port: u16) -> bool {
    let local =
        |get: unsafe extern "C" fn(c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> c_int| {
            // SAFETY: zeroed storage is a valid sockaddr_storage.
            let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            // SAFETY: `sa` and `len` describe writable storage of that size; a descriptor
            // that is not a socket only makes the call fail.
            let rc = unsafe { get(fd, (&raw mut sa).cast(), &mut len) };
            (rc == 0).then_some(sa)
        };
    let Some(sa) = local(libc::getsockname) else {
        return false;
    };
    let p = match c_int::from(sa.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let v4 = unsafe { &*(&raw const sa).cast::<libc::sockaddr_in>() };
            u16::from_be(v4.sin_port)
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let v6 = unsafe { &*(&raw const sa).cast::<libc::sockaddr_in6>() };
            u16::from_be(v6.sin6_port)
        }
        _ => return false,
    };
    // The listener has the port too, but no peer.
    p == port && local(libc::getpeername).is_some()
}

/// Sets `TCP_QUICKACK` on `fd` (failures are harmless: a closed descriptor, or one the
/// library closed and reused for another of this process's sockets, where the option
/// only makes acknowledgements prompt).
fn quickack(fd: c_int) {
    let one: c_int = 1;
    // SAFETY: `one` lives for the call and its size is passed; the option changes
    // nothing but when this end acknowledges.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&raw const one).cast(),
            std::mem::size_of::<c_int>() as libc::socklen_t,
        );
    }
}

impl Watcher {
    /// Makes the epoll set and its thread (`None`, logged, if either fails).
    fn start() -> Option<Watcher> {
        // SAFETY: plain system call.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            tracing::debug!(
                "PMIx connections: no epoll set ({}); acknowledgements stay delayed",
                std::io::Error::last_os_error()
            );
            return None;
        }
        let spawned = std::thread::Builder::new()
            .name("pmix-acks".into())
            .spawn(move || watch(epfd));
        if let Err(e) = spawned {
            tracing::debug!("PMIx connections: no watcher thread ({e})");
            // SAFETY: ours, closed once.
            unsafe { libc::close(epfd) };
            return None;
        }
        Some(Watcher { epfd })
    }
}

/// The watcher thread: acknowledges promptly on every connection data arrives on, and
/// drops the ones whose peer left (for the process's life: the server's).
fn watch(epfd: c_int) {
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        // SAFETY: `evs` has room for the 64 events passed.
        let n = unsafe { libc::epoll_wait(epfd, evs.as_mut_ptr(), evs.len() as c_int, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        for ev in &evs[..n as usize] {
            let fd = ev.u64 as c_int;
            let gone = (libc::EPOLLHUP | libc::EPOLLRDHUP | libc::EPOLLERR) as u32;
            if ev.events & gone != 0 {
                // SAFETY: removing a descriptor from our own set (it may be closed
                // already, which removed it: the call then fails harmlessly).
                unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
            } else {
                quickack(fd);
                // Relaxed: a counter.
                ACTED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_comes_from_the_servers_uri() {
        assert_eq!(
            port_of("pmix-server.29828;tcp4://127.0.0.1:40857"),
            Some(40857)
        );
        assert_eq!(port_of("pmix-server.1;tcp6://[::1]:512"), Some(512));
        assert_eq!(port_of("pmix-server.1;tcp4://127.0.0.1:0"), None);
        assert_eq!(port_of("no uri"), None);
    }

    /// Whether `fd`'s end acknowledges at once (`TCP_QUICKACK` reads 1 out of the
    /// delayed-ACK mode the kernel enters for request-answer traffic).
    fn quick(fd: c_int) -> bool {
        let mut v: c_int = -1;
        let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
        // SAFETY: `v` and `len` describe writable storage of that size.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                (&raw mut v).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        v == 1
    }

    #[test]
    fn data_arriving_on_a_watched_connection_makes_its_end_acknowledge_at_once() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 8];
        // Requests answered at once put the server's end in delayed-ACK mode.
        let rounds = |c: &mut std::net::TcpStream, s: &mut std::net::TcpStream| {
            let mut buf = [0u8; 8];
            for _ in 0..4 {
                c.write_all(b"request!").unwrap();
                s.read_exact(&mut buf).unwrap();
                s.write_all(b"answer!!").unwrap();
                c.read_exact(&mut buf).unwrap();
            }
        };
        rounds(&mut c, &mut s);
        assert!(!quick(s.as_raw_fd()), "no delayed-ACK mode to leave");
        enable();
        note_env(&[(
            "PMIX_SERVER_URI41".into(),
            format!("pmix-server.1;tcp4://127.0.0.1:{port}"),
        )]);
        client_connected();
        rounds(&mut c, &mut s);
        assert!(!quick(s.as_raw_fd()), "back in delayed-ACK mode");
        // A request the server does not answer: the watcher sees it arrive and leaves
        // the mode (the kernel's delayed ACK would leave it too, 40 ms later: hence the
        // count rather than a clock).
        let before = ACTED.load(Ordering::Relaxed);
        c.write_all(b"one-way!").unwrap();
        let t = std::time::Instant::now();
        while ACTED.load(Ordering::Relaxed) == before {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "the watcher did not act on the data"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(quick(s.as_raw_fd()), "still in delayed-ACK mode");
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"one-way!");
    }

    #[test]
    fn only_connected_sockets_on_the_port_are_client_ends() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s, _) = l.accept().unwrap();
        use std::os::fd::AsRawFd;
        assert!(is_client_end(s.as_raw_fd(), port), "the accepted end");
        assert!(
            !is_client_end(l.as_raw_fd(), port),
            "the listener has no peer"
        );
        assert!(
            !is_client_end(c.as_raw_fd(), port),
            "the client's end has another port"
        );
        assert!(!is_client_end(0, port) || port == 0);
        quickack(s.as_raw_fd());
    }
}
