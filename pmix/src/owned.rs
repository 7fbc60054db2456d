//! Owners of the PMIx objects the wrappers build or receive: info arrays ([`Infos`]),
//! values returned by the library ([`OwnedValue`]), process names ([`proc_of`]) and keys
//! ([`key`]). Each frees what it holds when dropped.

use std::ffi::{CStr, CString};

use crate::sys;
use crate::{PmixError, PmixValue};

/// A key as PMIx takes it: no NUL byte, at most `PMIX_MAX_KEYLEN` bytes.
pub(crate) fn key(op: &'static str, k: &str) -> Result<CString, PmixError> {
    if k.len() > sys::PMIX_MAX_KEYLEN as usize {
        return Err(PmixError::InvalidArgs {
            op,
            what: format!(
                "key of {} bytes (PMIx takes at most {})",
                k.len(),
                sys::PMIX_MAX_KEYLEN
            ),
        });
    }
    CString::new(k).map_err(|_| PmixError::InvalidArgs {
        op,
        what: format!("key {k:?} holds a NUL byte"),
    })
}

/// A process name: `nspace` (at most `PMIX_MAX_NSLEN` bytes, checked at init) and rank.
pub(crate) fn proc_of(nspace: &[u8], rank: u32) -> sys::pmix_proc_t {
    // SAFETY: pmix_proc_t is plain data (a char array and an integer): all zeroes is
    // the empty name PMIX_PROC_CONSTRUCT makes.
    let mut p: sys::pmix_proc_t = unsafe { std::mem::zeroed() };
    for (d, &s) in p
        .nspace
        .iter_mut()
        .zip(nspace.iter().take(sys::PMIX_MAX_NSLEN as usize))
    {
        *d = s as std::os::raw::c_char;
    }
    p.rank = rank;
    p
}

/// An array of `pmix_info_t` built here; each entry's value is destructed on drop (as
/// `PMIX_INFO_DESTRUCT` does).
pub(crate) struct Infos {
    list: Vec<sys::pmix_info_t>,
    /// Entries whose value the library does not own (not destructed).
    borrowed: Vec<usize>,
}

impl std::fmt::Debug for Infos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Infos({} entries)", self.list.len())
    }
}

impl Infos {
    pub(crate) fn new() -> Infos {
        Infos {
            list: Vec::new(),
            borrowed: Vec::new(),
        }
    }

    /// Appends `key` = `data` of PMIx type `ty` (copied by `PMIx_Info_load`).
    fn push_raw(&mut self, key: &[u8], data: *const std::ffi::c_void, ty: u32) {
        // SAFETY: all zeroes is an empty info (PMIX_INFO_CONSTRUCT); Info_load then sets
        // its key and copies the value from `data`, which points at a value of type `ty`
        // (the callers below pass matching pairs); `key` is one of the bindings'
        // NUL-terminated constants.
        unsafe {
            let mut info: sys::pmix_info_t = std::mem::zeroed();
            let rc = sys::PMIx_Info_load(&mut info, key.as_ptr().cast(), data, ty as u16);
            debug_assert_eq!(rc, 0, "PMIx_Info_load of a plain value");
            self.list.push(info);
        }
    }

    /// Appends a boolean directive (`key` is a NUL-terminated bindings constant).
    pub(crate) fn push_bool(&mut self, key: &[u8], v: bool) {
        self.push_raw(key, (&v as *const bool).cast(), sys::PMIX_BOOL);
    }

    /// Appends an integer directive (`PMIX_INT`, as `PMIX_TIMEOUT` takes).
    pub(crate) fn push_int(&mut self, key: &[u8], v: i32) {
        let v: std::os::raw::c_int = v;
        self.push_raw(
            key,
            (&v as *const std::os::raw::c_int).cast(),
            sys::PMIX_INT,
        );
    }

