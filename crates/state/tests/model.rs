//! The state table against a model (a HashMap of what should be there), under random
//! sequences of insert, lookup, touch, remove, time passing, limit changes and online resizes;
//! every third key's state has actions (a tag), which must come and go with it.

use proptest::prelude::*;
use std::collections::HashMap;
use xpf_state::*;

#[derive(Debug, Clone)]
enum Op {
    Insert { k: u16, nat: Option<u16>, t: u8 },
    Lookup(u16),
    Touch(u16),
    Remove(u16),
    Advance(u8),
    Raise(u16),
    Lower(u16),
    Batch(Vec<u16>),
}

fn key(i: u16) -> Key4 {
    Key4 {
        addr: [[10, 0, (i >> 8) as u8, i as u8], [10, 1, 0, 1]],
        port: [1000 + i % 7, 53],
        proto: 17,
        _pad: 0,
        kif: 0,
    }
}

fn stack_key(i: u16) -> Key4 {
    Key4 {
        addr: [[192, 168, (i >> 8) as u8, i as u8], [10, 1, 0, 1]],
        port: [40000 + i, 53],
        proto: 17,
        _pad: 0,
        kif: 0,
    }
}

/// A plain UDP-like state for `key`, inbound, rule 0.
fn udp_state(key: Key4, timeout: Timeout) -> NewState<Key4> {
    NewState {
        key,
        stack: None,
        dir: Dir::In,
        rule: 0,
        timeout,
        src_state: 0,
        dst_state: 0,
        tcp: None,
        nosync: false,
        allow_opts: false,
        sloppy: false,
        tag: 0,
        scrub: 0,
        rate: 0,
        pflow: false,
        log: 0,
        queue: 0,
        route: 0,
        held: 0,
    }
}

const CLASSES: [Timeout; 3] = [Timeout::UdpFirst, Timeout::UdpSingle, Timeout::OtherMultiple];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u16..600, proptest::option::of(0u16..600), 0u8..3).prop_map(|(k, nat, t)| Op::Insert { k, nat, t }),
        3 => (0u16..600).prop_map(Op::Lookup),
        2 => (0u16..600).prop_map(Op::Touch),
        1 => (0u16..600).prop_map(Op::Remove),
        1 => (0u8..90).prop_map(Op::Advance),
        1 => (1u16..2000).prop_map(Op::Raise),
        1 => (1u16..400).prop_map(Op::Lower),
        1 => proptest::collection::vec(0u16..600, 1..48).prop_map(Op::Batch),
    ]
}

#[derive(Debug)]
struct M {
    id: u32,
    stack: Option<Key4>,
    last: u32,
    t: Timeout,
    tag: u16,
}

/// The tag key `k`'s state is made with (0: none, no actions).
fn tag_of(k: u16) -> u16 {
    if k.is_multiple_of(3) {
        k + 1
    } else {
        0
    }
}

