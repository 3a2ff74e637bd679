/* xpf's steering program, attached to every interface xpfd filters.
 *
 * The kernel keeps the FIB and the neighbour tables (configured with `ip route`, `ip neigh`,
 * kept current by the kernel itself); this program asks them, with bpf_fib_lookup, where each
 * IPv4/IPv6 packet would be forwarded, writes the answer in front of the frame and redirects
 * the frame to xpfd's AF_XDP socket on this queue. xpfd filters it `in` on this interface and
 * `out` on the egress one, and transmits it itself.
 *
 * A unicast frame addressed to another host's MAC (flooded by a switch, or seen by a backup
 * firewall before it is master) is not forwarded: it goes up the stack, which drops it as
 * PACKET_OTHERHOST, counted here. xpfd writes each interface's MAC in map `ifmacs`.
 *
 * Everything the kernel must see goes up the stack (XDP_PASS): non-IP (ARP, LLDP...), IPv6
 * neighbour discovery, traffic to the box itself, TTL/hop limit about to expire (so the kernel
 * sends the ICMP time exceeded a traceroute needs), too big for the egress MTU (the kernel
 * sends the ICMP error), and what the FIB does not route. Forwardable traffic with no xpfd
 * socket on its queue is dropped and counted: the firewall fails closed.
 *
 * Fast path (xpfd --fastpath): flows whose `in` and `out` states xpfd holds are written by
 * xpfd into tables `flows4`/`flows6` (memory it maps; see struct flow4). Their packets are
 * forwarded here, in the kernel (MACs from the FIB, TTL/hop limit decremented, XDP_REDIRECT
 * to the egress interface), counted per flow for xpfd to carry into its states, and never
 * reach userspace. Only while they come in where the `in` state is and the FIB still routes
 * them out where the `out` state is. UDP once its states have seen two packets; TCP once
 * both peers are ESTABLISHED, each segment checked as pf checks it (sequence and ack windows
 * with window scaling, pf_tcp_track_full) and the windows slid: a segment outside them, a
 * SYN, FIN or RST, or one without ACK goes to xpfd, which judges it with the windows as this
 * program left them (frame metadata says the flow has an entry). A checksum its sender left
 * to offload (veth, tun/tap: the field holds the pseudo-header sum) is finished here, since
 * a redirected frame reaches the receiver as it is (up to 1,504 bytes of transport; longer
 * ones go to xpfd). A translated flow's entry has a rewrite record beside it (fast.h: xlats4,
 * xlats6): the FIB is asked with the addresses its packets leave with, and they leave
 * rewritten (a reply to a `nat-to` address of this host comes through the translation
 * targets' branch). IPv4 options and fragments, IPv6 extension headers and every other
 * protocol go to xpfd as before. With state sync on, a TCP segment goes to xpfd every
 * `pace` counts (a segment counts one, its payload one per 256 bytes: the engine's pacing
 * of pfsync updates), so the standby's windows stay as current as with every segment in xpfd.
 *
 * New connections queue apart: a TCP SYN (without ACK) goes to xpfd's second socket on the
 * queue (map `xsks` at SYN_LANE + queue in the interface's slot, sharing the first's frames)
 * when xpfd opened one. xpfd serves that socket after the first, so a SYN flood fills and
 * overflows only its own ring (the kernel counts the drops) while the segments of
 * established connections keep theirs. */
#include "fast.h"
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/icmpv6.h>

/* IEEE 802 local experimental ethertype: xpfd's egress probe frames. */
#define PROBE_ETHERTYPE 0x88b5

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* One program serves every interface xpfd filters, each in its slot (0..SLOTS-1, from
 * `ifmacs`): queue q's socket at SLOT_XSKS * slot + q, its socket for new connections at
 * SLOT_XSKS * slot + SYN_LANE + q; its counters at S_N * slot in steer_stats. (Loaded once,
 * the program is verified once, not once per interface.) */
