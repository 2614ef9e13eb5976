"""A free TCP port for a test's server or rendezvous (the OS picks it: nothing hard-coded)."""

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