fn check(t: &mut StateTable<Key4>, model: &HashMap<Key4, M>) {
    assert_eq!(t.len() as usize, model.len());
    for (k, m) in model {
        let h = t.hash(k);
        assert_eq!(t.find(k, h), Some(m.id), "wire key {k:?}");
        if let Some(s) = m.stack {
            assert_eq!(t.find(&s, t.hash(&s)), Some(m.id | STACK), "stack key {s:?}");
        }
        assert_eq!(t.actions.get(m.id).map(|a| a.tag), (m.tag != 0).then_some(m.tag), "actions of {k:?}");
    }
    assert_eq!(t.iter().count(), model.len());
    assert_eq!(t.actions.len(), model.values().filter(|m| m.tag != 0).count());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn table_matches_model(ops in proptest::collection::vec(op(), 1..300)) {
        let mut now = 1000u32;
        let mut t = StateTable::<Key4>::new(Config { limit: 64, rows: None, seed: Seed::fixed(7), events: 100_000, now, grow_from: None, prefault: false }).unwrap();
        let mut tm = Timeouts::default();
        // Adaptive scaling off, so the model's deadlines are exact.
        tm.set(Timeout::AdaptiveStart, u32::MAX - 1);
        tm.set(Timeout::AdaptiveEnd, u32::MAX);
        t.set_timeouts(tm.clone());
        let mut model: HashMap<Key4, M> = HashMap::new();
        let (mut ins_ev, mut del_ev) = (0u64, 0u64);
        for op in ops {
            match op {
                Op::Insert { k, nat, t: c } => {
                    let key = key(k);
                    let stack = nat.map(stack_key);
                    let taken = |x: &Key4| model.iter().any(|(w, m)| w == x || m.stack.as_ref() == Some(x));
                    let exists = taken(&key) || stack.as_ref().is_some_and(taken);
                    let ns = NewState { key, stack, dir: Dir::In, rule: 1, timeout: CLASSES[c as usize], src_state: 1, dst_state: 0, tcp: None, nosync: false, allow_opts: false, sloppy: false, tag: tag_of(k), scrub: 0, rate: 0, pflow: false, log: 0, queue: 0, route: 0, held: 0 };
                    let r = t.insert(t.hash(&key), ns, now);
                    if model.len() as u32 >= t.limit() {
                        prop_assert_eq!(r, Err(InsertError::Limit));
                    } else if exists {
                        prop_assert!(matches!(r, Err(InsertError::Exists(_))), "{r:?}");
                    } else {
                        let id = r.unwrap();
                        model.insert(key, M { id, stack, last: now, t: CLASSES[c as usize], tag: tag_of(k) });
                    }
                }
                Op::Lookup(k) => {
                    let got = t.lookup(&key(k));
                    prop_assert_eq!(got, model.get(&key(k)).map(|m| m.id));
                }
                Op::Touch(k) => {
                    if let Some(m) = model.get_mut(&key(k)) {
                        let s = t.touch(m.id, Dir::Out, 100, now);
                        prop_assert_eq!(s.packets[1] as u64 * 100, s.bytes[1]);
                        m.last = now;
                    }
                }
                Op::Remove(k) => {
                    let m = model.remove(&key(k));
                    if let Some(m) = m {
                        prop_assert!(t.remove(m.id));
                        prop_assert!(!t.remove(m.id));
                    }
                }
                Op::Advance(dt) => {
                    now += dt as u32;
                    // Enough budget to finish; interleaves with migration rows too.
                    while t.maintain(now, 64) > 0 || t.resizing() {}
                    model.retain(|_, m| m.last + tm.get(m.t) > now);
                }
                Op::Raise(n) => {
                    t.set_limit(t.limit().max(n as u32)).unwrap();
                    t.maintain(now, 2); // a little migration, lookups must still find everything
                }
                Op::Lower(n) => t.set_limit(n as u32).unwrap(),
                Op::Batch(ks) => {
                    let keys: Vec<Key4> = ks.iter().map(|&k| key(k)).collect();
                    let mut h = vec![0u64; keys.len()];
                    let mut out = vec![0u32; keys.len()];
                    t.lookup_batch(&keys, &mut h, &mut out);
                    for (k, r) in keys.iter().zip(&out) {
                        let want = model.get(k).map(|m| m.id).unwrap_or(NONE);
                        prop_assert_eq!(*r, want);
                    }
                }
            }
            t.drain_events(|e, _| match e.kind {
                EventKind::Insert => ins_ev += 1,
                EventKind::Delete => del_ev += 1,
                EventKind::Update => {}
            });
            check(&mut t, &model);
        }
        prop_assert_eq!(ins_ev, t.counters.inserts);
        prop_assert_eq!(del_ev, t.counters.removals);
        prop_assert_eq!(t.counters.inserts - t.counters.removals, model.len() as u64);
    }
}

