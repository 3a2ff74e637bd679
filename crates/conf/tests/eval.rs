//! Evaluation: verdicts of compiled rulesets on crafted packets, skip steps against a naive
//! evaluation, and a ruleset driving the engine.

use proptest::prelude::*;
use xpf_conf::{parse, Ruleset};
use xpf_engine::{Action, Context, Policy, Verdict, Worker, WorkerConfig};
use xpf_state::{Dir, Seed};
use xpf_wire::pdesc::{pdf, AF_INET, IPPROTO_TCP, IPPROTO_UDP};
use xpf_wire::{tcp, Addr, PDesc};

fn ifindex(n: &str) -> Option<u16> {
    match n {
        "em0" => Some(1),
        "em1" => Some(2),
        _ => None,
    }
}

fn rs(src: &str) -> Ruleset {
    let p = parse(src, "test", &[]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    Ruleset::compile(&p, &ifindex).unwrap()
}

fn pkt(proto: u8, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, flags: u8) -> PDesc {
    PDesc {
        src: Addr::v4(src),
        dst: Addr::v4(dst),
        sport,
        dport,
        af: AF_INET,
        proto,
        tcp_flags: flags,
        flags: pdf::HAS_PORTS,
        ..Default::default()
    }
}

fn action(r: &Ruleset, p: &PDesc, ifidx: u16, dir: Dir) -> Action {
    r.evaluate(p, ifidx, dir).action
}

fn worker(r: Ruleset) -> Worker<Ruleset> {
    worker_of(r, 100)
}

/// [`worker`] with room for `limit` states.
fn worker_of(r: Ruleset, limit: u32) -> Worker<Ruleset> {
    Worker::new(
        WorkerConfig { limit, rows: None, seed: Seed::fixed(1), events: 0, now: 0, prefault: false, secret: [1; 32] },
        r,
    )
    .unwrap()
}

/// A 60-byte Ethernet frame of a UDP datagram.
fn udp(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[12] = 8;
    xpf_wire::ipv4::emit_header(&mut f[14..], src, dst, 17, 46, 64, 1);
    xpf_wire::udp::emit_header(&mut f[34..], sp, dp, 26);
    f
}

#[test]
fn last_match_wins_and_quick_stops() {
    let r = rs("block all\npass in proto tcp to port 22\n");
    let ssh = pkt(IPPROTO_TCP, [1, 1, 1, 1], [2, 2, 2, 2], 999, 22, tcp::SYN);
    let web = pkt(IPPROTO_TCP, [1, 1, 1, 1], [2, 2, 2, 2], 999, 80, tcp::SYN);
    assert_eq!(action(&r, &ssh, 1, Dir::In), Action::Pass);
    assert_eq!(action(&r, &web, 1, Dir::In), Action::Block);
    assert_eq!(action(&r, &ssh, 1, Dir::Out), Action::Block, "the pass rule is for in only");
    let d = r.evaluate(&ssh, 1, Dir::In);
    assert!(d.keep_state);
    assert_eq!(d.rule, 1);
    let q = rs("block quick from 10/8\npass all\n");
    assert_eq!(action(&q, &pkt(IPPROTO_UDP, [10, 9, 9, 9], [2, 2, 2, 2], 1, 2, 0), 1, Dir::In), Action::Block);
    assert_eq!(action(&q, &pkt(IPPROTO_UDP, [11, 9, 9, 9], [2, 2, 2, 2], 1, 2, 0), 1, Dir::In), Action::Pass);
}

#[test]
fn match_rules_tag_and_go_on() {
    let r = rs("match in from 10/8 tag INSIDE\nblock all\npass in tagged INSIDE\npass out ! tagged INSIDE\n");
    let inside = pkt(IPPROTO_UDP, [10, 0, 0, 1], [8, 8, 8, 8], 1, 53, 0);
    let outside = pkt(IPPROTO_UDP, [11, 0, 0, 1], [8, 8, 8, 8], 1, 53, 0);
    assert_eq!(action(&r, &inside, 1, Dir::In), Action::Pass);
    assert_eq!(action(&r, &outside, 1, Dir::In), Action::Block);
    assert_eq!(action(&r, &outside, 1, Dir::Out), Action::Pass);
    let (_, tag) = r.eval(&inside, 1, Dir::In);
    assert_eq!(r.tag_name(tag), Some("INSIDE"));
}

#[test]
fn negation_ports_flags_and_interfaces() {
    let r = rs("block all\npass in on em0 proto tcp from ! 10/8 to any port 1000:2000 flags S/SA\n");
    let ok = pkt(IPPROTO_TCP, [11, 0, 0, 1], [2, 2, 2, 2], 5, 1500, tcp::SYN);
    assert_eq!(action(&r, &ok, 1, Dir::In), Action::Pass);
    assert_eq!(action(&r, &ok, 2, Dir::In), Action::Block, "other interface");
    assert_eq!(
        action(&r, &pkt(IPPROTO_TCP, [10, 0, 0, 1], [2, 2, 2, 2], 5, 1500, tcp::SYN), 1, Dir::In),
        Action::Block
    );
    assert_eq!(
        action(&r, &pkt(IPPROTO_TCP, [11, 0, 0, 1], [2, 2, 2, 2], 5, 2001, tcp::SYN), 1, Dir::In),
        Action::Block
    );
    assert_eq!(
        action(&r, &pkt(IPPROTO_TCP, [11, 0, 0, 1], [2, 2, 2, 2], 5, 1500, tcp::SYN | tcp::ACK), 1, Dir::In),
        Action::Block
    );
    // An interface the machine lacks (em7): the rule loads and waits for it, as in pf.
    let absent = rs("block all\npass in on em7\n");
    assert_eq!((action(&absent, &ok, 1, Dir::In), action(&absent, &ok, 2, Dir::In)), (Action::Block, Action::Block));
    let not = rs("block all\npass in on ! em7\n");
    assert_eq!((action(&not, &ok, 1, Dir::In), action(&not, &ok, 2, Dir::In)), (Action::Pass, Action::Pass));
}

#[test]
fn tables_are_longest_prefix_with_negation_and_counters() {
    let r = rs("table <t> { 10/8 !10.1/16 10.1.2.3 }\nblock all\npass from <t>\n");
    let a = |x: [u8; 4]| action(&r, &pkt(IPPROTO_UDP, x, [2, 2, 2, 2], 1, 2, 0), 1, Dir::In);
    assert_eq!(a([10, 2, 3, 4]), Action::Pass);
    assert_eq!(a([10, 1, 9, 9]), Action::Block, "the negated /16 excludes it");
    assert_eq!(a([10, 1, 2, 3]), Action::Pass, "a longer entry inside the negated one");
    assert_eq!(a([11, 0, 0, 1]), Action::Block);
    let t = r.table("t").unwrap();
    assert_eq!(t.len(), 3);
    // Each rule test counts the entry that decided; asking (`-T test`) counts nothing.
    let counts = |t: &xpf_conf::compile::Table| t.entries().iter().map(|e| e.matches).collect::<Vec<_>>();
    assert_eq!(counts(t), [1, 1, 1], "10/8, !10.1/16, 10.1.2.3 each decided once");
    let probe = xpf_wire::Addr::v4([10, 1, 2, 3]);
    assert!(t.holds(&probe, xpf_wire::pdesc::AF_INET));
    assert!(!t.holds(&xpf_wire::Addr::v4([10, 1, 7, 7]), xpf_wire::pdesc::AF_INET));
    assert_eq!(counts(t), [1, 1, 1], "asking is not a packet matching");
}

/// `table <T> counters`: each entry counts the packets the rules naming the table decided
/// for it, in and out, blocked and passed (pf's per-entry counters): packets without a state
/// at evaluation, a state's from the state. A table without `counters` counts none.
#[test]
fn a_counters_table_counts_per_entry_what_its_rules_decide() {
    use xpf_conf::compile::Verdict as V;
    let r = rs("table <t> counters { 10/8 !10.1/16 }\ntable <u> { 10/8 }\nblock all\n\
        pass in proto udp from <t> to port 53\npass in proto udp from <t> to port 54 no state\n\
        block in proto udp from <t> to port 55\nblock in proto udp from ! <t> to port 56\n\
        pass in proto udp from <u> to port 57 no state\nblock out proto udp to <t> port 58\n");
    let go = |src: [u8; 4], dst: [u8; 4], port: u16, dir: Dir| {
        let p = PDesc { ip_len: 100, ..pkt(IPPROTO_UDP, src, dst, 1000, port, 0) };
        r.evaluate(&p, 1, dir)
    };
    assert!(go([10, 2, 3, 4], [2, 2, 2, 2], 53, Dir::In).keep_state, "a state's packets count from the state");
    assert_eq!(go([10, 2, 3, 4], [2, 2, 2, 2], 54, Dir::In).action, Action::Pass);
    assert_eq!(go([10, 2, 3, 4], [2, 2, 2, 2], 55, Dir::In).action, Action::Block);
    assert_eq!(go([10, 2, 3, 5], [2, 2, 2, 2], 55, Dir::In).action, Action::Block);
    // `! <t>`: an address no entry holds counts nowhere (pf's XPass); one the negated entry
    // decides counts there.
    assert_eq!(go([11, 0, 0, 1], [2, 2, 2, 2], 56, Dir::In).action, Action::Block);
    assert_eq!(go([10, 1, 0, 1], [2, 2, 2, 2], 56, Dir::In).action, Action::Block);
    assert_eq!(go([10, 2, 3, 4], [2, 2, 2, 2], 57, Dir::In).action, Action::Pass);
    assert_eq!(go([2, 2, 2, 2], [10, 7, 7, 7], 58, Dir::Out).action, Action::Block);
    let t = r.table("t").unwrap();
    assert!(t.counted() && !r.table("u").unwrap().counted());
    let e = t.entries();
    let slot = |out, pass| V { out, pass }.slot();
    let mut want = [[0u64; 2]; 4];
    want[slot(false, false)] = [2, 200];
    want[slot(false, true)] = [1, 100];
    want[slot(true, false)] = [1, 100];
    assert_eq!((e[0].addr.to_string(), e[0].counts), ("10.0.0.0".into(), Some(want)));
    let mut neg = [[0u64; 2]; 4];
    neg[slot(false, false)] = [1, 100];
    assert_eq!((e[1].neg, e[1].counts), (true, Some(neg)));
    assert_eq!(r.table("u").unwrap().entries()[0].counts, None);
    // A copy `-T add` installs keeps them, `-T replace` keeps those of entries that stay,
    // `-T zero` clears them, `-T flush` leaves a table that still counts.
    let mut c = t.clone();
    assert_eq!(c.entries()[0].counts, Some(want));
    let ten = "10.0.0.0".parse().unwrap();
    assert_eq!(t.replaced(&[(ten, 8)], 5).entries()[0].counts, Some(want));
    c.zero(7);
    assert_eq!(c.entries()[0].counts, Some([[0; 2]; 4]));
    assert!(t.replaced(&[], 5).counted());

    // A state's packets: from the creator in its direction, the replies in the other, on the
    // entry of the address its rule saw.
    let mut w = worker(rs("table <t> counters { 10/8 }\nblock all\npass in proto udp from <t>\n"));
    let mut v = [Verdict::Pass; 2];
    w.process(&[&udp([10, 2, 3, 4], [2, 2, 2, 2], 5000, 53)], 1, Dir::In, 0, &mut v);
    let reply = udp([2, 2, 2, 2], [10, 2, 3, 4], 53, 5000);
    w.process(&[&reply, &reply], 1, Dir::Out, 1, &mut v);
    assert_eq!(v, [Verdict::Pass; 2]);
    let mut sums = w.policy.state_counts().expect("a rule names a counters table");
    sums.walk(&w.t4);
    let got = sums.sums().get(&("t".to_string(), ten, 8)).copied();
    let mut want = [[0u64; 2]; 4];
    want[slot(false, true)] = [1, 46];
    want[slot(true, true)] = [2, 92];
    assert_eq!(got, Some(want));
    assert!(rs("table <u> { 10/8 }\npass from <u>\n").state_counts().is_none(), "nothing to walk for");
}

/// A rule's packets and bytes as pf counts them (`-s rules -v`, `-s labels`): in and out by
/// the interface's direction, what it blocked and passed without a state as it decided, its
/// states' packets (those in the table now summed by a reader, those that ended kept in the
/// table's tally with the states they made); a packet no rule decided counts on none.
#[test]
fn rules_count_what_they_block_pass_and_their_states_carried() {
    let mut w = worker(rs("block in proto udp to port 9
pass in proto udp to port 53
        pass out proto udp to port 54 no state
block in proto tcp to port 22
"));
    let mut v = [Verdict::Pass; 4];
    // Rule 0 blocks two datagrams in (46 bytes each: 20 + 8 + 18).
    let nine = udp([10, 0, 0, 1], [2, 2, 2, 2], 5000, 9);
    w.process(&[&nine, &nine], 1, Dir::In, 0, &mut v);
    assert_eq!(v[..2], [Verdict::Drop(xpf_wire::Reason::Match); 2]);
    // Rule 1 makes a state: one in, two replies out; then a second state that is killed.
    w.process(&[&udp([10, 0, 0, 1], [2, 2, 2, 2], 5000, 53)], 1, Dir::In, 1, &mut v);
    let reply = udp([2, 2, 2, 2], [10, 0, 0, 1], 53, 5000);
    w.process(&[&reply, &reply], 1, Dir::Out, 1, &mut v);
    w.process(&[&udp([10, 0, 0, 2], [2, 2, 2, 2], 5001, 53)], 1, Dir::In, 1, &mut v);
    // Rule 2 passes one out without a state; nothing matches a datagram to port 99 (pf's
    // default rule passes it, and it counts on no rule).
    w.process(&[&udp([10, 0, 0, 1], [2, 2, 2, 2], 5000, 54)], 1, Dir::Out, 2, &mut v);
    w.process(&[&udp([10, 0, 0, 1], [2, 2, 2, 2], 5000, 99)], 1, Dir::In, 2, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    let killed = w.t4.iter().find(|(_, s)| s.packets == [1, 0]).map(|(id, _)| id).expect("the second state");
    assert!(w.t4.remove(killed));

    let tally = |r: u32| w.t4.tally.get(r).copied().unwrap_or_default();
    assert_eq!((tally(0).packets, tally(0).bytes, tally(0).created), ([2, 0], [92, 0], 0));
    assert_eq!((tally(1).packets, tally(1).bytes, tally(1).created), ([1, 0], [46, 0], 1), "the killed state");
    assert_eq!((tally(2).packets, tally(2).bytes), ([0, 1], [0, 46]));
    assert!(w.t4.tally.get(3).is_none() && w.t4.tally.get(xpf_engine::policy::NO_RULE).is_none());
    // The live state, as a reader's walk adds it.
    let (id, s) = w.t4.iter().next().expect("the first state");
    assert_eq!(w.t4.meta(id).rule, 1);
    let mut c = tally(1);
    c.add_state(s.flags & xpf_state::sf::OUT != 0, s.packets, s.bytes);
    assert_eq!((c.packets, c.bytes), ([2, 2], [92, 92]), "in: 2 from the creators; out: the 2 replies");
}

#[test]
fn no_match_passes_without_state() {
    let r = rs("block in on em1\n");
    let d = r.evaluate(&pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 1, 2, 0), 1, Dir::In);
    assert_eq!((d.action, d.keep_state), (Action::Pass, false));
}

#[test]
fn a_ruleset_drives_the_engine() {
    // Default block, outbound keep state: replies pass by state, unsolicited traffic does not.
    let r = rs("block all\npass out proto udp\n");
    let mut w = worker(r);
    let frame = udp;
    let mut v = [Verdict::Pass; 2];
    w.process(&[&frame([10, 0, 0, 1], [8, 8, 8, 8], 5000, 53)], 1, Dir::Out, 0, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    let reply = frame([8, 8, 8, 8], [10, 0, 0, 1], 53, 5000);
    let probe = frame([8, 8, 8, 8], [10, 0, 0, 1], 53, 5001);
    w.process(&[&reply, &probe], 1, Dir::In, 1, &mut v);
    assert_eq!(v, [Verdict::Pass, Verdict::Drop(xpf_wire::Reason::Match)]);
    assert_eq!(w.states(), 1);
}

/// Each worker counts the rules it tests in its own row; `-s rules -v` reads their sum and
/// `-z` starts it again from 0. Both lookups: the walk (a few rules) and the classifier (from
/// 64), with more workers than the rows of their own.
#[test]
fn evaluations_of_every_worker_are_summed_and_zeroed() {
    let small = "block all\npass in proto udp to port 53\npass in proto tcp\n".to_string();
    let mut big = "block all\n".to_string();
    for k in 0..100 {
        big += &format!("pass in proto udp from 10.{k}.0.0/16 to port 53\n");
    }
    for (text, last) in [(small, 1), (big, 100)] {
        let r = rs(&text);
        let p = pkt(IPPROTO_UDP, [10, 99, 1, 1], [2, 2, 2, 2], 1000, 53, 0);
        std::thread::scope(|s| {
            for worker in 0..20u16 {
                let r = &r;
                s.spawn(move || {
                    for _ in 0..1_000 {
                        let d = r.evaluate_in(&p, &Context { worker, ..Context::new(1, Dir::In) });
                        assert_eq!((d.action, d.rule), (Action::Pass, last as u32));
                    }
                });
            }
        });
        assert_eq!(r.evaluations(0), 20_000, "rule 0 tested by every packet ({text:.20})");
        assert_eq!(r.evaluations(last), 20_000, "the deciding rule, every packet");
        r.zero_evaluations();
        assert_eq!((r.evaluations(0), r.evaluations(last)), (0, 0));
        r.evaluate_in(&p, &Context { worker: 3, ..Context::new(1, Dir::In) });
        assert_eq!((r.evaluations(0), r.evaluations(last)), (1, 1), "counting goes on after -z");
    }
}

fn rule_line() -> impl Strategy<Value = String> {
    let action = prop_oneof![Just("pass"), Just("block"), Just("match")];
    let dir = prop_oneof![Just(""), Just(" in"), Just(" out")];
    let quick = prop_oneof![4 => Just(""), 1 => Just(" quick")];
    let on = prop_oneof![Just(""), Just(" on em0"), Just(" on ! em1")];
    let proto = prop_oneof![Just(""), Just(" proto tcp"), Just(" proto udp")];
    let src = prop_oneof![Just(" from any"), Just(" from 10/8"), Just(" from ! 10.1/16"), Just(" from <t>")];
    let dst = prop_oneof![Just(" to any"), Just(" to 20/8"), Just(" to ! 20.0.0.1")];
    let tag = prop_oneof![6 => Just(""), 2 => Just(" tag A"), 2 => Just(" tagged A"), 1 => Just(" probability 50%")];
    (action, dir, quick, on, proto, src, dst, tag).prop_map(|(a, d, q, o, p, s, t, g)| {
        let ports = if p.is_empty() { "" } else { " port 100:200" };
        format!("{a}{d}{q}{o}{p}{s}{t}{ports}{g}\n")
    })
}

proptest! {
    /// Skip steps never change a verdict: evaluation with them equals evaluation without.
    #[test]
    fn skip_steps_agree_with_naive_evaluation(
        lines in proptest::collection::vec(rule_line(), 1..40),
        pkts in proptest::collection::vec((any::<bool>(), 0u8..3, any::<u8>(), any::<u8>(), 90u16..210, any::<bool>(), 1u16..3, 0u16..3, any::<u32>()), 1..30),
    ) {
        let src = format!("table <t> {{ 10.2/16 !10.2.3/24 }}\n{}", lines.concat());
        let p = parse(&src, "t", &[]);
        prop_assume!(p.errors.is_empty());
        let r = Ruleset::compile(&p, &ifindex).unwrap();
        // The packet may carry a tag from an earlier pass (1: A, the only tag; 2: an unknown one).
        for (tcp_, net, b, c, port, out, ifi, tg, rnd) in pkts {
            let s = [[10, 2, b, c], [10, 1, b, c], [11, 0, b, c]][net as usize];
            let d = [20, 0, 0, c];
            let pd = pkt(if tcp_ { IPPROTO_TCP } else { IPPROTO_UDP }, s, d, port, port, tcp::SYN);
            let dir = if out { Dir::Out } else { Dir::In };
            let at = Context { tag: tg, rnd, ..Context::new(ifi, dir) };
            prop_assert_eq!(r.eval_with(&pd, &at), r.eval_naive(&pd, &at));
        }
    }
}

#[test]
fn anchors_are_evaluated_in_place() {
    let r = rs("block all\nanchor in on em0 {\n  pass proto tcp to port 22\n  anchor proto udp {\n    pass proto udp to port 53\n  }\n}\npass in on em1 proto udp\n");
    let ssh = pkt(IPPROTO_TCP, [1, 1, 1, 1], [2, 2, 2, 2], 999, 22, tcp::SYN);
    let dns = pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 999, 53, 0);
    let ntp = pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 999, 123, 0);
    assert_eq!(action(&r, &ssh, 1, Dir::In), Action::Pass);
    assert_eq!(action(&r, &dns, 1, Dir::In), Action::Pass);
    assert_eq!(action(&r, &ntp, 1, Dir::In), Action::Block);
    // The anchor is for em0: on em1 its body is passed over, the last rule decides.
    assert_eq!(action(&r, &ssh, 2, Dir::In), Action::Block);
    assert_eq!(action(&r, &ntp, 2, Dir::In), Action::Pass);
    // A quick anchor stops once a rule in it matched.
    let q = rs("block all\nanchor quick {\n  pass proto tcp\n}\nblock proto tcp\n");
    assert_eq!(action(&q, &ssh, 1, Dir::In), Action::Pass);
    for (p, ifi) in [(&ssh, 1), (&dns, 2), (&ntp, 1)] {
        assert_eq!(r.eval(p, ifi, Dir::In), r.eval_naive(p, &Context::new(ifi, Dir::In)));
    }
}

#[test]
fn state_options_reach_the_engine_and_limiters_survive_a_recompile() {
    let text = "table <bf> persist\n\
                pass in proto tcp to port 22 keep state (max 3, max-src-conn 2, overload <bf> flush global, udp.first 5)\n\
                pass in proto tcp to port 80 flags any keep state (sloppy)\n\
                pass in proto tcp to port 443\n";
    let r = rs(text);
    let ssh = r.evaluate(&pkt(IPPROTO_TCP, [1, 1, 1, 1], [2, 2, 2, 2], 1000, 22, tcp::SYN), 1, Dir::In);
    assert_ne!(ssh.limits, 0);
    let l = r.limits(ssh.limits).unwrap();
    assert_eq!(
        (l.max, l.max_src_conn, l.track_src, l.per_rule_nodes),
        (3, 2, true, true),
        "max-src-conn implies source-track rule, as in pfctl"
    );
    let o = l.overload.as_ref().unwrap();
    assert_eq!((o.table.as_str(), o.flush, o.global), ("bf", true, true));
    assert_eq!(l.timeouts[0], (xpf_state::Timeout::UdpFirst, 5));
    assert!(!ssh.sloppy && !ssh.pickup, "flags S/SA by default");
    let web = r.evaluate(&pkt(IPPROTO_TCP, [1, 1, 1, 1], [2, 2, 2, 2], 1000, 80, tcp::ACK), 1, Dir::In);
    assert!(web.sloppy && web.pickup && web.limits == 0);
    let tls = r.evaluate(&pkt(IPPROTO_TCP, [1, 1, 1, 1], [2, 2, 2, 2], 1000, 443, tcp::SYN), 1, Dir::In);
    assert_eq!(tls.limits, 0);
    // A table change recompiles everything: the unchanged rule keeps its limiter (its states
    // go on counting), a changed one gets another.
    let again = rs(&text.replace("persist", "persist { 10.0.0.1 }"));
    assert_eq!(again.limits[0].limiter, l.limiter);
    let changed = rs(&text.replace("max 3", "max 4"));
    assert_ne!(changed.limits[0].limiter, l.limiter);
}

/// `max-src-states` alone tracks sources globally, as pfctl makes it: one node a source,
/// shared by every rule that tracks globally, so a source's states through two such rules
/// count together; with `source-track rule` each rule counts its own. (The node, connection
/// and connection-rate limits are always a rule's own.)
#[test]
fn max_src_states_alone_counts_a_source_across_the_globally_tracking_rules() {
    for (opts, third) in [
        ("max-src-states 2", Verdict::Drop(xpf_wire::Reason::SrcLimit)),
        ("source-track global, max-src-states 2", Verdict::Drop(xpf_wire::Reason::SrcLimit)),
        ("source-track rule, max-src-states 2", Verdict::Pass),
    ] {
        let r = rs(&format!(
            "pass in proto udp to port 53 keep state ({opts})\npass in proto udp to port 54 keep state ({opts})\n"
        ));
        let mut w = worker(r);
        let mut v = [Verdict::Pass; 1];
        for (sport, dport, want) in [(1000, 53, Verdict::Pass), (1001, 54, Verdict::Pass), (1002, 53, third)] {
            let f = udp([10, 0, 0, 1], [10, 0, 0, 9], sport, dport);
            w.process(&[&f], 1, Dir::In, 1, &mut v);
            assert_eq!(v[0], want, "({opts}): the source's state to port {dport} from {sport}");
        }
    }
    let p = parse("pass in proto tcp keep state (source-track global, max-src-conn 3)\n", "test", &[]);
    assert!(
        p.errors.iter().any(|e| e.msg.contains("'max-src-conn' is incompatible with 'source-track global'")),
        "{:?}",
        p.errors
    );
}

/// pf's tags cross passes: the `in` pass tags, the `out` pass on another interface filters on
/// `tagged`; later packets take the tag from their `in` state, so an `out` state that went
/// (killed, expired) is made again under the same tag.
#[test]
fn tag_set_in_is_seen_by_tagged_out_and_kept_in_the_state() {
    let r = rs("block all\npass in on em0 proto udp to port 53 tag DNS\npass in on em0 proto udp to port 54\n\
                pass out on em1 tagged DNS\n");
    let mut w = worker(r);
    let frame = |dp: u16| udp([10, 0, 0, 1], [8, 8, 8, 8], 5000, dp);
    let (dns, other) = (frame(53), frame(54));
    let mut v = [Verdict::Pass; 2];
    let mut tags = [0u16; 2];
    w.process_tagged(&[&dns, &other], 1, Dir::In, 1, 0, &mut v, &mut tags, 0);
    assert_eq!(v, [Verdict::Pass, Verdict::Pass]);
    assert!(tags[0] != 0 && tags[1] == 0, "the DNS rule tagged, the other did not: {tags:?}");
    w.process_tagged(&[&dns, &other], 2, Dir::Out, 1, 0, &mut v, &mut tags, 0);
    assert_eq!(v, [Verdict::Pass, Verdict::Drop(xpf_wire::Reason::Match)], "only the tagged packet goes out");
    assert_eq!(w.states(), 3);
    // The `out` state goes; the next packet takes its tag from the `in` state.
    let out_id = w.t4.iter().find(|(_, s)| s.flags & xpf_state::sf::OUT != 0).map(|(i, _)| i).unwrap();
    w.t4.remove(out_id);
    let mut tags = [0u16; 1];
    w.process_tagged(&[&dns], 1, Dir::In, 1, 1, &mut v[..1], &mut tags, 0);
    assert_ne!(tags[0], 0, "the in state carries the tag");
    w.process_tagged(&[&dns], 2, Dir::Out, 1, 1, &mut v[..1], &mut tags, 0);
    assert_eq!(v[0], Verdict::Pass);
    // Without the tag (as before tags crossed passes) the out pass blocks it.
    let mut none = [0u16; 1];
    let out_id = w.t4.iter().find(|(_, s)| s.flags & xpf_state::sf::OUT != 0).map(|(i, _)| i).unwrap();
    w.t4.remove(out_id);
    w.process_tagged(&[&dns], 2, Dir::Out, 1, 1, &mut v[..1], &mut none, 0);
    assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Match));
}

