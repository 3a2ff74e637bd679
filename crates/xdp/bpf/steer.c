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
 * Fast path (xpfd --fastpath): UDP flows whose `in` and `out` states xpfd holds are put in
 * map `fast` by xpfd; their packets are forwarded here, in the kernel (MACs from the FIB,
 * TTL/hop limit decremented, XDP_REDIRECT to the egress interface), counted per flow for
 * xpfd to carry into its states, and never reach userspace. Only while the FIB still routes
 * them out of the interface the `out` state was made on. A UDP checksum its sender left to
 * offload (veth, tun/tap: the field holds the pseudo-header sum) is finished here, since a
 * redirected frame reaches the receiver as it is (datagrams up to 1,504 bytes; longer ones go
 * to xpfd). IPv4 options and fragments, and every other protocol (TCP: pf's window tracking
 * sees each segment) go to xpfd as before.
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

struct fast_key {
    __u8 family, proto;
    __be16 sport, dport;
    __u16 pad;
    __u8 src[16], dst[16];
};

struct fast_val {
    __u32 egress;       /* where the out state is: the FIB must still say so */
    __u32 owner;        /* the xpfd worker that installed it */
    __u32 slot, pad;    /* the worker's record of the flow */
    __u64 packets, bytes;
};

/* Preallocated (xpfd sizes it with --fastpath FLOWS; one entry without): the counters sit
 * in the entry, one cache line away from the key. */
struct xpf_map fast SEC("maps") = { BPF_MAP_TYPE_HASH, sizeof(struct fast_key), sizeof(struct fast_val), 1 << 20, 0 };
/* steer_cfg[0] = 1: forward everything routable here, unfiltered (the lab's measure of the
 * fast path's I/O ceiling; set only through xpfctl --steer bare). */
struct xpf_map steer_cfg SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, 4, 1, 0 };
struct xpf_map steer_stats SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 11, 0 };
/* ifindex -> the interface's MAC in the low six bytes (as they are in the frame). */
struct xpf_map ifmacs SEC("maps") = { BPF_MAP_TYPE_HASH, 4, 8, 256, 0 };

/* steer_stats slots (src/steer.rs names them). */
enum { S_NOT_IP, S_LOCAL, S_TTL, S_NO_ROUTE, S_MTU, S_TO_XSK, S_NO_SOCKET, S_ND, S_FAST, S_OTHERHOST, S_SYN_LANE };

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

/* Whether a UDP checksum holds only the pseudo-header sum (left to offload by its sender). */
INLINE int udp_partial(__u32 pseudo, __u16 check) {
    return check != 0 && check == fold(pseudo);
}

#define UDP_FINISH_MAX 1504

/* Finishes such a checksum: with the pseudo-header sum in the field, the sum of the datagram
 * as it is (field included) is the whole sum. 32-bit loads, summed in 64 bits and folded: the
 * result is in memory order, as the field is. 0 done, -1 when it cannot (too long, short). */
INLINE int udp_finish(__u8 *udp, void *end) {
    if ((void *)(udp + 8) > end)
        return -1;
    __u16 ulen = bswap16(*(__u16 *)(udp + 4));
    if (ulen < 8 || ulen > UDP_FINISH_MAX)
        return -1;
    __u64 s = 0;
    __u8 *q = udp;
    __u32 words = ulen / 4;
    for (__u32 i = 0; i < UDP_FINISH_MAX / 4; i++) {
        if (i >= words)
            break;
        /* Opaque to clang: it would merge the bound checks, and the verifier needs each. */
        asm volatile("" : "+r"(q));
        if ((void *)(q + 4) > end)
            return -1;
        s += *(__u32 *)q;
        q += 4;
    }
    __u32 rest = ulen & 3, w = 0;
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
    *(__u16 *)(udp + 6) = c ? c : 0xffff;
    return 0;
}