#[test]
fn updates_collapse_per_state() {
    let mut t = StateTable::<Key4>::new(Config {
        limit: 10,
        rows: None,
        seed: Seed::fixed(1),
        events: 16,
        now: 0,
        grow_from: None,
        prefault: false,
    })
    .unwrap();
    let k = key(1);
    let ns = udp_state(k, Timeout::UdpFirst);
    let id = t.insert(t.hash(&k), ns, 0).unwrap();
    let mut seen = Vec::new();
    t.drain_events(|e, _| seen.push(e.kind));
    assert_eq!(seen, vec![EventKind::Insert]);
    // An active state is offered on its first packet of each SYNC_EVERY-second epoch (its
    // phase depends on its id), collapsed while queued: ten packets a second for 3 epochs...
    let e = event::SYNC_EVERY;
    let mut updates = 0;
    for now in 1..=3 * e {
        for _ in 0..10 {
            t.touch(id, Dir::In, 60, now);
        }
        t.drain_events(|e, _| {
            assert_eq!(e.kind, EventKind::Update);
            updates += 1
        });
    }
    assert_eq!(updates, 3);
    // ... and a packet every other second, whatever its phase, for 3 more.
    for now in (3 * e + 2..=6 * e).step_by(2) {
        t.touch(id, Dir::In, 60, now);
    }
    assert_eq!(t.events_len(), 1, "collapsed while queued");
    t.drain_events(|_, _| {});
    let mut updates = 0;
    for now in (6 * e + 2..=9 * e).step_by(2) {
        t.touch(id, Dir::In, 60, now);
        updates += t.drain_events(|_, _| {});
    }
    assert_eq!(updates, 3);
    // The engine offers a state at once when it must (a TCP state change, maxupdates).
    t.queue_update(id);
    t.queue_update(id);
    assert_eq!(t.events_len(), 1);
    t.drain_events(|_, _| {});
    // no-sync states produce no events
    let k2 = key(2);
    let ns2 = NewState { key: k2, nosync: true, ..ns };
    let id2 = t.insert(t.hash(&k2), ns2, 0).unwrap();
    t.touch(id2, Dir::In, 60, 1);
    t.remove(id2);
    assert_eq!(t.drain_events(|_, _| {}), 0);
}

#[test]
fn full_queue_counts_and_keeps_states() {
    let mut t = StateTable::<Key4>::new(Config {
        limit: 100,
        rows: None,
        seed: Seed::fixed(1),
        events: 4,
        now: 0,
        grow_from: None,
        prefault: false,
    })
    .unwrap();
    for i in 0..10 {
        let k = key(i);
        let ns = udp_state(k, Timeout::UdpFirst);
        t.insert(t.hash(&k), ns, 0).unwrap();
    }
    assert_eq!(t.len(), 10);
    assert_eq!(t.events_dropped(), 6);
}

#[test]
fn resize_grows_rows_and_keeps_every_state() {
    let mut t = table::<Key4>(600);
    for i in 0..600 {
        let k = key(i);
        let ns = udp_state(k, Timeout::UdpFirst);
        t.insert(t.hash(&k), ns, 0).unwrap();
    }
    let before = t.rows();
    t.set_limit(60_000).unwrap();
    assert!(t.resizing());
    let mut steps = 0;
    while t.resizing() {
        t.maintain(0, 8);
        steps += 1;
        for i in (0..600).step_by(37) {
            assert!(t.lookup(&key(i)).is_some(), "lost {i} during resize");
        }
    }
    assert!(steps > 1, "resize must be incremental");
    assert_eq!(t.rows(), auto_rows(60_000));
    assert!(t.rows() > before);
    for i in 0..600 {
        assert!(t.lookup(&key(i)).is_some());
    }
}

#[test]
fn expiry_follows_pf_timeouts_and_activity() {
    let mut t = StateTable::<Key4>::new(Config {
        limit: 100_000,
        rows: None,
        seed: Seed::fixed(1),
        events: 0,
        now: 0,
        grow_from: None,
        prefault: false,
    })
    .unwrap();
    let k = key(1);
    let ns = udp_state(k, Timeout::UdpSingle);
    let id = t.insert(t.hash(&k), ns, 0).unwrap();
    assert_eq!(t.maintain(29, 100), 0);
    t.touch(id, Dir::In, 1, 29); // activity moves the deadline to 59
    assert_eq!(t.maintain(58, 100), 0);
    assert_eq!(t.maintain(59, 100), 1);
    assert!(t.lookup(&k).is_none());
    // A long timeout beyond the wheel's horizon is still honoured exactly.
    let ns = NewState { timeout: Timeout::TcpClosing, ..ns };
    t.insert(t.hash(&k), ns, 100).unwrap();
    assert_eq!(t.maintain(100 + 899, 1000), 0);
    assert_eq!(t.maintain(100 + 900, 1000), 1);
}

