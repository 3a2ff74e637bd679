/* xpf's fast path where xpfd reads frames through AF_PACKET (packet mode): established
 * flows forwarded in the kernel as socket buffers, whole.
 *
 * Why not XDP there: on a veth, attaching an XDP program takes segmentation offload away
 * from the peer (a sending host then cuts every TCP stream into 1,500-byte frames), and an
 * XDP frame redirected between veths carries neither a GSO size nor a checksum left to
 * offload. A socket buffer keeps both: a 64 KB TCP segment crosses the firewall as one, its
 * checksum still left to the receiver's offload.
 *
 * xpf_skb, at each filtered interface's tcx ingress, is the one place a frame is judged
 * before xpfd: no packet socket taps the interface (a tap sees every frame before the ingress
 * hooks, and costs each one). It reads the flow tables of fast.h, written by xpfd as for the
 * steering program. For each frame:
 * - what the kernel must see goes on to it: non-IP, broadcast and multicast, neighbour
 *   discovery, TTL/hop limit expiring, over the egress MTU or unroutable (the kernel sends
 *   the ICMP error), traffic for this host (the FIB says it is not forwarded) unless it goes
 *   to a translation target (maps natnet/natport, fast.h: replies
 *   to a `nat-to` address of this host, port forwardings to it), and frames for another
 *   host's MAC (which the kernel drops; counted);
 * - a frame of a live flow that came in where the flow's `in` state is and passes pf's
 *   checks (UDP and echoes: none; TCP: tcp_check, the windows slid) goes out of the flow's
 *   `out` interface while the FIB still routes it there (MACs from the FIB, or from the
 *   neighbour table when the FIB has none yet; TTL or hop limit down by one), a translated
 *   flow's rewritten as its rewrite record says (the FIB asked with the addresses it leaves
 *   with); a changed route clears the entry's `out_if` (its frames go to xpfd from then on);
 * - everything else goes to xpfd: redirected into the ingress of an ifb device of xpfd's
 *   (map `divert`), where xpfd's packet socket reads it and xpf_drop ends it; a TCP SYN
 *   without ACK into a second one, whose socket xpfd serves after the first.
 * Without an entry in `divert` the frame goes on to the kernel, whose chain xpfd-fwd
 * (iptables, FORWARD) drops what it would forward: the box fails closed. */
#include "fast.h"
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

static long (*bpf_skb_pull_data)(void *skb, __u32 len) = (void *)BPF_FUNC_skb_pull_data;
static long (*bpf_skb_store_bytes)(void *skb, __u32 off, const void *from, __u32 len, __u64 flags) =
    (void *)BPF_FUNC_skb_store_bytes;
static long (*bpf_l3_csum_replace)(void *skb, __u32 off, __u64 from, __u64 to, __u64 flags) =
    (void *)BPF_FUNC_l3_csum_replace;
static long (*bpf_l4_csum_replace)(void *skb, __u32 off, __u64 from, __u64 to, __u64 flags) =
    (void *)BPF_FUNC_l4_csum_replace;
static long (*bpf_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) =
    (void *)BPF_FUNC_redirect_neigh;

/* Counters (src/skbpath.rs names them). */
enum { K_FAST, K_NEIGH, K_REROUTED, K_MTU, K_TO_XPFD, K_HOST, K_KERNEL, K_OTHERHOST, K_NO_DIVERT, K_NAT_LOCAL,
       K_GIVEN_BACK, K_NO_ROUTE, K_TRANSLATED, K_REWRITE_FAILED, K_SYN_LANE, K_N };
struct xpf_map skb_stats SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, K_N, 0 };
/* A filtered interface's index -> the ifb devices whose ingress xpfd reads (written by
 * xpfd): `rx` for what it judges, `syn` (0: none) for new connections, TCP SYNs without ACK,
 * which xpfd serves after the first (as the steering program's second socket per queue): a
 * SYN flood fills and overflows its own socket's ring, not the established traffic's. */
