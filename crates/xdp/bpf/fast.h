/* The fast path's flow tables and the checks on them, shared by the steering program (XDP,
 * steer.c) and the skb fast path (skb.c). */
#ifndef XPF_FAST_H
#define XPF_FAST_H
#include "xpf.h"
#include <linux/ip.h>
#include <linux/ipv6.h>

/* A fast-path flow (one direction of a connection): the key, then `struct fast_tail`.
 * ctl: byte 0 the entry's state (F_*), byte 1 the protocol, byte 2 the xpfd worker that owns
 * it, byte 3 X_* flags (X_XLAT: the flow is translated, its rewrite in `xlats4`/`xlats6` at
 * the same index). xpfd claims an entry by compare-and-swap from F_EMPTY/F_DEAD, writes it while F_HELD
 * and publishes it F_LIVE; lookups probe FAST_PROBE entries from the key's hash and stop at
 * F_EMPTY. An entry xpfd takes back goes F_HELD (no longer matched), then F_DEAD once xpfd has
 * read it a last time. */
enum { F_EMPTY, F_LIVE, F_DEAD, F_HELD };
#define X_XLAT 1
#define FAST_PROBE 16

struct fast_tail {
    __u64 bytes;
    __u32 packets;
    __u32 in_if;        /* where the `in` state is */
    __u32 out_if;       /* where the `out` state is: the FIB must still say so */
    /* TCP: pf's two peers as this direction sees them (src: this direction's sender).
     * Each field has one writer besides xpfd: a direction writes its sender's seqlo and
     * max_win (here, and mirrored in the reverse entry) and its receiver's seqhi (in the
     * reverse entry, and here as peer_seqhi). A segment in the windows touches only its own
     * entry (one cache line): the reverse entry is written when a value there changes, and
     * the mirrored seqlo only each MIRROR_STEP bytes (the reverse's ack check allows for
     * that lag by being stricter than pf's, never looser). */
    __u32 peer_seqhi;   /* dst.seqhi as this direction last wrote it in the reverse entry */
    __u32 seqlo;        /* src.seqlo */
    __u32 seqhi;        /* src.seqhi (written by the reverse direction) */
    __u32 peer_seqlo;   /* dst.seqlo, up to MIRROR_STEP behind (written by the reverse direction) */
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

/* A translated flow's rewrite: the addresses and ports (ICMP echo: type, code and
 * identifier, as in the key) its packets leave with, and what that adds to the checksums
 * (ones'-complement sums of the 16-bit words as they are in memory, written by xpfd):
 * `addr_diff` for the addresses (the IPv4 header's, and the pseudo-header's of TCP, UDP and
 * ICMPv6), `port_diff` for the ports or the echo identifier. Kept apart from the entries so
 * that untranslated flows stay one cache line. */
struct xlat4 {
    __be32 src, dst;
    __u32 ports;
    __u16 addr_diff, port_diff;
};

struct xlat6 {
    __u32 src[4], dst[4];
    __u32 ports;
    __u16 addr_diff, port_diff;
};

_Static_assert(sizeof(struct fast_tail) == 48, "fast_tail");
_Static_assert(sizeof(struct xlat4) == 16, "xlat4");
_Static_assert(sizeof(struct xlat6) == 40, "xlat6");
_Static_assert(sizeof(struct flow4) == 64, "flow4: one cache line");
_Static_assert(sizeof(struct flow6) == 128, "flow6: two cache lines");

/* Sized by xpfd at load (a power of two; one entry without --fastpath), mapped by xpfd and
 * shared by the program of every interface. */
struct xpf_map flows4 SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct flow4), 1, BPF_F_MMAPABLE };
struct xpf_map flows6 SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct flow6), 1, BPF_F_MMAPABLE };
/* Each the size of its family's flow table. */
struct xpf_map xlats4 SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct xlat4), 1, BPF_F_MMAPABLE };
struct xpf_map xlats6 SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct xlat6), 1, BPF_F_MMAPABLE };
/* steer_cfg[C_BARE] = 1: forward everything routable here, unfiltered (the lab's measure of
 * the fast path's I/O ceiling; set only through xpfctl --steer bare). The others: the flow
 * tables' hash seed and index masks (0: fast path off), the sync pace (0: sync off), and
 * xpfd's egress probe (C_PROBE: an ifindex while a probe runs; C_COOKIE: its frames' mark),
 * xpfd's transmit through XDP (C_TXDEV: the interface its test runs name, C_TXKEY: the
 * random word their metadata carries; steer.c, tx_batch). Shared. */
enum { C_BARE, C_SEED, C_MASK4, C_MASK6, C_PACE, C_PROBE, C_COOKIE, C_TXDEV, C_TXKEY, C_N };
struct xpf_map steer_cfg SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, 4, C_N, 0 };
/* Folds a ones'-complement sum to 16 bits. Sums of raw (network-order) words fold to the
 * raw field value: the sum is the same in either byte order. */
