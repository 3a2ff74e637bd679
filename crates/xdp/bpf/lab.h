/* What the lab's generator (gen.c) and its sink and answerer (sink.c) share: the TCP flows'
 * modes and initial sequence numbers, and checksums written whole. */
#ifndef XPF_LAB_H
#define XPF_LAB_H
#include "xpf.h"
#include <linux/ip.h>
#include <linux/tcp.h>

/* gen_cfg.proto for the TCP flows: their SYNs, then their data segments. */
#define GEN_TCP_OPEN 1
#define GEN_TCP_DATA 2
/* The connections' initial sequence numbers: the generator's side, the sink's side. */
#define GEN_ISN_C 0x10000000u
#define GEN_ISN_S 0x20000000u

INLINE __u32 lab_fold(__u32 sum) {
    sum = (sum & 0xffff) + (sum >> 16);
    return (sum & 0xffff) + (sum >> 16);
}

/* Writes the IPv4 header's checksum (20 bytes, no options). */
INLINE void lab_ip_check(struct iphdr *ip) {
    ip->check = 0;
    __u32 sum = 0;
    __u16 *w = (__u16 *)ip;
#pragma unroll
    for (int i = 0; i < 10; i++)
        sum += w[i];
    ip->check = ~lab_fold(sum);
}

/* The checksum of a TCP segment of `len` bytes at th, from src to dst (host order): a
 * 20-byte header and no data, or 6 bytes of data (len 26); th->check must be 0. */
INLINE __u16 lab_tcp_sum(struct tcphdr *th, void *end, __u32 src, __u32 dst, __u32 len) {
    __u32 sum = (src >> 16) + (src & 0xffff) + (dst >> 16) + (dst & 0xffff) + 6 + len;
    sum = bswap16(lab_fold(sum));
    __u16 *w = (__u16 *)th;
    if ((void *)(w + 10) > end)
        return 0;
#pragma unroll
    for (int i = 0; i < 10; i++)
        sum += w[i];
    if (len == 26) {
        if ((void *)(w + 13) > end)
            return 0;
        sum += w[10] + w[11] + w[12];
    }
    return ~lab_fold(sum);
}
#endif
