/* xpfd's way to give the kernel a frame as if the interface had received it: run with
 * BPF_PROG_TEST_RUN in live-frame mode on that interface, it passes the frame up the stack.
 * xpfd uses it for the packets sent to it that turn out to be the host's (addressed to a
 * translation target, but belonging to no translation). The frame is marked in its metadata
 * (XPF_GIVEN_BACK), which the kernel keeps into the socket buffer: packet mode's tcx program
 * (skb.c), which would send a frame to a translation target to xpfd again, lets it by. */
#include "xpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

static long (*bpf_xdp_adjust_meta)(struct xdp_md *ctx, int delta) = (void *)BPF_FUNC_xdp_adjust_meta;

SEC("xdp")
int xpf_inject(struct xdp_md *ctx) {
    if (bpf_xdp_adjust_meta(ctx, -4) == 0) {
        void *meta = (void *)(long)ctx->data_meta;
        void *data = (void *)(long)ctx->data;
        if (meta + 4 <= data)
            *(__u32 *)meta = XPF_GIVEN_BACK;
    }
    return XDP_PASS;
}
