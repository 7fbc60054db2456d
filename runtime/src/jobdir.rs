//! A job's names on this machine, and their removal: the user's and the job's 0700
//! directories (sockets, the PMIx libraries' directories), each node's datastore segment
//! and the prefix of its other shared-memory segments, and the job's secret as passed in
//! the environment. The launcher and the servers both use it; neither imports the other.

use std::path::{Path, PathBuf};

/// The directory that holds a user's job directories: `$TMPDIR/weft-<uid>` (mode 0700).
pub fn user_dir() -> PathBuf {
    let uid = rustix::process::getuid().as_raw();
    std::env::temp_dir().join(format!("weft-{uid}"))
}

/// The name of the file in a `weft run` job's directory that holds its control URI
/// (for `weft ps`; the directory is the user's alone).
pub const CONTROL_FILE: &str = "control";

/// This machine's host name (`localhost` if it has none).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The host a node of label `label` is on, for tools that reach its processes (a
/// debugger attaching, MPIR): this machine for its logical nodes (`<host>-n<i>`, as
/// `weft run --nodes` names them), else the label itself (a host of `--hosts`).
pub fn physical_host(label: &str, this_host: &str) -> String {
    let logical = label
        .strip_prefix(this_host)
        .and_then(|rest| rest.strip_prefix("-n"))
        .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    if logical {
        this_host.to_owned()
    } else {
        label.to_owned()
    }
}

/// Where rank `rank` of `plan` runs and what it runs, as tools see it: the host
/// ([`physical_host`] of its node's label; `here` is this machine's name) and the program.
pub(crate) fn host_and_program(
    plan: &crate::wire::proto::JobPlan,
    rank: usize,
    here: &str,
) -> (String, String) {
    let Some(p) = plan.job.procs.get(rank) else {
        return (String::new(), String::new());
    };
    let host = plan
        .job
        .nodes
        .get(p.node as usize)
        .map_or_else(String::new, |n| physical_host(&n.hostname, here));
    let program = plan
        .apps
        .get(p.app as usize)
        .map_or_else(String::new, |a| a.program.clone());
    (host, program)
}

/// Writes `text` to `path` readable by its owner only (a URI with a secret, a tool's
/// rendezvous file), in full and on disk before it is seen under its name.
pub(crate) fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp-weft");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// The name of node `node`'s datastore segment for job `job_id`.
pub fn datastore_name(job_id: &str, node: u32) -> String {
    format!("/weft-{job_id}-n{node}")
}

/// The name prefix of every shared-memory segment of node `node` of job `job_id` other
/// than the datastore (transports name their segments with it, so the server can remove
/// them when the job ends, crash or not).
pub fn segment_prefix(job_id: &str, node: u32) -> String {
    format!("/weft-{job_id}-n{node}-")
}

/// Unlinks every segment in /dev/shm whose name starts with `prefix` (with its `/`).
pub fn unlink_segments(prefix: &str) {
    let bare = prefix.trim_start_matches('/');
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(bare) {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    // Open MPI's segment directory (`ompi_shm_dir`).
                    let _ = std::fs::remove_dir_all(e.path());
                } else {
                    let _ = weft_shm::unlink(&format!("/{name}"));
                }
            }
        }
    }
}

/// The directory of node `node`'s PMIx server library in the job directory.
pub fn pmix_dir(job_dir: &Path, node: u32) -> PathBuf {
    job_dir.join(format!("pmix-{node}"))
}

/// The directory in /dev/shm where Open MPI programs of node `node` keep their
/// shared-memory segments (under the node's segment prefix: removed with its segments).
pub fn ompi_shm_dir(job_id: &str, node: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm{}ompi", segment_prefix(job_id, node)))
}

/// The path of node `node`'s socket in the job directory.
pub fn socket_path(job_dir: &Path, node: u32) -> PathBuf {
    job_dir.join(format!("n{node}.sock"))
}

/// Parses a job secret as printed by [`format_secret`].
pub fn parse_secret(s: &str) -> Option<[u64; 2]> {
    let (a, b) = s.split_once('-')?;
    Some([
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    ])
}

/// Formats a job secret for `WEFT_JOB_SECRET`.
pub fn format_secret(s: [u64; 2]) -> String {
    format!("{:016x}-{:016x}", s[0], s[1])
}

pub(crate) use weft_wireup::job::random_u64;

/// Removes what job `job_id` may have left on this machine for its `nodes` nodes (each
/// node's datastore and segments, its socket and PMIx directory in `job_dir`), then the
/// job directory itself if empty: the launcher's last step, whatever its servers did.
pub(crate) fn remove_job(job_id: &str, job_dir: &Path, nodes: u32) {
    for n in 0..nodes {
        let _ = weft_shm::unlink(&datastore_name(job_id, n));
        unlink_segments(&segment_prefix(job_id, n));
        let _ = std::fs::remove_file(socket_path(job_dir, n));
        // A server that was killed leaves its PMIx library's directory behind.
        let _ = std::fs::remove_dir_all(pmix_dir(job_dir, n));
    }
    // The jobs its processes spawned (`<job_id>.<id>`), crash or not.
    unlink_segments(&format!("/weft-{job_id}."));
    // `weft ps`'s way in.
    let _ = std::fs::remove_file(job_dir.join(CONTROL_FILE));
    let _ = std::fs::remove_dir(job_dir);
}

#[cfg(test)]
mod tests {
    #[test]
    fn logical_nodes_are_on_this_host_and_others_keep_their_names() {
        let p = super::physical_host;
        assert_eq!(p("vm-n0", "vm"), "vm");
        assert_eq!(p("vm-n12", "vm"), "vm");
        assert_eq!(p("vm-n", "vm"), "vm-n");
        assert_eq!(p("vm-nx", "vm"), "vm-nx");
        assert_eq!(p("node7", "vm"), "node7");
        assert_eq!(p("vm2-n0", "vm"), "vm2-n0");
    }
}