/* What xpfd finds in front of each frame (src/steer.rs: Meta). */
struct meta {
    __u8 kind;          /* 1: forward (MACs valid), 2: neighbour not resolved yet */
    __u8 family;        /* AF_INET / AF_INET6 */
    __u16 pad;
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

INLINE int to_xsk(struct xdp_md *ctx, struct bpf_fib_lookup *p, int rc, __u8 family, int syn) {
    if (bpf_xdp_adjust_head(ctx, -META_LEN))
        return XDP_PASS;
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct meta *m = data;
    if ((void *)(m + 1) > end)
        return XDP_DROP;
    m->kind = rc == BPF_FIB_LKUP_RET_SUCCESS ? 1 : 2;
    m->family = family;
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

/* Forwards the packet in the kernel if it belongs to a fast-path flow (or the program is in
 * bare mode); -1 when it does not. `k` has the flow's addresses and ports when it is UDP. */
INLINE int fast_path(struct xdp_md *ctx, struct bpf_fib_lookup *p, struct fast_key *k, __u8 family, __u32 len,
                     int partial) {
    __u32 zero = 0;
    __u32 *bare = bpf_map_lookup_elem(&steer_cfg, &zero);
    struct fast_val *v = 0;
    if (!bare || *bare != 1) {
        if (!k->proto)
            return -1;
        v = bpf_map_lookup_elem(&fast, k);
        if (!v || v->egress != p->ifindex)
            return -1;
    }
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return -1;
    if (partial) {
        __u8 *udp = family == AF_INET ? (__u8 *)(eth + 1) + 20 : (__u8 *)(eth + 1) + 40;
        if (udp_finish(udp, end) < 0)
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
    if (v) {
        __sync_fetch_and_add(&v->packets, 1);
        __sync_fetch_and_add(&v->bytes, len);
    }
    count(&steer_stats, S_FAST);
    return bpf_redirect(p->ifindex, 0);
}

INLINE int verdict(struct xdp_md *ctx, struct bpf_fib_lookup *p, long rc, __u8 family, struct fast_key *k,
                   __u32 len, int partial, int syn) {
    switch (rc) {
    case BPF_FIB_LKUP_RET_SUCCESS:
        {
            int r = fast_path(ctx, p, k, family, len, partial);
            if (r >= 0)
                return r;
        }
        return to_xsk(ctx, p, rc, family, syn);
    case BPF_FIB_LKUP_RET_NO_NEIGH:
        return to_xsk(ctx, p, rc, family, syn);
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
        struct fast_key k = {};
        int partial = 0;
        /* UDP without options or fragments is a fast-path candidate (proto set). */
        if (ip->protocol == IPPROTO_UDP && ip->ihl == 5 && !(ip->frag_off & htons(0x3fff))) {
            __be16 *ports = (void *)(ip + 1);
            __u32 ph = (ip->saddr >> 16) + (ip->saddr & 0xffff) + (ip->daddr >> 16) + (ip->daddr & 0xffff) +
                       htons(IPPROTO_UDP);
            if ((void *)(ports + 4) <= end) {
                partial = udp_partial(ph + ports[2], ports[3]);
                k.family = AF_INET;
                k.proto = IPPROTO_UDP;
                k.sport = ports[0];
                k.dport = ports[1];
                __builtin_memcpy(k.src, &ip->saddr, 4);
                __builtin_memcpy(k.dst, &ip->daddr, 4);
            }
        }
        int syn = 0;
        if (!(ip->frag_off & htons(0x1fff))) {
            __u32 hl = (ip->ihl & 0xf) * 4;
            syn = hl >= 20 && tcp_syn(ip->protocol, (void *)ip + hl, end);
        }
        __u32 len = p.tot_len; /* the lookup reuses tot_len's bytes for the MTU */
        return verdict(ctx, &p, bpf_fib_lookup(ctx, &p, sizeof(p), 0), AF_INET, &k, len, partial, syn);
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
        struct fast_key k = {};
        int partial = 0;
        if (ip6->nexthdr == IPPROTO_UDP) {
            __be16 *ports = (void *)(ip6 + 1);
            __u32 ph = htons(IPPROTO_UDP);
            __u16 *a = (__u16 *)&ip6->saddr;
            for (int w = 0; w < 16; w++)
                ph += a[w];
            if ((void *)(ports + 4) <= end) {
                partial = udp_partial(ph + ports[2], ports[3]);
                k.family = AF_INET6;
                k.proto = IPPROTO_UDP;
                k.sport = ports[0];
                k.dport = ports[1];
                __builtin_memcpy(k.src, &ip6->saddr, 16);
                __builtin_memcpy(k.dst, &ip6->daddr, 16);
            }
        }
        int syn = tcp_syn(ip6->nexthdr, ip6 + 1, end);
        __u32 len = p.tot_len;
        return verdict(ctx, &p, bpf_fib_lookup(ctx, &p, sizeof(p), 0), AF_INET6, &k, len, partial, syn);
    }
    count(&steer_stats, S_NOT_IP);
    return XDP_PASS;
}