struct divert {
    __u32 rx, syn;
};
struct xpf_map divert SEC("maps") = { BPF_MAP_TYPE_HASH, 4, sizeof(struct divert), 256, 0 };

#define PACKET_BROADCAST 1
#define PACKET_MULTICAST 2
#define PACKET_OTHERHOST 3
/* What the headers take: Ethernet, IPv4 without options, TCP (UDP and ICMP need less). */
#define NEED4 (14 + 20 + 20)
/* Ethernet, IPv6, TCP. */
#define NEED6 (14 + 40 + 20)

/* Makes the first `need` bytes (or the whole frame, when shorter) readable in place. */
INLINE int headers(struct __sk_buff *skb, __u32 need) {
    if ((void *)(long)skb->data + need <= (void *)(long)skb->data_end)
        return 0;
    return bpf_skb_pull_data(skb, skb->len < need ? skb->len : need) < 0 ? -1 : 0;
}

/* BPF_F_IPV6 (Linux 6.16): an IPv6 pseudo-header change leaves a device-computed checksum
 * (CHECKSUM_COMPLETE) as it is, the addresses' change in the header making up for it. Older
 * kernels refuse the flag (then asked without it). */
#define F_IPV6 (1ULL << 7)

/* Rewrites a translated flow's frame as its packets leave (`w`; headers pulled, IP without
 * options or extension headers), its checksums through the kernel's helpers, which keep the
 * buffer's checksum state right (a checksum left to offload holds the pseudo-header sum only;
 * one the device computed covers the packet). -1 when a helper fails. */
INLINE int rewrite(struct __sk_buff *skb, __u8 family, __u8 proto, struct rewrite *w) {
    __u32 l4 = 14 + (family == AF_INET ? 20 : 40);
    if (family == AF_INET) {
        if (bpf_skb_store_bytes(skb, 14 + 12, &w->src[0], 4, 0) < 0 ||
            bpf_skb_store_bytes(skb, 14 + 16, &w->dst[0], 4, 0) < 0 ||
            bpf_l3_csum_replace(skb, 14 + 10, 0, w->addr_diff, 0) < 0)
            return -1;
    } else if (bpf_skb_store_bytes(skb, 14 + 8, w->src, 16, 0) < 0 ||
               bpf_skb_store_bytes(skb, 14 + 24, w->dst, 16, 0) < 0) {
        return -1;
    }
    __u64 m0 = proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
    __u32 coff = proto == IPPROTO_TCP ? 16 : proto == IPPROTO_UDP ? 6 : 2;
    if (proto != IPPROTO_ICMP) {
        /* The pseudo-header's addresses: TCP, UDP, ICMPv6. */
        __u64 fl = BPF_F_PSEUDO_HDR | m0;
        if (bpf_l4_csum_replace(skb, l4 + coff, 0, w->addr_diff, fl | (family == AF_INET6 ? F_IPV6 : 0)) < 0 &&
            (family == AF_INET || bpf_l4_csum_replace(skb, l4 + coff, 0, w->addr_diff, fl) < 0))
            return -1;
    }
    if (bpf_l4_csum_replace(skb, l4 + coff, 0, w->port_diff, m0) < 0)
        return -1;
    if (proto == IPPROTO_TCP || proto == IPPROTO_UDP)
        return bpf_skb_store_bytes(skb, l4, &w->ports, 4, 0) < 0 ? -1 : 0;
    /* An echo's identifier (bytes 2 and 3 of the key word, 4 and 5 of the header). */
    return bpf_skb_store_bytes(skb, l4 + 4, (__u8 *)&w->ports + 2, 2, 0) < 0 ? -1 : 0;
}

/* The FIB's question as the caller filled it. */
INLINE long fib_ask(struct __sk_buff *skb, struct bpf_fib_lookup *p) {
    /* tot_len left 0: the helper then checks the buffer against the egress MTU as the kernel
     * forwards it (a GSO packet by its segments). */
    return bpf_fib_lookup(skb, p, sizeof(*p), 0);
}

