"""The socket tests and benchmarks start servers on: TCP_NODELAY on it and on what it accepts."""

from __future__ import annotations

import asyncio
import socket

from flashspec_serve.app import listening_socket


def test_a_listening_socket_has_tcp_nodelay_and_so_do_its_connections() -> None:
    sock = listening_socket("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) != 0
        assert sock.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY on its connections only then
        sock.listen()
        with socket.create_connection(sock.getsockname()) as _client:
            conn, _ = sock.accept()
            with conn:
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        sock.close()


def test_an_asyncio_server_on_it_streams_on_nodelay_connections() -> None:
    """What uvicorn does with ``sockets=[...]``: ``loop.create_server(sock=...)``."""

    async def main() -> list[int]:
        seen: list[int] = []

        async def handler(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handler, sock=listening_socket("127.0.0.1", 0))
        async with server:
            reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            await reader.read()
            writer.close()
        return seen

    seen = asyncio.run(main())
    assert len(seen) == 1 and seen[0] != 0
