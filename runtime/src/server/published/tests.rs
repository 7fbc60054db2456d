use super::*;

fn who(ns: u32, rank: Rank, node: u32) -> NameCaller {
    NameCaller {
        proc: ProcId::new(NsId(ns), rank),
        nspace: format!("job{ns}"),
        node,
    }
}

fn publish(keys: &[&str], range: NameRange, persist: Persistence) -> NameOp {
    NameOp::Publish {
        range,
        persist,
        entries: keys
            .iter()
            .map(|k| ((*k).to_string(), NameValue::Str(format!("v-{k}"))))
            .collect(),
    }
}

fn lookup(keys: &[&str], range: NameRange, wait_ms: Option<u64>) -> NameOp {
    NameOp::Lookup {
        range,
        keys: keys.iter().map(|k| (*k).to_string()).collect(),
        wait_ms,
    }
}

/// The one answer of a request that completes at once.
fn one(r: &mut Registry, node: u32, qid: u64, w: NameCaller, op: NameOp) -> Answer {
    let (mut a, timer) = r.request(node, qid, w, op);
    assert_eq!(timer, None);
    assert_eq!(a.len(), 1, "{a:?}");
    let a = a.pop().unwrap();
    assert_eq!((a.node, a.qid), (node, qid));
    a
}

fn keys_of(a: &Answer) -> Vec<(String, ProcId)> {
    a.result
        .as_ref()
        .expect("found")
        .iter()
        .map(|p| (p.key.clone(), p.owner))
        .collect()
}

#[test]
fn a_session_name_is_found_by_another_job_with_its_publisher_and_value() {
    let mut r = Registry::default();
    let a = one(
        &mut r,
        1,
        7,
        who(1, 0, 1),
        publish(&["port"], NameRange::Session, Persistence::Session),
    );
    assert_eq!(a.result, Ok(Vec::new()));
    let a = one(
        &mut r,
        0,
        8,
        who(2, 3, 0),
        lookup(&["port"], NameRange::Session, None),
    );
    let found = a.result.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].owner, ProcId::new(NsId(1), 0));
    assert_eq!(found[0].nspace, "job1");
    assert_eq!(found[0].value, NameValue::Str("v-port".into()));
    // Missing keys: none found fails naming them, some found answers with those.
    let a = one(
        &mut r,
        0,
        9,
        who(2, 3, 0),
        lookup(&["x", "y"], NameRange::Session, None),
    );
    assert_eq!(
        a.result,
        Err(NameFailure::NotFound(vec!["x".into(), "y".into()]))
    );
    let a = one(
        &mut r,
        0,
        10,
        who(2, 3, 0),
        lookup(&["x", "port"], NameRange::Session, None),
    );
    assert_eq!(keys_of(&a), vec![("port".into(), ProcId::new(NsId(1), 0))]);
}

#[test]
fn a_duplicate_fails_whole_and_ranges_limit_who_sees_a_name() {
    let mut r = Registry::default();
    one(
        &mut r,
        0,
        1,
        who(1, 0, 0),
        publish(&["a"], NameRange::Session, Persistence::Session),
    );
    let a = one(
        &mut r,
        0,
        2,
        who(1, 1, 0),
        publish(&["b", "a"], NameRange::Global, Persistence::Session),
    );
    assert_eq!(a.result, Err(NameFailure::Duplicate(vec!["a".into()])));
    assert_eq!(r.len(), 1, "nothing of a refused publish is kept");
    let a = one(
        &mut r,
        0,
        3,
        who(1, 1, 0),
        publish(&["b", "b"], NameRange::Session, Persistence::Session),
    );
    assert_eq!(a.result, Err(NameFailure::Duplicate(vec!["b".into()])));
    // The same key in a job's own reach is another name.
    one(
        &mut r,
        0,
        4,
        who(2, 0, 1),
        publish(&["a"], NameRange::Namespace, Persistence::Session),
    );
    one(
        &mut r,
        0,
        5,
        who(2, 0, 1),
        publish(&["n"], NameRange::Node, Persistence::Session),
    );
    // Job 2 sees its own "a" first; job 1 the session's.
    let a = one(
        &mut r,
        0,
        6,
        who(2, 1, 0),
        lookup(&["a"], NameRange::Session, None),
    );
    assert_eq!(keys_of(&a), vec![("a".into(), ProcId::new(NsId(2), 0))]);
    let a = one(
        &mut r,
        0,
        7,
        who(1, 1, 1),
        lookup(&["a"], NameRange::Session, None),
    );
    assert_eq!(keys_of(&a), vec![("a".into(), ProcId::new(NsId(1), 0))]);
    // A node's name: seen on that node only, by any job there.
    let a = one(
        &mut r,
        0,
        8,
        who(1, 1, 1),
        lookup(&["n"], NameRange::Session, None),
    );
    assert_eq!(keys_of(&a), vec![("n".into(), ProcId::new(NsId(2), 0))]);
    let a = one(
        &mut r,
        0,
        9,
        who(2, 1, 0),
        lookup(&["n"], NameRange::Session, None),
    );
    assert_eq!(a.result, Err(NameFailure::NotFound(vec!["n".into()])));
    // A namespace lookup does not see the session's names.
    let a = one(
        &mut r,
        0,
        10,
        who(1, 1, 0),
        lookup(&["a"], NameRange::Namespace, None),
    );
    assert_eq!(a.result, Err(NameFailure::NotFound(vec!["a".into()])));
}