#define SLOTS 32
#define SYN_LANE 64
#define SLOT_XSKS (2 * SYN_LANE)
struct xpf_map xsks SEC("maps") = { BPF_MAP_TYPE_XSKMAP, 4, 4, SLOTS * SLOT_XSKS, 0 };

/* ifindex -> the interface's MAC in the low six bytes (as they are in the frame), its slot in
 * the seventh. */
struct xpf_map ifmacs SEC("maps") = { BPF_MAP_TYPE_HASH, 4, 8, 256, 0 };

/* steer_stats slots (src/steer.rs names them). */
enum { S_NOT_IP, S_LOCAL, S_TTL, S_NO_ROUTE, S_MTU, S_TO_XSK, S_NO_SOCKET, S_ND, S_FAST, S_OTHERHOST, S_SYN_LANE,
       S_NAT_LOCAL, S_TRANSLATED, S_N };
struct xpf_map steer_stats SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, SLOTS * S_N, 0 };
#define COUNT(i) count(&steer_stats, slot * S_N + (i))

/* The receiving interface's slot, or -1 when xpfd has not written it (yet). */
INLINE int if_slot(struct xdp_md *ctx, __u64 *mac) {
    __u32 i = ctx->ingress_ifindex;
    __u64 *v = bpf_map_lookup_elem(&ifmacs, &i);
    if (!v)
        return -1;
    *mac = *v & 0xffffffffffffULL;
    __u32 slot = (*v >> 48) & 0xff;
    return slot < SLOTS ? (int)slot : -1;
}

/* Whether a unicast frame is addressed to another host (not this interface's MAC). */
INLINE int other_host(struct ethhdr *eth, __u64 mac) {
    if (eth->h_dest[0] & 1)
        return 0; /* broadcast, multicast */
    __u64 d = 0;
    __builtin_memcpy(&d, eth->h_dest, 6);
    return d != mac;
}

#define FINISH_MAX 1504

/* Finishes a TCP/UDP checksum left to offload: with the pseudo-header sum in the field, the
 * sum of the `len` transport bytes as they are (field included) is the whole sum. 16 bytes a
 * step (two 64-bit loads, added as 32-bit halves into 64 bits, so nothing carries out), then
 * the last len % 16 from l4 + (len & ~15): an offset the verifier knows only as a range, so it
 * walks that tail once per path into here and not once per step the loop may end on (with
 * 4-byte steps and the tail after the loop's pointer, this function was 40% of the 822,084
 * instructions the verifier processed for the whole program). The result is in memory order,
 * as the field is. 0 done, -1 when it cannot (too long, short). */
INLINE int l4_finish(__u8 *l4, void *end, __u32 len, __u32 coff) {
    if (len < 8 || len > FINISH_MAX || (void *)(l4 + 18) > end)
        return -1;
    __u64 s = 0;
    __u8 *q = l4;
    __u32 blocks = len / 16;
    for (__u32 i = 0; i < FINISH_MAX / 16; i++) {
        if (i >= blocks)
            break;
        /* Opaque to clang: it would merge the bound checks, and the verifier needs each. */
        asm volatile("" : "+r"(q));
        if ((void *)(q + 16) > end)
            return -1;
        __u64 a = *(__u64 *)q, b = *(__u64 *)(q + 8);
        s += (a & 0xffffffff) + (a >> 32) + (b & 0xffffffff) + (b >> 32);
        q += 16;
    }
    __u32 tail = len & 15;
    __u8 *r = l4 + (len & ~15u);
    asm volatile("" : "+r"(r));
    if (tail >= 4) {
        if ((void *)(r + 4) > end)
            return -1;
        s += *(__u32 *)r;
    }
    if (tail >= 8) {
        if ((void *)(r + 8) > end)
            return -1;
        s += *(__u32 *)(r + 4);
    }
    if (tail >= 12) {
        if ((void *)(r + 12) > end)
            return -1;
        s += *(__u32 *)(r + 8);
    }
    __u32 rest = tail & 3, w = 0;
    if (rest) {
        __u8 *b = r + (tail & 12);
        asm volatile("" : "+r"(b));
        if ((void *)(b + 1) > end)
            return -1;
        w = b[0];
        if (rest > 1) {
            if ((void *)(b + 2) > end)
                return -1;
            w |= (__u32)b[1] << 8;
        }
        if (rest > 2) {
            if ((void *)(b + 3) > end)
                return -1;
            w |= (__u32)b[2] << 16;
        }
    }
    s += w;
    s = (s & 0xffffffff) + (s >> 32);
    s = (s & 0xffffffff) + (s >> 32);
    __u16 c = ~fold((__u32)s);
    if (coff == 6) {
        *(__u16 *)(l4 + 6) = c ? c : 0xffff; /* UDP: 0 means none */
    } else {
        *(__u16 *)(l4 + 16) = c;
    }
    return 0;
}

