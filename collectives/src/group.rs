//! [`FabricGroup::create_comm`](crate::FabricGroup::create_comm): a communicator from a
//! session group whose members agree among themselves, over the fabric, instead of
//! through a group construct at the servers.
//!
//! The members meet on a bootstrap context id (a hash of the tag, the members and how
//! many communicators this process made with both before: every member computes the
//! same) and run one allreduce over it, which synchronizes them, checks that they hashed
//! alike, and hands out the leader's counter (the group's first member counts the
//! communicators it led); the new id derives from the leader's job rank and that counter
//! (see `ids`), unique in the job with no server involved. Past the id scheme's limits
//! the members run `Communicator::create_from_group` (a construct at the servers).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use weft_fabric::{Communicator, ErrHandler, Group};

use crate::plan::plan_allreduce;
use crate::{ids, CollError, Op};

const OP: &str = "create_comm";

/// Per (tag, members): communicators this process made from them so far.
type Made = HashMap<(String, Vec<u32>), u64>;
static MADE: Mutex<Option<Made>> = Mutex::new(None);
/// Communicators this process led (was the first member of).
static LED: AtomicU64 = AtomicU64::new(0);

fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

pub(crate) fn create(group: &Group, tag: &str) -> Result<Communicator, CollError> {
    let invalid = |what: String| CollError::InvalidArgs { op: OP, what };
    if tag.is_empty() {
        return Err(invalid("the tag is empty".into()));
    }
    let Some(me) = group.rank() else {
        return Err(invalid(format!(
            "this process is not a member of the group (tag {tag:?})"
        )));
    };
    let members = group.members().to_vec();
    let seq = {
        let mut m = MADE.lock().unwrap_or_else(PoisonError::into_inner);
        let n = m
            .get_or_insert_with(HashMap::new)
            .entry((tag.to_owned(), members.clone()))
            .or_insert(0);
        *n += 1;
        *n
    };
    let mut h = fnv(0xcbf2_9ce4_8422_2325, tag.as_bytes());
    h = fnv(h, &[0xff]);
    for r in &members {
        h = fnv(h, &r.to_le_bytes());
    }
    h = fnv(h, &seq.to_le_bytes());
    let construct = |e: weft_fabric::CommError| CollError::Construct {
        op: OP,
        reason: e.to_string(),
    };
    let boot = group.derive_comm(ids::bootstrap(h)).map_err(construct)?;
    let counter = if me == 0 {
        LED.fetch_add(1, Ordering::Relaxed) + 1
    } else {
        0
    };
    let mine = [h, !h, counter];
    let mut all = [0u64; 3];
    // Point-to-point only: a node segment for a communicator used once would cost more.
    plan_allreduce(&boot, Some(&mine[..]), &mut all, &Op::Max)?.run(&boot)?;
    drop(boot);
    if all[0] != !all[1] {
        return Err(CollError::Construct {
            op: OP,
            reason: format!(
                "the members disagree on the tag or the group (tag {tag:?}, {} members here)",
                members.len()
            ),
        });
    }
    match ids::from_group(u64::from(members[0]), all[2]) {
        Some(ctx) => group.derive_comm(ctx).map_err(construct),
        None => Communicator::create_from_group(group, tag, ErrHandler::Return).map_err(construct),
    }
}
