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
 * ones go to xpfd). IPv4 options and fragments, IPv6 extension headers and every other
 * protocol go to xpfd as before. With state sync on, a TCP segment goes to xpfd every
 * `pace` counts (a segment counts one, its payload one per 256 bytes: the engine's pacing
 * of pfsync updates), so the standby's windows stay as current as with every segment in xpfd.
 *
 * New connections queue apart: a TCP SYN (without ACK) goes to xpfd's second socket on the
 * queue (map `xsks` at 64 + queue, sharing the first's frames) when xpfd opened one. xpfd
 * serves that socket after the first, so a SYN flood fills and overflows only its own ring
 * (the kernel counts the drops) while the segments of established connections keep theirs. */
#include "xpf.h"
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/icmpv6.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Queue q: xpfd's socket at q, its socket for new connections at SYN_LANE + q. */
#define SYN_LANE 64
struct xpf_map xsks SEC("maps") = { BPF_MAP_TYPE_XSKMAP, 4, 4, 2 * SYN_LANE, 0 };

/* A fast-path flow (one direction of a connection): the key, then `struct fast_tail`.
 * ctl: byte 0 the entry's state (F_*), byte 1 the protocol, byte 2 the xpfd worker that owns
 * it. xpfd claims an entry by compare-and-swap from F_EMPTY/F_DEAD, writes it while F_HELD
 * and publishes it F_LIVE; lookups probe FAST_PROBE entries from the key's hash and stop at
 * F_EMPTY. An entry xpfd takes back goes F_HELD (no longer matched), then F_DEAD once xpfd has
 * read it a last time. */
enum { F_EMPTY, F_LIVE, F_DEAD, F_HELD };
#define FAST_PROBE 16

struct fast_tail {
    __u64 bytes;
    __u32 packets;
    __u32 in_if;        /* where the `in` state is */
    __u32 out_if;       /* where the `out` state is: the FIB must still say so */
    __u32 slot;         /* the owner's record of the flow */
    /* TCP: pf's two peers as this direction sees them (src: this direction's sender).
     * Each field has one writer: a direction writes its sender's seqlo and max_win (here and
     * mirrored in the reverse entry) and its receiver's seqhi (in the reverse entry). */
    __u32 seqlo;        /* src.seqlo */
    __u32 seqhi;        /* src.seqhi (written by the reverse direction) */
    __u32 peer_seqlo;   /* dst.seqlo (written by the reverse direction) */
    __u16 max_win;      /* src.max_win */
    __u16 peer_max_win; /* dst.max_win (written by the reverse direction) */
    __u32 rev;          /* the reverse direction's entry */
    __u8 sws, dws;      /* window scale shifts (0 unless both sides scale) */
    __u16 unsynced;     /* sync counts since xpfd last saw a segment */
};

struct flow4 {
    __u32 ctl;
    __be32 src, dst;
    __u32 ports;        /* source and destination port as they are in the packet */
    struct fast_tail t;
};

struct flow6 {
    __u32 ctl;
    __u32 ports;
    __u32 src[4], dst[4];
    __u64 pad;
    struct fast_tail t;
    __u8 pad2[32];
};

_Static_assert(sizeof(struct fast_tail) == 48, "fast_tail");
_Static_assert(sizeof(struct flow4) == 64, "flow4: one cache line");
_Static_assert(sizeof(struct flow6) == 128, "flow6: two cache lines");

/* Sized by xpfd at load (a power of two; one entry without --fastpath), mapped by xpfd and
 * shared by the program of every interface. */
struct xpf_map flows4 SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct flow4), 1, BPF_F_MMAPABLE };
struct xpf_map flows6 SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct flow6), 1, BPF_F_MMAPABLE };
/* steer_cfg[C_BARE] = 1: forward everything routable here, unfiltered (the lab's measure of
 * the fast path's I/O ceiling; set only through xpfctl --steer bare). The others: the flow
 * tables' hash seed and index masks (0: fast path off), the sync pace (0: sync off), and
 * xpfd's egress probe (C_PROBE: an ifindex while a probe runs; C_COOKIE: its frames' mark).
 * Shared. */