#[test]
fn index_started_small_grows_with_load() {
    let mut t = StateTable::<Key4>::new(Config {
        limit: 60_000,
        rows: None,
        seed: Seed::fixed(5),
        events: 0,
        now: 0,
        grow_from: Some(16),
        prefault: false,
    })
    .unwrap();
    assert_eq!(t.rows(), 16);
    for i in 0..5000u16 {
        let k =
            Key4 { addr: [[10, 0, (i >> 8) as u8, i as u8], [1, 1, 1, 1]], port: [i, 1], proto: 17, _pad: 0, kif: 0 };
        let ns = udp_state(k, Timeout::UdpFirst);
        t.insert(t.hash(&k), ns, 0).unwrap();
        t.maintain(0, 16);
    }
    t.finish_resize();
    assert!(t.rows() >= 5000 / 6, "rows {}", t.rows());
    assert!(t.rows() <= auto_rows(60_000));
    assert_eq!(t.len(), 5000);
}

/// `-F states` in the middle of an index resize: the resize ends with it, nothing is found,
/// and the table takes its states again.
#[test]
fn remove_all_during_a_resize_leaves_an_empty_index() {
    let mut t = StateTable::<Key4>::new(Config {
        limit: 60_000,
        rows: None,
        seed: Seed::fixed(6),
        events: 0,
        now: 0,
        grow_from: Some(16),
        prefault: false,
    })
    .unwrap();
    for i in 0..3000u16 {
        let k = key(i);
        t.insert(t.hash(&k), NewState { stack: Some(stack_key(i)), ..udp_state(k, Timeout::UdpFirst) }, 0).unwrap();
    }
    // A growth started, its new index prepared (by a helper thread: up to 10 s given), its
    // rows being moved (two a call).
    let t0 = std::time::Instant::now();
    while !t.moving_rows() && t0.elapsed().as_secs() < 10 {
        t.maintain(0, 4);
    }
    t.maintain(0, 4);
    assert!(t.moving_rows(), "no resize moving rows");
    assert_eq!(t.remove_all(false), 3000);
    assert!(!t.moving_rows());
    for i in 0..3000u16 {
        assert!(t.lookup(&key(i)).is_none() && t.lookup(&stack_key(i)).is_none(), "{i} still found");
    }
    t.finish_resize();
    for i in 0..3000u16 {
        let k = key(i);
        t.insert(t.hash(&k), NewState { stack: Some(stack_key(i)), ..udp_state(k, Timeout::UdpFirst) }, 1).unwrap();
        t.maintain(1, 4);
    }
    t.finish_resize();
    for i in 0..3000u16 {
        assert!(t.lookup(&key(i)).is_some() && t.lookup(&stack_key(i)).is_some(), "{i} lost");
    }
    assert_eq!(t.len(), 3000);
}

