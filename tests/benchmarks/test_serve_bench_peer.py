"""The serve bench's peer attempts: a first attempt that never answers (the peer's compiled path
compiling on its first requests) leaves the fallback its share of the time, and says why it failed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flashspec_bench import serve as sb

# A stand-in for the peer: offline-ready at once; with its default compile mode its completions
# never come (what its torch.compile path looks like from outside for minutes), with
# `--compile off` it answers.
STAND_IN = """
import argparse, json, os, time, uuid
from http.server import BaseHTTPRequestHandler, HTTPServer

p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
p.add_argument("--target")
p.add_argument("--compile", default="auto")
args, _ = p.parse_known_args()
print(f"offline={os.environ.get('HF_HUB_OFFLINE')} torch_logs={os.environ.get('TORCH_LOGS')}", flush=True)
if args.target == "broken":
    raise SystemExit("cannot load broken")


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(200, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if args.compile != "off":
            print("still compiling", flush=True)
            time.sleep(600)
        self.reply(200, {"id": uuid.uuid4().hex, "choices": [{"text": "echo: " + body["prompt"]}],
                         "usage": {"completion_tokens": 3}})


HTTPServer(("127.0.0.1", args.port), H).serve_forever()
"""


def _stand_in(root: Path) -> Path:
    serve = root / "flashspec" / "serve"
    serve.mkdir(parents=True)
    (root / "flashspec" / "__init__.py").write_text("")
    (serve / "__init__.py").write_text("")
    (serve / "__main__.py").write_text(STAND_IN)
    return root


def _setups(site: Path, target: str = "target") -> object:
    return lambda extra: sb.PeerSetup(site, target, "draft", "float32", 0.0, 4, extra)


def test_a_first_attempt_that_never_answers_leaves_the_fallback_its_share(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    spec = sb.Load(("p one", "p two"), (1,), 1, 4, {"temperature": 0.0})
    start = time.monotonic()
    rows, requests, notes, failures = sb.peer_runs(_setups(_stand_in(tmp_path / "site")), [(), ("--compile", "off")],
                                                   spec, tmp_path / "peer.log", lambda _: None, start + 8)
    took = time.monotonic() - start
    assert rows["c1"]["requests"] == 1 and rows["c1"]["failed"] == 0 and requests is not None
    # the first attempt was cut at its half (4 s), and its failure quotes its log: offline, compiles logged
    assert len(failures) == 1 and failures[0].startswith("with []: timed_out")
    assert "still compiling" in failures[0] and "offline=1 torch_logs=recompiles" in failures[0]
    assert any(n.startswith("peer command:") and n.endswith("--compile off") for n in notes)
    assert any(n.startswith("peer attempts that failed: with []: timed_out") for n in notes)
    assert took < 8 + 2 * sb.STOP_S


def test_a_peer_that_no_attempt_starts_is_skipped_with_every_reason(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    spec = sb.Load(("p",), (1,), 1, 4, {"temperature": 0.0})
    rows, requests, _, failures = sb.peer_runs(_setups(_stand_in(tmp_path / "site"), "broken"),
                                               [(), ("--compile", "off")], spec, tmp_path / "peer.log",
                                               lambda _: None, time.monotonic() + 30)
    assert requests is None and len(failures) == 2
    assert rows == {"skipped": "; ".join(failures)} and all("cannot load broken" in f for f in failures)
