"""Throw-away HTTP servers on 127.0.0.1: one serving files the tests create, one standing in for a
tracking server that dies."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep test output clean
        pass


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _GoneAfterHealth(http.server.BaseHTTPRequestHandler):
    """/health answers 200 as MLflow's does; any other request is dropped unanswered."""

    def do_GET(self) -> None:
        if self.path != "/health":
            self.close_connection = True
            return
        body = b"OK"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.health_answered.set()

    def do_POST(self) -> None:
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def server_gone_after_health() -> Iterator[str]:
    """A tracking server that dies right after its health check: it answers /health once, then stops
    listening (connections are refused); a request that reaches it before then gets no answer."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GoneAfterHealth)
    server.health_answered = threading.Event()

    def stop_after_health() -> None:
        server.health_answered.wait()
        server.shutdown()
        server.server_close()

    threading.Thread(target=server.serve_forever, daemon=True).start()
    stopper = threading.Thread(target=stop_after_health, daemon=True)
    stopper.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.health_answered.set()
        stopper.join()
