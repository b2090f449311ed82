"""Is a TCP port free to listen on? `make run` asks before it starts anything."""

from __future__ import annotations

import errno
import socket


def port_in_use(host: str, port: int) -> bool:
    """True when a server could not listen on host:port (someone else holds it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As the servers do: a port in TIME_WAIT is free for them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def first_taken(host: str, ports: dict[str, int]) -> str | None:
    """One line naming the first taken port and the variable that moves it, or None."""
    for variable, port in ports.items():
        if port_in_use(host, port):
            return f"make run: port {port} is in use (set {variable} to another port)"
    return None