/* What xpfd finds in front of each frame (src/steer.rs: Meta). */
struct meta {
    __u8 kind;          /* 1: forward (MACs valid), 2: neighbour not resolved yet,
                         * 3: for this host, to a translation target (no route) */
    __u8 family;        /* AF_INET / AF_INET6 */
    __u8 fast;          /* 1: the flow has a live fast-path entry (the program handed it on) */
    __u8 pad;
    __u32 ifindex;      /* egress interface */
    __u8 dmac[6];
    __u8 smac[6];
    __u32 nexthop[4];   /* next hop (IPv4 in nexthop[0]), network order */
} __attribute__((packed));

#define META_LEN 36

INLINE int to_xsk(struct xdp_md *ctx, __u32 slot, struct bpf_fib_lookup *p, int rc, __u8 family, int syn,
                  int fast) {
    if (bpf_xdp_adjust_head(ctx, -META_LEN))
        return XDP_PASS;
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct meta *m = data;
    if ((void *)(m + 1) > end)
        return XDP_DROP;
    m->kind = rc == BPF_FIB_LKUP_RET_SUCCESS ? 1 : rc == BPF_FIB_LKUP_RET_NO_NEIGH ? 2 : 3;
    m->family = family;
    m->fast = fast;
    m->pad = 0;
    m->ifindex = p->ifindex;
    __builtin_memcpy(m->dmac, p->dmac, 6);
    __builtin_memcpy(m->smac, p->smac, 6);
    __builtin_memcpy(m->nexthop, p->ipv6_dst, 16);
    COUNT(S_TO_XSK);
    if (syn) {
        long l = bpf_redirect_map(&xsks, SLOT_XSKS * slot + SYN_LANE + ctx->rx_queue_index, 0);
        if (l == XDP_REDIRECT) {
            COUNT(S_SYN_LANE);
            return XDP_REDIRECT;
        }
    }
    long r = bpf_redirect_map(&xsks, SLOT_XSKS * slot + ctx->rx_queue_index, 0);
    if (r != XDP_REDIRECT)
        COUNT(S_NO_SOCKET);
    return r == XDP_REDIRECT ? XDP_REDIRECT : XDP_DROP;
}

/* Rewrites a translated flow's packet (`w`) in place, with its checksums by RFC 1624: the IPv4
 * header's, and the transport's (a checksum left to offload holds only the pseudo-header sum:
 * the addresses' difference alone). -1 when the headers are not all there. */
