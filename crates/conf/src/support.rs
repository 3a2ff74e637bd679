//! What xpf enforces. The parser reads all of OpenBSD's pf.conf (so that `xpfctl -nvf` prints
//! what pfctl prints); this pass stands between parsing and loading: every construct the
//! engine does not enforce is refused with `FILE:LINE: xpf does not support 'X' yet`, so a
//! ruleset that loads means what it says. `xpfd -f`, `xpfctl -f` and `xpfctl -nf` run it.
//!
//! [`refusals`] walks every field of every [`Rule`] and every statement-level setting by an
//! exhaustive destructuring: a field added to the AST fails to compile here until it is
//! either enforced or refused (the test `every_rule_option_is_refused_or_evaluated` then
//! holds the enforced ones to an evaluation test).

use crate::ast::*;
use crate::parse::{ConfError, Parsed};

/// What loading `p` would promise that xpf cannot keep, one error per construct and line, in
/// file order; and the warnings (constructs that load with a caveat, pfctl's), each a whole
/// line `FILE:LINE: warning: ...` to print as it is.
pub fn refusals(p: &Parsed) -> (Vec<ConfError>, Vec<String>) {
    let mut errs = Vec::new();
    let mut warn: Vec<String> = Vec::new();
    let mut no = |file: &str, line: u32, what: &str| {
        let e = ConfError { file: file.into(), line, msg: format!("xpf does not support '{what}' yet"), bare: false };
        if !errs.contains(&e) {
            errs.push(e);
        }
    };
    for (text, file, line) in &p.settings {
        let words: Vec<&str> = text.split_whitespace().collect();
        match words.get(1).copied().unwrap_or("") {
            // xpfd holds states, frags, src-nodes, tables and table-entries; it has no delay
            // queue and does not bound its anchors.
            "limit" => {
                let named = |n: &str| words.iter().any(|w| w.trim_matches(['{', ',', '}']) == n);
                for n in ["pktdelay-pkts", "anchors"].into_iter().filter(|n| named(n)) {
                    no(file, *line, &format!("set limit {n}"));
                }
            }
            // Enforced: block-policy (the rules carry it), timeout, reassemble,
            // state-policy, skip; ruleset-optimization changes no verdict (pfctl's optimizer
            // only reorders and merges rules that decide alike).
            // `hostid` is sync's creator id (xpfd --sync-hostid wins); syncookies, the engine's
            // (the host's own ports too: their SYNs pass through the same worker).
            // `state-defaults` takes pflow and no-sync only (the parser refuses the rest);
            // xpfd refuses pflow without a collector.
            // `debug` is the level of xpfd's own messages (pfctl -x's).
            // `loginterface`: xpfd counts its packets and bytes (-s info's Interface Stats).
            "block-policy"
            | "debug"
            | "loginterface"
            | "state-defaults"
            | "timeout"
            | "state-policy"
            | "skip"
            | "ruleset-optimization"
            | "hostid"
            | "syncookies" => {}
            "reassemble" if !text.contains("no-df") => {}
            "reassemble" => no(file, *line, "set reassemble no-df"),
            "optimization" if matches!(words.get(2).copied(), Some("normal" | "default")) => {}
            "optimization" => no(file, *line, &format!("set optimization {}", words.get(2).unwrap_or(&""))),
            w => no(file, *line, &format!("set {w}")),
        }
    }
    // FreeBSD's translation rules translate before the filter rules see the packet; a filter
    // rule's own translation on top of that is not something xpf does.
    let xlating = p.xrules.iter().any(|r| r.xlate.is_some_and(|x| !x.no) && r.anchor.is_none());
    for r in p.rules.iter().chain(&p.xrules) {
        let mut refuse = |what: &str| no(&r.file, r.line, what);
        // Exhaustive on purpose: a new field does not compile until it is placed.
        let Rule {
            action: _,
            ret,
            dir: _,
            log,
            quick: _,
            on: _,
            af: _,
            proto: _,
            src,
            src_port: _,
            dst,
            dst_port: _,
            flags: _,
            icmp: _,
            icmp6: _,
            tos,
            state,
            state_explicit: _,
            allow_opts: _,
            // Enforced: only a fragment not reassembled matches (with `set reassemble yes`,
            // pf's default, none reaches the rules, as in pf), and it makes no state.
            fragment: _,
            label: _,
            tag: _,
            tagged: _,
            state_opts,
            user,
            group,
            nat,
            rdr,
            binat,
            scrub,
            divert,
            rtable,
            af_to,
            depth: _,
            opens: _,
            route,
            set_prio,
            set_queue,
            set_tos,
            probability,
            received_on,
            once,
            max_pkt_rate,
            anchor: _,
            xlate,
            line: _,
            file: _,
        } = r;
        // Enforced: FreeBSD's `nat`, `rdr`, `binat` (and `no`, `pass`) in a ruleset of their
        // own before the filter (the engine's miss path); their anchors are named anchors.
        if xlate.is_none() && xlating {
            if nat.is_some() || rdr.is_some() || binat.is_some() {
                refuse("nat-to/rdr-to/binat-to in a ruleset with nat/rdr/binat rules");
            }
            if *state == StateKind::Synproxy {
                refuse("synproxy state in a ruleset with nat/rdr/binat rules");
            }
        }
        // Enforced: `received-on` against the pass's receiving interface, `once` expires the
        // rule at its first match, `max-pkt-rate` meters the rule and its states.
        let _ = (received_on, once, max_pkt_rate);
        // Enforced: every return variant (the engine's reply.rs).
        let _ = ret;
        // Enforced: `log`, `log (all)` and `log (to pflogN)` on pass and block rules (and
        // FreeBSD's `nat pass log`): the deciding rule's packet goes to pflog (xpfd's --pflog
        // file and `xpfctl log`), with `all` every packet of its states too; not yet per
        // matching rule, or with the socket's user.
        if let Some(l) = log {
            if l.matches {
                refuse("log (matches)");
            }
            if l.user {
                refuse("log (user)");
            }
            if let Some(to) = &l.to {
                if !to.strip_prefix("pflog").is_some_and(|n| n.parse::<u8>().is_ok_and(|n| n < 16)) {
                    refuse(&format!("log (to {to})"));
                }
            }
            if r.action == Action::Match || r.anchor.is_some() {
                refuse("log on match rules and anchors");
            }
        }
        for h in [src, dst] {
            match &h.kind {
                HostKind::Any | HostKind::Net(..) | HostKind::Range(..) | HostKind::Table(_) => {}
                // Enforced: the interfaces' addresses and the kernel's routes at compile time,
                // followed by xpfd.
                HostKind::SelfAddr | HostKind::Dynamic { .. } | HostKind::NoRoute | HostKind::UrpfFailed => {}
                // OpenBSD's route labels: Linux's routes have none to match.
                HostKind::RouteLabel(l) => refuse(&format!("route \"{l}\"")),
            }
        }
        // Enforced: `tos` matches the TOS byte without its ECN bits (pf_setup_pdesc).
        let _ = tos;
        match state {
            StateKind::No | StateKind::Keep | StateKind::Modulate => {}
            // Enforced (the engine's synproxy.rs) on inbound SYNs, but not with options that
            // need the handshake's tracking it replaces. Outbound, pf ignores it and pfctl says
            // so; so does xpf (the engine keeps state there).
            StateKind::Synproxy => {
                if r.dir != Dir::In {
                    let w = format!(
                        "{}:{}: warning: synproxy used for inbound rules only, ignored for outbound",
                        r.file, r.line
                    );
                    if !warn.contains(&w) {
                        warn.push(w);
                    }
                }
                if state_opts.sloppy {
                    refuse("synproxy state (sloppy)");
                }
                if state_opts.max_src_conn.is_some() || state_opts.max_src_conn_rate.is_some() {
                    refuse("synproxy state with max-src-conn");
                }
            }
        }
        let StateOpts {
            max: _,
            no_sync: _,
            // Exported by xpfd's --pflow (which refuses it when there is no collector).
            pflow: _,
            source_track: _,
            max_src_states: _,
            max_src_conn: _,
            max_src_conn_rate: _,
            max_src_nodes: _,
            overload: _,
            if_bound: _,
            floating: _,
            sloppy: _,
            timeouts: _,
        } = &**state_opts;
        if user.is_some() {
            refuse("user");
        }
        if group.is_some() {
            refuse("group");
        }
        // Enforced: translation (the engine's nat.rs) with pf's pool types over addresses,
        // networks, lists, tables and interfaces; binat-to as its nat-to and rdr-to halves.
        let _ = binat;
        let names = match xlate {
            Some(x) => [x.kind.word(); 2],
            None => ["nat-to", "rdr-to"],
        };
        for (what, pool) in names.into_iter().zip([nat, rdr]) {
            let Some(pool) = pool else { continue };
            for h in std::iter::once(&pool.host).chain(pool.list.iter().flatten()) {
                match &h.kind {
                    HostKind::Net(..) | HostKind::Table(_) | HostKind::Dynamic { .. } => {}
                    HostKind::Range(..) => refuse(&format!("{what} an address range")),
                    _ => refuse(&format!("{what} {}", crate::print::host_label(h))),
                }
            }
            if *state == StateKind::Synproxy {
                refuse(&format!("synproxy state with {what}"));
            }
        }
        if let Some(s) = scrub {
            // Enforced: no-df, random-id, min-ttl, max-mss, set-tos (proto::apply_scrub).
            if s.reassemble_tcp {
                refuse("scrub (reassemble tcp)");
            }
        }
        match divert {
            None => {}
            Some(Divert::To(..)) => refuse("divert-to"),
            Some(Divert::Reply) => refuse("divert-reply"),
            Some(Divert::Packet(_)) => refuse("divert-packet"),
        }
        if rtable.is_some() {
            refuse("rtable");
        }
        if af_to.is_some() {
            refuse("af-to");
        }
        // Enforced: `route-to` and `reply-to` to one next hop, FreeBSD's `(IF ADDR)` or
        // OpenBSD's `ADDR` (the interface of the kernel's route to it), or to a list of them
        // taken in turn: the engine marks the packets they apply to (its
        // `Batch::routes`), xpfd sends them there and filters them leaving by that
        // interface (pf_route).
        match route.as_deref() {
            None => {}
            Some((RouteKind::DupTo, _)) => refuse("dup-to"),
            Some((k, pl)) => {
                let w = if *k == RouteKind::RouteTo { "route-to" } else { "reply-to" };
                let one = |h: &Host| match h.kind {
                    HostKind::Net(a, len) => len == if a.is_ipv4() { 32 } else { 128 },
                    _ => false,
                };
                // A list taken in turn, an address each: FreeBSD's of `(IF ADDR)`, OpenBSD's of
                // `ADDR` (the automatic table pfctl makes of it; a network in it is refused
                // when the ruleset is compiled).
                let listed = matches!(&pl.host.kind, HostKind::Table(n) if n.starts_with("__automatic_"));
                let several = pl.hops.len() > 1 || listed;
                if !(one(&pl.host) || listed) || pl.list.is_some() || pl.hops.iter().any(|(_, h)| !one(h)) {
                    refuse(&format!("{w} {} (a pool of next hops)", crate::print::host_label(&pl.host)));
                } else if pl.kind != if several { PoolKind::RoundRobin } else { PoolKind::None }
                    || pl.sticky
                    || pl.port.is_some()
                {
                    refuse(&format!("{w} with pool options"));
                } else if r.dir == Dir::Both {
                    refuse(&format!("{w} on a rule without in or out"));
                }
            }
        }
        if set_prio.is_some() {
            refuse("set prio");
        }
        // Enforced: the state keeps the queue; the egress interface's shaper holds to it.
        let _ = set_queue;
        // Enforced: `set tos` is the rule's `scrub (set-tos)` (proto::apply_scrub).
        let _ = set_tos;
        // Enforced: a draw per packet from the worker's random numbers.
        let _ = probability;
    }
    errs.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    (errs, warn)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the evidence lives: the evaluation tests and the scenario checks.
    const EVIDENCE: &[&str] = &[
        include_str!("../tests/eval.rs"),
        include_str!("../../engine/src/tests.rs"),
        include_str!("../../engine/src/reply.rs"),
        include_str!("../../engine/src/frag.rs"),
        include_str!("../../../scripts/scenario.sh"),
        include_str!("../../../scripts/failover.sh"),
        include_str!("../../../scripts/observe.sh"),
        include_str!("../../xpfd/src/logging.rs"),
        include_str!("../../shape/src/tests.rs"),
        include_str!("../../state/src/track.rs"),
        include_str!("../../xpfd/src/control.rs"),
    ];

    enum Expect {
        /// Refused by this name.
        No(&'static str),
        /// Enforced, and this test (or scenario check) shows it.
        Yes(&'static str),
    }
    use Expect::*;

    /// Every construct the parser takes, one pf.conf line each (the rule AST's every option).
    const CONSTRUCTS: &[(&str, Expect)] = &[
        ("pass in quick on lo inet proto tcp from 10/8 port 1 to ! 20/8 port 2:3 flags S/SA", Yes("negation_ports_flags_and_interfaces")),
        ("match in tag A", Yes("match_rules_tag_and_go_on")),
        ("pass out tagged A", Yes("tag_set_in_is_seen_by_tagged_out_and_kept_in_the_state")),
        ("block drop in all", Yes("last_match_wins_and_quick_stops")),
        ("block return in proto tcp", Yes("block_return_answers_tcp_with_a_rst_and_udp_with_port_unreachable")),
        ("block return-rst (ttl 9) in proto tcp", Yes("a_blocked_syn_gets_pfs_rst")),
        ("block return-icmp (net-unr) in proto udp", Yes("block_return_answers_tcp_with_a_rst_and_udp_with_port_unreachable")),
        ("block return-icmp6 in inet6 proto udp", Yes("udp_gets_port_unreachable_quoting_it")),
        ("pass in log proto udp", Yes("a_logging_rule_marks_its_frames_for_pflog")),
        ("block in log (to pflog1) proto udp", Yes("a_logging_rule_marks_its_frames_for_pflog")),
        ("pass in log (all) proto udp", Yes("log_all_logs_every_packet_of_the_state")),
        ("match in log proto udp", No("log on match rules and anchors")),
        // What a FreeBSD scrub rule asks for its packets, xpf does to every packet.
        ("scrub in on lo inet all fragment reassemble", Yes("a fragmented ping passes whole (reassembly)")),
        ("scrub in all", Yes("null, FIN and Xmas scans are dropped as normalize")),
        ("scrub in all no-df random-id min-ttl 9 max-mss 1400 set-tos 0x10", Yes("scrub_rules_act_on_every_packet_they_select_first_match")),
        ("pass in inet proto icmp icmp-type echoreq code 0", Yes("an_icmp_error_quoting_no_state_is_left_to_the_rules")),
        ("pass in tos 0x10", Yes("tos_matches_the_tos_byte_without_its_ecn_bits")),
        ("pass in proto tcp keep state (max 3, max-src-conn 2, overload <b> flush global, tcp.established 5)", Yes("state_options_reach_the_engine_and_limiters_survive_a_recompile")),
        ("pass in proto tcp keep state (max-src-states 3, max-src-nodes 2, max-src-conn-rate 3/5, source-track rule)", Yes("max_src_conn_rate_counts_connections_over_time")),
        ("pass in proto tcp keep state (if-bound)", Yes("state_policy_if_bound_binds_states_a_rule_does_not_float")),
        ("pass in proto tcp keep state (floating)", Yes("state_policy_if_bound_binds_states_a_rule_does_not_float")),
        ("pass in proto tcp keep state (no-sync)", Yes("--sync-dev")),
        ("pass in proto tcp flags any keep state (sloppy)", Yes("a_sloppy_state_tracks_flags_only")),
        ("pass in proto tcp modulate state", Yes("modulate_state_replaces_both_initial_sequence_numbers")),
        ("pass in proto tcp no state", Yes("no_match_passes_without_state")),
        ("pass in allow-opts", Yes("ip_options_need_allow_opts_on_rule_and_state")),
        ("pass in proto udp fragment", Yes("fragment_rules_match_only_fragments_not_reassembled")),
        ("pass in label \"web\"", Yes("-k label")),
        ("pass in to self", Yes("self_stands_for_the_interfaces_addresses")),
        ("pass in to (lo)", Yes("self_stands_for_the_interfaces_addresses")),
        ("pass in from <t> to 10.0.0.1 - 10.0.0.9", Yes("tables_are_longest_prefix_with_negation_and_counters")),
        ("table <c> persist counters { 10.0.0.2 }\npass in from <c>", Yes("a_counters_table_counts_per_entry_what_its_rules_decide")),
        ("anchor \"a\" {\n pass\n}", Yes("anchors_are_evaluated_in_place")),
        ("pass in proto tcp synproxy state", Yes("synproxy_completes_the_handshake_then_splices_the_sequence_spaces")),
        ("pass in proto tcp synproxy state (max-src-conn 5)", No("synproxy state with max-src-conn")),
        ("pass in proto tcp keep state (pflow)", Yes("a_pflow_state_is_recorded_at_its_end_while_active_and_when_translated")),
        ("pass in to no-route", Yes("no_route_and_urpf_failed_follow_the_routes")),
        ("pass in from route \"dmz\"", No("route \"dmz\"")),
        ("pass in from urpf-failed", Yes("no_route_and_urpf_failed_follow_the_routes")),
        ("pass in proto tcp user 0", No("user")),
        ("pass in proto tcp group 0", No("group")),
        ("match out on lo nat-to 192.0.2.1", Yes("nat_to_translates_out_and_back_in")),
        ("match in on lo rdr-to 192.0.2.1", Yes("rdr_to_forwards_to_the_inside_server_and_answers_from_the_public_address")),
        ("match on lo from 10.0.0.1 to any binat-to 192.0.2.1", Yes("binat_to_compiles_to_a_static_nat_out_and_a_rdr_in")),
        ("pass out on lo nat-to { 192.0.2.1, 192.0.2.2 } round-robin sticky-address", Yes("sticky_address_keeps_a_sources_address_and_least_states_balances")),
        ("pass out on lo nat-to 192.0.2.0/28 least-states", Yes("sticky_address_keeps_a_sources_address_and_least_states_balances")),
        ("nat on lo from 10/8 to any -> 192.0.2.1", Yes("freebsd_nat_rdr_binat_translate_before_the_filter_rules")),
        ("no nat on lo from 10.0.0.9 to any", Yes("freebsd_nat_rdr_binat_translate_before_the_filter_rules")),
        ("nat pass on lo from 10/8 to any -> 192.0.2.1", Yes("freebsd_nat_rdr_binat_translate_before_the_filter_rules")),
        ("rdr on lo proto tcp to 192.0.2.1 port 80 -> 10.0.0.5 port 8080", Yes("freebsd_nat_rdr_binat_translate_before_the_filter_rules")),
        ("binat on lo from 10.0.0.7 to any -> 192.0.2.7", Yes("freebsd_nat_rdr_binat_translate_before_the_filter_rules")),
        ("nat-anchor \"natrules/*\"", Yes("freebsd_nat_rdr_binat_translate_before_the_filter_rules")),
        ("nat on lo from 10/8 to any -> 192.0.2.1\npass out nat-to 192.0.2.2", No("nat-to/rdr-to/binat-to in a ruleset with nat/rdr/binat rules")),
        ("rdr on lo proto tcp to port 80 -> 10.0.0.5\npass in proto tcp synproxy state", No("synproxy state in a ruleset with nat/rdr/binat rules")),
        ("nat on lo from 10/8 to any -> 192.0.2.0/28 round-robin sticky-address", Yes("sticky_address_keeps_a_sources_address_and_least_states_balances")),
        ("nat on lo proto udp from 10/8 to any -> 192.0.2.1 endpoint-independent", Yes("endpoint_independent_udp_keeps_a_sources_port_towards_every_destination")),
        ("pass out on lo proto udp nat-to 192.0.2.1 endpoint-independent", Yes("endpoint_independent_udp_keeps_a_sources_port_towards_every_destination")),
        ("pass out on lo nat-to 192.0.2.1 - 192.0.2.9", No("nat-to an address range")),
        ("pass in on lo proto tcp rdr-to 192.0.2.1 synproxy state", No("synproxy state with rdr-to")),
        ("match in scrub (max-mss 1400, no-df, random-id, min-ttl 9, set-tos 0x10)", Yes("scrub_rewrites_as_pf_scrub_does")),
        ("match in scrub (reassemble tcp)", No("scrub (reassemble tcp)")),
        ("pass in proto tcp divert-to 127.0.0.1 port 8080", No("divert-to")),
        ("pass out proto tcp divert-reply", No("divert-reply")),
        ("pass in divert-packet port 700", No("divert-packet")),
        ("pass in rtable 1", No("rtable")),
        ("pass in af-to inet6 from 2001:db8::1", No("af-to")),
        ("pass out on lo route-to 127.0.0.2", Yes("route_to_marks_the_states_way_and_reply_to_the_other")),
        ("pass in on lo route-to (lo 127.0.0.2)", Yes("route_to_sends_by_the_rules_next_hop")),
        ("pass in on lo reply-to (lo 127.0.0.2)", Yes("reply_to_sends_replies_back_by_the_rules_next_hop")),
        ("pass in on lo route-to { 127.0.0.2, 127.0.0.3 }", Yes("next_hops_in_a_list_are_taken_in_turn")),
        ("pass in on lo route-to <t>", No("route-to <t> (a pool of next hops)")),
        ("pass in on lo route-to 127.0.0.0/24 bitmask", No("route-to 127.0.0.0/24 (a pool of next hops)")),
        ("pass in on lo route-to { (lo 127.0.0.2), (lo 127.0.0.3) }", Yes("next_hops_in_a_list_are_taken_in_turn")),
        ("pass in on lo route-to { (lo 127.0.0.2), (lo 127.0.0.3) } random", No("route-to with pool options")),
        ("pass in on lo dup-to 127.0.0.2", No("dup-to")),
        ("pass in on lo reply-to 127.0.0.2", Yes("reply_to_sends_replies_back_by_the_rules_next_hop")),
        ("pass in on lo reply-to 127.0.0.2 sticky-address", No("reply-to with pool options")),
        ("pass on lo route-to 127.0.0.2", No("route-to on a rule without in or out")),
        ("pass out on lo dup-to 127.0.0.2", No("dup-to")),
        ("pass in set prio 3", No("set prio")),
        ("pass in set queue root", Yes("set_queue_is_kept_in_the_state_and_pure_acks_take_the_ack_queue")),
        ("pass in set tos 0x10", Yes("set_tos_sets_the_tos_of_every_packet_of_the_state")),
        ("pass in probability 50%", Yes("probability_passes_about_its_share")),
        ("pass out on lo received-on lo", Yes("received_on_matches_the_interface_the_packet_came_in_on")),
        ("pass out on lo !received-on lo", Yes("received_on_matches_the_interface_the_packet_came_in_on")),
        ("pass in proto tcp once", Yes("a_once_rule_expires_at_its_first_match")),
        ("pass in proto icmp max-pkt-rate 100/10", Yes("max_pkt_rate_stops_the_rule_and_its_states_over_the_rate")),
        ("queue q on lo bandwidth 10M default", Yes("siblings_share_by_bandwidth_and_the_root_caps")),
        ("set skip on lo", Yes("set_skip_on_leaves_an_interface_unfiltered")),
        ("set state-policy if-bound", Yes("state_policy_if_bound_binds_states_a_rule_does_not_float")),
        ("set block-policy return", Yes("block_return_answers_tcp_with_a_rst_and_udp_with_port_unreachable")),
        ("set timeout tcp.established 60", Yes("a_rule_timeout_overrides_the_global_one")),
        ("set limit states 1000", Yes("state_limit_drops_are_counted_and_keep_existing_states")),
        ("set reassemble yes", Yes("fragments_are_held_then_filtered_as_one_datagram_and_released_in_order")),
        ("set reassemble yes no-df", No("set reassemble no-df")),
        ("set optimization normal", Yes("ruleset-optimization")),
        ("set optimization aggressive", No("set optimization aggressive")),
        ("set ruleset-optimization basic", Yes("ruleset-optimization")),
        ("set loginterface lo", Yes("set loginterface")),
        ("set hostid 1", Yes("hostid_names_the_sync_creator")),
        ("set state-defaults pflow", Yes("a_pflow_state_is_recorded_at_its_end_while_active_and_when_translated")),
        ("set state-defaults no-sync", Yes("--sync-dev")),
        ("set syncookies always", Yes("syncookies_answer_a_syn_without_state_and_the_ack_makes_it")),
        ("set syncookies adaptive (start 25%, end 12%)", Yes("syncookies_adaptive_turn_on_at_the_half_open_watermark")),
        ("set syncookies never", Yes("syncookies_answer_a_syn_without_state_and_the_ack_makes_it")),
        ("set debug crit", Yes("pf_debug_names_map_to_levels")),
        ("set limit table-entries 10", Yes("a_ruleset_past_its_table_limits_is_refused_at_the_table")),
        ("set limit src-nodes 10", Yes("the_src_nodes_limit_counts_both_families")),
        ("set limit anchors 10", No("set limit anchors")),
        ("set limit { states 10, pktdelay-pkts 5 }", No("set limit pktdelay-pkts")),
    ];

    #[test]
    fn every_rule_option_is_refused_or_evaluated() {
        let evidence = EVIDENCE.concat() + include_str!("support.rs");
        for (line, expect) in CONSTRUCTS {
            let src = format!("table <t> {{ 10.0.0.1 }}\ntable <b> persist\nqueue root on lo bandwidth 10M\n{line}\n");
            let src = if line.starts_with("queue") {
                format!("{line}\n")
            } else {
                src.replace("queue root on lo bandwidth 10M\n", "")
            };
            let p = crate::parse::parse(&src, "t.conf", &[]);
            assert!(p.errors.is_empty(), "{line}: {:?}", p.errors);
            let (errs, _) = refusals(&p);
            match expect {
                No(what) => {
                    let want = format!("xpf does not support '{what}' yet");
                    assert!(
                        errs.iter().any(|e| e.msg == want && e.file == "t.conf"),
                        "{line}: want {want}, got {errs:?}"
                    );
                }
                Yes(test) => {
                    assert!(errs.is_empty(), "{line}: enforced, but refused: {errs:?}");
                    assert!(evidence.contains(test), "{line}: the evidence '{test}' names no test or check");
                }
            }
        }
    }

    #[test]
    fn refusals_name_the_included_file_and_its_line() {
        let d = std::env::temp_dir().join(format!("xpf-sup-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("inner.conf"), "pass\npass in rtable 1\n").unwrap();
        let p = crate::parse::parse_in("pass\ninclude \"inner.conf\"\n", "outer.conf", &[], Some(&d));
        let (errs, _) = refusals(&p);
        let e: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(e, vec!["inner.conf:2: xpf does not support 'rtable' yet"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
