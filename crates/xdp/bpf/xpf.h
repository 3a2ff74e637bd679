/* Shared by xpf's XDP programs. No libbpf: helpers are declared here by number, maps are
 * plain `struct xpf_map` definitions in section "maps" that xpf's own loader (src/obj.rs)
 * creates and links. License of the BPF programs: BSD-2-Clause OR GPL-2.0 (the GPL choice is
 * what lets the kernel give them bpf_fib_lookup). */
#ifndef XPF_BPF_H
#define XPF_BPF_H
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>

#define AF_INET 2
#define AF_INET6 10

#define SEC(n) __attribute__((section(n), used))
#define INLINE static inline __attribute__((always_inline))

struct xpf_map {
    __u32 type, key_size, value_size, max_entries, flags;
};

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)BPF_FUNC_redirect_map;
static long (*bpf_xdp_adjust_head)(struct xdp_md *ctx, int delta) = (void *)BPF_FUNC_xdp_adjust_head;
static long (*bpf_fib_lookup)(void *ctx, struct bpf_fib_lookup *p, int len, __u32 flags) =
    (void *)BPF_FUNC_fib_lookup;

static long (*bpf_redirect)(__u32 ifindex, __u64 flags) = (void *)BPF_FUNC_redirect;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)BPF_FUNC_ktime_get_ns;

/* What bpf/inject.c writes in a frame's metadata: xpfd gives it back to the kernel. */
#define XPF_GIVEN_BACK 0x78706662

#define bswap16(x) __builtin_bswap16(x)
#define bswap32(x) __builtin_bswap32(x)
#define htons(x) bswap16(x)
#define htonl(x) __builtin_bswap32(x)

INLINE void count(void *map, __u32 i) {
    __u64 *c = bpf_map_lookup_elem(map, &i);
    if (c)
        *c += 1;
}
#endif