enum { C_BARE, C_SEED, C_MASK4, C_MASK6, C_PACE, C_PROBE, C_COOKIE, C_N };
struct xpf_map steer_cfg SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, 4, C_N, 0 };
struct xpf_map steer_stats SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 12, 0 };
/* ifindex -> the interface's MAC in the low six bytes (as they are in the frame). */
struct xpf_map ifmacs SEC("maps") = { BPF_MAP_TYPE_HASH, 4, 8, 256, 0 };

/* Translation targets the kernel would not forward (the box's own addresses, mostly:
 * `nat-to (egress)`, a port forwarding to the public address; or a translated prefix routed
 * to the box): a packet to one goes to xpfd, which translates it when it belongs to a
 * translated state or a `rdr-to` rule, and gives it back to the kernel otherwise. xpfd
 * writes them from the rules. natnet: by longest prefix of (family, protocol, address), the
 * destination ports [lo, hi] that go to xpfd (ICMP: all); natport: one destination port of
 * one address (all zero: any address). Shared. */
struct natnet_key {
    __u32 prefixlen;    /* 32 (family, protocol, pad) + the address's prefix length */
    __u8 family;
    __u8 proto;
    __u16 pad;
    __u32 addr[4];
};
struct natport_key {
    __u8 family;
    __u8 proto;
    __u16 port;         /* host order */
    __u32 addr[4];
};
struct natval {
    __u16 lo, hi;
};
struct xpf_map natnet SEC("maps") = { BPF_MAP_TYPE_LPM_TRIE, sizeof(struct natnet_key), sizeof(struct natval), 4096,
                                      BPF_F_NO_PREALLOC };
struct xpf_map natport SEC("maps") = { BPF_MAP_TYPE_HASH, sizeof(struct natport_key), 4, 4096, 0 };

/* steer_stats slots (src/steer.rs names them). */
enum { S_NOT_IP, S_LOCAL, S_TTL, S_NO_ROUTE, S_MTU, S_TO_XSK, S_NO_SOCKET, S_ND, S_FAST, S_OTHERHOST, S_SYN_LANE,
       S_NAT_LOCAL, S_N };

/* Whether a unicast frame is addressed to another host (not this interface's MAC). */
INLINE int other_host(struct xdp_md *ctx, struct ethhdr *eth) {
    if (eth->h_dest[0] & 1)
        return 0; /* broadcast, multicast */
    __u32 i = ctx->ingress_ifindex;
    __u64 *mac = bpf_map_lookup_elem(&ifmacs, &i);
    if (!mac)
        return 1;
    __u64 d = 0;
    __builtin_memcpy(&d, eth->h_dest, 6);
    return d != *mac;
}

/* Folds a ones'-complement sum to 16 bits. Sums of raw (network-order) words fold to the
 * raw field value: the sum is the same in either byte order. */
INLINE __u16 fold(__u32 s) {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    return (__u16)s;
}

#define FINISH_MAX 1504

/* Finishes a TCP/UDP checksum left to offload: with the pseudo-header sum in the field, the
 * sum of the `len` transport bytes as they are (field included) is the whole sum. 32-bit
 * loads, summed in 64 bits and folded: the result is in memory order, as the field is.
 * 0 done, -1 when it cannot (too long, short). */
