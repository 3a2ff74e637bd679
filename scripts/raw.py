#!/usr/bin/env python3
"""IP packets of a protocol without ports (GRE 47, ESP 50, ...) over raw sockets.

raw.py echo PROTO
    Sends every packet of PROTO this host receives back to its source, from the address it
    was sent to (the kernel fills the IP checksum in).
raw.py send PROTO N SRC[,SRC...] DST[,DST...]
    N flows, the i-th from the i-th source to the i-th destination (each list taken round):
    a packet each, sent up to three times, 0.5 s apart, until its echo comes back from the
    destination. Prints how many came back.
"""
import select
import socket
import struct
import sys
import time


def echo(proto):
    r = socket.socket(socket.AF_INET, socket.SOCK_RAW, proto)
    w = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    while True:
        d, _ = r.recvfrom(65535)
        body = d[(d[0] & 15) * 4:]
        h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(body), 0, 0, 64, proto, 0, d[16:20], d[12:16])
        w.sendto(h + body, (socket.inet_ntoa(d[12:16]), 0))


def send(proto, n, srcs, dsts):
    ok = 0
    for i in range(n):
        src, dst = srcs[i % len(srcs)], dsts[i % len(dsts)]
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, proto)
        s.bind((src, 0))
        # A GRE header (no flags, IPv4 payload) and the flow's number.
        msg = b"\x00\x00\x08\x00flow %d" % i
        got = False
        for _ in range(3):
            s.sendto(msg, (dst, 0))
            end = time.time() + 0.5
            while not got and time.time() < end:
                if select.select([s], [], [], max(0, end - time.time()))[0]:
                    d = s.recv(65535)
                    got = d[(d[0] & 15) * 4:] == msg and socket.inet_ntoa(d[12:16]) == dst
            if got:
                break
        ok += got
        s.close()
    print(ok)


if __name__ == "__main__":
    if sys.argv[1] == "echo":
        echo(int(sys.argv[2]))
    else:
        send(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(","), sys.argv[5].split(","))
