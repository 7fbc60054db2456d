//! Names of processes across jobs (issue 33, step 1; see docs/design/many-jobs.md §1.2).
//!
//! A job's namespace is an [`NsId`]: a number the runtime gives each job, dense from 1 and
//! never reused while the runtime lives. A process is a [`ProcId`] (namespace and rank),
//! [`ProcSel`] is one process or every process of a namespace (PMIx's wildcard rank), and
//! [`Names`] is the table between ids and the namespace strings PMIx and people see
//! (`"{runtime tag}.{id}"` for the jobs the runtime names itself).
//!
//! Nothing on the wire uses these yet: today a process is named by its rank in the one job
//! of its runtime. They are the types the protocol (v4) and the server's concerns move to.

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Rank;

/// A job's namespace, as the runtime numbers it: 1 for the first job, never reused while
/// the runtime lives. 0 names no namespace (it never appears on the wire).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct NsId(pub u32);

impl NsId {
    /// The first job's namespace (a plain `weft run`'s only one).
    pub const FIRST: NsId = NsId(1);
}

impl fmt::Display for NsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ns{}", self.0)
    }
}

/// A process: its job's namespace and its rank there. Ordered by namespace, then rank.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct ProcId {
    /// Its job's namespace.
    pub ns: NsId,
    /// Its rank in that job.
    pub rank: Rank,
}

impl ProcId {
    /// Rank `rank` of namespace `ns`.
    pub const fn new(ns: NsId, rank: Rank) -> ProcId {
        ProcId { ns, rank }
    }
}

impl fmt::Display for ProcId {
    /// `ns1:3`: rank 3 of namespace 1.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ns, self.rank)
    }
}

/// One process, or every process of a namespace (PMIx's `PMIX_RANK_WILDCARD`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub enum ProcSel {
    /// This process.
    One(ProcId),
    /// Every process of this namespace.
    All(NsId),
}

impl ProcSel {
    /// The namespace selected from.
    pub fn ns(&self) -> NsId {
        match self {
            ProcSel::One(p) => p.ns,
            ProcSel::All(ns) => *ns,
        }
    }

    /// Whether `p` is selected.
    pub fn contains(&self, p: ProcId) -> bool {
        match self {
            ProcSel::One(q) => *q == p,
            ProcSel::All(ns) => p.ns == *ns,
        }
    }
}

/// The longest namespace string (PMIx's `PMIX_MAX_NSLEN`).
pub const MAX_NSPACE_LEN: usize = 255;

/// Why a name could not be added or found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamesError {
    /// No namespace has this name.
    #[error("namespace {0:?} is not known to this runtime")]
    Unknown(String),
    /// The name is taken (by the id given).
    #[error("namespace {0:?} is already registered (as {1})")]
    Duplicate(String, NsId),
    /// The name cannot be one (empty, too long, a NUL byte).
    #[error("namespace {0:?} is not a valid name: {1}")]
    Invalid(String, &'static str),
    /// No namespace has this id.
    #[error("namespace id {0} is not known to this runtime")]
    UnknownId(NsId),
    /// Every id is taken.
    #[error("this runtime has named {0} namespaces, the most it can")]
    Full(u32),
}

/// The runtime's namespaces: [`NsId`] to namespace string and back, append-only (an id
/// is never reused, a name never renamed); lookups both ways in constant time. On the
/// wire only the tag and the names in id order: decoding rebuilds the lookup and refuses
/// a table that breaks the rules (an invalid or repeated name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "NamesWire", into = "NamesWire")]
pub struct Names {
    /// Prefix of the names the runtime makes (`"{tag}.{id}"`).
    tag: String,
    /// Entry `i` is the name of `NsId(i + 1)`.
    by_id: Vec<String>,
    by_name: HashMap<String, NsId>,
}

/// What [`Names`] is on the wire.
#[derive(Serialize, Deserialize)]
struct NamesWire {
    tag: String,
    names: Vec<String>,
}

impl From<Names> for NamesWire {
    fn from(n: Names) -> NamesWire {
        NamesWire {
            tag: n.tag,
            names: n.by_id,
        }
    }
}

impl TryFrom<NamesWire> for Names {
    type Error = NamesError;
    fn try_from(w: NamesWire) -> Result<Names, NamesError> {
        let mut n = Names::new(&w.tag);
        for name in &w.names {
            n.add(name)?;
        }
        Ok(n)
    }
}