INLINE int l4_finish(__u8 *l4, void *end, __u32 len, __u32 coff) {
    if (len < 8 || len > FINISH_MAX || (void *)(l4 + 18) > end)
        return -1;
    __u64 s = 0;
    __u8 *q = l4;
    __u32 words = len / 4;
    for (__u32 i = 0; i < FINISH_MAX / 4; i++) {
        if (i >= words)
            break;
        /* Opaque to clang: it would merge the bound checks, and the verifier needs each. */
        asm volatile("" : "+r"(q));
        if ((void *)(q + 4) > end)
            return -1;
        s += *(__u32 *)q;
        q += 4;
    }
    __u32 rest = len & 3, w = 0;
    if (rest) {
        if ((void *)(q + 1) > end)
            return -1;
        w = q[0];
        if (rest > 1) {
            if ((void *)(q + 2) > end)
                return -1;
            w |= (__u32)q[1] << 8;
        }
        if (rest > 2) {
            if ((void *)(q + 3) > end)
                return -1;
            w |= (__u32)q[2] << 16;
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

/* Whether the packet is a TCP SYN without ACK (a new connection): `l4` is where its
 * transport header starts. */
INLINE int tcp_syn(__u8 proto, void *l4, void *end) {
    if (proto != IPPROTO_TCP || l4 + 14 > end)
        return 0;
    __u8 flags = ((__u8 *)l4)[13];
    return (flags & 0x12) == 0x02;
}

INLINE int to_xsk(struct xdp_md *ctx, struct bpf_fib_lookup *p, int rc, __u8 family, int syn, int fast) {
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
    count(&steer_stats, S_TO_XSK);
    if (syn) {
        long l = bpf_redirect_map(&xsks, SYN_LANE + ctx->rx_queue_index, 0);
        if (l == XDP_REDIRECT) {
            count(&steer_stats, S_SYN_LANE);
            return XDP_REDIRECT;
        }
    }
    long r = bpf_redirect_map(&xsks, ctx->rx_queue_index, 0);
    if (r != XDP_REDIRECT)
        count(&steer_stats, S_NO_SOCKET);
    return r == XDP_REDIRECT ? XDP_REDIRECT : XDP_DROP;
}

/* A packet that may belong to a fast-path flow: TCP or UDP right after an IPv4 header without
 * options (not a fragment) or right after the IPv6 header. */
struct cand {
    __u32 src[4], dst[4];
    __u32 ports;
    __u32 ph;           /* pseudo-header sum: addresses, protocol, transport length */
    __u16 l4len;        /* transport header and payload */
    __u8 proto;         /* 0: not a candidate */
    __u8 partial;       /* its checksum was left to offload */
};

INLINE __u32 cfg(__u32 i) {
    __u32 *v = bpf_map_lookup_elem(&steer_cfg, &i);
    return v ? *v : 0;
}

/* The flow tables' hash (fastpath.rs computes the same): murmur3's steps over the key's
 * words, seeded by xpfd with a random value. */
INLINE __u32 hmix(__u32 h, __u32 w) {
    w *= 0xcc9e2d51;
    w = (w << 15) | (w >> 17);
    w *= 0x1b873593;
    h ^= w;
    h = (h << 13) | (h >> 19);
    return h * 5 + 0xe6546b64;
}

INLINE __u32 hfinal(__u32 h) {
    h ^= h >> 16;
    h *= 0x85ebca6b;
    h ^= h >> 13;
    h *= 0xc2b2ae35;
    h ^= h >> 16;
    return h;
}

INLINE __u32 ctl_live(__u8 proto) {
    return ((__u32)proto << 8) | F_LIVE;
}

INLINE struct fast_tail *find4(struct cand *c, __u32 *at) {
    __u32 mask = cfg(C_MASK4);
    if (!mask)
        return 0;
    __u32 h = hfinal(hmix(hmix(hmix(hmix(cfg(C_SEED), c->src[0]), c->dst[0]), c->ports), c->proto));
    for (__u32 i = 0; i < FAST_PROBE; i++) {
        __u32 k = (h + i) & mask;
        struct flow4 *e = bpf_map_lookup_elem(&flows4, &k);
        if (!e)
            return 0;
        __u32 ctl = *(volatile __u32 *)&e->ctl;
        if ((ctl & 0xff) == F_EMPTY)
            return 0;
        if ((ctl & 0xffff) == ctl_live(c->proto) && e->src == c->src[0] && e->dst == c->dst[0] &&
            e->ports == c->ports) {
            *at = k;
            return &e->t;
        }
    }
    return 0;
}

INLINE struct fast_tail *find6(struct cand *c, __u32 *at) {
    __u32 mask = cfg(C_MASK6);
    if (!mask)
        return 0;
    __u32 h = cfg(C_SEED);
    for (int w = 0; w < 4; w++)
        h = hmix(h, c->src[w]);
    for (int w = 0; w < 4; w++)
        h = hmix(h, c->dst[w]);
    h = hfinal(hmix(hmix(h, c->ports), c->proto));
    for (__u32 i = 0; i < FAST_PROBE; i++) {
        __u32 k = (h + i) & mask;
        struct flow6 *e = bpf_map_lookup_elem(&flows6, &k);
        if (!e)
            return 0;
        __u32 ctl = *(volatile __u32 *)&e->ctl;
        if ((ctl & 0xff) == F_EMPTY)
            return 0;
        if ((ctl & 0xffff) == ctl_live(c->proto) && e->ports == c->ports && e->src[0] == c->src[0] &&
            e->src[1] == c->src[1] && e->src[2] == c->src[2] && e->src[3] == c->src[3] && e->dst[0] == c->dst[0] &&
            e->dst[1] == c->dst[1] && e->dst[2] == c->dst[2] && e->dst[3] == c->dst[3]) {
            *at = k;
            return &e->t;
        }
    }
    return 0;
}

INLINE struct fast_tail *rev_of(__u8 family, struct fast_tail *t) {
    __u32 r = t->rev;
    if (family == AF_INET) {
        struct flow4 *e = bpf_map_lookup_elem(&flows4, &r);
        return e ? &e->t : 0;
    }
    struct flow6 *e = bpf_map_lookup_elem(&flows6, &r);
    return e ? &e->t : 0;
}

#define MAXACKWINDOW (0xffff + 1500)
/* IEEE 802 local experimental ethertype: xpfd's egress probe frames. */
#define PROBE_ETHERTYPE 0x88b5

INLINE int seq_geq(__u32 a, __u32 b) {
    return (__s32)(a - b) >= 0;
}

INLINE int seq_gt(__u32 a, __u32 b) {
    return (__s32)(a - b) > 0;
}

/* pf_tcp_track_full for a segment of an established connection (both peers ESTABLISHED, no
 * modulation or scrub: xpfd installs no other): 0 when it is in the windows (and they are
 * slid as pf slides them), -1 when xpfd must judge it (SYN, FIN, RST, no ACK, outside the
 * windows, or due for a sync update). `th` is the TCP header, `len` the transport length. */
INLINE int tcp_check(__u8 family, struct fast_tail *t, __u8 *th, void *end, __u32 len) {
    if ((void *)(th + 20) > end)
        return -1;
    __u8 flags = th[13];
    if ((flags & 0x17) != 0x10) /* FIN 0x01, SYN 0x02, RST 0x04; ACK 0x10 */
        return -1;
    __u32 doff = (th[12] >> 4) * 4;
    if (doff < 20 || doff > len)
        return -1;
    struct fast_tail *r = rev_of(family, t);
    if (!r)
        return -1;
    __u32 payload = len - doff;
    __u32 pace = cfg(C_PACE);
    __u32 due = t->unsynced + 1 + (payload >> 8);
    if (pace && due >= pace)
        return -1;
    __u32 seq = bswap32(*(__u32 *)(th + 4));
    __u32 ack = bswap32(*(__u32 *)(th + 8));
    __u32 win = bswap16(*(__u16 *)(th + 14));
    __u32 sws = t->sws & 0xf, dws = t->dws & 0xf;
    __u32 seqlo = *(volatile __u32 *)&t->seqlo;
    __u32 fin = seq + payload;
    if (payload == 0) {
        /* No data: ease the sequencing restrictions. */
        seq = seqlo;
        fin = seqlo;
    }
    __s64 ackskew = (__s32)(*(volatile __u32 *)&t->peer_seqlo - ack);
    __u32 dwin = (__u32)*(volatile __u16 *)&t->peer_max_win << dws;
    if (!seq_geq(*(volatile __u32 *)&t->seqhi, fin) || !seq_geq(seq, seqlo - dwin) || ackskew < -MAXACKWINDOW ||
        ackskew > ((__s64)MAXACKWINDOW << sws))
        return -1;
    /* pf's slide: the sender's max window and seqlo, the receiver's seqhi. */
    if (t->max_win < win) {
        t->max_win = win;
        r->peer_max_win = win;
    }
    if (seq_gt(fin, seqlo)) {
        t->seqlo = fin;
        r->peer_seqlo = fin;
    }
    __u32 w = win << sws;
    if (seq_geq(ack + w, *(volatile __u32 *)&r->seqhi))
        r->seqhi = ack + (w ? w : 1);
    if (pace)
        t->unsynced = due;
    return 0;
}

/* Forwards the packet in the kernel if it belongs to a fast-path flow (or the program is in
 * bare mode); -1 when it does not. Sets *found when the flow has a live entry. */
INLINE int fast_path(struct xdp_md *ctx, struct bpf_fib_lookup *p, struct cand *c, __u8 family, __u32 len,
                     int *found) {
    struct fast_tail *t = 0;
    __u32 l3 = family == AF_INET ? 20 : 40;
    if (cfg(C_BARE) != 1) {
        if (!c->proto)
            return -1;
        __u32 at = 0;
        t = family == AF_INET ? find4(c, &at) : find6(c, &at);
        if (!t)
            return -1;
        *found = 1;
        if (t->in_if != ctx->ingress_ifindex || t->out_if != p->ifindex)
            return -1;
        if (c->partial && c->l4len > FINISH_MAX)
            return -1;
        if (c->proto == IPPROTO_TCP) {
            void *data = (void *)(long)ctx->data;
            void *end = (void *)(long)ctx->data_end;
            if (tcp_check(family, t, data + sizeof(struct ethhdr) + l3, end, c->l4len) < 0)
                return -1;
        }
    }
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return -1;
    if (t && c->partial) {
        __u8 *l4 = (__u8 *)(eth + 1) + l3;
        if (l4_finish(l4, end, c->l4len, c->proto == IPPROTO_UDP ? 6 : 16) < 0)
            return -1;
    }
    if (family == AF_INET) {
        struct iphdr *ip = (void *)(eth + 1);
        if ((void *)(ip + 1) > end)
            return -1;
        /* TTL down by one, checksum by RFC 1624 (the TTL is the high byte of its word). */
        __u32 sum = (__u16)~ip->check + (__u16)~htons(0x0100);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        ip->check = ~(__u16)sum;
        ip->ttl--;
    } else {
        struct ipv6hdr *ip6 = (void *)(eth + 1);
        if ((void *)(ip6 + 1) > end)
            return -1;
        ip6->hop_limit--;
    }
    __builtin_memcpy(eth->h_dest, p->dmac, 6);
    __builtin_memcpy(eth->h_source, p->smac, 6);
    if (t) {
        __sync_fetch_and_add(&t->packets, 1);
        __sync_fetch_and_add(&t->bytes, len);
    }
    count(&steer_stats, S_FAST);
    return bpf_redirect(p->ifindex, 0);
}

/* Whether a packet the kernel would not forward goes to a translation target (map natdst).
 * `p` still holds the packet's addresses: the lookup writes them back only when it forwards. */
INLINE int nat_target(struct bpf_fib_lookup *p, struct cand *c, __u8 family, int frag) {
    __u8 proto = p->l4_protocol;
    __u16 port = 0;
    /* An IPv4 fragment carries no port (or one that speaks for the rest): by its address
     * alone, every fragment to a translation address goes to xpfd, which reassembles it and
     * gives the host back what is the host's. */
    int by_addr = 0;
    if (proto == IPPROTO_TCP || proto == IPPROTO_UDP) {
        if (frag)
            by_addr = 1;
        else if (c->proto != proto)
            return 0; /* IP options: the kernel's */
        else
            port = bswap16(c->ports >> 16);
    } else if (proto != IPPROTO_ICMP && proto != IPPROTO_ICMPV6) {
        return 0;
    }
    struct natnet_key n = {};
    n.family = family;
    n.proto = proto;
    if (family == AF_INET) {
        n.prefixlen = 64;
        n.addr[0] = p->ipv4_dst;
    } else {
        n.prefixlen = 160;
        __builtin_memcpy(n.addr, p->ipv6_dst, 16);
    }
    struct natval *v = bpf_map_lookup_elem(&natnet, &n);
    if (v && (by_addr || (port >= v->lo && port <= v->hi)))
        return 1;
    if (by_addr)
        return 0;
    if (!port)
        return 0;
    struct natport_key k = {};
    k.family = family;
    k.proto = proto;
    k.port = port;
    __builtin_memcpy(k.addr, n.addr, 16);
    if (bpf_map_lookup_elem(&natport, &k))
        return 1;
    __builtin_memset(k.addr, 0, sizeof(k.addr));
    return bpf_map_lookup_elem(&natport, &k) != 0;
}

INLINE int verdict(struct xdp_md *ctx, struct bpf_fib_lookup *p, long rc, __u8 family, struct cand *c, __u32 len,
                   int syn, int frag) {
    if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH && rc != BPF_FIB_LKUP_RET_FRAG_NEEDED &&
        nat_target(p, c, family, frag)) {
        count(&steer_stats, S_NAT_LOCAL);
        return to_xsk(ctx, p, -1, family, syn, 0);
    }
    int found = 0;
    switch (rc) {
    case BPF_FIB_LKUP_RET_SUCCESS:
        {
            int r = fast_path(ctx, p, c, family, len, &found);
            if (r >= 0)
                return r;
        }
        return to_xsk(ctx, p, rc, family, syn, found);
    case BPF_FIB_LKUP_RET_NO_NEIGH:
        return to_xsk(ctx, p, rc, family, syn, 0);
    case BPF_FIB_LKUP_RET_FRAG_NEEDED:
        count(&steer_stats, S_MTU);
        return XDP_PASS;
    case BPF_FIB_LKUP_RET_NOT_FWDED:
        count(&steer_stats, S_LOCAL);
        return XDP_PASS;
    default:
        count(&steer_stats, S_NO_ROUTE);
        return XDP_PASS;
    }
}

/* Fills `c` for a TCP/UDP packet whose transport header is at `l4`: ports, transport length,
 * and whether its checksum holds only the pseudo-header sum `ph` (addresses and protocol). */
INLINE void candidate(struct cand *c, __u8 proto, __u8 *l4, void *end, __u32 l4len, __u32 ph) {
    if ((proto != IPPROTO_UDP && proto != IPPROTO_TCP) || l4len < 8 || l4len > 0xffff)
        return;
    if ((void *)(l4 + 8) > end)
        return;
    c->ports = *(__u32 *)l4;
    c->l4len = l4len;
    c->ph = ph + htons(l4len);
    __u32 coff = proto == IPPROTO_UDP ? 6 : 16;
    if (proto == IPPROTO_TCP && (void *)(l4 + 18) > end)
        return;
    __u16 check = *(__u16 *)(l4 + coff);
    c->partial = check != 0 && check == fold(c->ph);
    c->proto = proto;
}

SEC("xdp")
int xpf_steer(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return XDP_PASS;
    if (other_host(ctx, eth)) {
        count(&steer_stats, S_OTHERHOST);
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
            count(&steer_stats, S_TTL);
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
        return verdict(ctx, &p, bpf_fib_lookup(ctx, &p, sizeof(p), 0), AF_INET, &c, len, syn, frag);
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
                count(&steer_stats, S_ND);
                return XDP_PASS;
            }
        }
        if (ip6->hop_limit <= 1) {
            count(&steer_stats, S_TTL);
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
        return verdict(ctx, &p, bpf_fib_lookup(ctx, &p, sizeof(p), 0), AF_INET6, &c, len, syn, 0);
    }
    /* xpfd's probe of an egress (run by xpfd with BPF_PROG_TEST_RUN while C_PROBE is set):
     * does the device take redirected frames? (A veth only when its peer runs NAPI.) */
    if (proto == htons(PROBE_ETHERTYPE)) {
        __u32 to = cfg(C_PROBE);
        __u32 *mark = (void *)(eth + 1);
        if (to && (void *)(mark + 1) <= end && *mark == cfg(C_COOKIE))
            return bpf_redirect(to, 0);
    }
    count(&steer_stats, S_NOT_IP);
    return XDP_PASS;
}