    /// Appends a string directive (copied by `PMIx_Info_load`).
    pub(crate) fn push_str(&mut self, key: &[u8], v: &std::ffi::CStr) {
        // A PMIX_STRING is loaded from the string pointer itself.
        self.push_raw(key, v.as_ptr().cast(), sys::PMIX_STRING);
    }

    /// Appends a `uint32` value.
    pub(crate) fn push_u32(&mut self, key: &[u8], v: u32) {
        self.push_raw(key, (&v as *const u32).cast(), sys::PMIX_UINT32);
    }

    /// Appends a `uint16` value.
    pub(crate) fn push_u16(&mut self, key: &[u8], v: u16) {
        self.push_raw(key, (&v as *const u16).cast(), sys::PMIX_UINT16);
    }

    /// Appends a topology by pointer, as `PMIx_server_init` takes it (the library keeps
    /// the pointer, and before init `PMIx_Info_load` copies nothing either): the entry
    /// is not destructed on drop; `t` and its topology must outlive the library's use.
    pub(crate) fn push_topology_ptr(&mut self, key: &[u8], t: *mut sys::pmix_topology_t) {
        // SAFETY: all zeroes is an empty info; the key is copied in (bounded by the
        // array), the value set to the pointer by hand.
        unsafe {
            let mut info: sys::pmix_info_t = std::mem::zeroed();
            for (d, &c) in info
                .key
                .iter_mut()
                .zip(key.iter().take(sys::PMIX_MAX_KEYLEN as usize))
            {
                *d = c as std::os::raw::c_char;
            }
            info.value.type_ = sys::PMIX_TOPO as u16;
            info.value.data.topo = t;
            self.borrowed.push(self.list.len());
            self.list.push(info);
        }
    }

    /// Appends a `size_t` value.
    pub(crate) fn push_size(&mut self, key: &[u8], v: usize) {
        self.push_raw(key, (&v as *const usize).cast(), sys::PMIX_SIZE);
    }

    /// Appends a byte object (copied).
    pub(crate) fn push_bytes(&mut self, key: &[u8], v: &[u8]) {
        let bo = sys::pmix_byte_object_t {
            bytes: v.as_ptr().cast_mut().cast(),
            size: v.len(),
        };
        self.push_raw(
            key,
            (&bo as *const sys::pmix_byte_object_t).cast(),
            sys::PMIX_BYTE_OBJECT,
        );
    }

    /// Appends an array of process names (a `PMIX_DATA_ARRAY` of `PMIX_PROC`, copied).
    pub(crate) fn push_procs(&mut self, key: &[u8], v: &[sys::pmix_proc_t]) {
        let darray = sys::pmix_data_array_t {
            type_: sys::PMIX_PROC as u16,
            size: v.len(),
            array: v.as_ptr().cast_mut().cast(),
        };
        self.push_raw(
            key,
            (&darray as *const sys::pmix_data_array_t).cast(),
            sys::PMIX_DATA_ARRAY,
        );
    }

    /// Appends a status (`PMIX_STATUS`).
    pub(crate) fn push_status(&mut self, key: &[u8], v: i32) {
        let v: sys::pmix_status_t = v;
        self.push_raw(
            key,
            (&v as *const sys::pmix_status_t).cast(),
            sys::PMIX_STATUS,
        );
    }

