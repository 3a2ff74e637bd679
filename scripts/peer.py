#!/usr/bin/env python3
"""Answers every TCP connection and UDP datagram with the address and port it came from, as
the server saw them: what the NAT scenarios check translations by.

usage: peer.py ADDR PORT        (TCP and UDP on the same port; runs until killed)
"""
import socket
import sys
import threading

addr, port = sys.argv[1], int(sys.argv[2])
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET


def tcp():
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(128)
    while True:
        c, peer = s.accept()
        try:
            c.sendall(f"{peer[0]} {peer[1]}\n".encode())
        finally:
            c.close()


def udp():
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.bind((addr, port))
    while True:
        _, peer = s.recvfrom(2048)
        s.sendto(f"{peer[0]} {peer[1]}\n".encode(), peer)


threading.Thread(target=tcp, daemon=True).start()
udp()