#[test]
fn tos_matches_the_tos_byte_without_its_ecn_bits() {
    let r = rs("block all\npass in tos 0x10\n");
    let mut p = pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 1, 2, 0);
    p.tos = 0x11; // lowdelay, ECT(1)
    assert_eq!(action(&r, &p, 1, Dir::In), Action::Pass);
    p.tos = 0x08;
    assert_eq!(action(&r, &p, 1, Dir::In), Action::Block);
}

/// A fragment of a UDP datagram from 10.0.0.1 to 10.0.0.2 (id 7): `payload` at 8-byte
/// offset `off8`, more to come when `more`.
fn udp_fragment(off8: u16, more: bool, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 60.max(34 + payload.len())];
    f[12] = 8;
    xpf_wire::ipv4::emit_header(&mut f[14..], [10, 0, 0, 1], [10, 0, 0, 2], 17, 20 + payload.len() as u16, 64, 7);
    f[20..22].copy_from_slice(&(off8 | if more { 0x2000 } else { 0 }).to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let c = xpf_wire::checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f[34..34 + payload.len()].copy_from_slice(payload);
    f
}

/// A DNS datagram (10.0.0.1:5000 to 10.0.0.2:53) in two fragments: its UDP header and 8
/// bytes of data, then 16 more bytes.
fn dns_in_two_fragments() -> [Vec<u8>; 2] {
    let mut head = vec![0u8; 16];
    xpf_wire::udp::emit_header(&mut head, 5000, 53, 32);
    [udp_fragment(0, true, &head), udp_fragment(2, false, &[0x5a; 16])]
}

/// `fragment` (pf's): the rule matches only fragments that were not reassembled and keeps no
/// state for them; with reassembly on, the datagram is filtered whole and such a rule does
/// not match it. A later fragment matches no rule with an ICMP type (it has no ICMP header).
#[test]
fn fragment_rules_match_only_fragments_not_reassembled() {
    let conf = "block all\npass in proto udp fragment\npass in inet proto icmp icmp-type echoreq\n";
    let r = rs(conf);
    assert_eq!(action(&r, &pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 1, 2, 0), 1, Dir::In), Action::Block);
    let mut later = pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 0, 0, 0);
    later.flags = pdf::FRAGMENT | pdf::NOT_FIRST_FRAG;
    let d = r.evaluate(&later, 1, Dir::In);
    assert_eq!((d.action, d.keep_state), (Action::Pass, false));
    let mut echo = pkt(xpf_wire::pdesc::IPPROTO_ICMP, [1, 1, 1, 1], [2, 2, 2, 2], 0, 0, 0);
    echo.flags = 0;
    echo.icmp_type = 8;
    assert_eq!(action(&r, &echo, 1, Dir::In), Action::Pass);
    echo.flags = pdf::FRAGMENT | pdf::NOT_FIRST_FRAG;
    assert_eq!(action(&r, &echo, 1, Dir::In), Action::Block, "a later fragment has no ICMP type");
    let frags = dns_in_two_fragments();
    let frames: Vec<&[u8]> = frags.iter().map(|f| &f[..]).collect();
    // Without reassembly each fragment meets the rules: both pass, and no state is made.
    let mut w = worker(rs(conf));
    let mut v = [Verdict::Pass; 2];
    w.process(&frames, 1, Dir::In, 0, &mut v);
    assert_eq!(v, [Verdict::Pass; 2]);
    assert_eq!(w.states(), 0);
    // With reassembly the rules see the whole datagram, which `fragment` does not match.
    let mut w = worker(rs(conf));
    w.set_reassemble(true, 100, 60);
    w.process(&frames, 1, Dir::In, 0, &mut v);
    assert_eq!(v[0], Verdict::Held);
    assert_eq!(v[1], Verdict::Drop(xpf_wire::Reason::Match), "blocked whole");
    assert_eq!((w.stats.passed, w.states()), (0, 0));
}

/// Without reassembly a first fragment is a fragment, as pf takes it (PF_VPROTO_FRAGMENT):
/// its ports unread, so a rule with ports does not pass it and no state is made; a rule
/// without ports passes every fragment; a blocked one is counted as a fragment, and a
/// logging rule logs it.
#[test]
fn without_reassembly_a_first_fragment_matches_no_ports_as_in_pf() {
    let conf = "block log all\npass in proto udp to port 53\npass in proto udp from 10.0.0.1 to 10.0.0.9\n";
    let frags = dns_in_two_fragments();
    let frames: Vec<&[u8]> = frags.iter().map(|f| &f[..]).collect();
    let mut w = worker(rs(conf));
    let mut v = [Verdict::Pass; 2];
    w.process(&frames, 1, Dir::In, 0, &mut v);
    assert_eq!(v, [Verdict::Drop(xpf_wire::Reason::Fragment); 2], "port 53 is not seen in a fragment");
    assert_eq!((w.states(), w.batch().logged), (0, 0b11), "no state, both logged");
    // The same datagram whole passes by its port (and makes its state).
    let whole = udp([10, 0, 0, 1], [10, 0, 0, 2], 5000, 53);
    w.process(&[&whole[..]], 1, Dir::In, 0, &mut v[..1]);
    assert_eq!((v[0], w.states()), (Verdict::Pass, 1));
    // To 10.0.0.9 a rule without ports passes both fragments, and makes no state.
    let to9: Vec<Vec<u8>> = frags.iter().map(|f| retarget(f, [10, 0, 0, 9])).collect();
    let frames: Vec<&[u8]> = to9.iter().map(|f| &f[..]).collect();
    let mut w = worker(rs(conf));
    w.process(&frames, 1, Dir::In, 0, &mut v);
    assert_eq!((v, w.states(), w.batch().logged), ([Verdict::Pass; 2], 0, 0));
    // A TCP rule with flags (pf's default S/SA) passes no fragment, the first with its SYN
    // included; `flags any` passes both.
    let syn = |flags: &str| {
        let r = rs(&format!("block all\npass in proto tcp from 10.0.0.1 {flags}\n"));
        let mut pd = pkt(xpf_wire::pdesc::IPPROTO_TCP, [10, 0, 0, 1], [10, 0, 0, 2], 0, 0, 0);
        pd.flags = pdf::FRAGMENT | pdf::NOT_FIRST_FRAG;
        r.evaluate(&pd, 1, Dir::In).action
    };
    assert_eq!((syn("flags S/SA"), syn("flags /SA"), syn("flags any")), (Action::Block, Action::Block, Action::Pass));
}

