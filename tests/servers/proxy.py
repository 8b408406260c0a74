"""A TCP proxy on 127.0.0.1 that tests stop and start, to take a server away and bring it back.

Clients are given the proxy's address instead of the server's. :meth:`TcpProxy.stop`
ends the proxy, which closes its listening socket and cuts every open connection (what a
store that went down looks like to its clients: refused connections, requests in flight
cut); the server behind it keeps its data. :meth:`TcpProxy.start` listens again on the
same port.

The proxy runs in a child process: a library call that blocks holding the GIL (some of
delta-rs's) would otherwise stop a proxy thread of the same process from answering it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading

from tests.servers.s3 import _repo_root


class TcpProxy:
    """Forwards every connection made to ``127.0.0.1:<port>`` to ``target`` (from a child
    process; see the module docstring)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.host = "127.0.0.1"
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None

    def start(self) -> TcpProxy:
        """Listen (again, on the same port once it has one)."""
        if self._process is not None:
            return self
        target = f"{self.target[0]}:{self.target[1]}"
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.servers.proxy", str(self.port), target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=_repo_root(),
        )
        assert process.stdout is not None
        line = process.stdout.readline().decode().split()
        if line[:1] != ["PORT"]:
            process.kill()
            raise RuntimeError(f"the proxy did not start: {line}")
        self.port = int(line[1])
        self._process = process
        return self

    def stop(self) -> None:
        """Refuse new connections and cut the open ones."""
        process, self._process = self._process, None
        if process is None:
            return
        process.kill()
        process.wait(timeout=10)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class _Proxy:
    """The proxy itself, in the child process: a thread accepting, two per connection."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for conn in (source, sink):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            source.close()


def main(argv: list[str]) -> None:
    port, target = int(argv[0]), argv[1]
    host, target_port = target.rsplit(":", 1)
    proxy = _Proxy(host, int(target_port))
    proxy.port = port
    proxy.start()
    sys.stdout.write(f"PORT {proxy.port}\n")
    sys.stdout.flush()
    for _ in sys.stdin.buffer:  # until the parent goes (even SIGKILLed)
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