INLINE void fib_fill(__u32 ifindex, __u8 family, void *l3, struct bpf_fib_lookup *p) {
    p->ifindex = ifindex;
    if (family == AF_INET) {
        struct iphdr *ip = l3;
        p->family = AF_INET;
        p->tos = ip->tos;
        p->l4_protocol = ip->protocol;
        p->ipv4_src = ip->saddr;
        p->ipv4_dst = ip->daddr;
    } else {
        struct ipv6hdr *ip6 = l3;
        p->family = AF_INET6;
        p->flowinfo = *(__be32 *)ip6 & htonl(0x0fffffff);
        p->l4_protocol = ip6->nexthdr;
        __builtin_memcpy(p->ipv6_src, &ip6->saddr, 16);
        __builtin_memcpy(p->ipv6_dst, &ip6->daddr, 16);
    }
}

/* The FIB's question for the IP header at `l3` (validated by the caller). */
INLINE long fib(struct __sk_buff *skb, __u32 ifindex, __u8 family, void *l3, struct bpf_fib_lookup *p) {
    fib_fill(ifindex, family, l3, p);
    return fib_ask(skb, p);
}

/* Whether xpfd gave this frame back to the kernel (bpf/inject.c marks it in the metadata):
 * one to a translation target that belonged to no translation, which must not go to xpfd
 * again. */
INLINE int given_back(struct __sk_buff *skb) {
    void *meta = (void *)(long)skb->data_meta;
    void *data = (void *)(long)skb->data;
    return meta + 4 <= data && *(__u32 *)meta == XPF_GIVEN_BACK;
}

/* The frame to xpfd, or to the kernel when the FIB says it is for this host and it goes to
 * no translation target (`c`: its flow key, `frag`: an IPv4 fragment). `ifindex`: where it
 * came in (read once: clang would keep a pointer into the context, which the verifier
 * refuses). */
INLINE int to_xpfd(struct __sk_buff *skb, __u32 ifindex, __u8 family, struct cand *c, int frag) {
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    void *l3 = data + 14;
    if (l3 + (family == AF_INET ? 20 : 40) > end)
        return TC_ACT_OK;
    struct bpf_fib_lookup p = {};
    long rc = fib(skb, ifindex, family, l3, &p);
    if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
        /* Not forwarded: replies to a `nat-to` address of this host, port forwardings to it,
         * a translated prefix with no route of its own go to xpfd (as in the steering
         * program); the rest is the kernel's, as in XDP mode: for this host, over the egress
         * MTU (the kernel answers "too big"), unroutable (it answers "unreachable"). xpfd's
         * netdev table drops what the kernel would forward. */
        if (rc != BPF_FIB_LKUP_RET_FRAG_NEEDED && nat_target(&p, c, family, frag)) {
            if (given_back(skb)) {
                count(&skb_stats, K_GIVEN_BACK);
                return TC_ACT_OK;
            }
            count(&skb_stats, K_NAT_LOCAL);
        } else {
            count(&skb_stats, rc == BPF_FIB_LKUP_RET_NOT_FWDED ? K_HOST :
                              rc == BPF_FIB_LKUP_RET_FRAG_NEEDED ? K_MTU : K_NO_ROUTE);
            return TC_ACT_OK;
        }
    }
    struct divert *d = bpf_map_lookup_elem(&divert, &ifindex);
    if (!d) {
        count(&skb_stats, K_NO_DIVERT);
        return TC_ACT_OK;
    }
    /* candidate() parsed a TCP header only where it follows the IP header directly. */
    if (d->syn && c->proto == IPPROTO_TCP) {
        data = (void *)(long)skb->data;
        end = (void *)(long)skb->data_end;
        if (tcp_syn(IPPROTO_TCP, data + 14 + (family == AF_INET ? 20 : 40), end)) {
            count(&skb_stats, K_SYN_LANE);
            return bpf_redirect(d->syn, BPF_F_INGRESS);
        }
    }
    count(&skb_stats, K_TO_XPFD);
    return bpf_redirect(d->rx, BPF_F_INGRESS);
}

