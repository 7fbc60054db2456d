//! Generic POSIX shared-memory segments: create, publish, open and validate.
//!
//! A segment is a POSIX shm object (`/dev/shm/<name>` on Linux) that starts
//! with a [`SegmentHeader`]. The creator ([`WritableSegment::create`]) maps
//! it read-write, fills in its payload, then calls
//! [`WritableSegment::publish`], which writes the header and stores
//! [`STATE_READY`] last with `Release` ordering. Every other process maps it
//! with [`ReadOnlySegment::open`], which validates magic, layout version,
//! kind, state and size before handing out the mapping, and returns a
//! [`SegmentError`] naming the segment for every mismatch.
//!
//! The kind-specific stores ([`crate::store`]) and later transports build on
//! these two types.

use core::ffi::c_void;
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::{fence, Ordering};
use std::io;

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{fstat, ftruncate, Mode};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};
use rustix::shm;

use crate::layout::{
    SegmentHeader, LAYOUT_VERSION, SEGMENT_HEADER_BYTES, SEGMENT_MAGIC, STATE_READY,
};

/// Longest segment name accepted (Linux `NAME_MAX`, including the leading `/`).
pub const MAX_NAME_BYTES: usize = 255;

/// Errors of creating, opening, validating or unlinking a segment.
///
/// Every variant names the segment it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SegmentError {
    /// The name is not a valid POSIX shm name (`/` followed by 1..=254 bytes,
    /// no other `/`, no NUL).
    #[error("invalid shared-memory segment name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The requested size or geometry cannot be created.
    #[error("cannot create shared-memory segment {name}: {reason}")]
    InvalidConfig {
        /// Segment name.
        name: String,
        /// What is wrong with the request.
        reason: String,
    },
    /// `shm_open(O_CREAT|O_EXCL)` failed (e.g. the name already exists).
    #[error("cannot create shared-memory segment {name}")]
    Create {
        /// Segment name.
        name: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `ftruncate` to the requested size failed.
    #[error("cannot size shared-memory segment {name} to {bytes} bytes")]
    Resize {
        /// Segment name.
        name: String,
        /// Requested size.
        bytes: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// No segment of that name exists.
    #[error("shared-memory segment {name} does not exist")]
    NotFound {
        /// Segment name.
        name: String,
    },
    /// `shm_open` of an existing segment failed (e.g. permissions).
    #[error("cannot open shared-memory segment {name}")]
    Open {
        /// Segment name.
        name: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `fstat` of the segment failed.
    #[error("cannot stat shared-memory segment {name}")]
    Stat {
        /// Segment name.
        name: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `mmap` of the segment failed.
    #[error("cannot map shared-memory segment {name} ({bytes} bytes)")]
    Map {
        /// Segment name.
        name: String,
        /// Length of the attempted mapping.
        bytes: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The segment file is smaller than it must be: truncated, or its creator
    /// has not sized it yet.
    #[error(
        "shared-memory segment {name} is {file_bytes} bytes but needs {needed_bytes} bytes \
         (truncated, or still being created)"
    )]
    Truncated {
        /// Segment name.
        name: String,
        /// Actual size of the file.
        file_bytes: u64,
        /// Size the segment needs.
        needed_bytes: u64,
    },
    /// The segment does not start with the Weft magic number.
    #[error(
        "shared-memory segment {name} is not a Weft segment \
         (magic {found:#018x}, expected {expected:#018x})"
    )]
    BadMagic {
        /// Segment name.
        name: String,
        /// Magic found in the segment.
        found: u64,
        /// Magic this build expects.
        expected: u64,
    },
    /// The segment was written by a build with another layout version.
    #[error(
        "shared-memory segment {name} has layout version {found}, this build reads \
         version {expected}"
    )]
    LayoutVersion {
        /// Segment name.
        name: String,
        /// Version found in the segment.
        found: u32,
        /// Version this build expects.
        expected: u32,
    },
    /// The segment holds another kind of data than asked for.
    #[error("shared-memory segment {name} is of kind {found}, expected kind {expected}")]
    WrongKind {
        /// Segment name.
        name: String,
        /// Kind found in the segment.
        found: u32,
        /// Kind asked for.
        expected: u32,
    },
    /// The creator has not published the segment (yet).
    #[error("shared-memory segment {name} is not ready (state {state})")]
    NotReady {
        /// Segment name.
        name: String,
        /// State found in the header.
        state: u32,
    },
    /// A size or offset recorded in the segment is inconsistent.
    #[error("shared-memory segment {name} is corrupt: {what}")]
    Corrupt {
        /// Segment name.
        name: String,
        /// What was inconsistent.
        what: String,
    },
    /// `shm_unlink` failed for another reason than the name being absent.
    #[error("cannot unlink shared-memory segment {name}")]
    Unlink {
        /// Segment name.
        name: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// What a segment holds, recorded in [`SegmentHeader::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SegmentKind(pub u32);

impl SegmentKind {
    /// The wire-up server's node-local datastore ([`crate::store`]).
    pub const DATASTORE: SegmentKind = SegmentKind(crate::layout::KIND_DATASTORE);
    /// A shared-memory transport inbox ([`crate::Inbox`]).
    pub const INBOX: SegmentKind = SegmentKind(crate::layout::KIND_INBOX);
    /// A node-local collective segment ([`crate::CollSegment`]).
    pub const COLL: SegmentKind = SegmentKind(crate::layout::KIND_COLL);
}

/// Removes the segment `name`; a segment that does not exist is `Ok`.
///
/// Processes that still map the segment keep their mapping.
pub fn unlink(name: &str) -> Result<(), SegmentError> {
    check_name(name)?;
    match shm::unlink(name) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(SegmentError::Unlink {
            name: name.to_owned(),
            source: e.into(),
        }),
    }
}

