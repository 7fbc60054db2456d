//! Single-copy transfers between processes with cross-memory attach
//! (`process_vm_readv` / `process_vm_writev`).
//!
//! The kernel allows them when the caller may ptrace the target (same user
//! and, under Yama's `ptrace_scope = 1`, an ancestor or a process that
//! allowed it with `PR_SET_PTRACER`); otherwise they fail with `EPERM` and
//! the caller falls back to copying through shared memory.

use std::io;

/// Which direction a transfer goes.
#[derive(Clone, Copy)]
enum Dir {
    Read,
    Write,
}

/// Moves `len` bytes between `local` and `remote_addr` in process `pid`,
/// looping over partial transfers.
fn transfer(pid: i32, remote_addr: usize, local: *mut u8, len: usize, dir: Dir) -> io::Result<()> {
    if remote_addr.checked_add(len).is_none() {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    let mut done = 0usize;
    while done < len {
        let local_iov = libc::iovec {
            // SAFETY: done < len, so the pointer stays inside the caller's
            // buffer.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let remote_iov = libc::iovec {
            iov_base: (remote_addr + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `local_iov` describes memory of the caller's buffer (valid
        // for reads and, for `Read`, writes: the public functions take `&[u8]`
        // or `&mut [u8]`); the remote iovec is only interpreted by the kernel
        // in the other process, which checks it.
        let n = unsafe {
            match dir {
                Dir::Read => libc::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0),
                Dir::Write => libc::process_vm_writev(pid, &local_iov, 1, &remote_iov, 1, 0),
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            // No progress: the remote range is not (fully) mapped.
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        done += n as usize;
    }
    Ok(())
}

/// Copies `dst.len()` bytes from address `remote_addr` of process `pid`
/// into `dst` with one copy (`process_vm_readv`), looping over partial
/// transfers.
///
/// Errors carry the errno: `EPERM` when the kernel refuses (ptrace
/// restrictions, another user), `ESRCH` when `pid` does not exist, `EFAULT`
/// when the remote range is not mapped.
pub fn cma_read(pid: i32, remote_addr: usize, dst: &mut [u8]) -> io::Result<()> {
    transfer(pid, remote_addr, dst.as_mut_ptr(), dst.len(), Dir::Read)
}

/// Copies `src` to address `remote_addr` of process `pid` with one copy
/// (`process_vm_writev`), looping over partial transfers. Errors as for
/// [`cma_read`].
pub fn cma_write(pid: i32, remote_addr: usize, src: &[u8]) -> io::Result<()> {
    // The kernel only reads the local buffer for a write.
    transfer(
        pid,
        remote_addr,
        src.as_ptr().cast_mut(),
        src.len(),
        Dir::Write,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_child::{child_role, spawn_child};
    use std::io::{BufRead, BufReader, Write};

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn cma_within_this_process() {
        let pid = std::process::id() as i32;
        let src = pattern(3 << 20, 1);
        let mut dst = vec![0u8; src.len()];
        cma_read(pid, src.as_ptr() as usize, &mut dst).unwrap();
        assert!(dst == src, "cma_read copied wrong bytes");

        let mut target = vec![0u8; 100_000];
        let data = pattern(target.len(), 9);
        cma_write(pid, target.as_mut_ptr() as usize, &data).unwrap();
        assert!(target == data, "cma_write copied wrong bytes");

        cma_read(pid, 0, &mut []).unwrap();
        let err = cma_read(pid, 4096, &mut dst[..16]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
        let err = cma_read(pid, usize::MAX - 4, &mut dst[..16]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
    }

    #[test]
    fn cma_to_a_missing_process_is_esrch() {
        // A child that has exited and been reaped: its pid is free (reuse
        // within this test is very unlikely).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        let mut buf = [0u8; 8];
        let err = cma_read(pid, 4096, &mut buf).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH), "{err}");
    }

    const CHILD_LEN: usize = 1 << 20;

    #[test]
    fn cma_with_a_child_process() {
        if child_role() == Some("cma-child") {
            // Child: publish a buffer's address, wait, check what the parent
            // wrote into it.
            let buf = pattern(CHILD_LEN, 3);
            println!("CMA-CHILD {} {}", buf.as_ptr() as usize, buf.len());
            std::io::stdout().flush().unwrap();
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
            let want = pattern(CHILD_LEN, 77);
            let buf = std::hint::black_box(buf);
            std::process::exit(if buf == want { 0 } else { 3 });
        }
        let mut child = spawn_child(
            "cma::tests::cma_with_a_child_process",
            "cma-child",
            &[],
            true,
        );
        let stdout = child.stdout();
        let mut addr = None;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            // libtest may print "test NAME ... " before it on the same line.
            if let Some(at) = line.find("CMA-CHILD ") {
                let rest = &line[at + "CMA-CHILD ".len()..];
                let mut it = rest.split(' ');
                let a: usize = it.next().unwrap().parse().unwrap();
                let l: usize = it.next().unwrap().parse().unwrap();
                addr = Some((a, l));
                break;
            }
        }
        let (addr, len) = addr.expect("child did not report its buffer");
        assert_eq!(len, CHILD_LEN);
        let pid = child.id() as i32;
        let mut got = vec![0u8; len];
        match cma_read(pid, addr, &mut got) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                println!("SKIPPED: the kernel refuses CMA to a child here ({e})");
                return;
            }
            r => r.unwrap(),
        }
        assert!(
            got == pattern(CHILD_LEN, 3),
            "read wrong bytes from the child"
        );
        cma_write(pid, addr, &pattern(CHILD_LEN, 77)).unwrap();
        child.stdin().write_all(b"check\n").unwrap();
        let status = child.wait(std::time::Duration::from_secs(20));
        assert!(
            status.success(),
            "child saw wrong bytes after cma_write: {status}"
        );
    }
}