/* The flow's entry stops matching: its frames go to xpfd again. */
INLINE void reroute(__u8 family, __u32 e) {
    if (family == AF_INET) {
        struct flow4 *f = bpf_map_lookup_elem(&flows4, &e);
        if (f)
            *(volatile __u32 *)&f->t.out_if = 0;
    } else {
        struct flow6 *f = bpf_map_lookup_elem(&flows6, &e);
        if (f)
            *(volatile __u32 *)&f->t.out_if = 0;
    }
    count(&skb_stats, K_REROUTED);
}

/* A fast-path frame out of `out_if`, while the FIB still routes it there; a translated
 * flow's (`xl`) rewritten first, the FIB asked with the addresses it leaves with. */
INLINE int forward(struct __sk_buff *skb, __u32 ifindex, __u8 family, __u32 out_if, __u32 entry, struct cand *c,
                   int xl) {
    /* A sender's TCP segment reaches the firewall as a clone sharing its buffer with the
     * sender's retransmission queue. The buffer goes on as it is (the program's writes below
     * make the header private where it is shared, as tc's direct writes do): copying the head
     * every time (bpf_skb_change_head, as ip_forward's skb_cow can) let the receiver coalesce
     * 2-4x more segments but cost forwarded TCP 6-18% (docs/xpfd.md). */
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) + (family == AF_INET ? 20 : 40) > end)
        return TC_ACT_OK;
    struct bpf_fib_lookup p = {};
    struct rewrite w = {};
    fib_fill(ifindex, family, eth + 1, &p);
    if (xl) {
        if (rewrite_of(family, entry, &w) < 0)
            return to_xpfd(skb, ifindex, family, c, 0);
        fib_rewritten(&p, family, &w);
    }
    long rc = fib_ask(skb, &p);
    if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED && !xl) {
        /* Too big for the egress: the kernel answers "too big" and drops it (its netdev
         * table drops what it would fragment and forward). A translated flow's goes to xpfd,
         * which answers with the addresses the sender knows. */
        count(&skb_stats, K_MTU);
        return TC_ACT_OK;
    }
    if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) || p.ifindex != out_if) {
        if (rc != BPF_FIB_LKUP_RET_FRAG_NEEDED)
            reroute(family, entry);
        return to_xpfd(skb, ifindex, family, c, 0);
    }
    data = (void *)(long)skb->data;
    end = (void *)(long)skb->data_end;
    if (hop_down(family, data + 14, end) < 0)
        return TC_ACT_OK;
    if (xl) {
        if (rewrite(skb, family, c->proto, &w) < 0) {
            count(&skb_stats, K_REWRITE_FAILED);
            return TC_ACT_SHOT;
        }
        count(&skb_stats, K_TRANSLATED);
    }
    if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
        /* The kernel resolves the next hop and sends the frame when it can. */
        struct bpf_redir_neigh nh = {};
        if (family == AF_INET) {
            nh.nh_family = AF_INET;
            nh.ipv4_nh = p.ipv4_dst;
        } else {
            nh.nh_family = AF_INET6;
            __builtin_memcpy(nh.ipv6_nh, p.ipv6_dst, 16);
        }
        count(&skb_stats, K_NEIGH);
        return bpf_redirect_neigh(p.ifindex, &nh, sizeof(nh), 0);
    }
    /* The helpers above may have moved the buffer: its pointers again. */
    data = (void *)(long)skb->data;
    end = (void *)(long)skb->data_end;
    eth = data;
    if ((void *)(eth + 1) > end)
        return TC_ACT_SHOT;
    __builtin_memcpy(eth->h_dest, p.dmac, 6);
    __builtin_memcpy(eth->h_source, p.smac, 6);
    count(&skb_stats, K_FAST);
    return bpf_redirect(p.ifindex, 0);
}