INLINE __u16 fold(__u32 s) {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    return (__u16)s;
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

/* Whether the packet is a TCP SYN without ACK (a new connection): `l4` is where its
 * transport header starts. */
INLINE int tcp_syn(__u8 proto, void *l4, void *end) {
    if (proto != IPPROTO_TCP || l4 + 14 > end)
        return 0;
    __u8 flags = ((__u8 *)l4)[13];
    return (flags & 0x12) == 0x02;
}

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

/* The live entry of `c`'s flow: its tail, its index in `*at` and its X_* flags in `*x`. */
INLINE struct fast_tail *find4(struct cand *c, __u32 *at, __u8 *x) {
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
            *x = ctl >> 24;
            return &e->t;
        }
    }
    return 0;
}

INLINE struct fast_tail *find6(struct cand *c, __u32 *at, __u8 *x) {
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
            *x = ctl >> 24;
            return &e->t;
        }
    }
    return 0;
}

INLINE struct fast_tail *find(__u8 family, struct cand *c, __u32 *at, __u8 *x) {
    return family == AF_INET ? find4(c, at, x) : find6(c, at, x);
}

/* A translated flow's rewrite: its addresses in `w` (as `struct cand`'s), its ports and
 * checksum differences; -1 when the entry has none. */
struct rewrite {
    __u32 src[4], dst[4];
    __u32 ports;
    __u16 addr_diff, port_diff;
};

INLINE int rewrite_of(__u8 family, __u32 at, struct rewrite *w) {
    if (family == AF_INET) {
        struct xlat4 *x = bpf_map_lookup_elem(&xlats4, &at);
        if (!x)
            return -1;
        w->src[0] = x->src;
        w->dst[0] = x->dst;
        w->ports = x->ports;
        w->addr_diff = x->addr_diff;
        w->port_diff = x->port_diff;
        return 0;
    }
    struct xlat6 *x = bpf_map_lookup_elem(&xlats6, &at);
    if (!x)
        return -1;
    __builtin_memcpy(w->src, x->src, 16);
    __builtin_memcpy(w->dst, x->dst, 16);
    w->ports = x->ports;
    w->addr_diff = x->addr_diff;
    w->port_diff = x->port_diff;
    return 0;
}

/* The FIB's question for a translated packet: the addresses it leaves with. */
INLINE void fib_rewritten(struct bpf_fib_lookup *p, __u8 family, struct rewrite *w) {
    if (family == AF_INET) {
        p->ipv4_src = w->src[0];
        p->ipv4_dst = w->dst[0];
    } else {
        __builtin_memcpy(p->ipv6_src, w->src, 16);
        __builtin_memcpy(p->ipv6_dst, w->dst, 16);
    }
}

INLINE struct fast_tail *rev_of(__u8 family, struct fast_tail *t) {
    __u32 r = t->rev;
    if (family == AF_INET) {
        struct flow4 *e = bpf_map_lookup_elem(&flows4, &r);
        if (!e)
            return 0;
        /* Keeps clang from offsetting the pointer before the null check (the verifier
         * refuses arithmetic on a pointer that may be null). */
        asm volatile("" : "+r"(e));
        return &e->t;
    }
    struct flow6 *e = bpf_map_lookup_elem(&flows6, &r);
    if (!e)
        return 0;
    asm volatile("" : "+r"(e));
    return &e->t;
}

#define MAXACKWINDOW (0xffff + 1500)
/* A direction's seqlo is mirrored into the reverse entry when it crosses a multiple of this:
 * the mirror is less than this behind. */
#define MIRROR_STEP 16384

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
    /* Reserved bits, or an urgent pointer without URG (0x20): xpfd cleans the header, as
     * pf_normalize_tcp does. */
    if ((th[12] & 0x0f) || (!(flags & 0x20) && (th[18] | th[19])))
        return -1;
    __u32 doff = (th[12] >> 4) * 4;
    if (doff < 20 || doff > len)
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
    /* dst.seqlo may be up to MIRROR_STEP behind: an ack pf takes as too far behind it
     * (ackskew over the window) must be refused whatever the lag, so the upper bound is
     * lowered by it; one too far ahead is refused on the mirror already (the true ackskew is
     * larger). Refused here means judged by xpfd, on exact windows. */
    __s64 ackskew = (__s32)(*(volatile __u32 *)&t->peer_seqlo - ack);
    __u32 dwin = (__u32)*(volatile __u16 *)&t->peer_max_win << dws;
    if (!seq_geq(*(volatile __u32 *)&t->seqhi, fin) || !seq_geq(seq, seqlo - dwin) || ackskew < -MAXACKWINDOW ||
        ackskew + MIRROR_STEP > ((__s64)MAXACKWINDOW << sws))
        return -1;
    /* pf's slide: the sender's max window and seqlo, the receiver's seqhi. The reverse entry
     * only when something there changes. */
    __u32 w = win << sws;
    __u32 hi = *(volatile __u32 *)&t->peer_seqhi;
    __u32 newhi = ack + (w ? w : 1);
    int grow = t->max_win < win;
    int slide = seq_gt(fin, seqlo);
    int mirror = slide && (fin / MIRROR_STEP) != (seqlo / MIRROR_STEP);
    int raise = seq_geq(ack + w, hi) && newhi != hi;
    if (grow | mirror | raise) {
        struct fast_tail *r = rev_of(family, t);
        if (!r)
            return -1;
        if (grow)
            r->peer_max_win = win;
        if (mirror)
            r->peer_seqlo = fin;
        if (raise)
            r->seqhi = newhi;
    }
    if (grow)
        t->max_win = win;
    if (slide)
        t->seqlo = fin;
    if (raise)
        t->peer_seqhi = newhi;
    if (pace)
        t->unsynced = due;
    return 0;
}

