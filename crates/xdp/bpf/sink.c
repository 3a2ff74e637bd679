/* The lab's sink: counts and drops everything that reaches it. */
#include "xpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct xpf_map sink_count SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 1, 0 };

SEC("xdp")
int xpf_sink(struct xdp_md *ctx) {
    count(&sink_count, 0);
    return XDP_DROP;
}
