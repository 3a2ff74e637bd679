/* The lab's sink: counts and drops everything that reaches it, and each IPv4 source (by the
 * low 16 bits of its address: the shaper lab's members) apart; ICMP goes on to the kernel,
 * which answers pings (the shaper lab's idle member). */
#include "xpf.h"
#include <linux/ip.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct xpf_map sink_count SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 1, 0 };
struct xpf_map sink_src SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, 8, 65536, 0 };

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
    __u32 k = bswap32(ip->saddr) & 0xffff;
    __u64 *c = bpf_map_lookup_elem(&sink_src, &k);
    if (c)
        __sync_fetch_and_add(c, 1);
    return XDP_DROP;
}
