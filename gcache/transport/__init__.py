"""Moving bytes between an SDK and a data server. Imports only top-level modules."""

from gcache.transport.stream import StreamConnection
from gcache.transport.tcp import TcpListener, connect, parse_address

__all__ = ["StreamConnection", "TcpListener", "connect", "parse_address"]
