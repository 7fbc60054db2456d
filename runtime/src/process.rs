//! Signals to processes the runtime started (the launcher its servers' agents, a server
//! its ranks), by pid.

/// Sends `sig` to process `pid` (best effort: it may have exited already).
pub(crate) fn kill(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, sig);
    }
}
