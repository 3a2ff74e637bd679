/* xpf's fast path where xpfd reads frames through AF_PACKET (packet mode): established
 * flows forwarded in the kernel as socket buffers, whole.
 *
 * Why not XDP there: on a veth, attaching an XDP program takes segmentation offload away
 * from the peer (a sending host then cuts every TCP stream into 1,500-byte frames), and an
 * XDP frame redirected between veths carries neither a GSO size nor a checksum left to
 * offload. A socket buffer keeps both: a 64 KB TCP segment crosses the firewall as one, its
 * checksum still left to the receiver's offload.
 *
 * Two programs per filtered interface, both reading the flow tables of fast.h (written by
 * xpfd as for the steering program):
 * - xpf_tap, the socket filter of xpfd's packet socket on the interface. The kernel shows a
 *   received frame to its packet sockets (taps) before its ingress hooks, on the same CPU. A
 *   frame of a live flow that came in where the flow's `in` state is and passes pf's checks
 *   (UDP: none; TCP: tcp_check, the windows slid) is not copied to xpfd: the filter counts it
 *   in the flow and leaves its decision in this CPU's slot of `skb_pass`. Anything else is
 *   copied to xpfd whole, as without the fast path.
 * - xpf_fwd, at the interface's tcx ingress, runs next for the same frame. With a decision
 *   for it, it asks the FIB: still out of the flow's `out` interface, the frame goes there
 *   (MACs from the FIB, or from the neighbour table when the FIB has none yet; TTL or hop
 *   limit down by one). When the FIB now says otherwise, the flow's entry stops matching
 *   (its `out_if` cleared: its next frames go to xpfd) and this frame is left to the kernel's
 *   ingress, where xpfd's netdev table drops transit traffic, as for every frame xpfd sees. */
#include "fast.h"
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

static long (*bpf_skb_load_bytes)(const void *skb, __u32 offset, void *to, __u32 len) =
    (void *)BPF_FUNC_skb_load_bytes;
static long (*bpf_skb_pull_data)(void *skb, __u32 len) = (void *)BPF_FUNC_skb_pull_data;
static long (*bpf_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) =
    (void *)BPF_FUNC_redirect_neigh;

/* The tap's decision about the frame it saw last on this CPU. */
struct pass {
    __u32 ifindex;      /* where it came in; 0: no decision */
    __u32 len;
    __u32 out_if;
    __u32 entry;        /* its flow's entry */
    __u32 family;
};
struct xpf_map skb_pass SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, sizeof(struct pass), 1, 0 };

/* Counters (src/skbpath.rs names them). */
enum { K_FAST, K_NEIGH, K_REROUTED, K_MTU, K_STALE, K_N };
struct xpf_map skb_stats SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, K_N, 0 };

#define PACKET_HOST 0
/* Ethernet, IPv6, TCP: the most the tap reads. */
#define TAP_BYTES (14 + 40 + 20)

SEC("socket")
int xpf_tap(struct __sk_buff *skb) {
    const int all = 0x7fffffff;
    if (skb->pkt_type != PACKET_HOST)
        return all;
    /* Two bytes ahead of the Ethernet header align the IP header and the transport header
     * (the verifier refuses misaligned stack loads). */
    __u8 raw[2 + TAP_BYTES] __attribute__((aligned(8))) = {};
    __u8 *b = raw + 2;
    /* Ethernet and an IPv4 header without options, and 8 transport bytes. */
    if (bpf_skb_load_bytes(skb, 0, b, 14 + 20 + 8) < 0)
        return all;
    __u16 proto = *(__u16 *)(b + 12);
    struct cand c = {};
    __u8 family;
    __u8 *l4;
    __u8 *end;
    if (proto == htons(ETH_P_IP)) {
        struct iphdr *ip = (void *)(b + 14);
        if (ip->ihl != 5 || (ip->frag_off & htons(0x3fff)) || ip->ttl <= 1)
            return all;
        if (ip->protocol == IPPROTO_TCP && bpf_skb_load_bytes(skb, 0, b, 14 + 20 + 20) < 0)
            return all;
        __u32 tot = bswap16(ip->tot_len);
        if (tot <= 20)
            return all;
        family = AF_INET;
        c.src[0] = ip->saddr;
        c.dst[0] = ip->daddr;
        l4 = b + 14 + 20;
        end = l4 + (ip->protocol == IPPROTO_TCP ? 20 : 8);
        candidate(&c, ip->protocol, l4, end, tot - 20, 0);
    } else if (proto == htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = (void *)(b + 14);
        __u32 n = 14 + 40 + 8;
        if (bpf_skb_load_bytes(skb, 0, b, 14 + 40 + 8) < 0)
            return all;
        if (ip6->nexthdr == IPPROTO_TCP) {
            if (bpf_skb_load_bytes(skb, 0, b, TAP_BYTES) < 0)
                return all;
            n = TAP_BYTES;
        }
        if (ip6->hop_limit <= 1)
            return all;
        family = AF_INET6;
        __builtin_memcpy(c.src, &ip6->saddr, 16);
        __builtin_memcpy(c.dst, &ip6->daddr, 16);
        l4 = b + 14 + 40;
        end = b + n;
        candidate(&c, ip6->nexthdr, l4, end, bswap16(ip6->payload_len), 0);
    } else {
        return all;
    }
    if (!c.proto)
        return all;
    __u32 at = 0;
    struct fast_tail *t = family == AF_INET ? find4(&c, &at) : find6(&c, &at);
    if (!t)
        return all;
    __u32 out_if = *(volatile __u32 *)&t->out_if;
    if (t->in_if != skb->ifindex || !out_if)
        return all;
    if (c.proto == IPPROTO_TCP && tcp_check(family, t, l4, end, c.l4len) < 0)
        return all;
    __u32 z = 0;
    struct pass *d = bpf_map_lookup_elem(&skb_pass, &z);
    if (!d)
        return all;
    if (d->ifindex)
        count(&skb_stats, K_STALE);
    d->ifindex = skb->ifindex;
    d->len = skb->len;
    d->out_if = out_if;
    d->entry = at;
    d->family = family;
    __sync_fetch_and_add(&t->packets, 1);
    __sync_fetch_and_add(&t->bytes, skb->len);
    return 0;
}

