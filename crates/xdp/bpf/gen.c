/* The lab's traffic generator, run with BPF_PROG_TEST_RUN in live-frames mode (the technique
 * of xdp-tools' xdp-trafficgen): the kernel hands this program the template frame again and
 * again, it writes the flow's addresses and port into it and transmits it with XDP_TX out of
 * the interface the run names. Flows are stepped like netmap pkt-gen's ranges:
 * packet c is flow f = c mod (srcs * dsts * ports); sport = port0 + f mod ports, then the
 * destination, then the source. Fields are written absolutely, never incrementally, because a
 * recycled page keeps what the previous run wrote -- and what the receiver wrote: a frame the
 * kernel forwarded comes back with the next hop's MACs and a lower TTL, so the Ethernet and
 * IP headers are rewritten whole for every packet.
 *
 * With proto 6 it is a SYN flood instead: every packet a TCP SYN (40-byte datagram, valid
 * checksums) to dst0:dport from a new source: the source varies fastest (srcs of them), and
 * the source port steps once per pass over the sources, so (source, port) repeats only after
 * srcs * 60,000 packets; the sequence number is the packet's count.
 *
 * TCP flows (modes GEN_TCP_OPEN, GEN_TCP_DATA): the UDP flows' addresses and ports as TCP
 * connections to port 2000. Opening, each packet is its flow's SYN (sequence GEN_ISN_C); the
 * lab's sink answers SYN/ACK (GEN_ISN_S) and the program on the generator's interface
 * (sink.c, xpf_ack) the ACK, so that both firewalls hold established connections. Then each
 * packet is a segment of its flow with 6 bytes of data at the first sequence after the SYN
 * (46-byte datagrams, as the UDP flows'): a retransmission after the first, inside every
 * window a firewall tracks.
 *
 * Paced (gen_pace's gap nonzero): a frame goes out only when it is due, one every gap
 * nanoseconds (a late generator catches up by 16 frames at most); the runs in between are
 * dropped here, unsent and uncounted. A run keeps the kernel busy for as long as its repeat
 * count lasts, so the frames leave evenly spaced instead of in bursts of one run each. */
#include "lab.h"
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/tcp.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct gen_cfg {
    __u32 src0, dst0;       /* host order */
    __u32 srcs, dsts, ports;
    __u32 sport0;
    __u8 dmac[6], smac[6];
    __u32 proto;            /* 17: UDP flows; 6: SYN flood; GEN_TCP_OPEN/DATA: TCP flows */
    __u32 dport;
};

struct xpf_map gen_cfg SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct gen_cfg), 1, 0 };
struct xpf_map gen_count SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 1, 0 };

struct gen_pace {
    __u64 gap_ns;           /* 0: as fast as the runs go */
    __u64 next_ns;          /* when the next frame is due */
};
struct xpf_map gen_pace SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct gen_pace), 1, 0 };

INLINE void ether_ip(struct ethhdr *eth, struct iphdr *ip, struct gen_cfg *cfg,
                                     __u16 len, __u8 proto, __u32 src, __u32 dst) {
    __builtin_memcpy(eth->h_dest, cfg->dmac, 6);
    __builtin_memcpy(eth->h_source, cfg->smac, 6);
    eth->h_proto = bswap16(0x0800);
    ip->version = 4;
    ip->ihl = 5;
    ip->tos = 0;
    ip->tot_len = bswap16(len);
    ip->id = 0;
    ip->frag_off = 0;
    ip->ttl = 64;
    ip->protocol = proto;
    ip->saddr = __builtin_bswap32(src);
    ip->daddr = __builtin_bswap32(dst);
    lab_ip_check(ip);
}

