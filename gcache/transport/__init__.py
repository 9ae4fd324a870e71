"""Moving bytes between an SDK and a data server. Imports only top-level modules."""

from gcache.transport.connection import Connection
from gcache.transport.tcp import TcpConnection, TcpListener, connect, parse_address

__all__ = ["Connection", "TcpConnection", "TcpListener", "connect", "parse_address"]
