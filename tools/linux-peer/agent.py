#!/usr/bin/python3
"""The Linux peer's command channel.

`agent.py serve --port P` runs inside the guest: for each TCP connection it
reads one request (a JSON line: the shell command and its time bound), runs
the command in a session of its own with stdout and stderr merged, streams
the output back and ends with the exit status. A command still running at
its bound is killed (TERM, then KILL 2 s later) and reports 124, as
timeout(1) does; a command whose client went away is killed too, so that a
host-side test that is killed leaves nothing running in the guest.

`agent.py run --host H --port P [--timeout S] [--connect S] -- CMD...` is the
host's side: it prints what the command printed and exits with its status.
`agent.py wait --host H --port P --connect S` waits until the agent answers.

Frames, guest to host: one type byte ('o' output, 'x' exit status) and a
4-byte big-endian length, then that many bytes.
"""
import argparse
import json
import os
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time


def _frame(kind, data):
    return kind + struct.pack(">I", len(data)) + data


def _serve_one(conn):
    with conn:
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buf += chunk
        req = json.loads(buf.split(b"\n", 1)[0])
        bound = float(req.get("timeout", 60))
        proc = subprocess.Popen(
            ["/bin/bash", "-c", req["cmd"]], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=os.environ.get("TMPDIR", "/"))
        deadline = time.monotonic() + bound
        killed_at = None
        status = None
        out_open = True
        client_gone = False
        while out_open:
            wait = max(0.0, min(1.0, deadline - time.monotonic()))
            rd, _, _ = select.select([proc.stdout, conn], [], [], wait)
            if proc.stdout in rd:
                data = os.read(proc.stdout.fileno(), 65536)
                if not data:
                    out_open = False
                elif not client_gone:
                    try:
                        conn.sendall(_frame(b"o", data))
                    except OSError:
                        client_gone = True
            if conn in rd and not client_gone:
                try:
                    gone = conn.recv(4096) == b""
                except OSError:
                    gone = True
                if gone:
                    client_gone = True
                    _kill(proc, signal.SIGKILL)
            now = time.monotonic()
            if now >= deadline and killed_at is None:
                status = 124
                killed_at = now
                _kill(proc, signal.SIGTERM)
            elif killed_at is not None and now >= killed_at + 2:
                _kill(proc, signal.SIGKILL)
        rc = proc.wait()
        # Whatever the command left behind in its session goes with it.
        _kill(proc, signal.SIGKILL)
        if status is None:
            status = rc if rc >= 0 else 128 - rc
        if not client_gone:
            try:
                conn.sendall(_frame(b"x", str(status).encode()))
            except OSError:
                pass


def _kill(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def serve(port):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    srv.bind(("::", port))
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()


def _connect(host, port, within):
    deadline = time.monotonic() + within
    while True:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def run(host, port, cmd, bound, within):
    try:
        sock = _connect(host, port, within)
    except OSError as e:
        print(f"linux-peer: cannot reach the guest's agent at {host}:{port}: {e}", file=sys.stderr)
        return 125
    sock.settimeout(None)
    sock.sendall(json.dumps({"cmd": cmd, "timeout": bound}).encode() + b"\n")
    out = sys.stdout.buffer
    while True:
        head = _recv_exact(sock, 5)
        if head is None:
            print("linux-peer: the guest's agent closed the connection", file=sys.stderr)
            return 125
        kind, n = head[:1], struct.unpack(">I", head[1:])[0]
        data = _recv_exact(sock, n)
        if data is None:
            return 125
        if kind == b"o":
            out.write(data)
            out.flush()
        elif kind == b"x":
            return int(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=7777)
    for name in ("run", "wait"):
        r = sub.add_parser(name)
        r.add_argument("--host", required=True)
        r.add_argument("--port", type=int, default=7777)
        r.add_argument("--timeout", type=float, default=60)
        r.add_argument("--connect", type=float, default=5)
        if name == "run":
            r.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.verb == "serve":
        serve(a.port)
        return 0
    if a.verb == "wait":
        return run(a.host, a.port, "true", 10, a.connect)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("run needs a command")
    line = cmd[0] if len(cmd) == 1 else shlex.join(cmd)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run(a.host, a.port, line, a.timeout, a.connect)


if __name__ == "__main__":
    sys.exit(main())