/// `f` (an IPv4 frame) sent to `dst` instead, its header checksum made again.
fn retarget(f: &[u8], dst: [u8; 4]) -> Vec<u8> {
    let mut g = f.to_vec();
    g[30..34].copy_from_slice(&dst);
    g[24..26].copy_from_slice(&[0, 0]);
    let c = xpf_wire::checksum::checksum(&g[14..34]);
    g[24..26].copy_from_slice(&c.to_be_bytes());
    g
}

fn udp_frame(dst: [u8; 4]) -> Vec<u8> {
    udp([10, 0, 0, 1], dst, 5000, 53)
}

#[test]
fn set_skip_on_leaves_an_interface_unfiltered() {
    let mut w = worker(rs("set skip on em1\nblock all\n"));
    let f = udp_frame([8, 8, 8, 8]);
    let mut v = [Verdict::Pass];
    w.process(&[&f], 1, Dir::In, 0, &mut v);
    assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Match), "em0 is filtered");
    w.process(&[&f], 2, Dir::In, 0, &mut v);
    assert_eq!(v[0], Verdict::Pass, "em1 is skipped");
    assert_eq!(w.states(), 0);
}

#[test]
fn state_policy_if_bound_binds_states_a_rule_does_not_float() {
    let r = rs(
        "set state-policy if-bound\npass in proto udp to port 53\npass in proto udp to port 54 keep state (floating)\n",
    );
    let d = |port| r.evaluate(&pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 1, port, 0), 1, Dir::In).if_bound;
    assert!(d(53) && !d(54));
}

#[test]
fn self_stands_for_the_interfaces_addresses() {
    // Every network namespace has 127.0.0.1 on lo.
    let r = rs("block all\npass in to self\n");
    assert_eq!(action(&r, &pkt(IPPROTO_UDP, [1, 1, 1, 1], [127, 0, 0, 1], 1, 2, 0), 1, Dir::In), Action::Pass);
    assert_eq!(action(&r, &pkt(IPPROTO_UDP, [1, 1, 1, 1], [192, 0, 2, 1], 1, 2, 0), 1, Dir::In), Action::Block);
    let r = rs("block all\npass in to ! self\n");
    assert_eq!(action(&r, &pkt(IPPROTO_UDP, [1, 1, 1, 1], [127, 0, 0, 1], 1, 2, 0), 1, Dir::In), Action::Block);
    assert_eq!(action(&r, &pkt(IPPROTO_UDP, [1, 1, 1, 1], [192, 0, 2, 1], 1, 2, 0), 1, Dir::In), Action::Pass);
}

#[test]
fn a_table_file_is_read_at_every_compile_and_an_unreadable_one_fails() {
    let dir = std::env::temp_dir().join(format!("xpf-tf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("t.txt");
    std::fs::write(&f, "# blocked\n10.0.0.0/8 !10.1.0.0/16\n192.0.2.7\n").unwrap();
    let text = format!("table <t> file \"{}\"\nblock in from <t>\n", f.display());
    let r = rs(&text);
    let a = |r: &Ruleset, src| action(r, &pkt(IPPROTO_UDP, src, [2, 2, 2, 2], 1, 2, 0), 1, Dir::In);
    assert_eq!(
        (a(&r, [10, 2, 0, 1]), a(&r, [10, 1, 0, 1]), a(&r, [192, 0, 2, 7])),
        (Action::Block, Action::Pass, Action::Block)
    );
    std::fs::write(&f, "192.0.2.8\n").unwrap();
    let r = rs(&text);
    assert_eq!((a(&r, [10, 2, 0, 1]), a(&r, [192, 0, 2, 8])), (Action::Pass, Action::Block), "read again");
    std::fs::write(&f, "10.0.0.1\nnot-an-address\n").unwrap();
    let e = Ruleset::compile(&parse(&text, "test", &[]), &ifindex).unwrap_err();
    assert!(e.msg.contains("t.txt:2: 'not-an-address'"), "{}", e.msg);
    std::fs::remove_dir_all(&dir).unwrap();
    // A file gone since: the parser refuses it, as pfctl does (and a load stops there).
    let p = parse(&text, "test", &[]);
    assert!(p.errors[0].msg.contains("cannot load"), "{:?}", p.errors);
}

#[test]
fn block_return_answers_tcp_with_a_rst_and_udp_with_port_unreachable() {
    let mut w = worker(rs("block return in proto { tcp, udp }\nblock return-icmp (net-unr) in proto udp to port 54\n"));
    let mut syn = vec![0u8; 54];
    syn[12] = 8;
    xpf_wire::ipv4::emit_header(&mut syn[14..], [10, 0, 0, 1], [8, 8, 8, 8], 6, 40, 64, 1);
    xpf_wire::tcp::emit_header(&mut syn[34..], 40000, 23, 77, 0, tcp::SYN, 1024);
    let c = !xpf_wire::checksum::fold(xpf_wire::checksum::sum(
        &syn[34..],
        xpf_wire::checksum::pseudo_v4([10, 0, 0, 1], [8, 8, 8, 8], 6, 20),
    ));
    syn[50..52].copy_from_slice(&c.to_be_bytes());
    let dns = udp_frame([8, 8, 8, 8]);
    let mut other = udp_frame([8, 8, 8, 8]);
    other[37] = 54; // to port 54
    other[40..42].fill(0);
    let mut v = [Verdict::Pass; 3];
    w.process(&[&syn, &dns, &other], 1, Dir::In, 0, &mut v);
    assert!(v.iter().all(|v| *v == Verdict::Drop(xpf_wire::Reason::Match)));
    let answers: Vec<(u8, Vec<u8>)> = w.batch_mut().returns.drain(..).collect();
    assert_eq!(answers.len(), 3);
    let pd = |f: &[u8]| {
        let mut p = PDesc::default();
        xpf_wire::parse_ether(f, &mut p).unwrap();
        p
    };
    let rst = pd(&answers[0].1);
    assert_eq!((answers[0].0, rst.tcp_flags, rst.tcp_ack, rst.sport), (0, tcp::RST | tcp::ACK, 78, 23));
    let (u, n) = (pd(&answers[1].1), pd(&answers[2].1));
    assert_eq!((u.proto, u.icmp_type, u.icmp_code), (1, 3, 3), "port unreachable");
    assert_eq!((n.icmp_type, n.icmp_code), (3, 0), "return-icmp (net-unr)");
    assert_eq!(w.stats.returned, 3);
}

#[test]
fn probability_passes_about_its_share() {
    use rand_core_for_tests::next;
    let r = rs("block all\npass in proto udp probability 25%\n");
    assert!(r.wants_random());
    let p = pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 1, 2, 0);
    let mut x = 0x1234_5678u32;
    let passed = (0..20_000)
        .filter(|_| {
            r.evaluate_in(&p, &Context { rnd: next(&mut x), ..Context::new(1, Dir::In) }).action == Action::Pass
        })
        .count();
    assert!((4_500..5_500).contains(&passed), "25% of 20,000: {passed}");
    assert!(!rs("pass all\n").wants_random());
}

mod rand_core_for_tests {
    /// xorshift32: the test's stand-in for the worker's ChaCha20 draws.
    pub fn next(x: &mut u32) -> u32 {
        *x ^= *x << 13;
        *x ^= *x >> 17;
        *x ^= *x << 5;
        *x
    }
}

/// A SYN with DF, TTL 3, MSS 1460 (and a TCP checksum that verifies).
fn syn_with_mss(flags: u8) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 24];
    f[12] = 8;
    xpf_wire::ipv4::emit_header(&mut f[14..], [10, 0, 0, 1], [8, 8, 8, 8], 6, 44, 3, 7);
    f[20] = 0x40; // DF
    f[24..26].fill(0);
    let c = xpf_wire::checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    xpf_wire::tcp::emit_header(&mut f[34..], 40000, 80, 1000, if flags & tcp::ACK != 0 { 1 } else { 0 }, flags, 1024);
    f[46] = 6 << 4; // 24-byte header: MSS option
    f[54..58].copy_from_slice(&[2, 4, 0x05, 0xb4]);
    let ck = !xpf_wire::checksum::fold(xpf_wire::checksum::sum(
        &f[34..],
        xpf_wire::checksum::pseudo_v4([10, 0, 0, 1], [8, 8, 8, 8], 6, 24),
    ));
    f[50..52].copy_from_slice(&ck.to_be_bytes());
    f
}

/// `frame` filtered `in` as a first packet, which must pass with the rules' scrub actions:
/// the frame those actions make, and its descriptor.
fn first_scrubbed(w: &mut Worker<Ruleset>, frame: &[u8], what: &str) -> (Vec<u8>, PDesc) {
    let mut v = [Verdict::Pass];
    w.process(&[frame], 1, Dir::In, 0, &mut v);
    assert_eq!((v[0], w.batch().scrubbed), (Verdict::Pass, 1), "{what}");
    let mut f = frame.to_vec();
    assert!(xpf_engine::proto::apply_scrub(&mut f, &w.batch().scrubs[0]));
    let mut pd = PDesc::default();
    xpf_wire::parse_ether(&f, &mut pd).unwrap();
    (f, pd)
}

#[test]
fn scrub_rewrites_as_pf_scrub_does() {
    let mut w =
        worker(rs("match in scrub (max-mss 1300, no-df, min-ttl 100)\npass in proto tcp scrub (set-tos 0x10)\n"));
    let syn = syn_with_mss(tcp::SYN);
    let (f, pd) = first_scrubbed(&mut w, &syn, "the rules' actions for the first packet");
    assert_eq!((pd.ttl, pd.tos, f[20] & 0x40), (100, 0x10, 0), "min-ttl, set-tos (match and pass add up), no-df");
    assert_eq!(&f[54..58], &[2, 4, 0x05, 0x14], "MSS 1460 lowered to 1300");
    assert_eq!(xpf_wire::checksum::checksum(&f[14..34]), 0, "IP checksum");
    let tcp_sum = xpf_wire::checksum::fold(xpf_wire::checksum::sum(
        &f[34..],
        xpf_wire::checksum::pseudo_v4([10, 0, 0, 1], [8, 8, 8, 8], 6, 24),
    ));
    assert_eq!(tcp_sum, 0xffff, "TCP checksum");
    // A later packet of the state gets the same actions from the state.
    let ack = syn_with_mss(tcp::ACK);
    let mut v = [Verdict::Pass];
    w.process(&[&ack], 1, Dir::In, 1, &mut v);
    assert_eq!(w.batch().scrubbed, 1);
    assert_eq!(
        (w.batch().scrubs[0].min_ttl, w.batch().scrubs[0].max_mss, w.batch().scrubs[0].set_tos),
        (100, 1300, Some(0x10))
    );
    // Without scrub rules nothing is marked.
    let mut plain = worker(rs("pass in proto tcp\n"));
    plain.process(&[&syn], 1, Dir::In, 0, &mut v);
    assert_eq!(plain.batch().scrubbed, 0);
}

/// `set tos` (pfctl's PFSTATE_SETTOS, what `scrub (set-tos)` was) rewrites the TOS of every
/// packet of the state the rule makes, both ways, its ECN bits kept; on a `match` rule it
/// reaches the state the deciding rule makes; a name (`lowdelay`) is its value.
#[test]
fn set_tos_sets_the_tos_of_every_packet_of_the_state() {
    for conf in ["pass in proto udp set tos 0x10\n", "match in set tos lowdelay\npass in proto udp\n"] {
        let mut w = worker(rs(conf));
        let mut out = udp([10, 0, 0, 1], [8, 8, 8, 8], 5000, 53);
        out[15] = 0x03; // ECN CE
        out[24..26].fill(0);
        let c = xpf_wire::checksum::checksum(&out[14..34]);
        out[24..26].copy_from_slice(&c.to_be_bytes());
        let (f, pd) = first_scrubbed(&mut w, &out, conf);
        assert_eq!(pd.tos, 0x13, "{conf}: the TOS set, its ECN bits kept");
        assert_eq!(xpf_wire::checksum::checksum(&f[14..34]), 0, "{conf}: IP checksum");
        // The state's packets the other way get it too.
        let back = udp([8, 8, 8, 8], [10, 0, 0, 1], 53, 5000);
        let mut v = [Verdict::Pass];
        w.process(&[&back], 1, Dir::Out, 1, &mut v);
        assert_eq!((v[0], w.batch().scrubbed, w.batch().scrubs[0].set_tos), (Verdict::Pass, 1, Some(0x10)), "{conf}");
    }
    // Without it nothing is marked.
    let mut plain = worker(rs("pass in proto udp\n"));
    let mut v = [Verdict::Pass];
    plain.process(&[&udp([10, 0, 0, 1], [8, 8, 8, 8], 5000, 53)], 1, Dir::In, 0, &mut v);
    assert_eq!(plain.batch().scrubbed, 0);
}

/// FreeBSD's scrub rules act on every packet they select, a state's or not: the first that
/// matches gives its options (a plain one before a later one with options gives none), in
/// the direction and on the interface it names, applied before the state's own.
#[test]
fn scrub_rules_act_on_every_packet_they_select_first_match() {
    let conf = "scrub in on em1 all fragment reassemble\nscrub in all no-df min-ttl 100 max-mss 1400\n\
                scrub out all set-tos 0x10\nmatch in scrub (max-mss 1300, min-ttl 50)\npass all\n";
    let mut w = worker(rs(conf));
    let syn = syn_with_mss(tcp::SYN);
    let mut v = [Verdict::Pass];
    let applied = |w: &Worker<Ruleset>| {
        let mut f = syn.clone();
        assert!(xpf_engine::proto::apply_scrub(&mut f, &w.batch().scrubs[0]));
        let pd = desc(&f);
        assert_eq!(xpf_wire::checksum::checksum(&f[14..34]), 0, "IP checksum");
        (pd.ttl, pd.tos, f[20] & 0x40, u16::from_be_bytes([f[56], f[57]]))
    };
    w.process(&[&syn], 1, Dir::In, 0, &mut v);
    assert_eq!((v[0], w.batch().scrubbed), (Verdict::Pass, 1));
    // The scrub rule's min-ttl 100 stands over the match rule's 50, the match rule's lower
    // MSS over the scrub rule's.
    assert_eq!(applied(&w), (100, 0, 0, 1300), "in on em0: the second scrub rule, then the state's");
    // The state's later packets get the scrub rule's options too.
    let ack = syn_with_mss(tcp::ACK);
    w.process(&[&ack], 1, Dir::In, 1, &mut v);
    assert_eq!(w.batch().scrubbed, 1);
    assert!(w.batch().scrubs[0].no_df && w.batch().scrubs[0].min_ttl == 100);
    // In on em1 the plain scrub rule matches first: only the match rule's options.
    let mut w = worker(rs(conf));
    w.process(&[&syn], 2, Dir::In, 0, &mut v);
    assert_eq!(applied(&w), (50, 0, 0x40, 1300), "in on em1: the plain rule first, DF kept");
    // Going out, the third.
    let mut w = worker(rs(conf));
    w.process(&[&syn], 1, Dir::Out, 0, &mut v);
    assert_eq!(applied(&w), (3, 0x10, 0x40, 1460), "out: set-tos only");
    // Scrub rules without options mark nothing.
    let mut plain = worker(rs("scrub in all\npass all\n"));
    plain.process(&[&syn], 1, Dir::In, 0, &mut v);
    assert_eq!(plain.batch().scrubbed, 0);
    // A blocked packet is left alone.
    let mut blocked = worker(rs("scrub in all no-df\nblock all\n"));
    blocked.process(&[&syn], 1, Dir::In, 0, &mut v);
    assert!(matches!(v[0], Verdict::Drop(_)) && blocked.batch().scrubbed == 0, "{:?}", v[0]);
}

/// A TCP segment with a valid checksum (an MSS option when given, `len` bytes of payload).
#[allow(clippy::too_many_arguments)]
fn tcp_frame(
    src: [u8; 4],
    dst: [u8; 4],
    sp: u16,
    dp: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    len: usize,
    mss: Option<u16>,
) -> Vec<u8> {
    let th = if mss.is_some() { 24 } else { 20 };
    let mut f = vec![0u8; 14 + 20 + th + len];
    f[12] = 8;
    xpf_wire::ipv4::emit_header(&mut f[14..], src, dst, 6, (20 + th + len) as u16, 64, 1);
    xpf_wire::tcp::emit_header(&mut f[34..], sp, dp, seq, ack, flags, 8192);
    if let Some(m) = mss {
        f[46] = 6 << 4;
        f[54..58].copy_from_slice(&[2, 4, (m >> 8) as u8, m as u8]);
    }
    let c = !xpf_wire::checksum::fold(xpf_wire::checksum::sum(
        &f[34..],
        xpf_wire::checksum::pseudo_v4(src, dst, 6, (th + len) as u16),
    ));
    f[50..52].copy_from_slice(&c.to_be_bytes());
    f
}