INLINE int rewrite(void *l3, void *end, __u8 family, struct cand *c, struct rewrite *w) {
    __u8 *l4 = l3 + (family == AF_INET ? 20 : 40);
    /* Every bound first: nothing is written unless all of it is. */
    if ((void *)(l4 + (c->proto == IPPROTO_TCP ? 18 : 8)) > end)
        return -1;
    if (family == AF_INET) {
        struct iphdr *ip = l3;
        if ((void *)(ip + 1) > end)
            return -1;
        ip->saddr = w->src[0];
        ip->daddr = w->dst[0];
        ip->check = ~fold((__u16)~ip->check + (__u32)w->addr_diff);
    } else {
        struct ipv6hdr *ip6 = l3;
        if ((void *)(ip6 + 1) > end)
            return -1;
        __builtin_memcpy(&ip6->saddr, w->src, 16);
        __builtin_memcpy(&ip6->daddr, w->dst, 16);
    }
    __u16 *check;
    __u32 diff = w->port_diff;
    if (c->proto == IPPROTO_TCP) {
        check = (__u16 *)(l4 + 16);
    } else {
        check = (__u16 *)(l4 + (c->proto == IPPROTO_UDP ? 6 : 2));
    }
    if (c->proto != IPPROTO_ICMP)
        diff += w->addr_diff;
    if (c->partial) {
        *check = fold((__u32)*check + w->addr_diff);
    } else if (c->proto != IPPROTO_UDP || *check || family == AF_INET6) {
        __u16 n = ~fold((__u16)~*check + diff);
        *check = c->proto == IPPROTO_UDP && !n ? 0xffff : n;
    }
    if (c->proto == IPPROTO_TCP || c->proto == IPPROTO_UDP) {
        *(__u32 *)l4 = w->ports;
    } else {
        /* An echo's identifier: bytes 2 and 3 of the key word, 4 and 5 of the header. */
        *(__u16 *)(l4 + 4) = w->ports >> 16;
    }
    return 0;
}

/* Forwards the packet in the kernel if it belongs to a fast-path flow (or the program is in
 * bare mode); -1 when it does not. `p`, `rc`: the FIB's answer for the packet as it came. A
 * translated flow's packet is rewritten first, the FIB asked again with the addresses it
 * leaves with (a reply to a `nat-to` address reaches here through the branch for this host's
 * translation targets). Sets *found when the flow has a live entry. */
INLINE int fast_path(struct xdp_md *ctx, __u32 slot, struct bpf_fib_lookup *p, long rc, struct cand *c, __u8 family, __u32 len,
                     int *found) {
    struct fast_tail *t = 0;
    __u32 l3 = family == AF_INET ? 20 : 40;
    /* Filled only for a translated flow (no stores on the others' path). */
    struct bpf_fib_lookup q;
    struct rewrite w;
    __u8 x = 0;
    if (cfg(C_BARE) != 1) {
        if (!c->proto)
            return -1;
        __u32 at = 0;
        t = find(family, c, &at, &x);
        if (!t)
            return -1;
        *found = 1;
        if (t->in_if != ctx->ingress_ifindex)
            return -1;
        if (x & X_XLAT) {
            if (rewrite_of(family, at, &w) < 0)
                return -1;
            __builtin_memset(&q, 0, sizeof(q));
            q.family = p->family;
            q.tos = p->tos;
            q.flowinfo = p->flowinfo;
            q.l4_protocol = c->proto;
            q.tot_len = len;
            q.ifindex = ctx->ingress_ifindex;
            fib_rewritten(&q, family, &w);
            rc = bpf_fib_lookup(ctx, &q, sizeof(q), 0);
            p = &q;
        }
        if (rc != BPF_FIB_LKUP_RET_SUCCESS || t->out_if != p->ifindex)
            return -1;
        if (c->partial && c->l4len > FINISH_MAX)
            return -1;
        if (c->proto == IPPROTO_TCP) {
            void *data = (void *)(long)ctx->data;
            void *end = (void *)(long)ctx->data_end;
            if (tcp_check(family, t, data + sizeof(struct ethhdr) + l3, end, c->l4len) < 0)
                return -1;
        }
    } else if (rc != BPF_FIB_LKUP_RET_SUCCESS) {
        return -1;
    }
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) + l3 > end)
        return -1;
    /* A checksum left to offload is finished last (after the rewrite moved its pseudo-header
     * sum), with little else live: the verifier walks its loop once per family and protocol,
     * not once per path here. What could make it fail is checked before anything is written. */
    int finish = t && c->partial;
    if (finish && (void *)(eth + 1) + l3 + (c->l4len > 18 ? c->l4len : 18) > end)
        return -1;
    if (x & X_XLAT) {
        if (rewrite(eth + 1, end, family, c, &w) < 0)
            return -1;
        COUNT(S_TRANSLATED);
    }
    if (hop_down(family, eth + 1, end) < 0)
        return finish || (x & X_XLAT) ? XDP_DROP : -1;
    __builtin_memcpy(eth->h_dest, p->dmac, 6);
    __builtin_memcpy(eth->h_source, p->smac, 6);
    if (t) {
        __sync_fetch_and_add(&t->packets, 1);
        __sync_fetch_and_add(&t->bytes, len);
    }
    COUNT(S_FAST);
    __u32 out = p->ifindex;
    if (finish) {
        __u32 coff = c->proto == IPPROTO_UDP ? 6 : 16;
        __u32 l4len = c->l4len;
        data = (void *)(long)ctx->data;
        end = (void *)(long)ctx->data_end;
        if (l4_finish(data + sizeof(struct ethhdr) + l3, end, l4len, coff) < 0)
            return XDP_DROP;
    }
    return bpf_redirect(out, 0);
}