/// Checks that `name` is a portable POSIX shm name.
fn check_name(name: &str) -> Result<(), SegmentError> {
    let reason = if !name.starts_with('/') {
        Some("must start with '/'")
    } else if name.len() < 2 {
        Some("must have at least one byte after '/'")
    } else if name.len() > MAX_NAME_BYTES {
        Some("longer than 255 bytes")
    } else if name[1..].contains('/') {
        Some("must not contain '/' after the first byte")
    } else if name.contains('\0') {
        Some("must not contain NUL")
    } else if &name[1..] == "." || &name[1..] == ".." {
        Some("must not be '.' or '..'")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(SegmentError::InvalidName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// (device, inode) of an open shm object.
// The casts are no-ops on 64-bit Linux but not on every target.
#[allow(clippy::unnecessary_cast)]
fn file_id(st: &rustix::fs::Stat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

/// One `mmap` of a segment, unmapped on drop.
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, not tied to a thread; `base` is
// only an address, and every access to the memory goes through atomics or
// through the protocols of the types laid out in it.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` exposes nothing but the address and length.
unsafe impl Sync for Mapping {}

impl fmt::Debug for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapping")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish()
    }
}

/// Keeps a segment's memory mapped (not its name): for pointers into it held
/// by another object than the segment's owner.
pub(crate) type Keepalive = std::sync::Arc<Mapping>;

impl Mapping {
    /// Maps `len` bytes of `fd` shared, read-only or read-write.
    fn new(name: &str, fd: &OwnedFd, len: usize, writable: bool) -> Result<Mapping, SegmentError> {
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a fresh mapping chosen by the kernel (null hint, no
        // MAP_FIXED) cannot overlap any existing Rust allocation; `len` is
        // non-zero (callers check it is at least SEGMENT_HEADER_BYTES).
        let ptr = unsafe { mmap(core::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0) }
            .map_err(|e| SegmentError::Map {
                name: name.to_owned(),
                bytes: len,
                source: e.into(),
            })?;
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| SegmentError::Map {
            name: name.to_owned(),
            bytes: len,
            source: io::Error::other("mmap returned a null address"),
        })?;
        Ok(Mapping { base, len })
    }

    /// The segment header at offset 0.
    fn header(&self) -> &SegmentHeader {
        // SAFETY: the mapping is at least SEGMENT_HEADER_BYTES long (checked
        // before mapping), page-aligned (so aligned for SegmentHeader), lives
        // as long as `self`, and SegmentHeader's shared fields are atomics
        // (interior mutability), so a shared reference to memory other
        // processes write is sound.
        unsafe { &*self.base.as_ptr().cast::<SegmentHeader>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the region returned by mmap in
        // `Mapping::new`; nothing borrowed from it outlives `self` (every
        // borrow handed out is tied to the owning segment's lifetime).
        let _ = unsafe { munmap(self.base.as_ptr().cast::<c_void>(), self.len) };
    }
}

/// A segment created (and owned) by this process, mapped read-write.
///
/// Dropping it unmaps it and unlinks its name (if the name still refers to
/// this segment).
pub struct WritableSegment {
    name: String,
    map: Keepalive,
    /// (device, inode) of the shm object, to unlink only our own segment.
    id: (u64, u64),
    /// The open shm object (kept for `fcntl` record locks on it).
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory, not tied to the creating
// thread; the raw pointer is only an address. Moving the owner to another
// thread is fine.
unsafe impl Send for WritableSegment {}

impl fmt::Debug for WritableSegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WritableSegment")
            .field("name", &self.name)
            .field("bytes", &self.map.len)
            .finish_non_exhaustive()
    }
}

impl WritableSegment {
    /// Creates the POSIX shm object `name` (`O_CREAT|O_EXCL`, mode 0600),
    /// sizes it to `bytes` (sparse on tmpfs: untouched pages cost nothing)
    /// and maps it read-write. The header stays in [`crate::layout::STATE_INITIALIZING`]
    /// (all zero) until [`publish`](Self::publish).
    pub fn create(
        name: &str,
        bytes: usize,
        kind: SegmentKind,
    ) -> Result<WritableSegment, SegmentError> {
        check_name(name)?;
        if bytes < SEGMENT_HEADER_BYTES || bytes > isize::MAX as usize {
            return Err(SegmentError::InvalidConfig {
                name: name.to_owned(),
                reason: format!(
                    "size {bytes} bytes is outside {SEGMENT_HEADER_BYTES}..={}",
                    isize::MAX
                ),
            });
        }
        let fd = shm::open(
            name,
            shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| SegmentError::Create {
            name: name.to_owned(),
            source: e.into(),
        })?;
        // From here on the name exists: remove it again on any failure.
        let fail = |err: SegmentError| {
            let _ = shm::unlink(name);
            err
        };
        ftruncate(&fd, bytes as u64).map_err(|e| {
            fail(SegmentError::Resize {
                name: name.to_owned(),
                bytes,
                source: e.into(),
            })
        })?;
        let st = fstat(&fd).map_err(|e| {
            fail(SegmentError::Stat {
                name: name.to_owned(),
                source: e.into(),
            })
        })?;
        let map = Mapping::new(name, &fd, bytes, true).map_err(fail)?;
        let seg = WritableSegment {
            name: name.to_owned(),
            map: Keepalive::new(map),
            id: file_id(&st),
            fd,
        };
        // Relaxed: nobody may trust these before `publish` Release-stores the state.
        seg.header()
            .kind
            .store(kind.0, core::sync::atomic::Ordering::Relaxed);
        Ok(seg)
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Size of the mapping (and of the segment) in bytes.
    pub fn bytes(&self) -> usize {
        self.map.len
    }

    /// Start of the read-write mapping. Valid for [`bytes`](Self::bytes)
    /// bytes while `self` lives; the first [`SEGMENT_HEADER_BYTES`] are the
    /// header and must only be changed through [`header`](Self::header).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.base.as_ptr()
    }

    /// The segment header.
    pub fn header(&self) -> &SegmentHeader {
        self.map.header()
    }

    /// The open shm object.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A handle that keeps the memory mapped after `self` is dropped (the
    /// name is still unlinked then).
    pub(crate) fn keepalive(&self) -> Keepalive {
        self.map.clone()
    }

    /// Writes magic, layout version and size, then marks the segment ready.
    ///
    /// Everything this process wrote into the segment before this call is
    /// visible to any process whose [`ReadOnlySegment::open`] succeeds.
    pub fn publish(&self) {
        let h = self.header();
        h.magic.store(SEGMENT_MAGIC, Ordering::Relaxed);
        h.layout_version.store(LAYOUT_VERSION, Ordering::Relaxed);
        h.total_bytes.store(self.map.len as u64, Ordering::Relaxed);
        // SYNC: pairs with the Acquire fence after the `state` load in
        // `ReadOnlySegment::open`; publishes the header and payload.
        h.state.store(STATE_READY, Ordering::Release);
    }
}

impl Drop for WritableSegment {
    fn drop(&mut self) {
        // Unlink only if the name still refers to our object: a janitor may
        // have removed it and someone else may have created a new one since.
        if let Ok(fd) = shm::open(self.name.as_str(), shm::OFlags::RDONLY, Mode::empty()) {
            if let Ok(st) = fstat(&fd) {
                if file_id(&st) == self.id {
                    let _ = shm::unlink(self.name.as_str());
                }
            }
        }
        // `self.map` unmaps when dropped after this.
    }
}

/// A segment opened read-only by a process that did not create it.
pub struct ReadOnlySegment {
    name: String,
    map: Mapping,
}

// SAFETY: the mapping is plain shared memory, not tied to the opening thread.
unsafe impl Send for ReadOnlySegment {}
// SAFETY: `&ReadOnlySegment` only gives out the header (atomics) and a
// `*const u8`; the mapping is read-only, so no `&self` method mutates.
unsafe impl Sync for ReadOnlySegment {}

impl fmt::Debug for ReadOnlySegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadOnlySegment")
            .field("name", &self.name)
            .field("bytes", &self.map.len)
            .finish_non_exhaustive()
    }
}

