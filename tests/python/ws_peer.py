"""A bus client as another user would run it, for the tests of per-peer
shares: plain sockets and the standard library only, so that it runs as any
uid with the system's python.

  ws_peer.py URL hold N   open N websocket connections (as many as the bus
                          accepts), print "held K", then keep them, reading
                          nothing (no ping is answered), until stdin closes
  ws_peer.py URL send     read frames (one JSON text a line) from stdin until
                          an empty line, send them on one connection, then
                          print the type and error of each frame received
                          (one JSON line each) until stdin closes
"""

import base64
import json
import os
import socket
import struct
import sys
import threading
from urllib.parse import urlparse


def connect(url):
    parts = urlparse(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed during the handshake")
        answer += chunk
    if not answer.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(answer.split(b"\r\n")[0].decode())
    sock.settimeout(None)
    return sock, answer.split(b"\r\n\r\n", 1)[1]


def send_text(sock, text):
    payload = text.encode()
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x81, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
    # A mask of zeros: the payload goes as it is.
    sock.sendall(head + b"\0\0\0\0" + payload)


def frames(sock, buffered):
    data = buffered

    def need(n):
        nonlocal data
        while len(data) < n:
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise EOFError
            data += chunk

    while True:
        need(2)
        opcode, n = data[0] & 0x0F, data[1] & 0x7F
        at = 2
        if n == 126:
            need(4)
            n, at = struct.unpack("!H", data[2:4])[0], 4
        elif n == 127:
            need(10)
            n, at = struct.unpack("!Q", data[2:10])[0], 10
        need(at + n)
        payload, data = data[at : at + n], data[at + n :]
        yield opcode, payload


def hold(url, count):
    held = []
    for _ in range(count):
        try:
            held.append(connect(url)[0])
        except (OSError, ConnectionError):
            break
    print(f"held {len(held)}", flush=True)
    sys.stdin.read()


def send(url):
    sock, buffered = connect(url)
    for line in sys.stdin:
        if not line.strip():
            break
        send_text(sock, line.strip())
    print("sent", flush=True)

    def report():
        try:
            for opcode, payload in frames(sock, buffered):
                if opcode != 1:
                    continue
                message = json.loads(payload)
                error = str(message.get("data", {}).get("error", ""))[:200]
                print(json.dumps({"type": message.get("type"), "error": error}), flush=True)
        except (EOFError, OSError):
            pass

    threading.Thread(target=report, daemon=True).start()
    sys.stdin.read()


if __name__ == "__main__":
    if sys.argv[2] == "hold":
        hold(sys.argv[1], int(sys.argv[3]))
    else:
        send(sys.argv[1])
