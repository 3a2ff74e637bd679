/* xpfd's way to give the kernel a frame as if the interface had received it: run with
 * BPF_PROG_TEST_RUN in live-frame mode on that interface, it passes the frame up the stack.
 * xpfd uses it for the packets the steering program sent it that turn out to be the host's
 * (addressed to a translation target, but belonging to no translation). */
#include "xpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("xdp")
int xpf_inject(struct xdp_md *ctx) {
    return XDP_PASS;
}
