/* The lab's sink: counts and drops everything that reaches it, and each IPv4 source (by the
 * low 16 bits of its address: the shaper lab's members) apart; ICMP goes on to the kernel,
 * which answers pings (the shaper lab's idle member). A SYN to port 2000 (the generator's
 * TCP flows opening) goes on too, to xpf_answer at the sink's tcx ingress, which sends back
 * its SYN/ACK as a socket buffer (an XDP_TX into a veth whose peer runs no XDP program,
 * the kernel's turn in the lab, was lost once its first 256 filled the peer's ring). On the
 * generator's interface, xpf_ack answers the SYN/ACK with the ACK that completes the
 * handshake. */
#include "lab.h"
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/pkt_cls.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct xpf_map sink_count SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 1, 0 };
/* Mapped by the lab (BPF_F_MMAPABLE): the shaper lab reads every member's count at one
 * instant, without a lookup each. */
struct xpf_map sink_src SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, 8, 65536, BPF_F_MMAPABLE };

/* Answers the TCP flows' handshake in place: a SYN to port 2000 with its SYN/ACK (syn), a
 * SYN/ACK from port 2000 with its ACK (!syn); 1 when it did. The frame goes back where it
 * came from, addresses and ports swapped. */
INLINE int answer(void *data, void *end, int syn) {
    struct ethhdr *eth = data;
    struct iphdr *ip = (void *)(eth + 1);
    struct tcphdr *th = (void *)(ip + 1);
    if ((void *)(th + 1) > end || eth->h_proto != bswap16(ETH_P_IP) || ip->protocol != IPPROTO_TCP ||
        ip->ihl != 5 || th->doff != 5 || th->rst || th->fin || th->syn != 1)
        return 0;
    if (syn ? (th->ack || th->dest != bswap16(2000)) : (!th->ack || th->source != bswap16(2000)))
        return 0;
    __u8 mac[6];
    __builtin_memcpy(mac, eth->h_dest, 6);
    __builtin_memcpy(eth->h_dest, eth->h_source, 6);
    __builtin_memcpy(eth->h_source, mac, 6);
    __u32 a = ip->saddr;
    ip->saddr = ip->daddr;
    ip->daddr = a;
    ip->ttl = 64;
    ip->tot_len = bswap16(40);
    lab_ip_check(ip);
    __u16 p = th->source;
    th->source = th->dest;
    th->dest = p;
    __u32 seq = bswap32(th->seq), ack = th->ack_seq;
    th->ack_seq = bswap32(seq + 1);
    th->seq = syn ? bswap32(GEN_ISN_S) : ack;
    th->syn = syn;
    th->ack = 1;
    th->window = bswap16(64240);
    th->check = 0;
    th->urg_ptr = 0;
    th->check = lab_tcp_sum(th, end, bswap32(ip->saddr), bswap32(ip->daddr), 20);
    return 1;
}

SEC("xdp")
int xpf_sink(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = (void *)(eth + 1);
    count(&sink_count, 0);
    if ((void *)(ip + 1) > end || eth->h_proto != bswap16(ETH_P_IP))
        return XDP_DROP;
    if (ip->protocol == IPPROTO_ICMP)
        return XDP_PASS;
    /* A SYN of the TCP flows: to xpf_answer (the answer leaves as a socket buffer). */
    struct tcphdr *th = (void *)(ip + 1);
    if (ip->protocol == IPPROTO_TCP && (void *)(th + 1) <= end && th->syn && !th->ack &&
        th->dest == bswap16(2000))
        return XDP_PASS;
    __u32 k = bswap32(ip->saddr) & 0xffff;
    __u64 *c = bpf_map_lookup_elem(&sink_src, &k);
    if (c)
        __sync_fetch_and_add(c, 1);
    return XDP_DROP;
}

/* On the generator's interface: the ACK for the sink's SYN/ACK; the rest to the kernel. */
SEC("xdp/ack")
int xpf_ack(struct xdp_md *ctx) {
    return answer((void *)(long)ctx->data, (void *)(long)ctx->data_end, 0) ? XDP_TX : XDP_PASS;
}

/* At the sink's tcx ingress: the SYN/ACK for a SYN of the TCP flows, sent back out. */
SEC("tc/answer")
int xpf_answer(struct __sk_buff *skb) {
    if (answer((void *)(long)skb->data, (void *)(long)skb->data_end, 1))
        return bpf_redirect(skb->ifindex, 0);
    return TC_ACT_OK;
}