impl ReadOnlySegment {
    /// Opens `name` read-only (`O_RDONLY`, `PROT_READ`) and validates its
    /// header: magic, layout version, `kind`, state ready, and a recorded
    /// size that fits the file.
    pub fn open(name: &str, kind: SegmentKind) -> Result<ReadOnlySegment, SegmentError> {
        let (map, _fd) = open_validated(name, kind, false)?;
        Ok(ReadOnlySegment {
            name: name.to_owned(),
            map,
        })
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Usable size in bytes: the size recorded by the creator (never more
    /// than what is mapped).
    pub fn bytes(&self) -> usize {
        // Validated in `open`: SEGMENT_HEADER_BYTES <= total <= map.len.
        let total = self.header().total_bytes.load(Ordering::Relaxed);
        usize::try_from(total).map_or(self.map.len, |t| t.min(self.map.len))
    }

    /// Start of the read-only mapping, valid for [`bytes`](Self::bytes)
    /// bytes while `self` lives. Only read published data through it.
    pub fn as_ptr(&self) -> *const u8 {
        self.map.base.as_ptr()
    }

    /// The segment header.
    pub fn header(&self) -> &SegmentHeader {
        self.map.header()
    }
}

/// Opens `name`, maps all of it (read-only or read-write) and validates its
/// header: magic, layout version, `kind`, state ready, and a recorded size
/// that fits the file.
fn open_validated(
    name: &str,
    kind: SegmentKind,
    writable: bool,
) -> Result<(Mapping, OwnedFd), SegmentError> {
    check_name(name)?;
    let flags = if writable {
        shm::OFlags::RDWR
    } else {
        shm::OFlags::RDONLY
    };
    let fd = match shm::open(name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => {
            return Err(SegmentError::NotFound {
                name: name.to_owned(),
            })
        }
        Err(e) => {
            return Err(SegmentError::Open {
                name: name.to_owned(),
                source: e.into(),
            })
        }
    };
    let st = fstat(&fd).map_err(|e| SegmentError::Stat {
        name: name.to_owned(),
        source: e.into(),
    })?;
    let file_bytes = u64::try_from(st.st_size).unwrap_or(0);
    if file_bytes < SEGMENT_HEADER_BYTES as u64 {
        return Err(SegmentError::Truncated {
            name: name.to_owned(),
            file_bytes,
            needed_bytes: SEGMENT_HEADER_BYTES as u64,
        });
    }
    let len = usize::try_from(file_bytes)
        .ok()
        .filter(|&l| l <= isize::MAX as usize)
        .ok_or_else(|| SegmentError::Corrupt {
            name: name.to_owned(),
            what: format!("file size {file_bytes} does not fit the address space"),
        })?;
    let map = Mapping::new(name, &fd, len, writable)?;

    let h = map.header();
    // Relaxed loads (plus a fence) because Acquire loads are not
    // guaranteed to work on read-only mappings; Relaxed ones of this size are.
    let state = h.state.load(Ordering::Relaxed);
    // SYNC: pairs with the Release store of `state` in
    // `WritableSegment::publish`.
    fence(Ordering::Acquire);
    let magic = h.magic.load(Ordering::Relaxed);
    if magic != SEGMENT_MAGIC {
        return Err(SegmentError::BadMagic {
            name: name.to_owned(),
            found: magic,
            expected: SEGMENT_MAGIC,
        });
    }
    let version = h.layout_version.load(Ordering::Relaxed);
    if version != LAYOUT_VERSION {
        return Err(SegmentError::LayoutVersion {
            name: name.to_owned(),
            found: version,
            expected: LAYOUT_VERSION,
        });
    }
    let found_kind = h.kind.load(Ordering::Relaxed);
    if found_kind != kind.0 {
        return Err(SegmentError::WrongKind {
            name: name.to_owned(),
            found: found_kind,
            expected: kind.0,
        });
    }
    if state != STATE_READY {
        return Err(SegmentError::NotReady {
            name: name.to_owned(),
            state,
        });
    }
    let total = h.total_bytes.load(Ordering::Relaxed);
    if total > file_bytes {
        return Err(SegmentError::Truncated {
            name: name.to_owned(),
            file_bytes,
            needed_bytes: total,
        });
    }
    if total < SEGMENT_HEADER_BYTES as u64 {
        return Err(SegmentError::Corrupt {
            name: name.to_owned(),
            what: format!("recorded size {total} is smaller than the segment header"),
        });
    }
    Ok((map, fd))
}

/// A segment created by another process, opened read-write (a transport's
/// senders write into their receiver's inbox).
///
/// Keeps the shm object open, for `fcntl` record locks on it.
pub(crate) struct SharedSegment {
    name: String,
    map: Keepalive,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory, not tied to the opening thread;
// the raw pointer is only an address and the fd is an ordinary descriptor.
unsafe impl Send for SharedSegment {}

impl fmt::Debug for SharedSegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSegment")
            .field("name", &self.name)
            .field("bytes", &self.map.len)
            .finish_non_exhaustive()
    }
}

impl SharedSegment {
    /// Opens `name` read-write (`O_RDWR`, `PROT_READ|PROT_WRITE`) and
    /// validates its header like [`ReadOnlySegment::open`].
    pub(crate) fn open(name: &str, kind: SegmentKind) -> Result<SharedSegment, SegmentError> {
        let (map, fd) = open_validated(name, kind, true)?;
        Ok(SharedSegment {
            name: name.to_owned(),
            map: Keepalive::new(map),
            fd,
        })
    }

