//! The PMI bookkeeping driven through its `on_*` methods.

use std::collections::HashMap;

use crate::wire::proto::ProcData;
use weft_fuzz::{run, Mutator};
use weft_wireup::{Rank, Value};

use super::{NodeAttr, PmiKeys, KEY_PREFIX};

#[test]
fn a_key_is_owned_by_its_last_putter_local_or_learned_from_a_barrier() {
    let mut k = PmiKeys::default();
    assert_eq!(k.owner("port"), None);
    k.on_put(1, "port");
    assert_eq!(k.owner("port"), Some(1));
    // A barrier's data of other nodes' ranks: only the PMI keys count.
    let data: ProcData = vec![
        (
            3,
            1,
            Some(vec![
                (format!("{KEY_PREFIX}card-3"), Value::Str("x".into())),
                ("weft/card".to_owned(), Value::U64(1)),
            ]),
        ),
        (2, 1, None),
    ];
    k.on_learn(&data);
    assert_eq!(k.owner("card-3"), Some(3));
    assert_eq!(k.owner("weft/card"), None);
    assert_eq!(k.owner("port"), Some(1));
}

#[test]
fn a_node_attribute_get_waits_only_when_asked_and_is_answered_once() {
    let mut k = PmiKeys::default();
    assert_eq!(k.on_get_node_attr(0, "shm", false), NodeAttr::NotFound);
    assert_eq!(k.on_get_node_attr(0, "shm", true), NodeAttr::Waiting);
    assert_eq!(k.on_get_node_attr(1, "shm", true), NodeAttr::Waiting);
    assert_eq!(
        k.on_put_node_attr("other".into(), "1".into()),
        Vec::<Rank>::new()
    );
    assert_eq!(k.on_put_node_attr("shm".into(), "seg".into()), vec![0, 1]);
    // Answered: a second put answers nobody, later gets find the newest value.
    assert_eq!(
        k.on_put_node_attr("shm".into(), "seg2".into()),
        Vec::<Rank>::new()
    );
    assert_eq!(
        k.on_get_node_attr(2, "shm", true),
        NodeAttr::Found("seg2".into())
    );
}

/// Random puts, learned data and node-attribute gets and puts: an owner is always the
/// last putter; every waiting get is answered exactly once, at the first put of its
/// key, and a get of a key put before never waits.
#[test]
fn fuzz_pmi_keys_owners_are_the_last_putter_and_waiters_are_answered_once() {
    run("pmi_keys", 5, |m: &mut Mutator| {
        let mut k = PmiKeys::default();
        let mut owners: HashMap<String, Rank> = HashMap::new();
        let mut attrs: HashMap<String, String> = HashMap::new();
        let mut waiting: HashMap<String, Vec<Rank>> = HashMap::new();
        let key = |m: &mut Mutator| format!("k{}", m.below(5));
        for _ in 0..m.below(50) {
            match m.below(4) {
                0 => {
                    let (r, key) = (m.below(8) as Rank, key(m));
                    k.on_put(r, &key);
                    owners.insert(key, r);
                }
                1 => {
                    let (r, key) = (m.below(8) as Rank, key(m));
                    let data: ProcData = vec![(
                        r,
                        1,
                        Some(vec![(format!("{KEY_PREFIX}{key}"), Value::U64(1))]),
                    )];
                    k.on_learn(&data);
                    owners.insert(key, r);
                }
                2 => {
                    let (key, v) = (key(m), format!("v{}", m.next_u64()));
                    let mut got = k.on_put_node_attr(key.clone(), v.clone());
                    let mut want = waiting.remove(&key).unwrap_or_default();
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(got, want, "the waiters of {key}");
                    attrs.insert(key, v);
                }
                _ => {
                    let (r, key, wait) = (m.below(8) as Rank, key(m), m.below(2) == 0);
                    let got = k.on_get_node_attr(r, &key, wait);
                    let want = match attrs.get(&key) {
                        Some(v) => NodeAttr::Found(v.clone()),
                        None if wait => {
                            waiting.entry(key.clone()).or_default().push(r);
                            NodeAttr::Waiting
                        }
                        None => NodeAttr::NotFound,
                    };
                    assert_eq!(got, want, "get of {key}");
                }
            }
            for (key, r) in &owners {
                assert_eq!(k.owner(key), Some(*r), "the owner of {key}");
            }
        }
    });
}
