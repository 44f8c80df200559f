"""Demo requests: hostile and careless clients of the real demo server (``capsnets.demo.app.serve``, uvicorn on
localhost, in a subprocess whose log is read). JSON bodies with huge integers, numbers past float range, NaN and
Infinity, wrong types, nested lists and deep nesting; clients that declare a length and hang up early, or send half
a body and wait; bodies at and past the size limit; capsule values at and past the range the decoder is asked to
decode, and a model that overflows. Each gets a 4xx with a one-line message (or, for a client that is gone, one
line in the log), never a traceback. Behind ``faults_long``, a bounded load test records the latency percentiles and
the server's memory (``CAPSNETS_LOAD_REPORT=FILE`` keeps its JSON report).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

RUNNER = Path(__file__).with_name("demo_server.py")
#: The body timeout the fast tests' server runs with (seconds), instead of the default.
TIMEOUT = 1.0
GOOD = [[0.5] * 8] * 8
ROWS = b",[0,0,0,0,0,0,0,0]" * 7  # the other 7 rows of an 8x8 image
GONE = "the client went away before its body was in"


class Server:
    """The demo server in a subprocess: requests to it, its log and its memory."""

    def __init__(self, log: Path, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), *sys.path])}
        self.log = log
        with open(log, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(RUNNER), *args], env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        first = self.process.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", first)
        assert match, f"the demo server did not start: {first!r}\n{self.log_text()}"
        self.port = int(match.group(1))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.process.stdout.close()

    def log_text(self, start: int = 0) -> str:
        return self.log.read_text()[start:]

    def mark(self) -> int:
        return len(self.log.read_text())

    def rss(self) -> int:
        """The server process's resident memory in bytes (Linux ``/proc``)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024

    def post(self, path: str, body: bytes, timeout: float = 60) -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)


def headers(path: str, length: int | None) -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{size}\r\n".encode()


def status_of(sock: socket.socket) -> tuple[int, str]:
    """The status and body of the response the server sends on ``sock`` (which it then closes)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        if b"\r\n\r\n" in data and len(data.split(b"\r\n\r\n", 1)[1]) >= _length(data):
            break
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def _length(data: bytes) -> int:
    match = re.search(rb"content-length: (\d+)", data.split(b"\r\n\r\n", 1)[0], re.IGNORECASE)
    return int(match.group(1)) if match else 1 << 30


def wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.05)


def assert_no_traceback(text: str) -> None:
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text[-3000:]


@pytest.fixture(scope="module")
def server(tmp_path_factory, web_stack) -> Iterator[Server]:
    """The demo server, with a body timeout of :data:`TIMEOUT` seconds."""
    running = Server(tmp_path_factory.mktemp("demo-server") / "server.log", str(TIMEOUT))
    yield running
    running.stop()
    assert_no_traceback(running.log_text())


@pytest.fixture(scope="module")
def web_stack() -> None:
    """FastAPI, uvicorn and the client of FastAPI's TestClient; missing: skipped, except in CI (``CI`` set), where it
    fails (as ``tests/demo``'s ``web`` fixture)."""
    found = {name: importlib.util.find_spec(name) is not None for name in ("fastapi", "uvicorn")}
    found["httpx2 or httpx"] = any(importlib.util.find_spec(name) is not None for name in ("httpx2", "httpx"))
    missing = [name for name, present in found.items() if not present]
    if missing:
        message = f"needs {', '.join(missing)}: pip install -e '.[demo,test]'"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)


def digits(count: int) -> bytes:
    return b"1" * count