INLINE int verdict(struct xdp_md *ctx, __u32 slot, struct bpf_fib_lookup *p, long rc, __u8 family, struct cand *c, __u32 len,
                   int syn, int frag) {
    /* Forwarded, or for this host (which a translated flow's entry may take: a reply to a
     * `nat-to` address of this host, a port forwarded from it). */
    int local = rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH &&
                rc != BPF_FIB_LKUP_RET_FRAG_NEEDED;
    if (local || rc == BPF_FIB_LKUP_RET_SUCCESS) {
        /* One call site: the verifier walks the fast path once. The flow tables are asked
         * before the translation targets: what those say then leads only to the short path
         * to xpfd's socket, and the verifier does not walk the fast path once for each way
         * they can answer (it did: 60% of the instructions it processed). */
        int found = 0;
        int r = fast_path(ctx, slot, p, rc, c, family, len, &found);
        if (r >= 0)
            return r;
        if (!local)
            return to_xsk(ctx, slot, p, rc, family, syn, found);
        if (nat_target(p, c, family, frag)) {
            COUNT(S_NAT_LOCAL);
            return to_xsk(ctx, slot, p, -1, family, syn, found);
        }
    }
    switch (rc) {
    case BPF_FIB_LKUP_RET_NO_NEIGH:
        return to_xsk(ctx, slot, p, rc, family, syn, 0);
    case BPF_FIB_LKUP_RET_FRAG_NEEDED:
        COUNT(S_MTU);
        return XDP_PASS;
    case BPF_FIB_LKUP_RET_NOT_FWDED:
        COUNT(S_LOCAL);
        return XDP_PASS;
    default:
        COUNT(S_NO_ROUTE);
        return XDP_PASS;
    }
}

/* xpfd's transmit through XDP. The frames a worker sends out of one of its ports (an
 * interface's queue) wait in that port's lane of `tx_slots` (memory xpfd maps: its length,
 * the egress ifindex, the frame); a flush runs this program with BPF_PROG_TEST_RUN in
 * live-frame mode, once per frame, on an input frame whose metadata names the batch. Each
 * run copies its slot into the live frame and redirects it to the egress: the frames leave
 * in XDP bulk (ndo_xdp_xmit), where AF_XDP's copy mode builds a socket buffer for each (and
 * a veth's XDP receiver copies each again). The runs name C_TXDEV as their receiving
 * interface: one the program is attached to for no traffic (xpfd gives loopback's), so no
 * received frame takes this branch. A per-CPU cursor numbers the frames of a run (a run of
 * at most TX_LANE frames is one batch: one CPU, softirqs off); the metadata's key must match
 * C_TXKEY, else the frame is dropped (a live frame's page reused by the same run keeps the
 * metadata it was given, but nothing else is trusted). */
