#!/usr/bin/env python3
"""An attacker on the wire between client and target, for tests/native_ethernet.rs.

Usage: attacker.py IFACE SECONDS ETHERTYPE

Captures the native transport frames (EtherType ETHERTYPE) it sees on
IFACE addressed to other hosts (a hub between the client and the target:
both directions) and, for every fifth captured frame, sends an exact replay
of an earlier frame, a copy with one byte flipped (forged), a truncated
copy, and the frame's prefix followed by random bytes, each to the host the
original was for. Prints what it sent as JSON. Runs in its own network
namespace (ip netns exec), needs CAP_NET_RAW.
"""
import json
import random
import socket
import sys
import time

ETH_P_ALL = 3


def main():
    iface, seconds, ethertype = sys.argv[1], float(sys.argv[2]), int(sys.argv[3], 0)
    et = ethertype.to_bytes(2, "big")
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((iface, 0))
    s.settimeout(0.2)
    rng = random.Random(1)
    captured = []
    ours = set()
    sent = {"replayed": 0, "forged": 0, "truncated": 0, "garbage": 0}
    end = time.time() + seconds

    def send(frame):
        ours.add(frame)
        if len(ours) > 4096:
            ours.clear()
        s.send(frame)

    while time.time() < end:
        try:
            frame, addr = s.recvfrom(65535)
        except socket.timeout:
            continue
        if addr[2] != socket.PACKET_OTHERHOST or frame[12:14] != et or len(frame) < 14 + 40:
            continue
        if frame in ours:
            continue
        captured.append(frame)
        captured = captured[-256:]
        if len(captured) % 5:
            continue
        send(rng.choice(captured))
        sent["replayed"] += 1
        forged = bytearray(frame)
        i = rng.randrange(14 + 8, len(forged))
        forged[i] ^= 0xFF
        send(bytes(forged))
        sent["forged"] += 1
        send(frame[: rng.randrange(14 + 1, len(frame))])
        sent["truncated"] += 1
        send(frame[: 14 + 8] + bytes(rng.getrandbits(8) for _ in range(200)))
        sent["garbage"] += 1
    print(json.dumps(sent))


if __name__ == "__main__":
    main()
