//! Removing segment names when the process is terminated (`SIGTERM`), for processes
//! that no Weft server looks after (those started by a foreign engine such as `mpirun`
//! or `srun`): an engine that aborts a job sends its processes `SIGTERM`, and the names
//! they registered here are unlinked before the signal's default action ends them.
//! Mapped segments stay usable by whoever mapped them; only the names go.

use std::ffi::CString;
use std::sync::{Mutex, OnceLock};

/// The `/dev/shm` paths to unlink, fixed before the handler is installed (the handler
/// only reads them: no allocation or lock in signal context).
static PATHS: OnceLock<Vec<CString>> = OnceLock::new();

/// Whether the handler was installed (or found another one in place).
static INSTALLED: Mutex<bool> = Mutex::new(false);

/// The `SIGTERM` handler: unlinks the registered paths, restores the default action and
/// raises the signal again (the process ends as `SIGTERM` would have ended it).
extern "C" fn on_sigterm(sig: libc::c_int) {
    if let Some(paths) = PATHS.get() {
        for p in paths {
            // SAFETY: `p` is a NUL-terminated path that lives for the program's life;
            // unlink(2) is async-signal-safe.
            unsafe { libc::unlink(p.as_ptr()) };
        }
    }
    // SAFETY: signal(2) and raise(3) are async-signal-safe; restoring the default
    // action before raising makes the process end with the signal.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Unlinks the segments `names` (as given to [`crate::segment::unlink`], e.g.
/// `/weft-job-n0-r3`) if the process receives `SIGTERM`. Installs the handler once per
/// process, and only where `SIGTERM` still has its default action (a program's own
/// handler is left alone; then the names are not removed). Later calls do nothing.
/// Returns whether the handler is in place.
pub fn unlink_on_sigterm(names: &[String]) -> bool {
    let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
    if *installed {
        return PATHS.get().is_some();
    }
    *installed = true;
    let paths: Vec<CString> = names
        .iter()
        .filter_map(|n| CString::new(format!("/dev/shm/{}", n.trim_start_matches('/'))).ok())
        .collect();
    // SAFETY: a zeroed sigaction is a valid "query" buffer for sigaction(2).
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: querying the current action (null new action) writes only `old`.
    if unsafe { libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut old) } != 0
        || old.sa_sigaction != libc::SIG_DFL
    {
        return false;
    }
    if PATHS.set(paths).is_err() {
        return false;
    }
    // SAFETY: as above, a zeroed sigaction with the handler set and an empty mask.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: `act.sa_mask` is a valid sigset to empty.
    unsafe { libc::sigemptyset(&mut act.sa_mask) };
    // SAFETY: installs a handler that only makes async-signal-safe calls on data fixed
    // before (PATHS is set above and never changed).
    unsafe { libc::sigaction(libc::SIGTERM, &act, std::ptr::null_mut()) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminated_process_unlinks_the_names_it_registered() {
        // In a child (the handler ends the process it runs in).
        let name = format!("/weft-test-{}-sigterm", std::process::id());
        let seg =
            crate::segment::WritableSegment::create(&name, 4096, crate::segment::SegmentKind::COLL)
                .expect("a segment");
        // SAFETY: fork in a test process; the child only makes async-signal-safe calls
        // until it ends (it installs the handler, which allocates: acceptable in a test
        // whose parent waits for it, there are no other threads holding locks it takes).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = unlink_on_sigterm(std::slice::from_ref(&name));
            // SAFETY: raise(3) in the child.
            unsafe { libc::raise(if ok { libc::SIGTERM } else { libc::SIGKILL }) };
            // SAFETY: _exit(2) in the child.
            unsafe { libc::_exit(3) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status), "status {status}");
        assert_eq!(
            libc::WTERMSIG(status),
            libc::SIGTERM,
            "the handler was installed"
        );
        let path = format!("/dev/shm/{}", name.trim_start_matches('/'));
        assert!(
            !std::path::Path::new(&path).exists(),
            "{path} is still there"
        );
        drop(seg);
    }
}