/* Packet c of the TCP flows: its flow's SYN (open) or a segment of 6 bytes (not open). */
INLINE int tcp_flow(struct xdp_md *ctx, struct gen_cfg *cfg, __u64 c, int open) {
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = (void *)(eth + 1);
    struct tcphdr *th = (void *)(ip + 1);
    if ((void *)th + sizeof(*th) + 6 > end)
        return XDP_DROP;
    __u32 n = cfg->srcs * cfg->dsts * cfg->ports;
    __u32 f = (__u32)(c % n);
    __u32 port = f % cfg->ports;
    f /= cfg->ports;
    __u32 dst = cfg->dst0 + f % cfg->dsts;
    __u32 src = cfg->src0 + f / cfg->dsts;
    __u32 len = open ? 20 : 26;
    ether_ip(eth, ip, cfg, 20 + len, 6, src, dst);
    __builtin_memset(th, 0, sizeof(*th) + 6);
    th->source = bswap16((__u16)(cfg->sport0 + port));
    th->dest = bswap16(2000);
    th->doff = 5;
    th->window = bswap16(64240);
    if (open) {
        th->seq = __builtin_bswap32(GEN_ISN_C);
        th->syn = 1;
    } else {
        th->seq = __builtin_bswap32(GEN_ISN_C + 1);
        th->ack_seq = __builtin_bswap32(GEN_ISN_S + 1);
        th->ack = 1;
        th->psh = 1;
    }
    th->check = lab_tcp_sum(th, end, src, dst, len);
    return XDP_TX;
}

INLINE int syn(struct xdp_md *ctx, struct gen_cfg *cfg, __u64 c) {
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = (void *)(eth + 1);
    struct tcphdr *th = (void *)(ip + 1);
    if ((void *)(th + 1) > end)
        return XDP_DROP;
    __u32 src = cfg->src0 + (__u32)(c % cfg->srcs);
    __u16 sport = (__u16)(1024 + (c / cfg->srcs) % 60000);
    ether_ip(eth, ip, cfg, 40, 6, src, cfg->dst0);
    __builtin_memset(th, 0, sizeof(*th));
    th->source = bswap16(sport);
    th->dest = bswap16((__u16)cfg->dport);
    th->seq = __builtin_bswap32((__u32)c);
    th->doff = 5;
    th->syn = 1;
    th->window = bswap16(64240);
    th->check = lab_tcp_sum(th, end, src, cfg->dst0, 20);
    return XDP_TX;
}

SEC("xdp")
int xpf_gen(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = (void *)(eth + 1);
    struct udphdr *udp = (void *)(ip + 1);
    if ((void *)(udp + 1) > end)
        return XDP_DROP;
    __u32 zero = 0;
    struct gen_cfg *cfg = bpf_map_lookup_elem(&gen_cfg, &zero);
    __u64 *ctr = bpf_map_lookup_elem(&gen_count, &zero);
    struct gen_pace *pace = bpf_map_lookup_elem(&gen_pace, &zero);
    if (!cfg || !ctr || !pace || !cfg->srcs || !cfg->dsts || !cfg->ports)
        return XDP_DROP;
    if (pace->gap_ns) {
        __u64 now = bpf_ktime_get_ns();
        if (now < pace->next_ns)
            return XDP_DROP;
        __u64 floor = now - 16 * pace->gap_ns;
        pace->next_ns = (pace->next_ns > floor ? pace->next_ns : floor) + pace->gap_ns;
    }
    __u64 c = *ctr;
    *ctr = c + 1;
    if (cfg->proto == 6)
        return syn(ctx, cfg, c);
    if (cfg->proto == GEN_TCP_OPEN || cfg->proto == GEN_TCP_DATA)
        return tcp_flow(ctx, cfg, c, cfg->proto == GEN_TCP_OPEN);
    __u32 n = cfg->srcs * cfg->dsts * cfg->ports;
    __u32 f = c % n;
    __u32 port = f % cfg->ports;
    f /= cfg->ports;
    __u32 dst = cfg->dst0 + f % cfg->dsts;
    __u32 src = cfg->src0 + f / cfg->dsts;
    ether_ip(eth, ip, cfg, 46, 17, src, dst);
    udp->source = bswap16((__u16)(cfg->sport0 + port));
    udp->dest = bswap16(2000);
    udp->len = bswap16(26);
    udp->check = 0;
    return XDP_TX;
}