impl Names {
    /// An empty table whose generated names start with `tag` (e.g. `weft-7f3a`).
    pub fn new(tag: &str) -> Names {
        Names {
            tag: tag.to_string(),
            by_id: Vec::new(),
            by_name: HashMap::new(),
        }
    }

    /// Registers `nspace` under the next id (a job named from outside: a plain `weft run`
    /// keeps its own unique string as [`NsId::FIRST`]).
    pub fn add(&mut self, nspace: &str) -> Result<NsId, NamesError> {
        if nspace.is_empty() {
            return Err(NamesError::Invalid(nspace.into(), "it is empty"));
        }
        if nspace.len() > MAX_NSPACE_LEN {
            return Err(NamesError::Invalid(
                nspace.into(),
                "it is longer than 255 bytes (PMIX_MAX_NSLEN)",
            ));
        }
        if nspace.contains('\0') {
            return Err(NamesError::Invalid(nspace.into(), "it contains a NUL byte"));
        }
        if let Some(&id) = self.by_name.get(nspace) {
            return Err(NamesError::Duplicate(nspace.into(), id));
        }
        let next = u32::try_from(self.by_id.len() + 1)
            .map_err(|_| NamesError::Full(self.by_id.len() as u32))?;
        let id = NsId(next);
        self.by_id.push(nspace.to_string());
        self.by_name.insert(nspace.to_string(), id);
        Ok(id)
    }

    /// Names a new job `"{tag}.{id}"` and registers it (should a job named from outside
    /// already hold that string, the new one gets a suffix that is free).
    pub fn add_next(&mut self) -> Result<(NsId, String), NamesError> {
        let next = self.by_id.len() as u64 + 1;
        let mut name = format!("{}.{next}", self.tag);
        let mut k = 1u32;
        while self.by_name.contains_key(&name) {
            name = format!("{}.{next}-{k}", self.tag);
            k += 1;
        }
        let id = self.add(&name)?;
        Ok((id, name))
    }

    /// The namespace string of `id`.
    pub fn nspace(&self, id: NsId) -> Result<&str, NamesError> {
        (id.0 as usize)
            .checked_sub(1)
            .and_then(|i| self.by_id.get(i))
            .map(String::as_str)
            .ok_or(NamesError::UnknownId(id))
    }

    /// The id of namespace `nspace`.
    pub fn id(&self, nspace: &str) -> Result<NsId, NamesError> {
        self.by_name
            .get(nspace)
            .copied()
            .ok_or_else(|| NamesError::Unknown(nspace.into()))
    }

    /// Process `rank` of namespace `nspace` (what a PMIx `pmix_proc_t` names).
    pub fn proc(&self, nspace: &str, rank: Rank) -> Result<ProcId, NamesError> {
        Ok(ProcId::new(self.id(nspace)?, rank))
    }