#[test]
fn translated_states_double_the_index_once_they_fill_it() {
    let limit = 12_000u32;
    let new = || {
        StateTable::<Key4>::new(Config {
            limit,
            rows: None,
            seed: Seed::fixed(9),
            events: 0,
            now: 0,
            grow_from: None,
            prefault: false,
        })
        .unwrap()
    };
    let wire = |i: u32| Key4 {
        addr: [[10, 0, (i >> 8) as u8, i as u8], [1, 1, 1, 1]],
        port: [i as u16, 53],
        proto: 17,
        _pad: 0,
        kif: 0,
    };
    let stack = |i: u32| Key4 { addr: [[192, 0, (i >> 8) as u8, i as u8], [1, 1, 1, 1]], ..wire(i) };
    // Plain states to the limit: one entry each, the index stays as the limit made it.
    let mut t = new();
    for i in 0..limit {
        let k = wire(i);
        t.insert(t.hash(&k), udp_state(k, Timeout::UdpFirst), 0).unwrap();
        t.maintain(0, 64);
    }
    t.finish_resize();
    assert_eq!(t.rows(), auto_rows(limit));
    // Translated ones: two entries each; past the limit's load the index doubles (online,
    // every state found throughout), to two entries a state at the limit.
    let mut t = new();
    for i in 0..limit {
        let k = wire(i);
        let ns = NewState { stack: Some(stack(i)), ..udp_state(k, Timeout::UdpFirst) };
        t.insert(t.hash(&k), ns, 0).unwrap();
        t.maintain(0, 64);
        if i % 997 == 0 {
            for j in (0..=i).step_by(101) {
                assert!(t.lookup(&wire(j)).is_some() && t.lookup(&stack(j)).is_some(), "lost {j}");
            }
        }
    }
    t.finish_resize();
    assert_eq!(t.rows(), auto_rows(2 * limit));
    for i in 0..limit {
        assert_eq!(t.lookup(&wire(i)), t.lookup(&stack(i)).map(|r| r & !xpf_state::table::STACK));
    }
}

/// A new state of key `key` (and `stack`), made by rule 7.
fn new_state<K: Key>(key: K, stack: Option<K>, tcp: Option<[Peer; 2]>, sloppy: bool) -> NewState<K> {
    NewState {
        stack,
        dir: Dir::Out,
        rule: 7,
        timeout: if key.proto() == 6 { Timeout::TcpEstablished } else { Timeout::UdpFirst },
        tcp,
        sloppy,
        ..xpf_state::fixtures::established_tcp(key, [Peer::default(); 2])
    }
}

/// A table of `limit` states, sized automatically, no sync events.
fn table<K: Key>(limit: u32) -> StateTable<K> {
    StateTable::new(Config {
        limit,
        rows: None,
        seed: Seed::fixed(3),
        events: 0,
        now: 0,
        grow_from: None,
        prefault: false,
    })
    .unwrap()
}

/// A translated IPv4 state's line holds its stack key where its creation time, rule and
/// sequence were; those move to its side record. Whatever is read of a translated state of
/// either family, by any path, is what was inserted, and its TCP peers are its own.
#[test]
fn translated_states_keep_their_keys_meta_and_peers() {
    fn check<K: Key>(t: &mut StateTable<K>, wire: K, stack: K, tcp: Option<[Peer; 2]>, sloppy: bool, now: u32) {
        let id = t.insert(t.hash(&wire), new_state(wire, Some(stack), tcp, sloppy), now).unwrap();
        assert_eq!(t.stack_key(id), Some(stack));
        let m = t.meta(id);
        assert_eq!((m.creation, m.rule), (now, 7));
        assert_eq!(t.find(&wire, t.hash(&wire)), Some(id));
        assert_eq!(t.find(&stack, t.hash(&stack)), Some(id | STACK));
        let mut found = [0u32; 2];
        t.lookup_batch(&[wire, stack], &mut [0; 2], &mut found);
        assert_eq!(found, [id, id | STACK]);
        t.meta_mut(id).creation = now - 1;
        assert_eq!(t.meta(id).creation, now - 1);
        assert_eq!(t.stack_key(id), Some(stack), "the meta written is not the stack key's");
        match (tcp, sloppy) {
            (Some(p), false) => {
                assert_eq!(t.peers(id), Some(&p));
                t.state_and_peers_mut(id).1.unwrap()[0].seqlo = 99;
                assert_eq!(t.peers(id).unwrap()[0].seqlo, 99);
            }
            _ => {
                assert!(t.peers(id).is_none());
                assert!(t.state_and_peers_mut(id).1.is_none(), "a sloppy state has no peers");
            }
        }
        assert_eq!(t.stack_key(id), Some(stack));
        assert_eq!(t.meta(id).rule, 7);
        assert!(t.remove(id));
        assert_eq!(t.find(&stack, t.hash(&stack)), None);
    }
    let peers = [Peer { seqlo: 1, seqhi: 2, max_win: 3, ..Peer::default() }, Peer { seqlo: 5, ..Peer::default() }];
    let mut t4 = table::<Key4>(1024);
    for (proto, tcp, sloppy) in [(17, None, false), (6, Some(peers), false), (6, None, true), (1, None, false)] {
        let wire = Key4 { addr: [[198, 51, 100, 1], [192, 0, 2, 9]], port: [80, 50001], proto, _pad: 0, kif: 3 };
        let stack = Key4 { addr: [[198, 51, 100, 1], [10, 0, 0, 2]], port: [80, 34567], ..wire };
        check(&mut t4, wire, stack, tcp, sloppy, 100);
    }
    let mut t6 = table::<Key6>(1024);
    for (proto, tcp, sloppy) in [(17, None, false), (6, Some(peers), false), (6, None, true)] {
        let a = |x: u8| {
            let mut b = [0u8; 16];
            b[0] = 0x20;
            b[15] = x;
            b
        };
        let wire = Key6 { addr: [a(1), a(2)], port: [80, 50001], proto, _pad: 0, kif: 3 };
        let stack = Key6 { addr: [a(1), a(3)], port: [80, 34567], ..wire };
        check(&mut t6, wire, stack, tcp, sloppy, 100);
    }
}