#define ICMPV6 58

/* The TTL or hop limit of the IP header at `l3` down by one (IPv4: the checksum by RFC 1624,
 * the TTL being the high byte of its word); -1 when the header is not all there. */
INLINE int hop_down(__u8 family, void *l3, void *end) {
    if (family == AF_INET) {
        struct iphdr *ip = l3;
        if ((void *)(ip + 1) > end)
            return -1;
        __u32 sum = (__u16)~ip->check + (__u16)~htons(0x0100);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        ip->check = ~(__u16)sum;
        ip->ttl--;
        return 0;
    }
    struct ipv6hdr *ip6 = l3;
    if ((void *)(ip6 + 1) > end)
        return -1;
    ip6->hop_limit--;
    return 0;
}

/* Fills `c` for a TCP/UDP packet whose transport header is at `l4`: ports, transport length,
 * and whether its checksum holds only the pseudo-header sum `ph` (addresses and protocol).
 * An ICMP or ICMPv6 echo request or reply is keyed on its type, code and identifier, in the
 * place of the ports (bytes 0, 1, 4 and 5 of its header; the sender finishes its checksum):
 * a flow's entry then matches requests one way and replies the other. */
INLINE void candidate(struct cand *c, __u8 proto, __u8 *l4, void *end, __u32 l4len, __u32 ph) {
    if (l4len < 8 || l4len > 0xffff || (void *)(l4 + 8) > end)
        return;
    if (proto == IPPROTO_ICMP || proto == ICMPV6) {
        __u8 type = l4[0];
        if (proto == IPPROTO_ICMP ? type != 8 && type != 0 : type != 128 && type != 129)
            return;
        c->ports = (__u32)type | (__u32)l4[1] << 8 | (__u32)l4[4] << 16 | (__u32)l4[5] << 24;
        c->l4len = l4len;
        c->proto = proto;
        return;
    }
    if (proto != IPPROTO_UDP && proto != IPPROTO_TCP)
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

/* Translation targets the kernel would not forward (the box's own addresses, mostly:
 * `nat-to (egress)`, a port forwarding to the public address; or a translated prefix routed
 * to the box): a packet to one goes to xpfd (the steering program's, or packet mode's tcx program's), which translates it when it belongs to a
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

/* What a translation target for every protocol without ports is filed under (xpf_wire's
 * PROTO_PORTLESS; IANA's 255 is reserved). */
#define NAT_PORTLESS 255

/* Whether a packet the kernel would not forward goes to a translation target (maps natnet, natport).
 * `p` still holds the packet's addresses: the lookup writes them back only when it forwards. */
INLINE int nat_target(struct bpf_fib_lookup *p, struct cand *c, __u8 family, int frag) {
    __u8 proto = p->l4_protocol;
    __u16 port = 0;
    /* An IPv4 fragment carries no port (or one that speaks for the rest): by its address
     * alone, every fragment to a translation address goes to xpfd, which reassembles it and
     * gives the host back what is the host's. */
    int by_addr = 0, bare = 0;
    if (proto == IPPROTO_TCP || proto == IPPROTO_UDP) {
        if (frag)
            by_addr = 1;
        else if (c->proto != proto)
            return 0; /* IP options: the kernel's */
        else
            port = bswap16(c->ports >> 16);
    } else if (proto != IPPROTO_ICMP && proto != IPPROTO_ICMPV6) {
        /* GRE, ESP, ...: translated by address alone, under their own number or under
         * NAT_PORTLESS (a rule of any protocol). */
        by_addr = bare = 1;
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
    if (bare) {
        n.proto = NAT_PORTLESS;
        return bpf_map_lookup_elem(&natnet, &n) != 0;
    }
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

#endif