    /// A handle that keeps the memory mapped after `self` is dropped.
    pub(crate) fn keepalive(&self) -> Keepalive {
        self.map.clone()
    }

    /// The segment's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Usable size in bytes: the size recorded by the creator (validated by
    /// `open` to be at most what is mapped).
    pub(crate) fn bytes(&self) -> usize {
        let total = self.map.header().total_bytes.load(Ordering::Relaxed);
        usize::try_from(total).map_or(self.map.len, |t| t.min(self.map.len))
    }

    /// Start of the read-write mapping, valid for [`bytes`](Self::bytes)
    /// bytes while `self` lives.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.map.base.as_ptr()
    }

    /// The open shm object.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_name(test: &str) -> String {
        format!("/weft-test-{}-seg-{test}", std::process::id())
    }

    #[test]
    fn rejects_bad_names() {
        for bad in ["", "noslash", "/", "/a/b", "/a\0b", "/.."] {
            assert!(
                matches!(
                    WritableSegment::create(bad, 4096, SegmentKind(7)),
                    Err(SegmentError::InvalidName { .. })
                ),
                "{bad:?}"
            );
        }
        let long = format!("/{}", "x".repeat(255));
        assert!(matches!(
            ReadOnlySegment::open(&long, SegmentKind(7)),
            Err(SegmentError::InvalidName { .. })
        ));
    }

    #[test]
    fn create_is_exclusive() {
        let name = test_name("exclusive");
        let _seg = WritableSegment::create(&name, 4096, SegmentKind(7)).unwrap();
        match WritableSegment::create(&name, 4096, SegmentKind(7)) {
            Err(SegmentError::Create { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::AlreadyExists)
            }
            other => panic!("expected Create error, got {other:?}"),
        }
    }

    #[test]
    fn unpublished_segment_is_not_ready() {
        let name = test_name("not-ready");
        let seg = WritableSegment::create(&name, 4096, SegmentKind(7)).unwrap();
        // Magic and version are written by publish, so an unpublished
        // segment fails on the magic first.
        assert!(matches!(
            ReadOnlySegment::open(&name, SegmentKind(7)),
            Err(SegmentError::BadMagic { found: 0, .. })
        ));
        // A header with magic and version but state still initializing.
        seg.header().magic.store(SEGMENT_MAGIC, Ordering::Relaxed);
        seg.header()
            .layout_version
            .store(LAYOUT_VERSION, Ordering::Relaxed);
        match ReadOnlySegment::open(&name, SegmentKind(7)) {
            Err(SegmentError::NotReady { state: 0, name: n }) => assert_eq!(n, name),
            other => panic!("expected NotReady, got {other:?}"),
        }
        seg.publish();
        let ro = ReadOnlySegment::open(&name, SegmentKind(7)).unwrap();
        assert_eq!(ro.bytes(), 4096);
        assert!(matches!(
            ReadOnlySegment::open(&name, SegmentKind(8)),
            Err(SegmentError::WrongKind {
                found: 7,
                expected: 8,
                ..
            })
        ));
    }

    #[test]
    fn unlink_missing_is_ok_and_drop_unlinks() {
        let name = test_name("unlink");
        unlink(&name).unwrap();
        let seg = WritableSegment::create(&name, 4096, SegmentKind(7)).unwrap();
        seg.publish();
        let ro = ReadOnlySegment::open(&name, SegmentKind(7)).unwrap();
        drop(seg);
        assert!(matches!(
            ReadOnlySegment::open(&name, SegmentKind(7)),
            Err(SegmentError::NotFound { .. })
        ));
        // An existing mapping survives the unlink.
        assert_eq!(ro.header().state.load(Ordering::Relaxed), STATE_READY);
    }

    #[test]
    fn drop_does_not_unlink_a_successor() {
        let name = test_name("successor");
        let first = WritableSegment::create(&name, 4096, SegmentKind(7)).unwrap();
        unlink(&name).unwrap();
        let second = WritableSegment::create(&name, 4096, SegmentKind(7)).unwrap();
        second.publish();
        drop(first);
        assert!(ReadOnlySegment::open(&name, SegmentKind(7)).is_ok());
        drop(second);
        assert!(matches!(
            ReadOnlySegment::open(&name, SegmentKind(7)),
            Err(SegmentError::NotFound { .. })
        ));
    }
}
