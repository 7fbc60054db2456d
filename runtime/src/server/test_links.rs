//! For the concerns' fuzz tests: the messages in flight between servers driven by hand,
//! one queue per (from, to) link, kept in order per link.

use std::collections::{BTreeMap, VecDeque};

use weft_fuzz::Mutator;

use crate::wire::proto::JobMsg;

/// Takes the oldest message of a link chosen by `m` among those with one waiting:
/// (to, message), or `None` when nothing is in flight.
pub(super) fn pop_any(
    links: &mut BTreeMap<(u32, u32), VecDeque<JobMsg>>,
    m: &mut Mutator,
) -> Option<(u32, JobMsg)> {
    let busy: Vec<(u32, u32)> = links
        .iter()
        .filter(|(_, q)| !q.is_empty())
        .map(|(k, _)| *k)
        .collect();
    if busy.is_empty() {
        return None;
    }
    let (a, b) = busy[m.below(busy.len())];
    let msg = links.get_mut(&(a, b))?.pop_front()?;
    Some((b, msg))
}