#[test]
fn a_waiting_lookup_is_answered_by_the_publish_or_its_timer() {
    let mut r = Registry::default();
    let (a, timer) = r.request(
        1,
        20,
        who(2, 0, 1),
        lookup(&["p", "q"], NameRange::Session, Some(500)),
    );
    assert!(a.is_empty());
    let (id, d) = timer.expect("a timer for a bounded wait");
    assert_eq!(d, Duration::from_millis(500));
    // One key is not enough; the second completes it: the publisher's answer, then
    // the waiter's, addressed to its node and request.
    let (a, _) = r.request(
        0,
        1,
        who(1, 0, 0),
        publish(&["p"], NameRange::Session, Persistence::Session),
    );
    assert_eq!(a.len(), 1);
    let (a, _) = r.request(
        0,
        2,
        who(1, 0, 0),
        publish(&["q"], NameRange::Session, Persistence::Session),
    );
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!((a[1].node, a[1].qid), (1, 20));
    assert_eq!(a[1].result.as_ref().unwrap().len(), 2);
    assert_eq!(r.expire(id), None, "answered already");
    // A wait that ends names what is still missing.
    let (_, timer) = r.request(
        1,
        21,
        who(2, 0, 1),
        lookup(&["p", "z"], NameRange::Session, Some(10)),
    );
    let a = r.expire(timer.unwrap().0).expect("expired");
    assert_eq!((a.node, a.qid), (1, 21));
    assert_eq!(a.result, Err(NameFailure::Timeout(vec!["z".into()])));
    // No limit: no timer; the waiter goes with its process.
    let (_, timer) = r.request(
        1,
        22,
        who(2, 0, 1),
        lookup(&["z"], NameRange::Session, Some(u64::MAX)),
    );
    assert_eq!(timer, None);
    r.proc_gone(ProcId::new(NsId(2), 0));
    let (a, _) = r.request(
        0,
        3,
        who(1, 0, 0),
        publish(&["z"], NameRange::Session, Persistence::Session),
    );
    assert_eq!(a.len(), 1, "nobody waits any more: {a:?}");
}

#[test]
fn persistence_first_read_proc_and_job_and_unpublish_by_the_owner_only() {
    let mut r = Registry::default();
    let me = who(1, 0, 0);
    one(
        &mut r,
        0,
        1,
        me.clone(),
        publish(&["once"], NameRange::Session, Persistence::FirstRead),
    );
    one(
        &mut r,
        0,
        2,
        me.clone(),
        publish(&["life"], NameRange::Session, Persistence::Proc),
    );
    one(
        &mut r,
        0,
        3,
        me.clone(),
        publish(&["job"], NameRange::Session, Persistence::Job),
    );
    one(
        &mut r,
        0,
        4,
        me.clone(),
        publish(&["sess"], NameRange::Session, Persistence::Session),
    );
    one(
        &mut r,
        0,
        5,
        me.clone(),
        publish(&["mine"], NameRange::Session, Persistence::Indefinite),
    );
    let other = who(2, 0, 0);
    let a = one(
        &mut r,
        0,
        6,
        other.clone(),
        lookup(&["once"], NameRange::Session, None),
    );
    assert!(a.result.is_ok());
    let a = one(
        &mut r,
        0,
        7,
        other.clone(),
        lookup(&["once"], NameRange::Session, None),
    );
    assert_eq!(a.result, Err(NameFailure::NotFound(vec!["once".into()])));
    // Only the owner withdraws; a key it does not own fails naming it, removing nothing.
    let a = one(
        &mut r,
        0,
        8,
        other.clone(),
        NameOp::Unpublish {
            range: NameRange::Session,
            keys: vec!["mine".into()],
        },
    );
    assert_eq!(a.result, Err(NameFailure::NotFound(vec!["mine".into()])));
    let a = one(
        &mut r,
        0,
        9,
        me.clone(),
        NameOp::Unpublish {
            range: NameRange::Session,
            keys: vec!["mine".into()],
        },
    );
    assert_eq!(a.result, Ok(Vec::new()));
    assert_eq!(r.len(), 3);
    r.proc_gone(me.proc);
    let a = one(
        &mut r,
        0,
        10,
        other.clone(),
        lookup(&["life", "job", "sess"], NameRange::Session, None),
    );
    assert_eq!(keys_of(&a).len(), 2, "the process's own name went with it");
    r.job_ended(NsId(1));
    let a = one(
        &mut r,
        0,
        11,
        other,
        lookup(&["job", "sess"], NameRange::Session, None),
    );
    assert_eq!(keys_of(&a), vec![("sess".into(), me.proc)]);
    // Withdrawing everything of one's own.
    let a = one(
        &mut r,
        0,
        12,
        me.clone(),
        NameOp::Unpublish {
            range: NameRange::Session,
            keys: Vec::new(),
        },
    );
    assert_eq!(a.result, Ok(Vec::new()));
    assert_eq!(r.len(), 0);
}