    /// Appends a process table (a `PMIX_DATA_ARRAY` of `PMIX_PROC_INFO`, copied deeply
    /// by `PMIx_Info_load`). Texts with a NUL byte are cut at it.
    #[cfg(weft_pmix)]
    pub(crate) fn push_proc_infos(&mut self, key: &[u8], v: &[crate::server::ProcInfo]) {
        use crate::server::ProcState;
        let text = |s: &str| {
            let cut = s.split('\0').next().unwrap_or("");
            CString::new(cut).unwrap_or_default()
        };
        // The strings the rows point at, alive until the copy is made.
        let texts: Vec<(CString, CString)> = v
            .iter()
            .map(|p| (text(&p.hostname), text(&p.executable)))
            .collect();
        let rows: Vec<sys::pmix_proc_info_t> = v
            .iter()
            .zip(&texts)
            .map(|(p, (host, exe))| sys::pmix_proc_info_t {
                proc_: proc_of(p.nspace.as_bytes(), p.rank),
                hostname: host.as_ptr().cast_mut(),
                executable_name: exe.as_ptr().cast_mut(),
                pid: p.pid as sys::pid_t,
                exit_code: p.exit_code,
                state: match p.state {
                    ProcState::Starting => sys::PMIX_PROC_STATE_LAUNCH_UNDERWAY,
                    ProcState::Running => sys::PMIX_PROC_STATE_RUNNING,
                    ProcState::Terminated => sys::PMIX_PROC_STATE_TERMINATED,
                } as sys::pmix_proc_state_t,
            })
            .collect();
        let darray = sys::pmix_data_array_t {
            type_: sys::PMIX_PROC_INFO as u16,
            size: rows.len(),
            array: rows.as_ptr().cast_mut().cast(),
        };
        self.push_raw(
            key,
            (&darray as *const sys::pmix_data_array_t).cast(),
            sys::PMIX_DATA_ARRAY,
        );
    }

    /// Appends a process name (`PMIX_PROC`, copied).
    pub(crate) fn push_proc(&mut self, key: &[u8], p: &sys::pmix_proc_t) {
        self.push_raw(key, (p as *const sys::pmix_proc_t).cast(), sys::PMIX_PROC);
    }

    /// Appends a rank (`pmix_rank_t`).
    pub(crate) fn push_rank(&mut self, key: &[u8], v: u32) {
        let v: sys::pmix_rank_t = v;
        self.push_raw(
            key,
            (&v as *const sys::pmix_rank_t).cast(),
            sys::PMIX_PROC_RANK,
        );
    }

    /// Appends a string value; `None` (the text holds a NUL byte) appends nothing.
    pub(crate) fn push_string(&mut self, key: &[u8], v: &str) -> Option<()> {
        let c = std::ffi::CString::new(v).ok()?;
        self.push_str(key, &c);
        Some(())
    }