/* The flow's entry stops matching: its frames go to xpfd again. */
INLINE void reroute(struct pass *d) {
    __u32 e = d->entry;
    if (d->family == AF_INET) {
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

SEC("tc")
int xpf_fwd(struct __sk_buff *skb) {
    __u32 z = 0;
    struct pass *d = bpf_map_lookup_elem(&skb_pass, &z);
    if (!d || !d->ifindex)
        return TC_ACT_OK;
    if (d->ifindex != skb->ifindex || d->len != skb->len) {
        d->ifindex = 0;
        count(&skb_stats, K_STALE);
        return TC_ACT_OK;
    }
    d->ifindex = 0;
    __u32 l3 = d->family == AF_INET ? 20 : 40;
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    if (data + 14 + l3 > end) {
        if (bpf_skb_pull_data(skb, 14 + l3) < 0)
            return TC_ACT_OK;
        data = (void *)(long)skb->data;
        end = (void *)(long)skb->data_end;
    }
    struct ethhdr *eth = data;
    struct bpf_fib_lookup p = {};
    p.ifindex = skb->ifindex;
    if (d->family == AF_INET) {
        struct iphdr *ip = (void *)(eth + 1);
        if ((void *)(ip + 1) > end)
            return TC_ACT_OK;
        p.family = AF_INET;
        p.tos = ip->tos;
        p.l4_protocol = ip->protocol;
        p.ipv4_src = ip->saddr;
        p.ipv4_dst = ip->daddr;
    } else {
        struct ipv6hdr *ip6 = (void *)(eth + 1);
        if ((void *)(ip6 + 1) > end)
            return TC_ACT_OK;
        p.family = AF_INET6;
        p.flowinfo = *(__be32 *)ip6 & htonl(0x0fffffff);
        p.l4_protocol = ip6->nexthdr;
        __builtin_memcpy(p.ipv6_src, &ip6->saddr, 16);
        __builtin_memcpy(p.ipv6_dst, &ip6->daddr, 16);
    }
    /* tot_len left 0: the helper then checks the buffer against the egress MTU as the kernel
     * forwards it (a GSO packet by its segments). */
    long rc = bpf_fib_lookup(skb, &p, sizeof(p), 0);
    if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
        /* Too big for the egress: dropped by the kernel's ingress, as xpfd drops it. */
        count(&skb_stats, K_MTU);
        return TC_ACT_OK;
    }
    if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) || p.ifindex != d->out_if) {
        reroute(d);
        return TC_ACT_OK;
    }
    if (hop_down(d->family, eth + 1, end) < 0)
        return TC_ACT_OK;
    if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
        /* The kernel resolves the next hop and sends the frame when it can. */
        struct bpf_redir_neigh nh = {};
        if (d->family == AF_INET) {
            nh.nh_family = AF_INET;
            nh.ipv4_nh = p.ipv4_dst;
        } else {
            nh.nh_family = AF_INET6;
            __builtin_memcpy(nh.ipv6_nh, p.ipv6_dst, 16);
        }
        count(&skb_stats, K_NEIGH);
        return bpf_redirect_neigh(p.ifindex, &nh, sizeof(nh), 0);
    }
    __builtin_memcpy(eth->h_dest, p.dmac, 6);
    __builtin_memcpy(eth->h_source, p.smac, 6);
    count(&skb_stats, K_FAST);
    return bpf_redirect(p.ifindex, 0);
}
