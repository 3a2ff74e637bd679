#!/usr/bin/env python3
"""Long TCP transfers for the failover scenario (scripts/failover.sh).

server PORT RATE: every connection gets RATE bytes/s of data until it closes.
client HOST PORT N SECONDS: opens N connections, reads for SECONDS, then prints one line per
flow and a summary. A flow is lost if it failed (reset, timeout) or received nothing in its
last 3 seconds; the longest pause in any flow is printed too (the failover's gap).
"""
import socket, sys, threading, time

def serve(port, rate):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(64)
    chunk = b"x" * 16384
    def pump(c):
        try:
            per = rate / 50
            while True:
                sent = 0
                t = time.monotonic()
                while sent < per:
                    sent += c.send(chunk)
                time.sleep(max(0, 0.02 - (time.monotonic() - t)))
        except OSError:
            pass
        finally:
            c.close()
    while True:
        c, _ = ls.accept()
        threading.Thread(target=pump, args=(c,), daemon=True).start()

def client(host, port, n, secs):
    res = [None] * n
    def run(i):
        got, last, gap, err = 0, None, 0.0, ""
        try:
            s = socket.create_connection((host, port), timeout=5)
            s.settimeout(20)
            start = time.monotonic()
            last = start
            while time.monotonic() - start < secs:
                b = s.recv(65536)
                if not b:
                    err = "closed by peer"
                    break
                now = time.monotonic()
                gap = max(gap, now - last)
                last = now
                got += len(b)
            s.close()
        except OSError as e:
            err = str(e) or type(e).__name__
        end = time.monotonic()
        stalled = last is None or end - last > 3
        res[i] = (got, gap, err, stalled)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
        time.sleep(0.05)
    for t in ts:
        t.join()
    lost = 0
    for i, (got, gap, err, stalled) in enumerate(res):
        bad = bool(err) or stalled
        lost += bad
        print(f"flow {i}: {got} bytes, longest pause {gap:.2f} s{', LOST: ' + (err or 'stalled') if bad else ''}")
    print(f"flows carried over: {n - lost}, lost: {lost}, longest pause {max(r[1] for r in res):.2f} s")
    return lost

if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(1 if client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])) else 0)