#define TX_SLOT 2048
#define TX_DATA (TX_SLOT - 8)
#define TX_LANE 128
struct tx_slot {
    __u32 len;
    __u32 ifindex;
    __u8 data[TX_DATA];
};
struct tx_meta {
    __u32 key, run, first, count;
};
struct tx_cursor {
    __u32 run, first, next, pad;
};
/* Sized by xpfd: TX_LANE slots for each port. */
struct xpf_map tx_slots SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, TX_SLOT, 1, BPF_F_MMAPABLE };
struct xpf_map tx_cursor SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, sizeof(struct tx_cursor), 1, 0 };

static long (*bpf_xdp_adjust_meta)(struct xdp_md *ctx, int delta) = (void *)BPF_FUNC_xdp_adjust_meta;
static long (*bpf_xdp_adjust_tail)(struct xdp_md *ctx, int delta) = (void *)BPF_FUNC_xdp_adjust_tail;
static long (*bpf_xdp_store_bytes)(struct xdp_md *ctx, __u32 off, void *buf, __u32 len) =
    (void *)BPF_FUNC_xdp_store_bytes;

INLINE int tx_batch(struct xdp_md *ctx) {
    struct tx_meta *m = (void *)(long)ctx->data_meta;
    if ((void *)(m + 1) > (void *)(long)ctx->data)
        return XDP_DROP;
    __u32 key = cfg(C_TXKEY);
    if (!key || m->key != key || m->count > TX_LANE)
        return XDP_DROP;
    __u32 zero = 0;
    struct tx_cursor *c = bpf_map_lookup_elem(&tx_cursor, &zero);
    if (!c)
        return XDP_DROP;
    if (c->run != m->run || c->first != m->first) {
        c->run = m->run;
        c->first = m->first;
        c->next = 0;
    }
    __u32 i = c->next;
    if (i >= m->count)
        return XDP_DROP;
    c->next = i + 1;
    __u32 k = m->first + i;
    struct tx_slot *s = bpf_map_lookup_elem(&tx_slots, &k);
    if (!s)
        return XDP_DROP;
    __u32 len = s->len, to = s->ifindex;
    if (len < ETH_HLEN || len > TX_DATA)
        return XDP_DROP;
    /* The input frame is ETH_HLEN bytes past its metadata (xpfd's TX_INPUT). */
    if (bpf_xdp_adjust_meta(ctx, sizeof(*m)) || bpf_xdp_adjust_tail(ctx, (int)len - ETH_HLEN) ||
        bpf_xdp_store_bytes(ctx, 0, s->data, len))
        return XDP_DROP;
    return bpf_redirect(to, 0);
}

