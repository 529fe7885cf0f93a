#!/usr/bin/env python3
"""Prints a TCP port on 127.0.0.1 that is free now, for a test that must name a server's port
before the server starts (PaddleRec's PADDLE_PSERVERS_IP_PORT_LIST names it in advance).

The port is drawn below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range):
a port taken by binding port 0 and closing comes from that range, and so do the ports of every
server started with --port 0 and of every outgoing connection of the tests running beside this
one, any of which could take it before the test's server binds it. Below the range only another
test's drawn port can collide, one chance in thousands, and the draw checks that it binds."""
import random
import socket


def ephemeral_low(default=32768):
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def main():
    high = ephemeral_low()
    low = 10000 if high > 12000 else 1024
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, high)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        print(port)
        return 0
    raise SystemExit(f"free_port: no free port in {low}..{high - 1} after 200 draws")


if __name__ == "__main__":
    raise SystemExit(main())
