//! Sender liveness through open-file-description record locks.
//!
//! Every [`Outbox`](crate::Outbox) holds a shared `F_OFD_SETLK` lock on byte
//! `sender_id` of its inbox's shm object, for as long as its descriptor is
//! open. The kernel drops the lock when the process dies, however it dies.
//! "Is some live sender `s` connected?" is then one `F_OFD_GETLK` on that
//! byte: no pids (which differ across pid namespaces and get reused), no
//! heartbeats. Only the slow paths ask: taking over a fastbox whose claim
//! says attached, and recycling a queue slot that stayed busy.

use std::io;

use rustix::fd::{AsRawFd, BorrowedFd};

/// Builds the `flock` record for byte `sender_id`.
fn record(l_type: libc::c_short, sender_id: u32) -> libc::flock {
    // SAFETY: `flock` is a plain C struct of integers; all-zero is valid
    // (and `l_pid` must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { core::mem::zeroed() };
    fl.l_type = l_type;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = libc::off_t::from(sender_id);
    fl.l_len = 1;
    fl
}

/// Takes a shared lock on byte `sender_id` of `fd`'s file, held until the
/// open file description is closed.
pub(crate) fn lock_sender(fd: BorrowedFd<'_>, sender_id: u32) -> io::Result<()> {
    let fl = record(libc::F_RDLCK as libc::c_short, sender_id);
    loop {
        // SAFETY: `fd` is an open descriptor for the duration of the call and
        // `fl` a valid `flock` that the kernel only reads.
        let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether another open file description (in this or any process) holds a
/// lock on byte `sender_id` of `fd`'s file: some live `Outbox` of that
/// sender exists.
pub(crate) fn sender_locked_elsewhere(fd: BorrowedFd<'_>, sender_id: u32) -> io::Result<bool> {
    let mut fl = record(libc::F_WRLCK as libc::c_short, sender_id);
    loop {
        // SAFETY: `fd` is an open descriptor for the duration of the call and
        // `fl` a valid `flock` the kernel reads and overwrites.
        let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
        if rc == 0 {
            return Ok(fl.l_type != libc::F_UNLCK as libc::c_short);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
