//! MPIR, the process acquisition interface legacy parallel debuggers (TotalView, DDT,
//! `gdb` scripts) read from the starter process: `MPIR_proctable` (host, executable and
//! pid of every rank, in rank order), `MPIR_proctable_size`, `MPIR_debug_state`,
//! `MPIR_being_debugged` and the breakpoint function `MPIR_Breakpoint`, which `weft run`
//! calls once the table is complete. The symbols are the MPIR specification's names
//! and layout (`struct MPIR_PROCDESC { char *host_name; char *executable_name; int
//! pid; }`); a debugger reads them from this process's memory by symbol.

#![allow(unsafe_code)]
// Exported by symbol name for debuggers, not for Rust callers.
#![allow(unreachable_pub, non_upper_case_globals)]

use std::ffi::{c_char, c_int, CString};
use std::ptr::{addr_of_mut, null_mut};

/// One row of `MPIR_proctable`.
#[repr(C)]
#[derive(Debug)]
pub struct MpirProcdesc {
    host_name: *mut c_char,
    executable_name: *mut c_char,
    pid: c_int,
}

/// `MPIR_DEBUG_SPAWNED`: the table is filled in.
const MPIR_DEBUG_SPAWNED: c_int = 1;

/// The table (null until the processes started).
#[no_mangle]
#[used]
pub static mut MPIR_proctable: *mut MpirProcdesc = null_mut();
/// Rows in the table.
#[no_mangle]
#[used]
pub static mut MPIR_proctable_size: c_int = 0;
/// What happened last (`MPIR_DEBUG_SPAWNED` once the table is filled).
#[no_mangle]
#[used]
pub static mut MPIR_debug_state: c_int = 0;
/// Set by a debugger that started `weft run` (before the launch): the job's processes
/// are then held in init until the debugger goes on from `MPIR_Breakpoint`.
#[no_mangle]
#[used]
pub static mut MPIR_being_debugged: c_int = 0;
/// This process starts the job's processes (it is not one of them).
#[no_mangle]
#[used]
pub static mut MPIR_i_am_starter: c_int = 1;
/// A debugger may attach to some of the processes only.
#[no_mangle]
#[used]
pub static mut MPIR_partial_attach_ok: c_int = 1;

/// Where a debugger sets its breakpoint; called once the table is complete.
#[no_mangle]
#[inline(never)]
pub extern "C" fn MPIR_Breakpoint() {
    // Something the optimizer must keep, so the function has a body to stop in.
    std::hint::black_box(());
}

/// Whether a debugger set `MPIR_being_debugged`.
pub(crate) fn being_debugged() -> bool {
    // SAFETY: a plain read of an int a debugger may write while this process is stopped;
    // volatile, as nothing in this program writes it.
    unsafe { addr_of_mut!(MPIR_being_debugged).read_volatile() != 0 }
}

/// Fills the table from the launcher's rows (once; later calls are ignored), then calls
/// `MPIR_Breakpoint`; returns whether a debugger is there (`MPIR_being_debugged`), which
/// has now let the launcher go on. The rows' strings live until the process ends.
pub(crate) fn publish(rows: &[weft_runtime::launcher::ProcRow]) -> bool {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let text = |s: &str| {
            CString::new(s.replace('\0', ""))
                .unwrap_or_default()
                .into_raw()
        };
        let table: Box<[MpirProcdesc]> = rows
            .iter()
            .map(|r| MpirProcdesc {
                host_name: text(&r.host),
                executable_name: text(&r.executable),
                pid: c_int::try_from(r.pid).unwrap_or(0),
            })
            .collect();
        let size = c_int::try_from(table.len()).unwrap_or(c_int::MAX);
        let table = Box::into_raw(table).cast::<MpirProcdesc>();
        // SAFETY: these statics are written only here, once (`DONE`), by the launcher's
        // thread; debuggers read them while this process is stopped. Writes go through
        // raw pointers (no reference to a `static mut` is made), volatile so the stores
        // are not elided: nothing in this program reads them.
        unsafe {
            addr_of_mut!(MPIR_proctable).write_volatile(table);
            addr_of_mut!(MPIR_proctable_size).write_volatile(size);
            addr_of_mut!(MPIR_debug_state).write_volatile(MPIR_DEBUG_SPAWNED);
        }
        MPIR_Breakpoint();
    });
    being_debugged()
}