    /// Appends `inner` as a data array of infos (copied deeply by `PMIx_Info_load`).
    pub(crate) fn push_infos(&mut self, key: &[u8], inner: &mut Infos) {
        let darray = sys::pmix_data_array_t {
            type_: sys::PMIX_INFO as u16,
            size: inner.len(),
            array: inner.as_mut_ptr().cast(),
        };
        self.push_raw(
            key,
            (&darray as *const sys::pmix_data_array_t).cast(),
            sys::PMIX_DATA_ARRAY,
        );
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut sys::pmix_info_t {
        if self.list.is_empty() {
            std::ptr::null_mut()
        } else {
            self.list.as_mut_ptr()
        }
    }

    pub(crate) fn as_ptr(&self) -> *const sys::pmix_info_t {
        if self.list.is_empty() {
            std::ptr::null()
        } else {
            self.list.as_ptr()
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }
}

impl Drop for Infos {
    fn drop(&mut self) {
        for (k, i) in self.list.iter_mut().enumerate() {
            if self.borrowed.contains(&k) {
                continue;
            }
            // SAFETY: each value was loaded by PMIx_Info_load and is destructed once.
            unsafe { sys::PMIx_Value_destruct(&mut i.value) };
        }
    }
}

/// A `pmix_value_t` the library allocated (what `PMIx_Get` returns): destructed and
/// freed on drop (`PMIX_VALUE_RELEASE`).
pub(crate) struct OwnedValue(pub(crate) *mut sys::pmix_value_t);

impl OwnedValue {
    /// A Rust copy of the value.
    pub(crate) fn to_value(&self) -> PmixValue {
        // SAFETY: the pointer came non-null from PMIx_Get and stays valid until drop.
        unsafe { value_of(&*self.0) }
    }
}

/// A process name's parts.
///
/// # Safety
/// `p` is a valid process name.
pub(crate) unsafe fn proc_name(p: &sys::pmix_proc_t) -> (String, u32) {
    // SAFETY: the caller's contract: `nspace` is NUL-terminated within its array.
    let ns = unsafe { CStr::from_ptr(p.nspace.as_ptr()) };
    (ns.to_string_lossy().into_owned(), p.rank)
}

/// A Rust copy of a value the library owns.
///
/// # Safety
/// `v` is a valid, initialized `pmix_value_t` (its pointers valid for the call).
pub(crate) unsafe fn value_of(v: &sys::pmix_value_t) -> PmixValue {
    let d = &v.data;
    let text = |p: *const std::os::raw::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: a non-null string of a valid value is NUL-terminated.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    // SAFETY: every union read below is of the member the type tag names; the pointers
    // of a valid value point at what its type says, for `size` entries.
    unsafe {
        match u32::from(v.type_) {
            sys::PMIX_BOOL => PmixValue::Bool(d.flag),
            sys::PMIX_UINT8 | sys::PMIX_BYTE => PmixValue::U8(d.uint8),
            sys::PMIX_UINT16 => PmixValue::U16(d.uint16),
            sys::PMIX_UINT32 => PmixValue::U32(d.uint32),
            sys::PMIX_UINT64 => PmixValue::U64(d.uint64),
            sys::PMIX_INT | sys::PMIX_INT32 => PmixValue::I32(d.int32),
            sys::PMIX_SIZE => PmixValue::Size(d.size),
            sys::PMIX_PROC_RANK => PmixValue::Rank(d.rank),
            sys::PMIX_STRING => PmixValue::Str(text(d.string)),
            sys::PMIX_BYTE_OBJECT => PmixValue::Bytes(if d.bo.bytes.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(d.bo.bytes.cast::<u8>(), d.bo.size).to_vec()
            }),
            sys::PMIX_PROC if !d.proc_.is_null() => PmixValue::Procs(vec![proc_name(&*d.proc_)]),
            sys::PMIX_DATA_ARRAY if !d.darray.is_null() => {
                let a = &*d.darray;
                if a.array.is_null() || a.size == 0 {
                    return match u32::from(a.type_) {
                        sys::PMIX_PROC => PmixValue::Procs(Vec::new()),
                        _ => PmixValue::Strings(Vec::new()),
                    };
                }
                match u32::from(a.type_) {
                    sys::PMIX_STRING => PmixValue::Strings(
                        std::slice::from_raw_parts(
                            a.array.cast::<*mut std::os::raw::c_char>(),
                            a.size,
                        )
                        .iter()
                        .map(|&p| text(p))
                        .collect(),
                    ),
                    sys::PMIX_PROC => PmixValue::Procs(
                        std::slice::from_raw_parts(a.array.cast::<sys::pmix_proc_t>(), a.size)
                            .iter()
                            .map(|p| proc_name(p))
                            .collect(),
                    ),
                    _ => PmixValue::Other(v.type_),
                }
            }
            _ => PmixValue::Other(v.type_),
        }
    }
}

impl Drop for OwnedValue {
    fn drop(&mut self) {
        if self.0.is_null() {
            return;
        }
        // SAFETY: the value and its data were allocated by the library with malloc
        // (PMIX_VALUE_RELEASE: destruct, then free); freed once, here.
        unsafe {
            sys::PMIx_Value_destruct(self.0);
            libc::free(self.0.cast());
        }
    }
}

impl Infos {
    /// `n` empty infos (as `PMIX_INFO_CREATE` makes them), to unpack into.
    pub(crate) fn empty(n: usize) -> Infos {
        Infos {
            // SAFETY: all zeroes is an empty info (PMIX_INFO_CONSTRUCT).
            list: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            borrowed: Vec::new(),
        }
    }
}