    /// How many namespaces are registered.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Every namespace, by id.
    pub fn iter(&self) -> impl Iterator<Item = (NsId, &str)> {
        self.by_id
            .iter()
            .enumerate()
            .map(|(i, n)| (NsId(i as u32 + 1), n.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_are_dense_from_one_and_both_lookups_agree() {
        let mut n = Names::new("weft-ab12");
        assert!(n.is_empty());
        assert_eq!(n.add("weft-1234-job"), Ok(NsId::FIRST));
        let (id, name) = n.add_next().expect("a second namespace");
        assert_eq!((id, name.as_str()), (NsId(2), "weft-ab12.2"));
        assert_eq!(n.id("weft-1234-job"), Ok(NsId(1)));
        assert_eq!(n.nspace(NsId(2)), Ok("weft-ab12.2"));
        assert_eq!(n.proc("weft-ab12.2", 5), Ok(ProcId::new(NsId(2), 5)));
        assert_eq!(n.len(), 2);
        let all: Vec<_> = n.iter().collect();
        assert_eq!(all, [(NsId(1), "weft-1234-job"), (NsId(2), "weft-ab12.2")]);
    }

    #[test]
    fn bad_names_and_unknown_ones_are_errors_naming_them() {
        let mut n = Names::new("t");
        n.add("a").expect("a");
        let e = n.add("a").unwrap_err();
        assert_eq!(e, NamesError::Duplicate("a".into(), NsId(1)));
        assert!(
            e.to_string()
                .contains("\"a\" is already registered (as ns1)"),
            "{e}"
        );
        assert!(matches!(n.add(""), Err(NamesError::Invalid(..))));
        assert!(matches!(n.add("x\0y"), Err(NamesError::Invalid(..))));
        let long = "x".repeat(MAX_NSPACE_LEN + 1);
        assert!(matches!(n.add(&long), Err(NamesError::Invalid(..))));
        n.add(&"y".repeat(MAX_NSPACE_LEN))
            .expect("255 bytes is allowed");
        let e = n.id("b").unwrap_err();
        assert!(e.to_string().contains("\"b\" is not known"), "{e}");
        assert_eq!(n.nspace(NsId(0)), Err(NamesError::UnknownId(NsId(0))));
        assert_eq!(n.nspace(NsId(9)), Err(NamesError::UnknownId(NsId(9))));
        assert_eq!(n.proc("b", 0), Err(NamesError::Unknown("b".into())));
        // Nothing failed was added.
        assert_eq!(n.len(), 2);
    }

    #[test]
    fn a_generated_name_never_takes_one_registered_from_outside() {
        let mut n = Names::new("t");
        n.add("t.2").expect("an outside name that looks generated");
        let (id, name) = n.add_next().expect("next");
        assert_eq!(id, NsId(2));
        assert_ne!(name, "t.2");
        assert_eq!(n.id(&name), Ok(NsId(2)));
        assert_eq!(n.id("t.2"), Ok(NsId(1)));
    }

    #[test]
    fn a_selection_holds_what_it_names() {
        let (a, b) = (NsId(1), NsId(2));
        let p = ProcId::new(a, 3);
        assert!(ProcSel::One(p).contains(p));
        assert!(!ProcSel::One(p).contains(ProcId::new(a, 4)));
        assert!(!ProcSel::One(p).contains(ProcId::new(b, 3)));
        assert!(ProcSel::All(a).contains(ProcId::new(a, 4_000_000)));
        assert!(!ProcSel::All(b).contains(p));
        assert_eq!(ProcSel::One(p).ns(), a);
        assert_eq!(ProcSel::All(b).ns(), b);
        assert_eq!(p.to_string(), "ns1:3");
        // Sorted by namespace first: a list of processes groups by job.
        let mut v = vec![ProcId::new(b, 0), ProcId::new(a, 7), ProcId::new(a, 2)];
        v.sort();
        assert_eq!(v, [ProcId::new(a, 2), ProcId::new(a, 7), ProcId::new(b, 0)]);
    }

    /// An operation on the table.
    #[derive(Debug, Clone)]
    enum Op {
        Add(String),
        Next,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            "[a-c.0-9]{0,4}".prop_map(Op::Add),
            Just(Op::Add("t.3".into())),
            Just(Op::Next),
        ]
    }

    proptest! {
        /// Whatever is added: ids are dense, never reused, each name has one id and each
        /// id one name, a refused add changes nothing, and the table survives postcard.
        #[test]
        fn the_table_stays_a_bijection(ops in proptest::collection::vec(op(), 0..40)) {
            let mut n = Names::new("t");
            let mut seen: Vec<String> = Vec::new();
            for o in ops {
                let before = n.clone();
                match o {
                    Op::Add(s) => match n.add(&s) {
                        Ok(id) => {
                            prop_assert!(!seen.contains(&s));
                            seen.push(s);
                            prop_assert_eq!(id, NsId(seen.len() as u32));
                        }
                        Err(_) => prop_assert_eq!(&n, &before),
                    },
                    Op::Next => {
                        let (id, s) = n.add_next().expect("room");
                        prop_assert!(!seen.contains(&s));
                        seen.push(s);
                        prop_assert_eq!(id, NsId(seen.len() as u32));
                    }
                }
            }
            prop_assert_eq!(n.len(), seen.len());
            for (i, s) in seen.iter().enumerate() {
                let id = NsId(i as u32 + 1);
                prop_assert_eq!(n.id(s), Ok(id));
                prop_assert_eq!(n.nspace(id), Ok(s.as_str()));
            }
            let bytes = postcard::to_allocvec(&n).expect("encodes");
            let back: Names = postcard::from_bytes(&bytes).expect("decodes");
            prop_assert_eq!(back, n);
            // A table whose names repeat does not decode.
            if let Some(first) = seen.first() {
                let mut dup = seen.clone();
                dup.push(first.clone());
                let bytes = postcard::to_allocvec(&NamesWire { tag: "t".into(), names: dup })
                    .expect("encodes");
                prop_assert!(postcard::from_bytes::<Names>(&bytes).is_err());
            }
        }
    }
}