fn desc(f: &[u8]) -> PDesc {
    let mut p = PDesc::default();
    xpf_wire::parse_ether(f, &mut p).unwrap();
    p
}

#[test]
fn synproxy_on_an_outbound_rule_keeps_state_as_pf_does_and_says_so() {
    // pf proxies inbound connections only; pfctl warns of an outbound `synproxy state` and the
    // rule keeps state as `keep state` would.
    let text = "block all\npass out on em1 proto tcp to port 80 synproxy state\n";
    let p = xpf_conf::parse::parse(text, "t.conf", &[]);
    let (refused, warnings) = xpf_conf::support::refusals(&p);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(warnings, ["t.conf:2: warning: synproxy used for inbound rules only, ignored for outbound"]);
    let (cl, sv) = ([10, 0, 1, 2], [10, 0, 2, 2]);
    let mut w = worker(rs(text));
    let mut v = [Verdict::Pass];
    w.process(&[&tcp_frame(cl, sv, 4000, 80, 1000, 0, tcp::SYN, 0, Some(1460))], 2, Dir::Out, 0, &mut v);
    assert_eq!(v[0], Verdict::Pass, "the SYN goes on to the server");
    assert_eq!((w.batch_mut().returns.drain(..).count(), w.states()), (0, 1), "no SYN|ACK from the filter; a state");
    w.process(&[&tcp_frame(sv, cl, 80, 4000, 5000, 1001, tcp::SYN | tcp::ACK, 0, Some(1460))], 2, Dir::In, 0, &mut v);
    assert_eq!(v[0], Verdict::Pass, "the server's answer by the state");
}

#[test]
fn synproxy_completes_the_handshake_then_splices_the_sequence_spaces() {
    let (cl, sv) = ([10, 0, 1, 2], [10, 0, 2, 2]);
    let mut w =
        worker(rs("block all\npass in on em0 proto tcp to port 80 synproxy state\npass out on em1 proto tcp\n"));
    let mut v = [Verdict::Pass];
    // 1. The client's SYN: answered by the filter, dropped.
    w.process(&[&tcp_frame(cl, sv, 4000, 80, 1000, 0, tcp::SYN, 0, Some(1460))], 1, Dir::In, 0, &mut v);
    assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Synproxy));
    let synack: Vec<_> = w.batch_mut().returns.drain(..).collect();
    let sa = desc(&synack[0].1);
    assert_eq!((sa.src.v4_bytes(), sa.sport, sa.tcp_flags, sa.tcp_ack), (sv, 80, tcp::SYN | tcp::ACK, 1001));
    assert_eq!(xpf_engine::reply::tcp_mss(&synack[0].1, &sa), Some(1460));
    let isn_fw = sa.tcp_seq;
    assert_eq!(w.batch_mut().substitutes.drain(..).count(), 0, "nothing reaches the server yet");
    // The SYNs made no state (the SYN|ACK's number is a cookie): a flood fills nothing. A
    // bogus ACK is dropped (no state, and no rule passes a lone ACK).
    w.process(&[&tcp_frame([6, 6, 6, 6], sv, 1, 80, 77, 0, tcp::SYN, 0, None)], 1, Dir::In, 0, &mut v);
    assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Synproxy));
    assert_eq!(w.states(), 0);
    w.batch_mut().returns.drain(..).for_each(drop);
    w.process(&[&tcp_frame(cl, sv, 4000, 80, 1001, isn_fw.wrapping_add(9), tcp::ACK, 0, None)], 1, Dir::In, 0, &mut v);
    assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Match), "an ACK of another number");
    assert_eq!(w.states(), 0);
    // 2. The client's ACK goes on as the SYN to the server, through the out rules.
    w.process(&[&tcp_frame(cl, sv, 4000, 80, 1001, isn_fw.wrapping_add(1), tcp::ACK, 0, None)], 1, Dir::In, 1, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    let syn: Vec<_> = w.batch_mut().substitutes.drain(..).collect();
    let s = desc(&syn[0].1);
    assert_eq!((s.src.v4_bytes(), s.dst.v4_bytes(), s.dport, s.tcp_flags), (cl, sv, 80, tcp::SYN));
    assert_eq!(xpf_engine::reply::tcp_mss(&syn[0].1, &s), Some(1460));
    let isn_to_server = s.tcp_seq;
    w.process(&[&syn[0].1], 2, Dir::Out, 1, &mut v);
    assert_eq!(v[0], Verdict::Pass, "the SYN passes out and makes the out state");
    // 3. The server's SYN|ACK: an ACK back to the server, the client gets an ACK.
    let srv_synack =
        tcp_frame(sv, cl, 80, 4000, 5000, isn_to_server.wrapping_add(1), tcp::SYN | tcp::ACK, 0, Some(1400));
    w.process(&[&srv_synack], 2, Dir::In, 1, &mut v);
    assert_eq!(v[0], Verdict::Pass, "by the out state");
    w.process(&[&srv_synack], 1, Dir::Out, 1, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    let to_server: Vec<_> = w.batch_mut().returns.drain(..).collect();
    let a = desc(&to_server[0].1);
    assert_eq!(
        (a.src.v4_bytes(), a.dst.v4_bytes(), a.tcp_flags, a.tcp_seq, a.tcp_ack),
        (cl, sv, tcp::ACK, isn_to_server.wrapping_add(1), 5001)
    );
    let to_client: Vec<_> = w.batch_mut().substitutes.drain(..).collect();
    let c = desc(&to_client[0].1);
    assert_eq!(
        (c.src.v4_bytes(), c.dst.v4_bytes(), c.tcp_flags, c.tcp_seq, c.tcp_ack),
        (sv, cl, tcp::ACK, isn_fw.wrapping_add(1), 1001)
    );
    // 4. Data both ways, each side's numbers translated into the other's.
    let data = tcp_frame(cl, sv, 4000, 80, 1001, isn_fw.wrapping_add(1), tcp::ACK | tcp::PSH, 10, None);
    w.process(&[&data], 1, Dir::In, 2, &mut v);
    assert_eq!((v[0], w.batch().patched), (Verdict::Pass, 1));
    let mut d = data.clone();
    let (add, subtract) = w.batch().patches[0];
    xpf_engine::proto::apply_modulation(&mut d, add, subtract);
    let dp = desc(&d);
    assert_eq!((dp.tcp_seq, dp.tcp_ack), (isn_to_server.wrapping_add(1), 5001), "in the server's numbering");
    w.process(&[&d], 2, Dir::Out, 2, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    let reply = tcp_frame(sv, cl, 80, 4000, 5001, isn_to_server.wrapping_add(11), tcp::ACK | tcp::PSH, 5, None);
    w.process(&[&reply], 2, Dir::In, 2, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    w.process(&[&reply], 1, Dir::Out, 2, &mut v);
    assert_eq!((v[0], w.batch().patched), (Verdict::Pass, 1));
    let mut r = reply.clone();
    let (add, subtract) = w.batch().patches[0];
    xpf_engine::proto::apply_modulation(&mut r, add, subtract);
    let rp = desc(&r);
    assert_eq!((rp.tcp_seq, rp.tcp_ack), (isn_fw.wrapping_add(1), 1011), "in the client's numbering");
    assert!(w.stats.proxied >= 5);
}

/// `set syncookies always`: a SYN the rules pass makes no state; the filter answers it with
/// a cookie. A flood fills nothing; a blocked port gets no answer; a forged ACK makes
/// nothing; the client's genuine ACK makes the state and goes on as the SYN to the server,
/// and the handshake ends as synproxy's does. `never` keeps states as always.
#[test]
fn syncookies_answer_a_syn_without_state_and_the_ack_makes_it() {
    let text = "set syncookies always\nblock all\npass in on em0 proto tcp to port 80\npass out on em1 proto tcp\n";
    let p = parse(text, "t", &[]);
    assert_eq!(p.syncookies, Some(xpf_engine::syncookie::Mode::Always));
    let mut w = worker(Ruleset::compile(&p, &ifindex).unwrap());
    w.set_syncookies(p.syncookies.unwrap(), Some([9; 32]));
    let (cl, sv) = ([10, 0, 1, 2], [10, 0, 2, 2]);
    let mut v = [Verdict::Pass];
    w.process(&[&tcp_frame(cl, sv, 4000, 80, 1000, 0, tcp::SYN, 0, Some(1400))], 1, Dir::In, 100, &mut v);
    assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Synproxy));
    assert_eq!(w.states(), 0, "no state for a SYN");
    let synack: Vec<_> = w.batch_mut().returns.drain(..).collect();
    let sa = desc(&synack[0].1);
    assert_eq!((sa.src.v4_bytes(), sa.dst.v4_bytes(), sa.tcp_flags, sa.tcp_ack), (sv, cl, tcp::SYN | tcp::ACK, 1001));
    assert_eq!(xpf_engine::reply::tcp_mss(&synack[0].1, &sa), Some(1400));
    let cookie = sa.tcp_seq;
    // A flood of SYNs from 200 sources (the limit is 100): no state, each answered.
    let mut answered = 0;
    for i in 0..200u32 {
        let src = [172, 16, (i >> 8) as u8, i as u8];
        let b = w.process(&[&tcp_frame(src, sv, 1024, 80, i, 0, tcp::SYN, 0, None)], 1, Dir::In, 100, &mut v);
        answered += b.returns.len();
        assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Synproxy));
    }
    assert_eq!((w.states(), answered), (0, 200));
    // A port the rules block: no answer.
    w.process(&[&tcp_frame(cl, sv, 4001, 22, 1, 0, tcp::SYN, 0, None)], 1, Dir::In, 100, &mut v);
    assert_eq!((v[0], w.batch_mut().returns.drain(..).count()), (Verdict::Drop(xpf_wire::Reason::Match), 0));
    // Forged ACKs: another number, another port. Nothing made, nothing sent on.
    for f in [
        tcp_frame(cl, sv, 4000, 80, 1001, cookie.wrapping_add(2), tcp::ACK, 0, None),
        tcp_frame(cl, sv, 4002, 80, 1001, cookie.wrapping_add(1), tcp::ACK, 0, None),
    ] {
        w.process(&[&f], 1, Dir::In, 101, &mut v);
        assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Match));
    }
    assert_eq!((w.states(), w.batch_mut().substitutes.drain(..).count()), (0, 0));
    // The genuine ACK, an epoch later: the state, and the SYN to the server in its place.
    let now = 100 + xpf_engine::syncookie::EPOCH;
    w.process(
        &[&tcp_frame(cl, sv, 4000, 80, 1001, cookie.wrapping_add(1), tcp::ACK, 0, None)],
        1,
        Dir::In,
        now,
        &mut v,
    );
    assert_eq!(v[0], Verdict::Pass);
    assert_eq!((w.states(), w.halfopen()), (1, 1));
    let syn: Vec<_> = w.batch_mut().substitutes.drain(..).collect();
    let s = desc(&syn[0].1);
    assert_eq!((s.src.v4_bytes(), s.dst.v4_bytes(), s.dport, s.tcp_flags), (cl, sv, 80, tcp::SYN));
    assert_eq!(xpf_engine::reply::tcp_mss(&syn[0].1, &s), Some(1400));
    w.process(&[&syn[0].1], 2, Dir::Out, now, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    // The server's SYN|ACK: an ACK to the server, and the client's view completed.
    let srv = tcp_frame(sv, cl, 80, 4000, 5000, s.tcp_seq.wrapping_add(1), tcp::SYN | tcp::ACK, 0, Some(1460));
    w.process(&[&srv], 2, Dir::In, now, &mut v);
    w.process(&[&srv], 1, Dir::Out, now, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    assert_eq!(w.batch_mut().returns.drain(..).count(), 1);
    let c = desc(&w.batch_mut().substitutes.drain(..).next().unwrap().1);
    assert_eq!((c.tcp_flags, c.tcp_seq, c.tcp_ack), (tcp::ACK, cookie.wrapping_add(1), 1001));
    // Data from the client establishes the out state too: nothing half-open is left.
    let data = tcp_frame(cl, sv, 4000, 80, 1001, cookie.wrapping_add(1), tcp::ACK | tcp::PSH, 10, None);
    w.process(&[&data], 1, Dir::In, now, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    let mut d = data.clone();
    xpf_engine::proto::apply_modulation(&mut d, w.batch().patches[0].0, w.batch().patches[0].1);
    w.process(&[&d], 2, Dir::Out, now, &mut v);
    assert_eq!((v[0], w.states(), w.halfopen()), (Verdict::Pass, 2, 0));
    let (_, on, n) = w.syncookies();
    assert!(on);
    assert_eq!((n.sent, n.valid, n.invalid), (201, 1, 2));
    // `never`: the SYN makes its state.
    w.set_syncookies(xpf_engine::syncookie::Mode::Never, None);
    w.process(&[&tcp_frame(cl, sv, 4005, 80, 1, 0, tcp::SYN, 0, None)], 1, Dir::In, now, &mut v);
    assert_eq!((v[0], w.states(), w.halfopen()), (Verdict::Pass, 3, 1));
}

/// A TCP segment over IPv6 with a valid checksum (no options, no payload).
fn tcp6_frame(src: [u8; 16], dst: [u8; 16], sp: u16, dp: u16, seq: u32, ack: u32, flags: u8) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 40 + 20];
    f[12..14].copy_from_slice(&[0x86, 0xdd]);
    xpf_wire::ipv6::emit_header(&mut f[14..], &src, &dst, 6, 20, 64);
    xpf_wire::tcp::emit_header(&mut f[54..], sp, dp, seq, ack, flags, 8192);
    let c =
        !xpf_wire::checksum::fold(xpf_wire::checksum::sum(&f[54..], xpf_wire::checksum::pseudo_v6(&src, &dst, 6, 20)));
    f[70..72].copy_from_slice(&c.to_be_bytes());
    f
}

