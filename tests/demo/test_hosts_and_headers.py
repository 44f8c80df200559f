"""Which ``Host`` the demo answers, and the headers of its responses: a web page elsewhere must not reach
the demo by DNS rebinding (a name of its own made to resolve to this machine, sent as ``Host``), nor frame it; the
page still loads everything it needs under its Content-Security-Policy (the browser test runs it for real)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from capsnets.demo.app import SECURITY_HEADERS

STATIC = Path(__file__).parents[2] / "src" / "capsnets" / "demo" / "static"
#: Hosts a web page can name and make resolve to this machine: none is answered.
FOREIGN = [
    "evil.example.com",
    "evil.example.com:8000",
    "localhost.evil.example.com:8000",
    "127.0.0.1.nip.io:8000",
    "testserver",
    "localhost:8000:80",
    "[::1:8000",
    "localhost:http",
]
LOOPBACK = ["localhost", "localhost:8000", "LocalHost:1", "localhost.:8000", "127.0.0.1", "127.0.0.1:8000", "[::1]"]
LOOPBACK += ["[::1]:8000", "::1", "127.0.0.2:8000"]


def client(demo, host: str = "127.0.0.1"):
    from fastapi.testclient import TestClient

    from capsnets.demo.app import create_app

    return TestClient(create_app(demo, host), base_url="http://127.0.0.1:8000", raise_server_exceptions=False)


def assert_secure(response) -> None:
    for key, value in SECURITY_HEADERS.items():
        assert response.headers.get(key) == value, (response.request.url, key, dict(response.headers))
    policy = response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
    assert response.headers["x-frame-options"] == "DENY" and response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("host", FOREIGN)
def test_a_host_the_demo_does_not_serve_is_refused_with_one_line(web, untrained_capsnet, host):
    api = client(untrained_capsnet)
    for answer in (
        api.get("/", headers={"Host": host}),
        api.get("/static/demo.js", headers={"Host": host}),
        api.get("/api/info", headers={"Host": host}),
        api.post("/api/predict", json={"pixels": [[0.5] * 8] * 8}, headers={"Host": host}),
    ):
        assert answer.status_code == 403, (host, answer.status_code, answer.text)
        assert answer.headers["content-type"].startswith("text/plain")
        assert answer.text.count("\n") == 1 and answer.text.startswith("capsnets demo: refused a request for Host")
        assert "DNS rebinding" in answer.text and "localhost" in answer.text and "--host" in answer.text
        assert socket.gethostname() not in answer.text.split("Host", 1)[1].replace(host, "")  # no name disclosed
        assert_secure(answer)


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_hosts_with_and_without_a_port_are_answered(web, untrained_capsnet, host):
    answer = client(untrained_capsnet).get("/api/info", headers={"Host": host})
    assert answer.status_code == 200 and answer.json()["kind"] == "vector", (host, answer.text)


def test_the_host_it_was_started_on_and_this_machines_names_are_answered(web, untrained_capsnet):
    named = client(untrained_capsnet, host="capsnets-demo.lan")
    for host in ("capsnets-demo.lan", "capsnets-demo.lan:8000", "CAPSNETS-demo.lan.:80", "localhost:8000"):
        assert named.get("/api/info", headers={"Host": host}).status_code == 200, host
    assert named.get("/api/info", headers={"Host": "other.lan:8000"}).status_code == 403
    assert client(untrained_capsnet).get("/api/info", headers={"Host": "capsnets-demo.lan"}).status_code == 403

    # --host 0.0.0.0: reached by one of this machine's addresses or names, as a user elsewhere on the network does
    everywhere = client(untrained_capsnet, host="0.0.0.0")
    for host in ("192.0.2.7:8000", "[2001:db8::7]:8000", "0.0.0.0:8000", socket.gethostname(), socket.getfqdn()):
        assert everywhere.get("/api/info", headers={"Host": f"{host}"}).status_code == 200, host
    for host in ("evil.example.com", "0.0.0.0.evil.example.com:8000"):
        assert everywhere.get("/api/info", headers={"Host": host}).status_code == 403, host


def test_every_response_carries_the_security_headers(web, untrained_capsnet, monkeypatch):
    api = client(untrained_capsnet)
    for path, status in (
        ("/", 200),
        ("/static/demo.js", 200),
        ("/static/demo.css", 200),
        ("/api/info", 200),
        ("/api/samples", 200),
        ("/api/nothing", 404),
        ("/openapi.json", 200),
    ):
        answer = api.get(path)
        assert answer.status_code == status, (path, answer.text)
        assert_secure(answer)
    assert_secure(api.post("/api/predict", json={"pixels": [[0.5] * 8] * 8}))
    assert_secure(api.post("/api/predict", content=b"{"))  # 400
    assert_secure(api.post("/api/reconstruct", json={"capsule": [0.0], "class": 0}))  # 422
    assert_secure(api.get("/api/predict"))  # 405
    monkeypatch.setattr(untrained_capsnet, "info", lambda: 1 / 0)
    failed = api.get("/api/info")
    assert failed.status_code == 500 and failed.json()["detail"] == "internal error (ZeroDivisionError)"
    assert_secure(failed)
    assert api.get("/static/demo.js").headers["content-type"].split(";")[0] in (
        "text/javascript",
        "application/javascript",
    )
    assert api.get("/static/demo.css").headers["content-type"].startswith("text/css")


def test_the_page_uses_nothing_its_policy_forbids():
    """No inline script, style or event handler, nothing from another origin, no code built from strings: what
    ``script-src 'self'; style-src 'self'`` and ``default-src 'none'`` would block (images are ``data:`` URLs, which
    ``img-src`` allows; the browser test loads the page under the policy)."""
    page = (STATIC / "index.html").read_text()
    script = (STATIC / "demo.js").read_text()
    style = (STATIC / "demo.css").read_text()
    assert re.findall(r"<script\b[^>]*>", page) == ['<script src="/static/demo.js">'], "only the page's own script"
    assert re.findall(r"<script\b[^>]*>\s*[^<\s]", page) == [], "no inline script"
    assert "<style" not in page and not re.search(r"\sstyle\s*=", page + script), "no inline style attribute"
    assert not re.search(r"\son[a-z]+\s*=", page + script), "no inline event handler"
    assert not re.search(r"\beval\(|new Function\(|setTimeout\(\s*['\"`]|setAttribute\(\s*['\"]style", script)
    assert not re.search(r"https?://|//[a-z0-9-]+\.[a-z]", page + script + style), "nothing from another origin"
    assert "@import" not in style and "url(" not in style


def test_host_allowed_reads_each_form_of_the_header():
    from capsnets.demo.app import host_allowed

    names = frozenset({"localhost", "box.lan"})
    for header in [*LOOPBACK, "box.lan", "BOX.lan.:8080", "10.1.2.3:80", "[fe80::1%25eth0]:80", "[::ffff:127.0.0.1]"]:
        assert host_allowed(header, names), header
    for header in [*FOREIGN, None, "", ":8000", "[::1]x", "[]", "box.lan:99999999", "box.lan:-1", "box.lan :80"]:
        assert not host_allowed(header, names), header