/// `remove_all` (`-F states`) leaves what removing each state leaves, whether it takes the
/// keys out one by one (few states for the rows) or empties the index at once: no state
/// found, the same removals, sync events and NAT releases, and every key insertable again.
#[test]
fn remove_all_is_removing_each() {
    for n in [20u16, 3000] {
        let fill = || {
            let mut t = StateTable::<Key4>::new(Config {
                limit: 3000,
                rows: None,
                seed: Seed::fixed(5),
                events: 8192,
                now: 0,
                grow_from: None,
                prefault: false,
            })
            .unwrap();
            for i in 0..n {
                let k = key(i);
                // A third translated, half of those by this box (holding a port), the rest
                // synced from a peer (holding nothing here).
                let stack = (i % 3 == 0).then(|| stack_key(i));
                let held = if i % 6 == 0 { xpf_state::held::PORT } else { 0 };
                t.insert(t.hash(&k), NewState { stack, held, ..udp_state(k, Timeout::UdpFirst) }, 0).unwrap();
            }
            t.drain_events(|_, _| {});
            t
        };
        let mut each = fill();
        let ids: Vec<u32> = each.iter().map(|(id, _)| id).collect();
        for id in ids {
            assert!(each.remove(id));
        }
        let mut all = fill();
        assert_eq!(all.remove_all(true), n as u32);
        // One by one, each state holding a port of this box's has it queued for release (a
        // synced one holds none); all at once, the caller releases every port itself.
        for (t, gone) in [(&mut each, n.div_ceil(6) as usize), (&mut all, 0)] {
            assert_eq!(t.len(), 0);
            assert_eq!(t.counters.removals, n as u64);
            assert_eq!(t.nat_gone.len(), gone);
            assert_eq!(t.drain_events(|_, _| {}), n as usize);
            for i in 0..n {
                assert!(t.lookup(&key(i)).is_none() && t.lookup(&stack_key(i)).is_none(), "{i} still found");
            }
            t.maintain(1, 1 << 20);
            for i in 0..n {
                let k = key(i);
                let stack = (i % 2 == 0).then(|| stack_key(i));
                t.insert(t.hash(&k), NewState { stack, ..udp_state(k, Timeout::UdpFirst) }, 1).unwrap();
            }
            for i in 0..n {
                assert!(t.lookup(&key(i)).is_some() && (i % 2 != 0 || t.lookup(&stack_key(i)).is_some()));
            }
        }
        // Without events (the peer is cleared in one message): none queued.
        let mut quiet = fill();
        assert_eq!(quiet.remove_all(false), n as u32);
        assert_eq!((quiet.len(), quiet.drain_events(|_, _| {})), (0, 0));
    }
}