/// Syncookies over IPv6: the SYN|ACK is an IPv6 segment back to the client, and the ACK that
/// proves its cookie makes the state and goes on as the SYN to the server.
#[test]
fn syncookies_work_over_ipv6() {
    let p = parse("set syncookies always\nblock all\npass in on em0 inet6 proto tcp to port 443\n", "t", &[]);
    let mut w = worker(Ruleset::compile(&p, &ifindex).unwrap());
    w.set_syncookies(p.syncookies.unwrap(), None);
    let (cl, sv) =
        ([0xfd, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2], [0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    let mut v = [Verdict::Pass];
    w.process(&[&tcp6_frame(cl, sv, 5000, 443, 7, 0, tcp::SYN)], 1, Dir::In, 10, &mut v);
    assert_eq!((v[0], w.states()), (Verdict::Drop(xpf_wire::Reason::Synproxy), 0));
    let sa: Vec<_> = w.batch_mut().returns.drain(..).collect();
    let d = desc(&sa[0].1);
    assert_eq!(
        (d.af, d.src.0, d.dst.0, d.tcp_flags, d.tcp_ack),
        (xpf_wire::pdesc::AF_INET6, sv, cl, tcp::SYN | tcp::ACK, 8)
    );
    assert_eq!(xpf_engine::reply::tcp_mss(&sa[0].1, &d), Some(1200), "none offered: the largest under IPv6's 1,220");
    w.process(&[&tcp6_frame(cl, sv, 5000, 443, 8, d.tcp_seq.wrapping_add(1), tcp::ACK)], 1, Dir::In, 11, &mut v);
    assert_eq!((v[0], w.states()), (Verdict::Pass, 1));
    let syn = desc(&w.batch_mut().substitutes.drain(..).next().unwrap().1);
    assert_eq!((syn.af, syn.dst.0, syn.tcp_flags), (xpf_wire::pdesc::AF_INET6, sv, tcp::SYN));
}

/// `set syncookies adaptive (start 10%, end 5%)` with a limit of 100 states: SYNs make
/// states until 10 are half-open, then get cookies; once fewer than 5 are half-open, states
/// again.
#[test]
fn syncookies_adaptive_turn_on_at_the_half_open_watermark() {
    let p = parse("set syncookies adaptive (start 10%, end 5%)\npass in on em0 proto tcp\n", "t", &[]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let mut w = worker(Ruleset::compile(&p, &ifindex).unwrap());
    w.set_syncookies(p.syncookies.unwrap(), None);
    let mut v = [Verdict::Pass];
    let syn = |i: u32| tcp_frame([172, 16, 0, i as u8], [10, 0, 2, 2], 1024, 80, i, 0, tcp::SYN, 0, None);
    for i in 0..10 {
        w.process(&[&syn(i)], 1, Dir::In, 1, &mut v);
        assert_eq!(v[0], Verdict::Pass, "SYN {i}");
    }
    assert_eq!((w.states(), w.halfopen(), w.syncookies().1), (10, 10, false));
    w.process(&[&syn(10)], 1, Dir::In, 1, &mut v);
    assert_eq!((v[0], w.states(), w.syncookies().1), (Verdict::Drop(xpf_wire::Reason::Synproxy), 10, true));
    assert_eq!(w.batch_mut().returns.drain(..).count(), 1);
    // Six of the half-open states go (expired, killed): 4 left, below the end mark.
    let ids: Vec<u32> = w.t4.iter().map(|(i, _)| i).take(6).collect();
    for id in ids {
        w.t4.remove(id);
    }
    assert_eq!(w.halfopen(), 4);
    w.process(&[&syn(11)], 1, Dir::In, 1, &mut v);
    assert_eq!((v[0], w.states(), w.syncookies().1), (Verdict::Pass, 5, false));
    assert_eq!(w.syncookies().2.floods, 1);
}

/// A batch of SYNs is counted as pf counts them one packet at a time (each `in` state gets
/// its `out` state before the next SYN): the cookies come on at the mark, not past it.
#[test]
fn syncookies_adaptive_count_a_batch_as_pf_counts_each_packet() {
    let src = "set syncookies adaptive (start 10%, end 5%)\npass in on em0 proto tcp\npass out on em1 proto tcp\n";
    let p = parse(src, "t", &[]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let mut w = worker(Ruleset::compile(&p, &ifindex).unwrap());
    w.set_syncookies(p.syncookies.unwrap(), None);
    let frames: Vec<Vec<u8>> = (0..20u32)
        .map(|i| tcp_frame([172, 16, 0, i as u8], [10, 0, 2, 2], 1024, 80, i, 0, tcp::SYN, 0, None))
        .collect();
    let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
    let mut v = [Verdict::Pass; 20];
    w.process(&refs, 1, Dir::In, 1, &mut v);
    let passed: Vec<&[u8]> = refs.iter().zip(v).filter(|(_, v)| *v == Verdict::Pass).map(|(f, _)| *f).collect();
    assert_eq!(passed.len(), 5, "{v:?}");
    assert!(w.syncookies().1);
    let mut vo = [Verdict::Pass; 5];
    w.process(&passed, 2, Dir::Out, 1, &mut vo);
    assert_eq!(vo, [Verdict::Pass; 5]);
    assert_eq!((w.states(), w.halfopen()), (10, 10));
}

/// `no-route` and `urpf-failed` as pf_routable, against a snapshot of routes: em0 (1) leads
/// to 10.0.1.0/24, em1 (2) to 10.0.2.0/24, 192.0.2.0/24 is a blackhole; then a default route
/// out of em1 is added.
#[test]
fn no_route_and_urpf_failed_follow_the_routes() {
    use xpf_conf::routes::{Fib, Route};
    let r = |a: [u8; 4], len, reject, oifs: Vec<u32>| Route { addr: a.into(), len, reject, oifs };
    let fib = Fib {
        routes: vec![
            r([10, 0, 1, 0], 24, false, vec![1]),
            r([10, 0, 2, 0], 24, false, vec![2]),
            r([192, 0, 2, 0], 24, true, vec![]),
        ],
    };
    let p = parse("block in quick from urpf-failed\nblock in quick to no-route\npass in all\n", "t", &[]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(Ruleset::uses_routes(&p));
    let rs = Ruleset::compile_at(&p, &ifindex, &fib).unwrap();
    let v = |rs: &Ruleset, src, dst, ifidx| {
        rs.evaluate_in(&pkt(IPPROTO_UDP, src, dst, 1, 2, 0), &Context::new(ifidx, Dir::In)).action
    };
    assert_eq!(v(&rs, [10, 0, 1, 5], [10, 0, 2, 2], 1), Action::Pass, "route back out of em0, destination routable");
    assert_eq!(v(&rs, [10, 0, 1, 5], [10, 0, 2, 2], 2), Action::Block, "em0's network arriving on em1");
    assert_eq!(v(&rs, [10, 0, 1, 5], [8, 8, 8, 8], 1), Action::Block, "no route to 8.8.8.8");
    assert_eq!(v(&rs, [10, 0, 1, 5], [192, 0, 2, 1], 1), Action::Block, "a blackhole is no route");
    assert_eq!(v(&rs, [8, 8, 8, 8], [10, 0, 2, 2], 1), Action::Block, "no route back at all");
    // A default route out of em1: everything is routable, and sources from anywhere pass
    // uRPF on em1, not on em0.
    let mut with_default = fib.clone();
    with_default.routes.push(r([0, 0, 0, 0], 0, false, vec![2]));
    let rs = Ruleset::compile_at(&p, &ifindex, &with_default).unwrap();
    assert_eq!(v(&rs, [10, 0, 1, 5], [8, 8, 8, 8], 1), Action::Pass);
    assert_eq!(v(&rs, [8, 8, 8, 8], [10, 0, 2, 2], 2), Action::Pass);
    assert_eq!(v(&rs, [8, 8, 8, 8], [10, 0, 2, 2], 1), Action::Block);
    assert_eq!(v(&rs, [10, 0, 1, 5], [192, 0, 2, 1], 1), Action::Block, "the blackhole is longer than the default");
    // Negated: `to ! no-route` is what has a route.
    let n = parse("block in all\npass in to ! no-route\n", "t", &[]);
    let rs = Ruleset::compile_at(&n, &ifindex, &fib).unwrap();
    assert_eq!(
        (v(&rs, [1, 1, 1, 1], [10, 0, 2, 9], 1), v(&rs, [1, 1, 1, 1], [8, 8, 8, 8], 1)),
        (Action::Pass, Action::Block)
    );
    // A ruleset without them reads no routes.
    assert!(!Ruleset::uses_routes(&parse("pass in from self\n", "t", &[])));
}

/// `received-on` tests the interface the packet came in on, in either pass: a forwarded
/// packet's `out` pass sees its `in` interface; the host's own packets came in on none.
#[test]
fn received_on_matches_the_interface_the_packet_came_in_on() {
    let r = rs("block all\npass out on em1 received-on em0\n");
    let p = pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 1, 2, 0);
    let out = |rcvif| r.evaluate_in(&p, &Context { rcvif, ..Context::new(2, Dir::Out) }).action;
    assert_eq!(out(1), Action::Pass, "came in on em0");
    assert_eq!(out(2), Action::Block, "came in on em1");
    assert_eq!(out(0), Action::Block, "the host's own");
    let n = rs("block all\npass out on em1 !received-on em0\n");
    let out = |rcvif| n.evaluate_in(&p, &Context { rcvif, ..Context::new(2, Dir::Out) }).action;
    assert_eq!((out(1), out(2), out(0)), (Action::Block, Action::Pass, Action::Pass));
    // Through the worker: the `in` pass on em0 hands its interface to the `out` pass.
    let mut w = worker(rs("pass in all\nblock out all\npass out on em1 received-on em0\n"));
    let f = udp([10, 0, 0, 1], [8, 8, 8, 8], 5000, 53);
    let mut v = [Verdict::Pass; 1];
    let mut tags = [0u16; 1];
    w.process_tagged(&[&f], 2, Dir::Out, 1, 1, &mut v, &mut tags, 0);
    assert_eq!(v[0], Verdict::Pass);
    let g = udp([10, 0, 0, 2], [8, 8, 8, 8], 5000, 53);
    w.process_tagged(&[&g], 2, Dir::Out, 2, 1, &mut v, &mut tags, 0);
    assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Match), "received on em1");
    assert!(rs("pass out received-on em0\n").len() == 1);
    // received-on an interface the machine lacks: nothing came in on it (yet).
    let absent = rs("block all\npass out on em1 received-on nosuch0\n");
    assert_eq!(absent.evaluate_in(&p, &Context { rcvif: 1, ..Context::new(2, Dir::Out) }).action, Action::Block);
}

/// A group (`egress`, a link group) stands for its members wherever an interface is taken:
/// `on`, `! on`, `received-on`, `set skip on`, `set loginterface`; through the skip steps
/// (a rule on an interface before a rule on a group) and through the classifier alike.
#[test]
fn rules_on_an_interface_group_match_its_members() {
    let ifs = |n: &str| ["em0", "em1", "em2"].iter().position(|&i| i == n).map(|i| i as u16 + 1);
    let groups = |n: &str| match n {
        "egress" => Some(vec!["em0".to_string()]),
        "lan" => Some(vec!["em1".to_string(), "em2".to_string()]),
        "dmz" => Some(vec![]),
        _ => None,
    };
    let fib = xpf_conf::routes::Fib::default();
    let c = |src: &str| {
        let p = parse(src, "t", &[]);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        Ruleset::compile_with(&p, &ifs, &groups, &fib).unwrap()
    };
    let udp = pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 1, 53, 0);
    let tcp = pkt(IPPROTO_TCP, [1, 1, 1, 1], [2, 2, 2, 2], 1, 22, tcp::SYN);
    let on = |r: &Ruleset, p: &PDesc| [1, 2, 3].map(|i| action(r, p, i, Dir::In));
    let (pass, block) = (Action::Pass, Action::Block);
    assert_eq!(on(&c("block all\npass in on egress\n"), &udp), [pass, block, block]);
    assert_eq!(on(&c("block all\npass in on lan\n"), &udp), [block, pass, pass]);
    assert_eq!(on(&c("block all\npass in on ! lan\n"), &udp), [pass, block, block]);
    assert_eq!(on(&c("block all\npass in on dmz\n"), &udp), [block, block, block], "no member, no match");
    // The skip step of the rule on em1 must not pass over the rule on the group.
    assert_eq!(on(&c("block all\npass in on em1 proto tcp\npass in on egress proto tcp\n"), &tcp), [pass, pass, block]);
    // Through the classifier (from 64 rules).
    let mut big = String::from("block all\n");
    for p in 1000..1100 {
        big += &format!("pass in on em1 proto tcp to port {p}\n");
    }
    big += "pass in on lan proto tcp to port 22\npass in on egress proto udp\n";
    let b = c(&big);
    assert_eq!(on(&b, &tcp), [block, pass, pass]);
    assert_eq!(on(&b, &udp), [pass, block, block]);
    // received-on a group, in the `out` pass.
    let r = c("block all\npass out on egress received-on lan\n");
    let out = |rcvif| r.evaluate_in(&udp, &Context { rcvif, ..Context::new(1, Dir::Out) }).action;
    assert_eq!([out(1), out(2), out(3)], [block, pass, pass]);
    // set skip on, set loginterface.
    let s = c("set skip on lan\nset loginterface lan\nblock all\n");
    assert!(!s.skip(1) && s.skip(2) && s.skip(3));
    assert_eq!(s.loginterface, vec![2, 3]);
    // A name that is neither stands for no interface (yet).
    assert_eq!(on(&c("block all\npass in on nosuch\n"), &udp), [block, block, block]);
}

/// `once`: the rule decides one packet, then is gone; the state it made lives on. A
/// recompile of the same rules (a table changed) keeps it gone; a reload brings it back.
#[test]
fn a_once_rule_expires_at_its_first_match() {
    let text = "table <t> persist\nblock all\npass in proto udp to port 53 once\n";
    let r = rs(text);
    let a = pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 1000, 53, 0);
    let b = pkt(IPPROTO_UDP, [1, 1, 1, 1], [2, 2, 2, 2], 1001, 53, 0);
    assert!(!r.expired(1));
    assert_eq!(action(&r, &a, 1, Dir::In), Action::Pass);
    assert!(r.expired(1));
    assert_eq!(action(&r, &b, 1, Dir::In), Action::Block, "expired");
    let mut again = rs(text);
    again.keep_marks(&r);
    assert_eq!(action(&again, &b, 1, Dir::In), Action::Block, "a recompile keeps it expired");
    assert_eq!(action(&rs(text), &b, 1, Dir::In), Action::Pass, "a reload re-arms it");
    // The state made by the one match carries its flow on.
    let mut w = worker(rs(text));
    let f = udp([10, 0, 0, 1], [8, 8, 8, 8], 5000, 53);
    let g = udp([10, 0, 0, 1], [8, 8, 8, 8], 5001, 53);
    let mut v = [Verdict::Pass; 1];
    for _ in 0..3 {
        w.process(&[&f], 1, Dir::In, 1, &mut v);
        assert_eq!(v[0], Verdict::Pass);
    }
    w.process(&[&g], 1, Dir::In, 1, &mut v);
    assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Match), "a second flow finds the rule gone");
    // A `match` rule with `once` expires at its first match too.
    let m = rs("match in proto udp tag X once\npass in tagged X\nblock in proto udp to port 99\n");
    assert_eq!(action(&m, &a, 1, Dir::In), Action::Pass);
    assert_eq!(action(&m, &b, 1, Dir::In), Action::Pass, "pass all: untagged, no rule");
    assert!(m.expired(0));
}

/// `max-pkt-rate N/S`: past N packets in S seconds the rule stops matching (the next rule
/// or the default decides), and its states drop packets in their first direction (replies
/// are not counted), until the rate decays.
#[test]
fn max_pkt_rate_stops_the_rule_and_its_states_over_the_rate() {
    let r = rs("block all\npass in proto icmp max-pkt-rate 3/10 no state\n");
    let p = PDesc { proto: 1, flags: 0, ..pkt(1, [1, 1, 1, 1], [2, 2, 2, 2], 0, 0, 0) };
    let at = |now| Context { now, ..Context::new(1, Dir::In) };
    let passed = (0..5).filter(|_| r.evaluate_in(&p, &at(100)).action == Action::Pass).count();
    assert_eq!(passed, 3, "three in ten seconds");
    assert_eq!(r.evaluate_in(&p, &at(111)).action, Action::Pass, "decayed");
    // A state of the rule: its first direction counts, replies do not.
    let mut w = worker(rs("block all\npass in on em0 proto udp max-pkt-rate 3/10\n"));
    let f = udp([10, 0, 0, 1], [8, 8, 8, 8], 5000, 53);
    let reply = udp([8, 8, 8, 8], [10, 0, 0, 1], 53, 5000);
    let mut v = [Verdict::Pass; 1];
    let mut got = Vec::new();
    for _ in 0..5 {
        w.process(&[&f], 1, Dir::In, 50, &mut v);
        got.push(v[0]);
        w.process(&[&reply], 1, Dir::Out, 50, &mut v);
        assert_eq!(v[0], Verdict::Pass, "replies are not metered");
    }
    let rate = Verdict::Drop(xpf_wire::Reason::PktRate);
    assert_eq!(got, vec![Verdict::Pass, Verdict::Pass, Verdict::Pass, rate, rate]);
    w.process(&[&f], 1, Dir::In, 61, &mut v);
    assert_eq!(v[0], Verdict::Pass, "the rate decayed");
}

/// `-T delete` of many entries removes them all and prunes the prefix lengths once.
#[test]
fn table_delete_removes_entries_and_their_prefix_lengths() {
    use std::net::IpAddr;
    let mut t = xpf_conf::compile::Table::default();
    let a = |s: &str| s.parse::<IpAddr>().unwrap();
    t.insert(a("10.1.0.0"), 16, false);
    for i in 0..100u8 {
        t.insert(a(&format!("10.2.0.{i}")), 32, false);
    }
    let inside = Addr::v4([10, 1, 2, 3]);
    assert!(t.contains(&inside, AF_INET));
    let set = vec![(a("10.1.0.0"), 16), (a("10.2.0.5"), 32), (a("10.9.9.9"), 32)];
    assert_eq!(t.remove(set), 2, "the absent one is not counted");
    assert!(!t.contains(&inside, AF_INET));
    assert!(!t.contains(&Addr::v4([10, 2, 0, 5]), AF_INET));
    assert!(t.contains(&Addr::v4([10, 2, 0, 6]), AF_INET));
    assert_eq!(t.len(), 99);
}

