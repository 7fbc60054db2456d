//! `PMIx_Job_control` through the host: the library's `job_control` upcall, its
//! directives read into a [`JobCtrl`], answered through the info callback.

use std::ffi::{c_void, CStr};

use super::imp::{host, name_of, names_of};
use super::{GroupReply, JobControl, JobCtrl};
use crate::client::SUCCESS;
use crate::sys;

/// The directives that only inform the host (nothing to do), as OpenPMIx's `jctrl.c`
/// sends them with no target.
const NOTES: [&[u8]; 4] = [
    sys::PMIX_JOB_CTRL_PREEMPTIBLE,
    sys::PMIX_JOB_CTRL_CHECKPOINT_METHOD,
    sys::PMIX_JOB_CTRL_CHECKPOINT_EVENT,
    sys::PMIX_JOB_CTRL_CHECKPOINT_SIGNAL,
];

/// What `directives` ask for, or the key of the first one that is not served.
pub(super) fn action(directives: &[(Vec<u8>, crate::PmixValue)]) -> Result<JobCtrl, String> {
    let mut notes = Vec::new();
    let mut act = None;
    for (k, v) in directives {
        let on = !matches!(v, crate::PmixValue::Bool(false));
        let name = String::from_utf8_lossy(k.strip_suffix(b"\0").unwrap_or(k)).into_owned();
        let found = if k == sys::PMIX_JOB_CTRL_KILL {
            on.then_some(JobCtrl::Kill)
        } else if k == sys::PMIX_JOB_CTRL_TERMINATE {
            on.then_some(JobCtrl::Terminate)
        } else if k == sys::PMIX_JOB_CTRL_PAUSE {
            on.then_some(JobCtrl::Pause)
        } else if k == sys::PMIX_JOB_CTRL_RESUME {
            on.then_some(JobCtrl::Resume)
        } else if k == sys::PMIX_JOB_CTRL_SIGNAL {
            match v {
                crate::PmixValue::I32(s) if *s > 0 && *s < 65 => Some(JobCtrl::Signal(*s)),
                other => return Err(format!("{name} = {other:?} is not a signal number")),
            }
        } else if NOTES.contains(&k.as_slice()) || k == sys::PMIX_JOB_CTRL_ID {
            notes.push(name.clone());
            None
        } else {
            return Err(name);
        };
        if let Some(a) = found {
            if act.replace(a).is_some() {
                return Err(format!("{name} (more than one action in one call)"));
            }
        }
    }
    Ok(act.unwrap_or(JobCtrl::Note(notes)))
}

pub(super) unsafe extern "C" fn job_control(
    requestor: *const sys::pmix_proc_t,
    targets: *const sys::pmix_proc_t,
    ntargets: usize,
    directives: *const sys::pmix_info_t,
    ndirs: usize,
    cb: sys::pmix_info_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let Some(h) = host() else {
        return sys::PMIX_ERR_NOT_SUPPORTED;
    };
    if requestor.is_null() {
        return sys::PMIX_ERR_BAD_PARAM;
    }
    let mut dirs = Vec::new();
    for i in 0..if directives.is_null() { 0 } else { ndirs } {
        // SAFETY: the library passes `ndirs` valid infos.
        let inf = unsafe { &*directives.add(i) };
        // SAFETY: a valid info's key is NUL-terminated within its array.
        let k = unsafe { CStr::from_ptr(inf.key.as_ptr()) }.to_bytes_with_nul();
        // SAFETY: the union member read is the one the type tag names.
        dirs.push((k.to_vec(), unsafe { crate::owned::value_of(&inf.value) }));
    }
    // SAFETY: the library passes the requestor's valid name (checked non-null).
    let requestor = unsafe { name_of(requestor) };
    let action = match action(&dirs) {
        Ok(a) => a,
        Err(key) => {
            tracing::warn!(
                "PMIx_Job_control of {}:{:?}: directive {key} is not served",
                requestor.nspace,
                requestor.rank
            );
            return sys::PMIX_ERR_NOT_SUPPORTED;
        }
    };
    h.job_control(JobControl {
        requestor,
        // SAFETY: the library passes `ntargets` valid names (or null).
        targets: unsafe { names_of(targets, ntargets) },
        action,
        reply: GroupReply::new(cb, cbdata),
    });
    SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PmixValue;

    fn d(k: &[u8], v: PmixValue) -> (Vec<u8>, PmixValue) {
        (k.to_vec(), v)
    }

    #[test]
    fn directives_become_one_action_or_notes_and_the_rest_is_refused_by_name() {
        assert_eq!(
            action(&[
                d(sys::PMIX_JOB_CTRL_PREEMPTIBLE, PmixValue::Bool(true)),
                d(sys::PMIX_JOB_CTRL_CHECKPOINT_METHOD, PmixValue::Bool(true)),
            ]),
            Ok(JobCtrl::Note(vec![
                "pmix.jctrl.preempt".into(),
                "pmix.jctrl.ckmethod".into()
            ]))
        );
        assert_eq!(
            action(&[d(sys::PMIX_JOB_CTRL_SIGNAL, PmixValue::I32(10))]),
            Ok(JobCtrl::Signal(10))
        );
        assert_eq!(
            action(&[d(sys::PMIX_JOB_CTRL_KILL, PmixValue::Bool(true))]),
            Ok(JobCtrl::Kill)
        );
        assert_eq!(
            action(&[d(sys::PMIX_JOB_CTRL_TERMINATE, PmixValue::Bool(false))]),
            Ok(JobCtrl::Note(Vec::new()))
        );
        assert_eq!(
            action(&[d(sys::PMIX_JOB_CTRL_PROVISION, PmixValue::Bool(true))]),
            Err("pmix.jctrl.pvn".into())
        );
        assert!(action(&[d(sys::PMIX_JOB_CTRL_SIGNAL, PmixValue::I32(0))])
            .unwrap_err()
            .contains("not a signal number"));
        assert!(action(&[
            d(sys::PMIX_JOB_CTRL_KILL, PmixValue::Bool(true)),
            d(sys::PMIX_JOB_CTRL_PAUSE, PmixValue::Bool(true)),
        ])
        .unwrap_err()
        .contains("more than one action"));
    }
}
