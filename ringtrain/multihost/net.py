"""Ports and addresses: free ports, whether a server answers, and waiting
for a condition with a deadline."""
import socket
import time


def free_ports(count, host="127.0.0.1"):
    """`count` distinct free ports on this machine, found by binding to port 0
    (all held until all are chosen, so none is handed out twice)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def is_listening(address, timeout=1.0):
    """Whether something accepts TCP connections at 'host:port'."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


# HTTP/2's connection preface and an empty SETTINGS frame: what a gRPC client sends first.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def grpc_answers(address, timeout=3.0):
    """Whether a gRPC server at 'host:port' answers, not just accepts: a frozen
    process's kernel still completes the TCP handshake, but only a running
    server sends its HTTP/2 SETTINGS back."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as conn:
            conn.sendall(HTTP2_PREFACE)
            return len(conn.recv(9)) > 0
    except OSError:
        return False


def is_local_host(host):
    """Whether `host` names this machine: it resolves to an address that a
    socket here can bind (a loopback address or one of our interfaces)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((sockaddr[0], 0))
                return True
            except OSError:
                continue
    return False


def wait_for(predicate, timeout, poll=0.25):
    """Call predicate() until it returns something true or `timeout` seconds
    pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(poll)


def main(argv=None):
    """`python -m ringtrain.multihost.net free-ports N`: N free ports on this host, one
    line; how a launcher picks ports on another host (over ssh)."""
    import sys
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "free-ports" or not argv[1].isdigit():
        sys.stderr.write("usage: python -m ringtrain.multihost.net free-ports N\n")
        return 2
    print(" ".join(map(str, free_ports(int(argv[1]), host=""))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