#[test]
fn binat_to_compiles_to_a_static_nat_out_and_a_rdr_in() {
    let r = rs("match on em1 from 10.0.0.0/24 to any binat-to 192.0.2.0/24\npass\n");
    // Out: the source's host bits over the public network, port kept.
    let out = pkt(IPPROTO_UDP, [10, 0, 0, 7], [198, 51, 100, 1], 4000, 53, 0);
    let d = r.evaluate(&out, 2, Dir::Out);
    assert!(d.keep_state && d.nat != 0 && d.rdr == 0, "{d:?}");
    let p = r.pool(d.nat).unwrap();
    assert!(p.static_port);
    // In: to the public network, back to the inside one.
    let inb = pkt(IPPROTO_UDP, [198, 51, 100, 1], [192, 0, 2, 7], 53, 4000, 0);
    let d = r.evaluate(&inb, 2, Dir::In);
    assert!(d.rdr != 0 && d.nat == 0, "{d:?}");
    let mut w = worker(r);
    let f = udp([10, 0, 0, 7], [198, 51, 100, 1], 4000, 53);
    let mut v = [Verdict::Pass];
    w.process(&[&f[..]], 2, Dir::Out, 1, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    assert_eq!(w.batch().translated, 1);
    let rw = w.batch().rewrites[0];
    assert_eq!((rw.addr[0], rw.port[0]), (Addr::v4([192, 0, 2, 7]), 4000));
    // A connection from outside to 192.0.2.9 reaches 10.0.0.9.
    let f = udp([198, 51, 100, 1], [192, 0, 2, 9], 53, 5000);
    w.process(&[&f[..]], 2, Dir::In, 2, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    assert_eq!(w.batch().rewrites[0].addr[1], Addr::v4([10, 0, 0, 9]));
}

#[test]
fn nat_to_on_an_inbound_rule_gives_its_port_back_when_its_state_goes() {
    // OpenBSD takes `nat-to` on an `in` rule (the source translated as the packet comes in);
    // its state holds a port of the allocator as an outbound one does, and gives it back.
    let mut w = worker(rs("pass in on em0 nat-to 192.0.2.1 port 50001:50010\n"));
    let mut v = [Verdict::Pass];
    let f = udp([10, 0, 0, 7], [198, 51, 100, 1], 4000, 53);
    w.process(&[&f[..]], 1, Dir::In, 1, &mut v);
    assert_eq!((v[0], w.batch().translated), (Verdict::Pass, 1));
    let rw = w.batch().rewrites[0];
    assert_eq!(rw.addr[0], Addr::v4([192, 0, 2, 1]));
    assert!((50001..=50010).contains(&rw.port[0]), "{}", rw.port[0]);
    assert_eq!(w.nat.ports_used().0, 1);
    // The reply, to the translated source, goes back to the inside host.
    let back = udp([198, 51, 100, 1], [192, 0, 2, 1], 53, rw.port[0]);
    w.process(&[&back[..]], 1, Dir::Out, 2, &mut v);
    assert_eq!(
        (v[0], w.batch().rewrites[0].addr[1], w.batch().rewrites[0].port[1]),
        (Verdict::Pass, Addr::v4([10, 0, 0, 7]), 4000)
    );
    w.maintain(2 + 61, u32::MAX);
    assert_eq!((w.states(), w.nat.ports_used().0), (0, 0));
}

#[test]
fn a_source_hash_pool_keeps_its_key_through_recompiles_and_prints_it() {
    use xpf_engine::nat::Method;
    // No key given: one is drawn at the load, as pfctl draws it, and kept by every compile of
    // that load (xpfd compiles again when an address or a route changes: each source keeps its
    // address); the printed ruleset shows the key in use.
    let text = "pass out on em1 nat-to 192.0.2.0/28 source-hash\n";
    let p = parse(text, "test", &[]);
    let key = |p: &xpf_conf::Parsed| match Ruleset::compile(p, &ifindex).unwrap().pools[0].method {
        Method::SourceHash(k) => k,
        ref m => panic!("{m:?}"),
    };
    let k = key(&p);
    assert_eq!(key(&p), k, "a recompile keeps the key");
    assert_ne!(k, [0; 16]);
    let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
    assert!(xpf_conf::print::parsed(&p).contains(&format!("source-hash 0x{hex}")), "{}", xpf_conf::print::parsed(&p));
    // The next load draws another.
    assert_ne!(key(&parse(text, "test", &[])), k);
}

#[test]
fn nat_pools_round_robin_over_a_table_and_follow_its_changes() {
    let r = rs("table <pub> { 192.0.2.1 192.0.2.2 }\npass out on em1 nat-to <pub> round-robin\n");
    let mut w = worker(r.clone());
    let mut got = Vec::new();
    for k in 0..4u16 {
        let f = udp([10, 0, 0, 7], [198, 51, 100, 1], 4000 + k, 53);
        let mut v = [Verdict::Pass];
        w.process(&[&f[..]], 2, Dir::Out, 1, &mut v);
        assert_eq!(v[0], Verdict::Pass);
        got.push(w.batch().rewrites[0].addr[0]);
    }
    assert_eq!(got, [[192, 0, 2, 1], [192, 0, 2, 2], [192, 0, 2, 1], [192, 0, 2, 2]].map(Addr::v4));
    let mut t = xpf_conf::compile::Table::default();
    t.insert("192.0.2.9".parse().unwrap(), 32, false);
    let r2 = r.with_table("pub", t).unwrap();
    assert_eq!(r2.pools[0].nets.len(), 1);
    assert_eq!(r2.pools[0].nets[0].addr, Addr::v4([192, 0, 2, 9]));
}

/// FreeBSD's dialect: translation rules first (first match, `no nat` stops), the filter rules
/// then see the translated packet; `nat pass` skips them.
#[test]
fn freebsd_nat_rdr_binat_translate_before_the_filter_rules() {
    let r = rs("nat-anchor \"natearly/*\"
no nat on em1 from 10.0.0.9 to any
nat on em1 from 10.0.0.0/24 to any -> 192.0.2.1
nat pass on em1 from 10.0.1.0/24 to any -> 192.0.2.2
rdr on em1 proto udp from any to 192.0.2.1 port 53 -> 10.0.0.53 port 5353
binat on em1 from 10.0.0.7 to any -> 192.0.2.7
block all
pass out on em1 from 192.0.2.0/24 to any
pass in on em1 proto udp from any to 10.0.0.53 port 5353
pass in on em1 from any to 10.0.0.7
");
    let mut w = worker(r);
    let mut go = |f: Vec<u8>, dir: Dir, now: u32| {
        let mut v = [Verdict::Pass];
        w.process(&[&f[..]], 2, dir, now, &mut v);
        (v[0], (w.batch().translated & 1 != 0).then(|| w.batch().rewrites[0]))
    };
    // Out through nat: the filter passes it for its translated source.
    let (v, rw) = go(udp([10, 0, 0, 5], [198, 51, 100, 1], 4000, 53), Dir::Out, 1);
    assert_eq!(v, Verdict::Pass);
    let rw = rw.expect("translated");
    assert_eq!(rw.addr[0], Addr::v4([192, 0, 2, 1]));
    assert!((50001..=65535).contains(&rw.port[0]), "{}", rw.port[0]);
    // A MAP-E port set (6/8/0x34): every translated source port is one of the set's 252.
    let mut mape =
        worker_of(rs("nat on em1 from 10.0.9.0/24 to any -> 192.0.2.9 map-e-portset 6/8/0x34\npass all\n"), 1000);
    let mut seen = std::collections::HashSet::new();
    for k in 0..300u16 {
        let mut v = [Verdict::Pass];
        mape.process(&[&udp([10, 0, 9, 5], [198, 51, 100, 1], 10_000 + k, 53)[..]], 2, Dir::Out, 1, &mut v);
        if k < 252 {
            assert_eq!(v[0], Verdict::Pass);
            let p = mape.batch().rewrites[0].port[0];
            assert!(p >> 10 != 0 && (p >> 2) & 0xff == 0x34, "{p:#06x} not in the set");
            assert!(seen.insert(p), "{p} twice while others were free");
        } else {
            // Every port in use towards this one destination: refused, as pf's translate.
            assert_eq!(v[0], Verdict::Drop(xpf_wire::Reason::Translate), "flow {k}");
        }
    }
    // `no nat` ends the search: untranslated, the filter blocks it.
    let (v, rw) = go(udp([10, 0, 0, 9], [198, 51, 100, 1], 4000, 53), Dir::Out, 1);
    assert_eq!((v, rw), (Verdict::Drop(xpf_wire::Reason::Match), None));
    // binat comes before nat going out: 10.0.0.7 is 192.0.2.7, its port kept.
    let (v, rw) = go(udp([10, 0, 0, 7], [198, 51, 100, 1], 4000, 53), Dir::Out, 1);
    assert_eq!(v, Verdict::Pass);
    assert_eq!(rw.map(|r| (r.addr[0], r.port[0])), Some((Addr::v4([192, 0, 2, 7]), 4000)));
    // `nat pass`: no filter rule passes 192.0.2.2, the translation rule does.
    let (v, rw) = go(udp([10, 0, 1, 5], [198, 51, 100, 1], 4000, 53), Dir::Out, 1);
    assert_eq!(v, Verdict::Pass);
    assert_eq!(rw.map(|r| r.addr[0]), Some(Addr::v4([192, 0, 2, 2])));
    // In through rdr: the filter passes it for its translated destination and port.
    let (v, rw) = go(udp([198, 51, 100, 9], [192, 0, 2, 1], 3333, 53), Dir::In, 1);
    assert_eq!(v, Verdict::Pass);
    assert_eq!(rw.map(|r| (r.addr[1], r.port[1])), Some((Addr::v4([10, 0, 0, 53]), 5353)));
    // Another port of the public address: no rdr, blocked.
    let (v, _) = go(udp([198, 51, 100, 9], [192, 0, 2, 1], 3333, 54), Dir::In, 1);
    assert_eq!(v, Verdict::Drop(xpf_wire::Reason::Match));
    // In to the binat address: back to the inside host.
    let (v, rw) = go(udp([198, 51, 100, 9], [192, 0, 2, 7], 3333, 7000), Dir::In, 1);
    assert_eq!(v, Verdict::Pass);
    assert_eq!(rw.map(|r| (r.addr[1], r.port[1])), Some((Addr::v4([10, 0, 0, 7]), 7000)));
}

#[test]
fn freebsd_translation_rules_print_as_pfctl_prints_them() {
    let src = "nat-anchor \"natearly/*\"
no nat on em1 inet from 10.0.0.9 to any
nat pass log on em1 inet proto udp from 10.0.1.0/24 to any -> 192.0.2.2 port 1024:65535
rdr on em1 inet proto tcp from any to 192.0.2.1 port 80 -> 10.0.0.5 port 8080
binat on em1 from 10.0.0.7 to any -> 192.0.2.7
nat on em1 from 10.0.2.0/24 to any -> 192.0.2.3 round-robin map-e-portset 6/8/0x34
pass in all
";
    let p = parse(src, "test", &[]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let got = xpf_conf::print::parsed(&p);
    assert_eq!(
        got,
        "nat-anchor \"natearly/*\" all
no nat on em1 inet from 10.0.0.9 to any
nat pass log on em1 inet proto udp from 10.0.1.0/24 to any -> 192.0.2.2 port 1024:65535
rdr on em1 inet proto tcp from any to 192.0.2.1 port = 80 -> 10.0.0.5 port 8080
binat on em1 inet from 10.0.0.7 to any -> 192.0.2.7
nat on em1 inet from 10.0.2.0/24 to any -> 192.0.2.3 round-robin map-e-portset 6/8/52
pass in all flags S/SA
"
    );
    // What it prints loads back the same.
    assert_eq!(xpf_conf::print::parsed(&parse(&got, "test", &[])), got);
    for (bad, msg) in [
        ("no nat pass on em1 from any to any", "\"pass\" not valid with \"no\""),
        ("nat on em1 from any to any", "translation rule requires '-> address'"),
        ("no rdr on em1 from any to any -> 10.0.0.1", "translation rule with 'no' does not need '->'"),
        (
            "nat on em1 from any to any -> 192.0.2.1 map-e-portset 0/8/1",
            "map-e-portset 0/8/1: the offset and the psid length are at least 1 and at most 16 together",
        ),
        (
            "nat on em1 from any to any -> 192.0.2.1 map-e-portset 10/8/1",
            "map-e-portset 10/8/1: the offset and the psid length are at least 1 and at most 16 together",
        ),
        (
            "nat on em1 from any to any -> 192.0.2.1 map-e-portset 6/8/256",
            "map-e-portset 6/8/256: psid 256 does not fit in 8 bits",
        ),
        ("nat on em1 from any to any -> 192.0.2.1 map-e-portset 6/8", "map-e-portset 6/8: OFFSET/LEN/PSID"),
        (
            "nat on em1 from any to any -> 192.0.2.1 port 1024:65535 map-e-portset 6/8/1",
            "map-e-portset with a port range or static-port",
        ),
        ("rdr on em1 from any to any -> 192.0.2.1 map-e-portset 6/8/1", "syntax error"),
    ] {
        let p = parse(bad, "test", &[]);
        assert!(p.errors.iter().any(|e| e.msg == msg && e.line == 1), "{bad}: {:?}", p.errors);
    }
}

/// `log`: the deciding rule's frame is marked for pflog with the rule's number, the unit,
/// pf's action, reason and direction; a state's later packets are not (`log (all)` is not
/// built).
#[test]
fn log_all_logs_every_packet_of_the_state() {
    let r = rs(
        "block all\npass in log (all, to pflog2) proto udp to port 53\npass in log proto udp to port 54\npass out\n",
    );
    let mut w = worker(r);
    let mut v = [Verdict::Pass; 2];
    let all = udp([10, 0, 0, 7], [198, 51, 100, 1], 4000, 53);
    let first = udp([10, 0, 0, 7], [198, 51, 100, 1], 4000, 54);
    w.process(&[&all[..], &first[..]], 2, Dir::In, 1, &mut v);
    assert_eq!((v, w.batch().logged), ([Verdict::Pass; 2], 0b11));
    // Their next packets match their states: `log (all)` logs it (rule 1, pflog2), `log` not.
    for t in 2..5 {
        w.process(&[&all[..], &first[..]], 2, Dir::In, t, &mut v);
        assert_eq!((v, w.batch().logged), ([Verdict::Pass; 2], 0b01), "at {t}");
        let l = w.batch().logs[0];
        assert_eq!((l.rule, l.unit, l.action, l.dir), (1, 2, 0, 1));
    }
    // The reply too, through the same state.
    let reply = udp([198, 51, 100, 1], [10, 0, 0, 7], 53, 4000);
    w.process(&[&reply[..]], 2, Dir::Out, 5, &mut v[..1]);
    assert_eq!((v[0], w.batch().logged & 1), (Verdict::Pass, 1));
    assert_eq!(w.batch().logs[0].dir, 2);
}

#[test]
fn a_logging_rule_marks_its_frames_for_pflog() {
    let r = rs("block log all\npass in log (to pflog1) proto udp to port 53\npass out\n");
    let mut w = worker(r);
    let mut v = [Verdict::Pass; 2];
    let q = udp([10, 0, 0, 7], [198, 51, 100, 1], 4000, 53);
    let blocked = udp([10, 0, 0, 7], [198, 51, 100, 1], 4000, 54);
    w.process(&[&q[..], &blocked[..]], 2, Dir::In, 1, &mut v);
    assert_eq!(v, [Verdict::Pass, Verdict::Drop(xpf_wire::Reason::Match)]);
    assert_eq!(w.batch().logged, 0b11);
    let l = w.batch().logs;
    assert_eq!((l[0].rule, l[0].unit, l[0].action, l[0].reason, l[0].dir), (1, 1, 0, 0, 1));
    assert_eq!((l[1].rule, l[1].unit, l[1].action, l[1].reason, l[1].dir), (0, 0, 1, 0, 1));
    // The flow's next packet matches its state: no rule decides it, nothing is logged.
    w.process(&[&q[..]], 2, Dir::In, 1, &mut v[..1]);
    assert_eq!((v[0], w.batch().logged), (Verdict::Pass, 0));
    // A rule without `log` logs nothing.
    w.process(&[&q[..]], 3, Dir::Out, 1, &mut v[..1]);
    assert_eq!((v[0], w.batch().logged), (Verdict::Pass, 0));
}

/// A rule line for the classifier's property test: addresses of every shape the classifier
/// files (prefixes between its levels, hosts, ranges, tables, negations), exact ports and
/// ranges, interfaces, directions, tags, `match` and `quick`.
fn class_line() -> impl Strategy<Value = String> {
    let action = prop_oneof![3 => Just("pass"), 2 => Just("block"), 1 => Just("match")];
    let dir = prop_oneof![Just(""), Just(" in"), Just(" out")];
    let quick = prop_oneof![3 => Just(""), 1 => Just(" quick")];
    let on = prop_oneof![2 => Just(""), 1 => Just(" on em0"), 1 => Just(" on em1"), 1 => Just(" on ! em1")];
    let proto = prop_oneof![Just(""), Just(" proto tcp"), Just(" proto udp")];
    let src = prop_oneof![
        Just(" from any"),
        Just(" from 10/8"),
        Just(" from 10.1/16"),
        Just(" from 10.1.2/24"),
        Just(" from 10.1.2.0/28"),
        Just(" from 10.1.2.3"),
        Just(" from 10.1.2.2/31"),
        Just(" from ! 10.1/16"),
        Just(" from <t>"),
        Just(" from 10.1.2.1 - 10.1.2.5"),
    ];
    let dst = prop_oneof![
        Just(" to any"),
        Just(" to 20/8"),
        Just(" to 20.0.0/24"),
        Just(" to 20.0.0.5"),
        Just(" to 20.0.0.4/30"),
        Just(" to ! 20.0.0.1"),
        Just(" to 20.0.1.0/23"),
    ];
    let sport = prop_oneof![3 => Just(""), 1 => Just(" port 5"), 1 => Just(" port 100:200")];
    let dport = prop_oneof![2 => Just(""), 2 => Just(" port 5"), 1 => Just(" port 6"), 1 => Just(" port != 5"), 1 => Just(" port { 5 7 }")];
    let tag = prop_oneof![6 => Just(""), 2 => Just(" tag A"), 2 => Just(" tagged A"), 1 => Just(" probability 50%")];
    (action, dir, quick, on, proto, src, dst, sport, dport, tag).prop_map(|(a, d, q, o, p, s, t, sp, dp, g)| {
        let (sp, dp) = if p.is_empty() { ("", "") } else { (sp, dp) };
        format!("{a}{d}{q}{o}{p}{s}{sp}{t}{dp}{g}\n")
    })
}

/// Items of a ruleset: a rule, or an anchor (perhaps `quick`, perhaps with a nested one)
/// with a few rules in it.
fn class_item() -> impl Strategy<Value = String> {
    let head = prop_oneof![
        Just("anchor"),
        Just("anchor quick"),
        Just("anchor in on em0"),
        Just("anchor proto tcp to 20.0.0/24"),
        Just("anchor from 10.1/16"),
    ];
    prop_oneof![
        4 => class_line(),
        1 => (head.clone(), proptest::collection::vec(class_line(), 0..5), proptest::option::of((head, proptest::collection::vec(class_line(), 0..4))))
            .prop_map(|(h, body, inner)| {
                let inner = inner.map_or(String::new(), |(ih, ib)| format!("{ih} {{\n{}}}\n", ib.concat()));
                format!("{h} {{\n{}{inner}}}\n", body.concat())
            }),
    ]
}

/// A first packet for the classifier's tests: TCP or UDP, from one of the sources the rules
/// name (or none), to one of their destinations, ports among theirs, in or out, on em0 or
/// em1, with a tag (1: A, 2: unknown) and a random number.
type ClassPacket = (bool, u8, u8, u8, usize, usize, bool, u16, u16, u32);

fn class_packet() -> impl Strategy<Value = ClassPacket> {
    (any::<bool>(), 0u8..4, 0u8..8, 0u8..3, 0usize..6, 0usize..6, any::<bool>(), 1u16..3, 0u16..3, any::<u32>())
}

fn class_probe((tcp_, net, h, d, sp, dp, out, ifi, tg, rnd): ClassPacket) -> (PDesc, Context) {
    let ports = [5u16, 6, 7, 150, 250, 4];
    let s = [[10, 1, 2, h], [10, 1, 3, h], [10, 2, 0, h], [11, 0, 0, h]][net as usize];
    let dd = [[20, 0, 0, 5], [20, 0, 0, 1], [20, 0, 1, 9]][d as usize];
    let pd = pkt(if tcp_ { IPPROTO_TCP } else { IPPROTO_UDP }, s, dd, ports[sp], ports[dp], tcp::SYN);
    let dir = if out { Dir::Out } else { Dir::In };
    (pd, Context { tag: tg, rnd, ..Context::new(ifi, dir) })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    /// The classifier never changes a verdict: its candidates walked in order decide what
    /// the naive walk over every rule decides (deciding rule, tag, and the match rules'
    /// actions through the engine's decision).
    #[test]
    fn classifier_agrees_with_naive_evaluation(
        items in proptest::collection::vec(class_item(), 1..40),
        pkts in proptest::collection::vec(class_packet(), 1..40),
    ) {
        let src = format!("table <t> {{ 10.1.2/24 !10.1.2.4/30 }}\n{}", items.concat());
        let p = parse(&src, "t", &[]);
        prop_assume!(p.errors.is_empty());
        let walk = Ruleset::compile(&p, &ifindex).unwrap();
        let mut class = walk.clone();
        class.set_lookup(xpf_conf::compile::Lookup::Classify);
        for (pd, at) in pkts.into_iter().map(class_probe) {
            prop_assert_eq!(class.eval_with(&pd, &at), walk.eval_naive(&pd, &at), "{}", src);
            prop_assert_eq!(class.evaluate_in(&pd, &at), walk.evaluate_in(&pd, &at));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]
    /// The same with each ruleset written 3-6 times over: lookups find more candidates than
    /// the classifier copies and sorts, and the walk takes them merged from the lists.
    #[test]
    fn classifier_agrees_with_naive_evaluation_over_long_lists(
        items in proptest::collection::vec(class_item(), 20..40),
        times in 3usize..7,
        pkts in proptest::collection::vec(class_packet(), 1..20),
    ) {
        let src = format!("table <t> {{ 10.1.2/24 !10.1.2.4/30 }}\n{}", items.concat().repeat(times));
        let p = parse(&src, "t", &[]);
        prop_assume!(p.errors.is_empty());
        let walk = Ruleset::compile(&p, &ifindex).unwrap();
        let mut class = walk.clone();
        class.set_lookup(xpf_conf::compile::Lookup::Classify);
        for (pd, at) in pkts.into_iter().map(class_probe) {
            prop_assert_eq!(class.eval_with(&pd, &at), walk.eval_naive(&pd, &at), "{}", src);
            prop_assert_eq!(class.evaluate_in(&pd, &at), walk.evaluate_in(&pd, &at));
        }
    }
}

/// IPv6 through the classifier: prefixes at and between its levels, hosts, and rules for
/// either family beside them, against the naive walk.
#[test]
fn classifier_agrees_with_naive_evaluation_for_ipv6() {
    let mut text = String::from("block all\n");
    let nets = ["2001:db8::/32", "2001:db8:1::/48", "2001:db8:1:2::/64", "2001:db8:1:2::5", "2001:db8:1::/52", "any"];
    for (i, s) in nets.iter().enumerate() {
        for (j, d) in nets.iter().enumerate() {
            let q = if (i + j) % 5 == 0 { " quick" } else { "" };
            let a = if (i * 7 + j) % 3 == 0 { "block" } else { "pass" };
            text.push_str(&format!("{a} in{q} inet6 proto tcp from {s} to {d} port {}\n", 20 + (i + j) % 4));
            text.push_str(&format!("pass out inet6 from {s} to {d}\n"));
        }
    }
    text.push_str("block in proto tcp to port 22\npass proto udp\n");
    // Last, so that they decide when they match: prefixes between the classifier's levels.
    text.push_str("block in inet6 proto tcp from 2001:db8:1::/52 port 1000 to 2001:db8:1:2::/60\n");
    text.push_str("match out inet6 from 2001:db8:1:f00::/57 to 2001:db8:1:2::4/126 tag L\n");
    let walk = rs(&text);
    assert!(walk.len() >= xpf_conf::compile::CLASSIFY_FROM);
    let mut class = walk.clone();
    class.set_lookup(xpf_conf::compile::Lookup::Classify);
    let hosts: [[u8; 16]; 4] = [
        "2001:db8:1:2::5".parse::<std::net::Ipv6Addr>().unwrap().octets(),
        "2001:db8:1:2::6".parse::<std::net::Ipv6Addr>().unwrap().octets(),
        "2001:db8:1:f00::1".parse::<std::net::Ipv6Addr>().unwrap().octets(),
        "2001:db9::1".parse::<std::net::Ipv6Addr>().unwrap().octets(),
    ];
    let mut n = 0;
    for s in hosts {
        for d in hosts {
            for (proto, port) in [(IPPROTO_TCP, 20), (IPPROTO_TCP, 21), (IPPROTO_TCP, 22), (IPPROTO_UDP, 23)] {
                for dir in [Dir::In, Dir::Out] {
                    let pd = PDesc {
                        src: Addr(s),
                        dst: Addr(d),
                        af: xpf_wire::pdesc::AF_INET6,
                        ..pkt(proto, [0; 4], [0; 4], 1000, port, tcp::SYN)
                    };
                    let at = Context::new(1, dir);
                    assert_eq!(class.eval_with(&pd, &at), walk.eval_naive(&pd, &at), "{pd:?} {dir:?}");
                    n += (class.eval_with(&pd, &at).0.is_some()) as usize;
                }
            }
        }
    }
    assert!(n > 64, "most packets meet a rule: {n}");
}

/// `load anchor NAME from FILE`: the file's rules are the body of the anchor rules named NAME,
/// evaluated there; a load that no anchor rule takes, or a file that is not there, is an error
/// naming the line.
#[test]
fn load_anchor_puts_a_files_rules_in_the_named_anchor() {
    let dir = std::env::temp_dir().join(format!("xpf-load-anchor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("members.conf"),
        "pass in proto tcp to 20.0.0.5 port 8080\nblock in quick proto tcp to port 22\n",
    )
    .unwrap();
    let main = format!(
        "block all\npass in proto tcp to port 22\nanchor \"members\" in on em0\nload anchor \"members\" from \"{}\"\npass in proto udp\n",
        dir.join("members.conf").display()
    );
    let r = rs(&main);
    let web = pkt(IPPROTO_TCP, [1, 1, 1, 1], [20, 0, 0, 5], 999, 8080, tcp::SYN);
    let ssh = pkt(IPPROTO_TCP, [1, 1, 1, 1], [20, 0, 0, 5], 999, 22, tcp::SYN);
    assert_eq!(action(&r, &web, 1, Dir::In), Action::Pass, "the anchor's pass");
    assert_eq!(action(&r, &ssh, 1, Dir::In), Action::Block, "the anchor's quick block overrides the pass before it");
    // The anchor is for em0: on em1 its body is passed over.
    assert_eq!(action(&r, &web, 2, Dir::In), Action::Block);
    assert_eq!(action(&r, &ssh, 2, Dir::In), Action::Pass);
    let p = parse(&main, "main", &[]);
    let printed = xpf_conf::print::ruleset(&p.rules);
    assert!(printed.contains("anchor \"members\" in on em0 all {\n  pass in"), "{printed}");
    // Errors name the load line.
    let missing = parse("anchor \"m\"\nload anchor \"m\" from \"/nonexistent/m.conf\"\n", "main", &[]);
    assert_eq!(missing.errors.len(), 1);
    assert_eq!((missing.errors[0].line, missing.errors[0].msg.contains("cannot open")), (2, true));
    let nobody =
        parse(&format!("pass\nload anchor \"other\" from \"{}\"\n", dir.join("members.conf").display()), "main", &[]);
    assert!(nobody.errors.iter().any(|e| e.line == 2 && e.msg.contains("no anchor rule")), "{:?}", nobody.errors);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file that loads itself into its own anchor stops at the nesting bound with an error.
#[test]
fn load_anchor_cycle_is_an_error() {
    let f = std::env::temp_dir().join(format!("xpf-load-cycle-{}.conf", std::process::id()));
    std::fs::write(&f, format!("anchor \"a\"\nload anchor \"a\" from \"{}\"\n", f.display())).unwrap();
    let p = parse(&std::fs::read_to_string(&f).unwrap(), "main", &[]);
    std::fs::remove_file(&f).unwrap();
    assert!(p.errors.iter().any(|e| e.msg.contains("nesting too deep")), "{:?}", p.errors);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]
    /// Rules loaded into an anchor at run time decide as the same rules written inline there:
    /// the anchor's match, `quick` on it and in it, tags set before and tested after, match
    /// rules' actions, the rules after it; they replace the body the main ruleset gave it;
    /// the walk, the classifier and the naive walk agree over both.
    #[test]
    fn an_anchor_loaded_at_run_time_decides_as_its_rules_inline(
        before in proptest::collection::vec(class_item(), 0..12),
        head in prop_oneof![Just(""), Just(" quick"), Just(" in on em0"), Just(" proto tcp to 20.0.0/24"), Just(" quick from 10.1/16")],
        old in proptest::collection::vec(class_line(), 0..4),
        body in proptest::collection::vec(class_item(), 0..12),
        after in proptest::collection::vec(class_item(), 0..12),
        classify in any::<bool>(),
        pkts in proptest::collection::vec(class_packet(), 1..30),
    ) {
        let table = "table <t> { 10.1.2/24 !10.1.2.4/30 }\n";
        // A probability rule's draw is keyed by its number, which differs between the two.
        let unprob = |v: Vec<String>| v.concat().replace(" probability 50%", "");
        let (b, a, body, old) = (unprob(before), unprob(after), unprob(body), unprob(old));
        let inline = format!("{table}{b}anchor \"m\"{head} {{\n{body}}}\n{a}");
        let runtime = format!("{table}{b}anchor \"m\"{head} {{\n{old}}}\n{a}");
        let (pi, pr, pb) = (parse(&inline, "i", &[]), parse(&runtime, "r", &[]), parse(&body, "b", &[]));
        prop_assume!(pi.errors.is_empty() && pr.errors.is_empty() && pb.errors.is_empty());
        let first = 1u32 << 31;
        let want = Ruleset::compile(&pi, &ifindex).unwrap();
        let mut got = Ruleset::compile(&pr, &ifindex).unwrap().with_anchor("m", &pb, first, &ifindex).unwrap();
        if classify {
            got.set_lookup(xpf_conf::compile::Lookup::Classify);
        }
        // The deciding rule as printed: numbers differ (the loaded rules number apart).
        let text_i = |n: Option<usize>| n.map(|n| xpf_conf::print::rule(&pi.rules[n]));
        let text_r = |n: Option<usize>| n.map(|n| if n >= first as usize {
            xpf_conf::print::rule(&pb.rules[n - first as usize])
        } else {
            xpf_conf::print::rule(&pr.rules[n])
        });
        for (pd, at) in pkts.into_iter().map(class_probe) {
            let (wi, ti) = want.eval_naive(&pd, &at);
            let (wr, tr) = got.eval_with(&pd, &at);
            prop_assert_eq!(got.eval_naive(&pd, &at), (wr, tr));
            prop_assert_eq!((text_r(wr), tr), (text_i(wi), ti), "{}\n-a m:\n{}", runtime, body);
            let (di, dr) = (want.evaluate_in(&pd, &at), got.evaluate_in(&pd, &at));
            prop_assert_eq!(xpf_engine::Decision { rule: 0, ..dr }, xpf_engine::Decision { rule: 0, ..di });
        }
    }
}

/// Anchors loaded at run time: an anchor rule without a body evaluates what is loaded into
/// it; `P/*` evaluates every anchor loaded directly under P, in name order; an anchor removed
/// is empty again; what such an anchor cannot hold is refused at its line.
#[test]
fn anchors_loaded_at_run_time_by_name_and_by_wildcard() {
    let main = rs("block all\nanchor \"m\" in on em0\nanchor \"w/*\" in\n");
    let p = |s: &str| parse(s, "a", &[]);
    let first = 1u32 << 31;
    let port = |n: u16| pkt(IPPROTO_TCP, [1, 1, 1, 1], [20, 0, 0, 5], 999, n, tcp::SYN);
    assert_eq!(action(&main, &port(80), 1, Dir::In), Action::Block);
    let r = main.with_anchor("m", &p("pass in proto tcp to port 80\n"), first, &ifindex).unwrap();
    assert_eq!(action(&r, &port(80), 1, Dir::In), Action::Pass, "loaded into m, evaluated on em0");
    assert_eq!(action(&r, &port(80), 2, Dir::In), Action::Block, "m's anchor rule is for em0 only");
    assert_eq!(r.evaluate(&port(80), 1, Dir::In).rule, first, "the loaded rule decides, by its own number");
    // Under the wildcard, a before b: b's quick block decides over a's pass.
    let w = r
        .with_anchor("w/b", &p("block in quick proto tcp to port 80\n"), first + 1, &ifindex)
        .unwrap()
        .with_anchor("w/a", &p("pass in proto tcp to port 80\npass in proto tcp to port 81\n"), first + 2, &ifindex)
        .unwrap()
        .with_anchor("w/x/y", &p("pass in proto tcp to port 82\n"), first + 4, &ifindex)
        .unwrap();
    assert_eq!(action(&w, &port(80), 2, Dir::In), Action::Block);
    assert_eq!(action(&w, &port(81), 2, Dir::In), Action::Pass);
    assert_eq!(action(&w, &port(82), 2, Dir::In), Action::Block, "w/* takes w's children, not their children");
    assert!(w.anchor("w/a").unwrap().referenced && !w.anchor("w/x/y").unwrap().referenced);
    let w = w.without_anchor("w/b");
    assert_eq!(action(&w, &port(80), 2, Dir::In), Action::Pass, "w/b removed");
    assert!(w.anchor("w/b").is_none() && !w.anchor_has_body("m"));
    // Refused, at the line.
    for (text, line, says) in [
        ("pass\ntable <x> { 10.9.9.9 }\n", 2, "declare tables in the main ruleset"),
        ("pass in on em0 received-on em1\n", 1, "received-on"),
        ("pass in on egress\n", 1, "interface groups"),
        ("pass in on em7\n", 1, "interfaces not present"),
        ("pass proto tcp keep state (max 10)\n", 1, "state limits"),
        ("pass\nanchor \"x\"\n", 2, "inline"),
        ("pass out nat-to 192.0.2.1\n", 1, "translation"),
    ] {
        let e = main.with_anchor("m", &p(text), first, &ifindex).unwrap_err();
        assert!(e.line == line && e.msg.contains(says), "{text}: {}: {}", e.line, e.msg);
    }
    assert!(main.with_anchor("m/*", &p("pass\n"), first, &ifindex).is_err(), "a wildcard is not loaded into");
    // The main file's `set state-policy` and `set state-defaults` hold for them too.
    let bound = rs("set state-policy if-bound\nset state-defaults no-sync\nblock all\nanchor \"m\" in on em0\n");
    let d = bound.with_anchor("m", &p("pass in proto tcp\n"), first, &ifindex).unwrap().evaluate(&port(80), 1, Dir::In);
    assert!(d.if_bound && d.nosync && d.keep_state, "{d:?}");
    assert!(main.with_anchor("", &p("pass\n"), first, &ifindex).is_err());
}

/// pflog names a rule as pf does: a rule of the main ruleset by its number there (anchor
/// bodies are not counted in it); a rule in an anchor by the main ruleset's (outermost) anchor
/// rule, its own number in its anchor and that anchor's path (an unnamed one is `_1`, `_2`,
/// ...); a rule loaded at run time the same way, under the anchor rule that evaluates it.
#[test]
fn pflog_names_rules_in_anchors_as_pf_does() {
    use xpf_engine::LogName;
    let r = rs("block all\nanchor \"a\" in {\n pass in proto tcp\n anchor {\n  pass in proto tcp\n  block in proto udp\n }\n}\npass out\nanchor \"m\"\n");
    let name = LogName::in_anchor;
    // Flat: 0 block, 1 anchor a, 2 pass, 3 anchor _1, 4 pass, 5 block, 6 pass out, 7 anchor m.
    assert_eq!(r.log_name(0), LogName::main(0));
    assert_eq!(r.log_name(1), LogName::main(1));
    assert_eq!(r.log_name(6), LogName::main(2), "the bodies are not counted in the main ruleset");
    assert_eq!(r.log_name(7), LogName::main(3));
    assert_eq!(r.log_name(2), name(1, 0, "a"));
    assert_eq!(r.log_name(3), name(1, 1, "a"));
    assert_eq!(r.log_name(5), name(1, 1, "a/_1"), "under the outermost anchor rule, in the inner ruleset");
    let w = r.with_anchor("m", &parse("pass\nblock in proto udp\n", "m", &[]), 1 << 31, &ifindex).unwrap();
    assert_eq!(w.log_name((1 << 31) + 1), name(3, 1, "m"));
    // Without anchors a rule's number is its index.
    assert_eq!(rs("block all\npass out\n").log_name(1), LogName::main(1));
}

/// `set queue (q, ack)`: the rule that makes the state decides its queue once; every packet
/// of the state then carries it (both directions, no rule evaluated), a match rule's queue
/// holds unless the deciding rule names one, and pure ACKs go to the ACK queue.
#[test]
fn set_queue_is_kept_in_the_state_and_pure_acks_take_the_ack_queue() {
    let conf = "queue root on em1 bandwidth 100M\nqueue bulk parent root bandwidth 60M default\n\
                queue web parent root bandwidth 30M\nqueue ack parent root bandwidth 10M\n\
                match out proto udp set queue bulk\npass\npass proto tcp to port 80 set queue (web, ack)\n";
    let r = rs(conf);
    let ids = &r.queues.ids;
    let (web, ack, bulk) = (ids["web"], ids["ack"], ids["bulk"]);
    assert_eq!(r.queues.trees.len(), 1);
    assert_eq!(
        r.queues.trees[0].classes.iter().map(|c| c.bandwidth).collect::<Vec<_>>(),
        [100_000_000, 60_000_000, 30_000_000, 10_000_000]
    );
    let mut w = worker(r);
    let mut v = [Verdict::Pass; 1];
    let syn = tcp_frame([10, 0, 0, 1], [10, 1, 0, 1], 40000, 80, 1, 0, tcp::SYN, 0, None);
    w.process(&[&syn], 1, Dir::In, 1, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    assert_eq!(w.queue_of(0), web, "a SYN is not a pure ACK");
    w.process(&[&syn], 2, Dir::Out, 1, &mut v);
    assert_eq!((v[0], w.queue_of(0)), (Verdict::Pass, web), "out on em1");
    let synack = tcp_frame([10, 1, 0, 1], [10, 0, 0, 1], 80, 40000, 900, 2, tcp::SYN | tcp::ACK, 0, None);
    w.process(&[&synack], 2, Dir::In, 2, &mut v);
    assert_eq!(v[0], Verdict::Pass);
    assert_eq!(w.queue_of(0), ack, "the reply meets the state's queues (no data, an ACK: pf's ACK queue)");
    let ackf = tcp_frame([10, 0, 0, 1], [10, 1, 0, 1], 40000, 80, 2, 901, tcp::ACK, 0, None);
    w.process(&[&ackf], 1, Dir::In, 1, &mut v);
    assert_eq!(w.queue_of(0), ack, "a pure ACK");
    let data = tcp_frame([10, 0, 0, 1], [10, 1, 0, 1], 40000, 80, 2, 901, tcp::ACK | tcp::PSH, 100, None);
    w.process(&[&data], 1, Dir::In, 1, &mut v);
    assert_eq!(w.queue_of(0), web, "data");
    // Out on em1: a match rule's queue for UDP; none for the rest (the default queue).
    let u = udp([10, 0, 0, 1], [10, 1, 0, 1], 5000, 53);
    w.process(&[&u], 2, Dir::Out, 1, &mut v);
    assert_eq!(w.queue_of(0), bulk);
    let t = tcp_frame([10, 0, 0, 1], [10, 1, 0, 1], 40001, 22, 1, 0, tcp::SYN, 0, None);
    w.process(&[&t], 2, Dir::Out, 1, &mut v);
    assert_eq!(w.queue_of(0), 0);
    // The checks pfctl leaves to the kernel, at the queue's line.
    for (bad, want) in [
        ("queue r on em1 bandwidth 10M\nqueue a parent r bandwidth 8M default\nqueue b parent r bandwidth 4M\n", "higher than its own"),
        ("queue r on em1 bandwidth 10M\nqueue a parent r bandwidth 8M min 1M default\nqueue a1 parent a bandwidth 1M\n", "min on a queue with children"),
        ("queue r on em1 bandwidth 50%\nqueue a parent r bandwidth 1M default\n", "percent"),
        ("queue r on em1 bandwidth 10M\nqueue s on em1 bandwidth 10M\nqueue a parent r bandwidth 1M default\n", "root queue already"),
        ("queue r on em1 bandwidth 10M burst 20M for 10ms\nqueue a parent r bandwidth 1M default\n", "burst on a root"),
        ("queue r on em1 bandwidth 10M\nqueue a parent r bandwidth 4M burst 2M for 10ms default\n", "not above its rate"),
        ("queue r on em1 bandwidth 10M\nqueue a parent r bandwidth 4M burst 8M for 0ms default\n", "for 0ms"),
    ] {
        let p = parse(bad, "test", &[]);
        let e = match Ruleset::compile(&p, &ifindex) {
            Err(e) => e,
            Ok(_) => panic!("{bad} compiled"),
        };
        assert!(e.msg.contains(want) && e.line > 0, "{bad}: {e:?}");
    }
}

#[test]
fn queue_numbers_out_of_pfctls_ranges_and_options_given_twice_are_refused() {
    // pfctl's ranges (flows 1-32767, quantum 1-65535, qlimit 0-65535) and its words; a
    // number over them is refused at its line, not cut or allocated.
    for (line, want) in [
        ("queue a parent r bandwidth 1M flows 4000000000 default", "number of flows out of range: max 32767"),
        ("queue a parent r bandwidth 1M flows 0 default", "number of flows out of range: max 32767"),
        ("queue a parent r bandwidth 1M flows 8 quantum 70000 default", "quantum out of range: max 65535"),
        ("queue a parent r bandwidth 1M qlimit 100000000 default", "qlimit out of range: max 65535"),
        ("queue a parent r bandwidth 1M flows 8 flows 16 default", "number of flows cannot be respecified"),
        ("queue a parent r bandwidth 1M qlimit 5 qlimit 6 default", "qlimit cannot be respecified"),
        ("queue a parent r bandwidth 1M flows 8 quantum 300 quantum 600 default", "quantum cannot be respecified"),
        ("queue a parent r bandwidth 1M bandwidth 2M default", "bandwidth cannot be respecified"),
        ("queue a parent r parent s bandwidth 1M default", "parent cannot be respecified"),
        ("queue a parent r bandwidth 1M default default", "default cannot be respecified"),
        ("queue a parent r bandwidth 1M max 2M max 3M default", "max cannot be respecified"),
        ("queue a parent r bandwidth 1M min 1M min 500K default", "min cannot be respecified"),
    ] {
        let src = format!("queue r on em1 bandwidth 10M\n{line}\n");
        let p = parse(&src, "q.conf", &[]);
        assert!(p.errors.iter().any(|e| e.line == 2 && e.msg.contains(want)), "{line}: {:?}", p.errors);
    }
    // The ends of the ranges load.
    let p = parse(
        "queue r on em1 bandwidth 10M\nqueue a parent r bandwidth 1M flows 32767 quantum 65535 qlimit 65535 default\n",
        "q.conf",
        &[],
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!((p.queues[1].flows, p.queues[1].quantum, p.queues[1].qlimit), (Some(32767), Some(65535), Some(65535)));
}

#[test]
fn a_burst_loads_and_prints_as_pfctl_prints_it() {
    // pf.conf(5)'s example, and a burst on min and max.
    let src = "queue rootq on em0 bandwidth 100M max 100M\n\
               queue http parent rootq bandwidth 60M burst 90M for 100ms\n\
               queue developers parent http bandwidth 45M\n\
               queue employees parent http bandwidth 15M\n\
               queue mail parent rootq bandwidth 10M, min 5M burst 8M for 50ms, max 20M burst 30M for 20ms qlimit 80 default\n";
    let p = parse(src, "test", &[]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let printed: Vec<String> = p.queues.iter().map(xpf_conf::print::queue).collect();
    assert_eq!(printed[1], "queue http parent rootq bandwidth 60M burst 90M for 100ms");
    assert_eq!(
        printed[4],
        "queue mail parent rootq bandwidth 10M, min 5M burst 8M for 50ms, max 20M burst 30M for 20ms default qlimit 80"
    );
    // Bursts are the leaves': the example's `http` has children, and is refused at its line.
    let e = xpf_conf::compile::queues::compile(&p.queues).expect_err("a burst on a parent");
    assert!(e.line == 2 && e.msg.contains("burst on a queue with children"), "{e:?}");
    let leaf = parse(
        &src.replace("queue developers parent http bandwidth 45M\n", "")
            .replace("queue employees parent http bandwidth 15M\n", ""),
        "test",
        &[],
    );
    let q = xpf_conf::compile::queues::compile(&leaf.queues).expect("compiles");
    let http = &q.trees[0].classes.iter().find(|c| c.name == "http").unwrap();
    assert_eq!(http.burst[1], xpf_shape::Burst { bits: 90_000_000, ms: 100 });
    assert!(parse("queue r on em0 bandwidth 1M\nqueue a parent r bandwidth 1M burst 2M for 10 default\n", "t", &[])
        .errors
        .iter()
        .any(|e| e.msg.contains("must be in ms")));
}

#[test]
fn tags_end_at_pfs_tagid_max_with_the_rule_line() {
    // pf's ids are 16-bit and end at TAGID_MAX (50,000): the next name is refused at its line,
    // a name already given keeps its id.
    let mut src = String::new();
    for i in 0..xpf_conf::compile::TAGS_MAX {
        src += &format!("pass in proto udp to port {} tag t{i}\n", 1 + i % 60_000);
    }
    src += "pass in tagged t7\n";
    assert!(Ruleset::compile(&parse(&src, "test", &[]), &ifindex).is_ok());
    src += "pass in tag one_too_many\n";
    let Err(e) = Ruleset::compile(&parse(&src, "test", &[]), &ifindex) else { panic!("one tag too many compiled") };
    assert_eq!(e.line as usize, xpf_conf::compile::TAGS_MAX + 2);
    assert!(e.msg.contains("one_too_many") && e.msg.contains("50000"), "{}", e.msg);
}

/// A compile asks the system what an interface name stands for once a name, not once a rule
/// (each answer is a socket and an ioctl in xpfd), and every rule still gets the answer.
#[test]
fn interface_names_are_resolved_once_per_compile() {
    use std::cell::Cell;
    let src: String = (0..3000)
        .map(|i| format!("pass out on {} proto tcp to port {} received-on em1\n", ["em0", "em1", "lan"][i % 3], i + 1))
        .collect();
    let p = parse(&src, "t", &[]);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let (asked, members) = (Cell::new(0), Cell::new(0));
    let counted = |n: &str| {
        asked.set(asked.get() + 1);
        ifindex(n)
    };
    let groups = |n: &str| {
        members.set(members.get() + 1);
        (n == "lan").then(|| vec!["em0".to_string(), "em1".to_string()])
    };
    let r = Ruleset::compile_with(&p, &counted, &groups, &xpf_conf::routes::Fib::default()).unwrap();
    // em0, em1, lan, and lan's two members.
    assert_eq!((asked.get(), members.get()), (5, 1));
    let cases = [
        (1u16, 2u16, 1u16, true),
        (2, 2, 2, true),
        (1, 2, 3, true),
        (2, 2, 3, true),
        (2, 2, 1, false),
        (1, 1, 1, false),
    ];
    for (ifi, rcvif, port, hit) in cases {
        let pd = pkt(IPPROTO_TCP, [10, 0, 0, 1], [10, 0, 0, 2], 1000, port, tcp::SYN);
        let at = Context { rcvif, ..Context::new(ifi, Dir::Out) };
        assert_eq!(r.eval_naive(&pd, &at).0.is_some(), hit, "out on {ifi} from {rcvif} to port {port}");
    }
}

/// FreeBSD's `route-to { (IF ADDR), ... }` (pfSense's load-balancing gateway group): each new
/// state takes the next hop after the last one's, and keeps it; the hops print as pfctl
/// prints them, round-robin being the list's default.
#[test]
fn next_hops_in_a_list_are_taken_in_turn() {
    let conf = "pass in on em0 route-to { (em1 192.0.2.1), (em1 198.51.100.1) } proto udp\n";
    let p = parse(conf, "test", &[]);
    assert_eq!(
        xpf_conf::print::parsed(&p).trim(),
        "pass in on em0 inet proto udp all route-to { (em1 192.0.2.1), (em1 198.51.100.1) } round-robin"
    );
    let mut w = worker(rs(conf));
    let em0 = ifindex("em0").unwrap();
    let hop = |w: &Worker<Ruleset>| {
        let t = w.policy.route(w.batch().routes[0]).expect("a next hop");
        (t.ifidx, t.addr, t.reply)
    };
    let mut v = [Verdict::Pass];
    let mut seen = Vec::new();
    for port in 0..4 {
        w.process(&[&udp([10, 0, 0, 1], [8, 8, 8, 8], 5000 + port, 53)], em0, Dir::In, 0, &mut v);
        assert_eq!(v[0], Verdict::Pass);
        seen.push(hop(&w));
    }
    let (a, b) = (
        (ifindex("em1").unwrap(), Addr::v4([192, 0, 2, 1]), false),
        (ifindex("em1").unwrap(), Addr::v4([198, 51, 100, 1]), false),
    );
    assert!(seen == [a, b, a, b] || seen == [b, a, b, a], "{seen:?}");
    // A state's later packets keep the hop it took.
    for _ in 0..3 {
        w.process(&[&udp([10, 0, 0, 1], [8, 8, 8, 8], 5001, 53)], em0, Dir::In, 0, &mut v);
        assert_eq!(hop(&w), seen[1]);
    }
    // OpenBSD's list of addresses (pfctl's automatic table of them) the same way; a network
    // in it is no next hop.
    let conf = "pass in on em0 route-to { 192.0.2.1, 198.51.100.1 } proto udp\n";
    let mut w = worker(rs(conf));
    let mut seen = Vec::new();
    for port in 0..4 {
        w.process(&[&udp([10, 0, 0, 1], [8, 8, 8, 8], 5000 + port, 53)], em0, Dir::In, 0, &mut v);
        seen.push(hop(&w).1);
    }
    let (a, b) = (Addr::v4([192, 0, 2, 1]), Addr::v4([198, 51, 100, 1]));
    assert!(seen == [a, b, a, b] || seen == [b, a, b, a], "{seen:?}");
    let p = parse("pass in on em0 route-to { 192.0.2.1, 198.51.100.0/24 } proto udp\n", "test", &[]);
    let e = Ruleset::compile(&p, &ifindex).expect_err("a network as a next hop");
    assert!(e.msg.contains("a next hop is an address, not 198.51.100.0/24"), "{}", e.msg);
}