MALFORMED = [  # (endpoint, body, status, words of the message)
    ("predict", b'{"pixels": [[' + digits(100_000) + b",0,0,0,0,0,0,0]" + ROWS + b"]}", 422, "at most 20 digits"),
    ("predict", b'{"pixels": [[' + digits(21) + b",0,0,0,0,0,0,0]" + ROWS + b"]}", 422, "got one of 21"),
    ("predict", b'{"pixels": [[-' + digits(21) + b",0,0,0,0,0,0,0]" + ROWS + b"]}", 422, "at most 20 digits"),
    ("predict", b'{"pixels": [[' + digits(20) + b",0,0,0,0,0,0,0]" + ROWS + b"]}", 422, "pixels must lie in [0, 1]"),
    ("predict", digits(5000), 422, "at most 20 digits"),
    ("predict", b'{"pixels": [[0.5,0,0,0,0,0,0,0]' + ROWS + b'], "capsule": ' + digits(4400) + b"}", 422, "20 digits"),
    ("predict", b'{"pixels": [[1e400,0,0,0,0,0,0,0]' + ROWS + b"]}", 422, "pixels must be finite numbers"),
    ("predict", b'{"pixels": [[NaN,0,0,0,0,0,0,0]' + ROWS + b"]}", 422, "pixels must be finite numbers"),
    ("predict", b'{"pixels": [[Infinity,0,0,0,0,0,0,0]' + ROWS + b"]}", 422, "pixels must be finite numbers"),
    ("predict", b'{"pixels": [[-Infinity,0,0,0,0,0,0,0]' + ROWS + b"]}", 422, "pixels must be finite numbers"),
    ("predict", b'{"pixels": [[1e308,0,0,0,0,0,0,0]' + ROWS + b"]}", 422, "pixels must"),
    ("predict", json.dumps({"pixels": "0.5"}).encode(), 422, "pixels: Input should be a valid list"),
    ("predict", json.dumps({"pixels": [["0.5"] * 8] * 8}).encode(), 422, "pixels.0.0: Input should be a valid number"),
    ("predict", json.dumps({"pixels": [[[[0.5]] * 8] * 8]}).encode(), 422, "pixels.0.0"),
    ("predict", json.dumps({"pixels": [[{"a": 1}] * 8] * 8}).encode(), 422, "pixels.0.0"),
    ("predict", json.dumps({"pixels": [[True] * 8] * 8}).encode(), 422, "pixels.0.0"),
    ("predict", json.dumps({"pixels": GOOD, "capsule": 1.5}).encode(), 422, "capsule"),
    ("predict", json.dumps({"pixels": GOOD, "capsule": "1"}).encode(), 422, "capsule"),
    ("predict", json.dumps({"pixels": GOOD, "frame": 1}).encode(), 422, "frame"),
    ("predict", json.dumps({"image": 5}).encode(), 422, "image"),
    ("predict", b"null", 422, "valid dictionary"),
    ("predict", b'{"pixels": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nests JSON too deeply"),
    ("predict", b'{"pixels": ' + b"[" * 500 + b"0.5" + b"]" * 500 + b"}", 422, "pixels"),
    ("predict", b'{"pixels": [[0.5]', 400, "must be JSON"),
    (
        "reconstruct",
        b'{"capsule": [0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0], "class": ' + digits(100_000) + b"}",
        422,
        "20 dig",
    ),
    ("reconstruct", b'{"capsule": [' + b"1e400," * 15 + b'0], "class": 0}', 422, "16 finite numbers"),
    ("reconstruct", b'{"capsule": [' + b"NaN," * 15 + b'0], "class": 0}', 422, "16 finite numbers"),
    ("reconstruct", json.dumps({"capsule": {"0": 0.1}, "class": 0}).encode(), 422, "capsule"),
    ("reconstruct", json.dumps({"capsule": [[0.1]] * 16, "class": 0}).encode(), 422, "capsule.0"),
    ("reconstruct", json.dumps({"capsule": ["0.1"] * 16, "class": 0}).encode(), 422, "capsule.0"),
    ("reconstruct", json.dumps({"capsule": [0.1] * 16, "class": "0"}).encode(), 422, "class"),
    ("reconstruct", json.dumps({"capsule": [0.1] * 16, "class": 0.0}).encode(), 422, "class"),
    ("perturbations", b'{"pixels": [[' + digits(100_000) + b",0,0,0,0,0,0,0]" + ROWS + b"]}", 422, "20 digits"),
    ("perturbations", b'{"pixels": [[NaN,0,0,0,0,0,0,0]' + ROWS + b"]}", 422, "finite"),
]


def test_malformed_bodies_are_a_4xx_with_a_message_and_no_traceback(server):
    start = server.mark()
    for number, (endpoint, body, status, words) in enumerate(MALFORMED):
        code, answer = server.post(f"/api/{endpoint}", body)
        assert (code, isinstance(answer["detail"], str)) == (status, True), (number, answer)
        assert words in answer["detail"] and len(answer["detail"]) < 300, (number, answer)
    assert_no_traceback(server.log_text(start))
    code, answer = server.post("/api/predict", json.dumps({"pixels": GOOD}).encode())
    assert code == 200 and len(answer["scores"]) == 10


def _get(server: Server, host: str, path: str = "/api/info") -> tuple[int, dict[str, str], str]:
    """A GET naming ``host`` in its Host header, sent to the server on 127.0.0.1 (as a page whose name an attacker
    made resolve to 127.0.0.1 sends it): status, headers (lower case), body."""
    with server.connect() as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {key.lower(): value for key, value in fields.items()}, body.decode()


def test_a_page_reaching_the_server_by_another_name_is_refused(server):
    """DNS rebinding: a request that reaches 127.0.0.1 naming another host gets 403 and one line (the log: one
    warning); localhost and the address itself, with their port, are answered; every answer carries the headers."""
    from capsnets.demo.app import SECURITY_HEADERS

    start = server.mark()
    for host in (f"evil.example.com:{server.port}", "evil.example.com", f"127.0.0.1.nip.io:{server.port}"):
        for path in ("/", "/api/info", "/static/demo.js"):
            code, fields, body = _get(server, host, path)
            assert code == 403 and body.count("\n") == 1 and "DNS rebinding" in body, (host, path, code, body)
            assert all(fields.get(key.lower()) == value for key, value in SECURITY_HEADERS.items()), fields
    wait_for(lambda: server.log_text(start).count("refused a request for Host") == 9)
    assert_no_traceback(server.log_text(start))
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", "localhost", f"[::1]:{server.port}"):
        code, fields, body = _get(server, host)
        assert code == 200 and json.loads(body)["kind"] == "vector", (host, code, body)
        assert all(fields.get(key.lower()) == value for key, value in SECURITY_HEADERS.items()), fields


def test_integers_up_to_the_digit_limit_are_read(server):
    from capsnets.demo.app import MAX_INTEGER_DIGITS

    body = {"capsule": [0.1] * 16, "class": 0}
    at_limit = json.dumps(body).replace('"class": 0', '"class": ' + "0" * (MAX_INTEGER_DIGITS - 1) + "1").encode()
    assert server.post("/api/reconstruct", at_limit)[1]["detail"].startswith("body must be JSON")  # leading zeros
    at_limit = json.dumps(body).replace('"class": 0', '"class": ' + "9" * MAX_INTEGER_DIGITS).encode()
    code, answer = server.post("/api/reconstruct", at_limit)
    assert code == 422 and "class must be an integer in [0, 9], got 99999999999999999999" in answer["detail"]
    past = json.dumps(body).replace('"class": 0', '"class": ' + "9" * (MAX_INTEGER_DIGITS + 1)).encode()
    code, answer = server.post("/api/reconstruct", past)
    assert (
        code == 422
        and answer["detail"] == f"integers in the body have at most {MAX_INTEGER_DIGITS} digits, got one of 21"
    )


def _abandon(server: Server, path: str, how: str) -> None:
    """A client that declares a body (or a chunked one) and hangs up before sending all of it."""
    with server.connect() as sock:
        if how == "headers only":
            sock.sendall(headers(path, 1000))
        elif how == "half a body":
            sock.sendall(headers(path, 1000) + b'{"pixels": [[0.5, 0.5')
        else:  # a chunked body cut in its middle
            sock.sendall(headers(path, None) + b"10\r\n" + b'{"pixels": [[0.5' + b"\r\n")
        time.sleep(0.05)


def test_clients_that_hang_up_early_leave_one_short_line_each(server):
    start = server.mark()
    hows = ["headers only", "half a body", "chunked"] * 7
    for number, how in enumerate(hows):
        _abandon(server, ("/api/predict", "/api/reconstruct", "/api/perturbations")[number % 3], how)
    wait_for(lambda: server.log_text(start).count(GONE) >= len(hows))
    time.sleep(0.3)  # nothing more comes
    log = server.log_text(start)
    assert_no_traceback(log)
    assert log.count(GONE) == len(hows) and len(log.splitlines()) == len(hows), log
    code, answer = server.post("/api/predict", json.dumps({"pixels": GOOD}).encode())
    assert code == 200 and answer["prediction"] in range(10)


def test_a_body_not_in_within_the_timeout_gets_408(server):
    start = server.mark()
    body = json.dumps({"pixels": GOOD}).encode()
    with server.connect() as sock:  # half a body, then waiting
        began = time.monotonic()
        sock.sendall(headers("/api/predict", len(body)) + body[: len(body) // 2])
        status, text = status_of(sock)
        waited = time.monotonic() - began
    assert status == 408 and f"request body not received within {TIMEOUT:g} s" in text, text
    assert TIMEOUT <= waited < TIMEOUT + 10
    with server.connect() as sock:  # a byte at a time, each within the timeout: the whole body is timed
        sock.sendall(headers("/api/predict", len(body)))
        began = time.monotonic()
        for byte in body:
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # the server answered and closed the connection
                break
            time.sleep(0.1)
        status, text = status_of(sock)
    assert status == 408 and time.monotonic() - began < TIMEOUT + 10, text
    log = server.log_text(start)
    assert_no_traceback(log)
    assert log.count("body not in after") == 2 and len(log.splitlines()) == 2, log


def test_a_body_in_within_the_timeout_is_answered(server):
    body = json.dumps({"pixels": GOOD}).encode()
    with server.connect() as sock:
        sock.sendall(headers("/api/predict", len(body)) + body[:50])
        time.sleep(TIMEOUT / 10)
        sock.sendall(body[50:])
        status, text = status_of(sock)
    assert status == 200 and json.loads(text)["prediction"] in range(10)


def test_bodies_at_and_past_the_size_limit(server):
    from capsnets.demo.app import MAX_BODY_BYTES

    body = json.dumps({"pixels": GOOD}).encode()
    padded = body[:-1] + b" " * (MAX_BODY_BYTES - len(body)) + b"}"
    assert len(padded) == MAX_BODY_BYTES
    code, answer = server.post("/api/predict", padded)
    assert code == 200 and answer["prediction"] in range(10)
    with server.connect() as sock:  # one byte more, declared: refused before it is sent
        sock.sendall(headers("/api/predict", MAX_BODY_BYTES + 1))
        status, text = status_of(sock)
    assert status == 413 and f"at most {MAX_BODY_BYTES:,} bytes" in text
    start = server.mark()
    with server.connect() as sock:  # a length of 5000 digits: uvicorn's HTTP parser refuses it, in one line
        sock.sendall(headers("/api/predict", 0).replace(b"0\r\n", b"9" * 5000 + b"\r\n", 1))
        status, _ = status_of(sock)
    assert status == 400
    time.sleep(0.2)
    assert_no_traceback(server.log_text(start))
    assert len(server.log_text(start).splitlines()) <= 1


def test_capsule_values_at_and_past_the_limit(server):
    from capsnets.demo.capsules import MAX_CAPSULE_VALUE

    for values in ([MAX_CAPSULE_VALUE, -MAX_CAPSULE_VALUE] * 8, [3e38, -3e38] * 8, [1e300] * 16, [0.0] * 16):
        code, answer = server.post("/api/reconstruct", json.dumps({"capsule": values, "class": 3}).encode())
        if max(map(abs, values)) <= MAX_CAPSULE_VALUE:
            pixels = torch.tensor(answer["pixels"])  # a None would fail here
            assert code == 200 and pixels.shape == (8, 8) and bool(((pixels >= 0) & (pixels <= 1)).all()), answer
        else:
            assert code == 422, answer
            assert f"capsule values must lie in [-{MAX_CAPSULE_VALUE:g}, {MAX_CAPSULE_VALUE:g}]" in answer["detail"]
    past = [MAX_CAPSULE_VALUE * (1 + 1e-6)] + [0.0] * 15
    code, answer = server.post("/api/reconstruct", json.dumps({"capsule": past, "class": 3}).encode())
    assert code == 422 and "got one of magnitude 100" in answer["detail"]


def test_a_model_that_overflows_is_a_422_not_null_pixels(web_stack):
    """A decoder that overflows on values in range (its weights near float32's limit) answers 422, never NaN."""
    from fastapi.testclient import TestClient

    from capsnets.demo import DemoModel
    from capsnets.demo.app import create_app
    from capsnets.models import create_model

    torch.manual_seed(0)
    model = create_model("capsnet_digits", routing={"iterations": 2})
    with torch.no_grad():
        for parameter in model.decoder.parameters():
            parameter.mul_(1e30)
    api = TestClient(create_app(DemoModel(model, dataset="digits", name="capsnet_digits")), base_url="http://localhost")
    for endpoint, body, what in (
        ("reconstruct", {"capsule": [0.5] * 16, "class": 0}, "the reconstruction"),
        ("predict", {"pixels": GOOD}, "the reconstruction"),
        ("perturbations", {"pixels": GOOD}, "the perturbation grid"),
    ):
        answer = api.post(f"/api/{endpoint}", json=body)
        assert answer.status_code == 422 and "null" not in answer.text, answer.text
        assert answer.json()["detail"].startswith(f"{what} of this input hold non-finite values"), answer.text


#: The load: predictions, concurrent clients, rounds, and clients that hang up mid-body in each round.
LOAD = {"predictions": 400, "clients": 8, "rounds": 2, "abandoned": 40}
#: The server's resident memory may grow by at most this much over a round (after 20 predictions to warm up).
MAX_GROWTH_MIB = 32


def _round(server: Server, bodies: list[bytes]) -> tuple[list[float], list[str]]:
    """The bodies POSTed to /api/predict by ``LOAD["clients"]`` threads (keep-alive connections), while another
    client hangs up mid-body ``LOAD["abandoned"]`` times: each prediction's latency (s), and the errors."""
    latencies, errors, lock = [], [], threading.Lock()
    queue = iter(bodies)

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        while True:
            with lock:
                body = next(queue, None)
            if body is None:
                break
            began = time.perf_counter()
            try:
                connection.request("POST", "/api/predict", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = json.loads(response.read())
                ok = response.status == 200 and answer["prediction"] in range(10)
            except (OSError, http.client.HTTPException, ValueError, KeyError) as err:
                ok, answer = False, repr(err)
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
            with lock:
                latencies.append(time.perf_counter() - began)
                if not ok:
                    errors.append(str(answer)[:200])
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(LOAD["clients"])]
    for thread in threads:
        thread.start()
    for number in range(LOAD["abandoned"]):
        _abandon(server, "/api/predict", ("headers only", "half a body", "chunked")[number % 3])
    for thread in threads:
        thread.join()
    return latencies, errors


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


@pytest.mark.faults_long
def test_load_keeps_latency_and_memory_bounded(tmp_path, web_stack):
    if not Path("/proc/self/status").is_file():
        pytest.skip("reads the server's memory from /proc (Linux)")
    server = Server(tmp_path / "server.log")
    try:
        generator = torch.Generator().manual_seed(0)
        bodies = [
            json.dumps({"pixels": torch.rand(8, 8, generator=generator).tolist()}).encode()
            for _ in range(LOAD["predictions"])
        ]
        _round(server, bodies[:20])  # warm-up
        report = {
            "load": LOAD,
            "machine": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
            },
            "rss_start_mib": round(server.rss() / 2**20, 1),
            "rounds": [],
        }
        for _ in range(LOAD["rounds"]):
            before, began = server.rss(), time.perf_counter()
            latencies, errors = _round(server, bodies)
            seconds = time.perf_counter() - began
            report["rounds"].append(
                {
                    "seconds": round(seconds, 2),
                    "predictions_per_s": round(len(latencies) / seconds, 1),
                    "p50_ms": round(1000 * _percentile(latencies, 50), 1),
                    "p99_ms": round(1000 * _percentile(latencies, 99), 1),
                    "errors": errors,
                    "rss_before_mib": round(before / 2**20, 1),
                    "rss_after_mib": round(server.rss() / 2**20, 1),
                }
            )
        wait_for(lambda: server.log_text().count(GONE) >= LOAD["abandoned"] * (LOAD["rounds"] + 1))
    finally:
        server.stop()
    path = Path(os.environ.get("CAPSNETS_LOAD_REPORT") or tmp_path / "demo_load.json")
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    log, abandoned = server.log_text(), LOAD["abandoned"] * (LOAD["rounds"] + 1)
    assert_no_traceback(log)
    assert log.count(GONE) == len(log.splitlines()) == abandoned, log[-3000:]  # one line per client gone
    for result in report["rounds"]:
        assert not result["errors"], result["errors"][:5]
        assert result["rss_after_mib"] - result["rss_before_mib"] <= MAX_GROWTH_MIB, report