SEC("tc")
int xpf_skb(struct __sk_buff *skb) {
    __u32 ifindex = skb->ifindex;
    __u32 pt = skb->pkt_type;
    if (pt != 0 || skb->vlan_present) {
        /* Another host's MAC: the kernel drops it (PACKET_OTHERHOST), never forwarded. */
        count(&skb_stats, pt == PACKET_OTHERHOST ? K_OTHERHOST : K_KERNEL);
        return TC_ACT_OK;
    }
    if (headers(skb, NEED4) < 0)
        return TC_ACT_OK;
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    if (data + 14 > end)
        return TC_ACT_OK;
    __u16 proto = ((struct ethhdr *)data)->h_proto;
    struct cand c = {};
    __u8 family;
    int frag = 0;
    if (proto == htons(ETH_P_IP)) {
        struct iphdr *ip = data + 14;
        if ((void *)(ip + 1) > end)
            return TC_ACT_OK;
        if (ip->ttl <= 1) {
            count(&skb_stats, K_KERNEL);
            return TC_ACT_OK;
        }
        family = AF_INET;
        frag = (ip->frag_off & htons(0x3fff)) != 0;
        __u32 tot = bswap16(ip->tot_len);
        if (ip->ihl == 5 && !(ip->frag_off & htons(0x3fff)) && tot > 20) {
            c.src[0] = ip->saddr;
            c.dst[0] = ip->daddr;
            candidate(&c, ip->protocol, (void *)(ip + 1), end, tot - 20, 0);
        }
    } else if (proto == htons(ETH_P_IPV6)) {
        if (headers(skb, NEED6) < 0)
            return TC_ACT_OK;
        data = (void *)(long)skb->data;
        end = (void *)(long)skb->data_end;
        struct ipv6hdr *ip6 = data + 14;
        if ((void *)(ip6 + 1) > end)
            return TC_ACT_OK;
        __u8 *l4 = (void *)(ip6 + 1);
        if (ip6->hop_limit <= 1 ||
            (ip6->nexthdr == ICMPV6 && (void *)(l4 + 1) <= end && l4[0] >= 133 && l4[0] <= 137)) {
            count(&skb_stats, K_KERNEL);
            return TC_ACT_OK;
        }
        family = AF_INET6;
        __builtin_memcpy(c.src, &ip6->saddr, 16);
        __builtin_memcpy(c.dst, &ip6->daddr, 16);
        candidate(&c, ip6->nexthdr, l4, end, bswap16(ip6->payload_len), 0);
    } else {
        count(&skb_stats, K_KERNEL);
        return TC_ACT_OK;
    }
    if (!c.proto)
        return to_xpfd(skb, ifindex, family, &c, frag);
    __u32 at = 0;
    __u8 x = 0;
    struct fast_tail *t = find(family, &c, &at, &x);
    if (!t)
        return to_xpfd(skb, ifindex, family, &c, frag);
    __u32 out_if = *(volatile __u32 *)&t->out_if;
    if (t->in_if != ifindex || !out_if)
        return to_xpfd(skb, ifindex, family, &c, frag);
    if (c.proto == IPPROTO_TCP) {
        /* candidate() saw the whole TCP header (it reads its checksum). */
        __u8 *th = data + 14 + (family == AF_INET ? 20 : 40);
        if (tcp_check(family, t, th, end, c.l4len) < 0)
            return to_xpfd(skb, ifindex, family, &c, frag);
    }
    /* The IP length, as pf and the engine count a packet's bytes (skb->len holds the
     * Ethernet header, and a short frame's padding). */
    __sync_fetch_and_add(&t->packets, 1);
    __sync_fetch_and_add(&t->bytes, c.l4len + (family == AF_INET ? 20 : 40));
    return forward(skb, ifindex, family, out_if, at, &c, x & X_XLAT);
}

/* At the ingress of xpfd's ifb devices: their frames were for xpfd's packet socket only,
 * which saw them before this hook. */
SEC("tc/drop")
int xpf_drop(struct __sk_buff *skb) {
    return TC_ACT_SHOT;
}
