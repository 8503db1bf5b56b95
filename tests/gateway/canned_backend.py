"""A backend that answers every request with the same bytes, and a keyed app in front of it:
for tests of what the gateway does with what a backend reports (usage, counts)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from litestar import Litestar

from gateway.access.keystore_file import FileKeyStore
from gateway.composition import create_app
from gateway.config.settings import AuthSettings, Settings
from gateway.config.tier_settings import TierSettings
from policies.keys import issue_key
from policies.principal import KeyPolicy


@contextmanager
def canned_backend(answer: bytes, stream_answer: bytes) -> Iterator[str]:
    """A backend's URL: POSTs get ``answer`` (JSON) or, when they ask to stream,
    ``stream_answer`` (SSE); GETs (health probes, /v1/models) get ``{}``."""

    class Backend(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # the stdlib's name
            sent = self.rfile.read(int(self.headers["Content-Length"]))
            stream = b'"stream":true' in sent.replace(b" ", b"")
            body = stream_answer if stream else answer
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # health probes and /v1/models: answered 200
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def keyed_app(backend: str, keys_dir: Path, tpm: int) -> tuple[Litestar, str]:
    """The gateway app with its fast tier on ``backend`` and one key of ``tpm`` tokens a
    minute (returned with the app)."""
    store = FileKeyStore(keys_dir / "keys.yaml")
    record, token = issue_key("team", KeyPolicy(tpm=tpm), now=time.time())
    store.put_sync(record)
    settings = Settings(
        tiers={
            "fast": TierSettings(model="m", replicas=[backend], default_max_tokens=16),
            "precise": TierSettings(model="p", replicas=["http://127.0.0.1:9"]),
        },
        auth=AuthSettings(keys_file=store.path, cache_ttl_s=0, keys_reload_interval_s=0),
    )
    return create_app(settings), token