SEC("xdp")
int xpf_steer(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return XDP_PASS;
    __u64 mac = 0;
    int found = if_slot(ctx, &mac);
    if (found < 0) {
        __u32 txdev = cfg(C_TXDEV);
        if (txdev && ctx->ingress_ifindex == txdev)
            return tx_batch(ctx);
        return XDP_PASS; /* not (yet) an interface xpfd filters: the kernel's */
    }
    __u32 slot = found;
    if (other_host(eth, mac)) {
        COUNT(S_OTHERHOST);
        return XDP_PASS;
    }
    __u16 proto = eth->h_proto;
    struct bpf_fib_lookup p = {};
    p.ifindex = ctx->ingress_ifindex;
    if (proto == htons(ETH_P_IP)) {
        struct iphdr *ip = (void *)(eth + 1);
        if ((void *)(ip + 1) > end)
            return XDP_PASS;
        if (ip->ttl <= 1) {
            COUNT(S_TTL);
            return XDP_PASS;
        }
        p.family = AF_INET;
        p.tos = ip->tos;
        p.l4_protocol = ip->protocol;
        p.tot_len = bswap16(ip->tot_len);
        p.ipv4_src = ip->saddr;
        p.ipv4_dst = ip->daddr;
        struct cand c = {};
        /* No options, no fragments: a fast-path candidate. */
        if (ip->ihl == 5 && !(ip->frag_off & htons(0x3fff)) && p.tot_len > 20) {
            c.src[0] = ip->saddr;
            c.dst[0] = ip->daddr;
            __u32 ph = (ip->saddr >> 16) + (ip->saddr & 0xffff) + (ip->daddr >> 16) + (ip->daddr & 0xffff) +
                       htons(ip->protocol);
            candidate(&c, ip->protocol, (void *)(ip + 1), end, p.tot_len - 20, ph);
        }
        int syn = 0;
        if (!(ip->frag_off & htons(0x1fff))) {
            __u32 hl = (ip->ihl & 0xf) * 4;
            syn = hl >= 20 && tcp_syn(ip->protocol, (void *)ip + hl, end);
        }
        __u32 len = p.tot_len; /* the lookup reuses tot_len's bytes for the MTU */
        int frag = (ip->frag_off & htons(0x3fff)) != 0;
        return verdict(ctx, slot, &p, bpf_fib_lookup(ctx, &p, sizeof(p), 0), AF_INET, &c, len, syn, frag);
    }
    if (proto == htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = (void *)(eth + 1);
        if ((void *)(ip6 + 1) > end)
            return XDP_PASS;
        if (ip6->nexthdr == IPPROTO_ICMPV6) {
            struct icmp6hdr *ic = (void *)(ip6 + 1);
            if ((void *)(ic + 1) > end)
                return XDP_PASS;
            /* Router/neighbour solicitation and advertisement, redirect: the kernel's. */
            if (ic->icmp6_type >= 133 && ic->icmp6_type <= 137) {
                COUNT(S_ND);
                return XDP_PASS;
            }
        }
        if (ip6->hop_limit <= 1) {
            COUNT(S_TTL);
            return XDP_PASS;
        }
        p.family = AF_INET6;
        p.flowinfo = *(__be32 *)ip6 & htonl(0x0fffffff);
        p.l4_protocol = ip6->nexthdr;
        p.tot_len = bswap16(ip6->payload_len) + sizeof(*ip6);
        __builtin_memcpy(p.ipv6_src, &ip6->saddr, 16);
        __builtin_memcpy(p.ipv6_dst, &ip6->daddr, 16);
        struct cand c = {};
        __builtin_memcpy(c.src, &ip6->saddr, 16);
        __builtin_memcpy(c.dst, &ip6->daddr, 16);
        __u32 ph = htons(ip6->nexthdr);
        __u16 *a = (__u16 *)&ip6->saddr;
        for (int w = 0; w < 16; w++)
            ph += a[w];
        candidate(&c, ip6->nexthdr, (void *)(ip6 + 1), end, bswap16(ip6->payload_len), ph);
        int syn = tcp_syn(ip6->nexthdr, ip6 + 1, end);
        __u32 len = p.tot_len;
        return verdict(ctx, slot, &p, bpf_fib_lookup(ctx, &p, sizeof(p), 0), AF_INET6, &c, len, syn, 0);
    }
    /* xpfd's probe of an egress (run by xpfd with BPF_PROG_TEST_RUN while C_PROBE is set):
     * does the device take redirected frames? (A veth only when its peer runs NAPI.) */
    if (proto == htons(PROBE_ETHERTYPE)) {
        __u32 to = cfg(C_PROBE);
        __u32 *mark = (void *)(eth + 1);
        if (to && (void *)(mark + 1) <= end && *mark == cfg(C_COOKIE))
            return bpf_redirect(to, 0);
    }
    COUNT(S_NOT_IP);
    return XDP_PASS;
}
