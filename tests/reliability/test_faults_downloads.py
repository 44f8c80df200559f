"""Fault class: downloads of pretrained weights from a URL (``pretrained="https://..."``, ``download_weights``).

A real HTTP server on this machine's loopback, in a thread, plays a hostile or broken server: a file larger than
the limit (declared in ``Content-Length`` or not, sent without end), a connection dropped mid-body, a server that
stalls before answering or within the body, a file that is not the one whose SHA-256 was given, and redirects to
plain http. Each download is refused with a message naming the problem and the fix, and leaves nothing in the
cache folder. Plain http to another host is refused before any connection. The limit lowered through
``max_bytes=`` (or ``CAPSNETS_MAX_DOWNLOAD_BYTES``) keeps each case to a few kilobytes.
"""

from __future__ import annotations

import hashlib
import http.server
import logging
import os
import socket
import threading
import time
from pathlib import Path

import pytest

import capsnets
from capsnets.cli import main
from capsnets.models import download, pretrained
from capsnets.models.download import MAX_DOWNLOAD_BYTES, MAX_DOWNLOAD_ENV, DownloadError
from capsnets.models.pretrained import PretrainedError, download_weights
from capsnets.validation import ArgumentError

WEIGHT = pretrained.WEIGHTS_DIR / "matrix_capsnet_small-mnist.safetensors"  # a shipped weight: 145 kB
BODY = bytes(range(256)) * 16  # 4096 bytes
BODY_SHA = hashlib.sha256(BODY).hexdigest()
ENDLESS = 1 << 40  # what an endless body would send: the client must stop long before


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``/<case>``; the server's ``release`` event ends the stalls."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        case = self.path.strip("/").split("?")[0].removesuffix(".safetensors")
        getattr(self, f"_{case.replace('-', '_')}", self._missing)()

    def _head(self, length: int | None = None, chunked: bool = False, status: int = 200) -> None:
        self.send_response(status)
        if length is not None:
            self.send_header("Content-Length", str(length))
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()

    def _missing(self) -> None:
        self._head(0, status=404)

    def _body(self) -> None:
        self._head(len(BODY))
        self.wfile.write(BODY)

    def _body_chunked(self) -> None:
        self._head(chunked=True)
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))

    def _weight(self) -> None:
        data = WEIGHT.read_bytes()
        self._head(len(data))
        self.wfile.write(data)

    def _declares_too_much(self) -> None:
        self._head(ENDLESS)
        self._send_endless(lambda block: block)

    def _endless(self) -> None:  # no Content-Length: the body ends when the connection closes
        self._head()
        self._send_endless(lambda block: block)

    def _endless_chunked(self) -> None:
        self._head(chunked=True)
        self._send_endless(lambda block: b"%x\r\n%s\r\n" % (len(block), block))

    def _send_endless(self, frame) -> None:
        block = frame(b"\0" * 4096)
        try:
            for _ in range(ENDLESS // 4096):
                self.wfile.write(block)
        except OSError:  # the client hung up: what a refusal does
            pass

    def _hangs_up(self) -> None:  # declares the whole body, sends half of it, closes
        self._head(len(BODY))
        self.wfile.write(BODY[: len(BODY) // 2])

    def _hangs_up_chunked(self) -> None:
        self._head(chunked=True)
        self.wfile.write(b"%x\r\n%s" % (len(BODY), BODY[:100]))

    def _stalls_in_body(self) -> None:
        self._head(len(BODY))
        self.wfile.write(BODY[:100])
        self.wfile.flush()
        self.server.release.wait(10)

    def _stalls_before_answer(self) -> None:
        self.server.release.wait(10)

    def _redirect(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.path.split("?to=", 1)[1])
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()


@pytest.fixture(scope="module")
def server():
    """The hostile server on 127.0.0.1, its base URL as ``server.url``."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.release = threading.Event()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


def _left_in(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_a_file_at_the_limit_is_kept_one_byte_past_it_is_refused(server, cache):
    for case in ("body", "body-chunked"):
        url = f"{server.url}/{case}"
        with pytest.raises(PretrainedError, match=f"larger than the download limit of 4,095 bytes.*{MAX_DOWNLOAD_ENV}"):
            download_weights(url, BODY_SHA, cache, max_bytes=len(BODY) - 1)
        assert _left_in(cache) == []
        path = download_weights(url, BODY_SHA, cache, max_bytes=len(BODY))
        assert path.read_bytes() == BODY and _left_in(cache) == [path.name]
        path.unlink()


def test_a_declared_content_length_over_the_limit_is_refused_before_the_body(server, cache):
    with pytest.raises(PretrainedError, match=r"its Content-Length is 1,099,511,627,776 bytes.*max_bytes="):
        download_weights(f"{server.url}/declares-too-much", BODY_SHA, cache, max_bytes=1 << 20)
    assert _left_in(cache) == []


@pytest.mark.parametrize("case", ["endless", "endless-chunked"])
def test_an_endless_body_without_content_length_is_cut_at_the_limit_while_streaming(server, cache, case):
    start = time.monotonic()
    with pytest.raises(PretrainedError, match="larger than the download limit of 65,536 bytes.*more than that arrived"):
        download_weights(f"{server.url}/{case}", BODY_SHA, cache, max_bytes=1 << 16)
    assert time.monotonic() - start < 10
    assert _left_in(cache) == []


@pytest.mark.parametrize("case", ["hangs-up", "hangs-up-chunked"])
def test_a_connection_dropped_mid_body_leaves_nothing(server, cache, case):
    with pytest.raises(
        PretrainedError, match=r"the connection (closed|broke).* after [\d,]+ (of [\d,]+ )?bytes; nothing is kept"
    ):
        download_weights(f"{server.url}/{case}", BODY_SHA, cache)
    assert _left_in(cache) == []


@pytest.mark.parametrize(
    "case, where", [("stalls-in-body", "after 100 bytes"), ("stalls-before-answer", "before an answer")]
)
def test_a_stalled_server_hits_the_timeout_with_a_clear_message(server, cache, case, where):
    start = time.monotonic()
    with pytest.raises(PretrainedError, match=f"no data for 0.3 s {where} \\(the server stalled\\).*timeout="):
        download_weights(f"{server.url}/{case}", BODY_SHA, cache, timeout=0.3)
    assert time.monotonic() - start < 5
    assert _left_in(cache) == []


def test_a_file_that_is_not_the_one_named_by_its_sha256_is_refused_and_removed(server, cache):
    with pytest.raises(PretrainedError, match=f"has SHA-256 {BODY_SHA}, expected f{{64}}; refused, nothing is kept"):
        download_weights(f"{server.url}/body", "f" * 64, cache)
    assert _left_in(cache) == []


def test_an_http_error_is_refused_with_its_status(server, cache):
    with pytest.raises(PretrainedError, match="HTTP Error 404"):
        download_weights(f"{server.url}/nothing-here", BODY_SHA, cache)
    assert _left_in(cache) == []


@pytest.mark.parametrize(
    "url",
    [
        "http://example.org/w.safetensors",
        "http://10.0.0.1:8000/w.safetensors",
        "HTTP://[2001:db8::1]/w.safetensors",
        "http://localhost.example.org/w.safetensors",
    ],
)
def test_plain_http_to_another_host_is_refused_without_a_connection(cache, monkeypatch, url):
    def connect(*args, **kwargs):
        raise AssertionError(f"a connection was opened to {args}")

    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(socket.socket, "connect", connect)
    with pytest.raises(PretrainedError, match="plain http:// is refused.*use https://"):
        download_weights(url, BODY_SHA, cache)
    with pytest.raises(PretrainedError, match="plain http:// is refused"):
        capsnets.create_model("capsnet_small", pretrained=url, sha256=BODY_SHA)
    assert not cache.exists()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "localhost", "LOCALHOST"])
def test_loopback_hosts_are_read_over_plain_http(host):
    shown = f"[{host}]" if ":" in host else host
    download.check_url(f"http://{shown}:8000/w.safetensors")


@pytest.mark.parametrize(
    "target",
    ["http://example.org/w.safetensors", "file:///etc/passwd", "ftp://127.0.0.1/w.safetensors"],
)
def test_a_redirect_to_plain_http_elsewhere_or_another_scheme_is_refused(server, cache, monkeypatch, target):
    opened = []
    real = socket.create_connection

    def connect(address, *args, **kwargs):  # the loopback server only
        opened.append(address[0])
        assert address[0] == "127.0.0.1", f"a connection was opened to {address}"
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", connect)
    with pytest.raises(PretrainedError, match=f"redirects to '?{target}'?.*(refused|only https://)"):
        download_weights(f"{server.url}/redirect?to={target}", BODY_SHA, cache)
    assert opened == ["127.0.0.1"] and _left_in(cache) == []


def test_a_redirect_between_loopback_urls_is_followed(server, cache):
    path = download_weights(f"{server.url}/redirect?to={server.url}/body", BODY_SHA, cache)
    assert path.read_bytes() == BODY


@pytest.mark.parametrize("target", ["http://127.0.0.1:8000/w.safetensors", "http://example.org/w.safetensors"])
def test_an_https_url_redirected_to_http_is_refused(target):
    """From https, even loopback http is a downgrade: the redirect handler refuses it before following it."""
    source = "https://example.org/w.safetensors"
    with pytest.raises(DownloadError, match=f"'{source}' redirects to '{target}', which is not https://; refused"):
        download.check_redirect(source, target)
    download.check_redirect(source, "https://cdn.example.org/w.safetensors")
    download.check_redirect(source, "/elsewhere/w.safetensors")  # relative: https still


def test_create_model_from_a_loopback_url_loads_quietly_and_the_env_variable_sets_the_limit(
    server, cache, monkeypatch, caplog
):
    """The cached weight has no .json beside it: it loads without a warning. The limit set by the environment
    variable refuses it, leaving nothing in the cache."""
    monkeypatch.setattr(pretrained, "CACHE_DIR", cache)
    digest = hashlib.sha256(WEIGHT.read_bytes()).hexdigest()
    url = f"{server.url}/weight.safetensors"
    monkeypatch.setenv(MAX_DOWNLOAD_ENV, str(WEIGHT.stat().st_size - 1))
    with pytest.raises(PretrainedError, match="larger than the download limit"):
        capsnets.create_model("matrix_capsnet_small", pretrained=url, sha256=digest)
    assert _left_in(cache) == []
    monkeypatch.setenv(MAX_DOWNLOAD_ENV, str(WEIGHT.stat().st_size))
    with caplog.at_level(logging.WARNING):
        model = capsnets.create_model("matrix_capsnet_small", pretrained=url, sha256=digest)
    assert model.model_name == "matrix_capsnet_small" and caplog.records == []
    assert [p.suffix for p in cache.iterdir()] == [".safetensors"]


@pytest.mark.parametrize("value", ["0", "-5", "lots", "1e9"])
def test_a_bad_limit_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(MAX_DOWNLOAD_ENV, value)
    with pytest.raises(ArgumentError, match=f"{MAX_DOWNLOAD_ENV}='{value}' is invalid: expected a positive number"):
        download.max_download_bytes()
    with pytest.raises(ArgumentError, match="max_bytes must be a positive integer, got 0"):
        download.max_download_bytes(0)
    monkeypatch.delenv(MAX_DOWNLOAD_ENV)
    assert download.max_download_bytes() == MAX_DOWNLOAD_BYTES == 1 << 30


def test_the_cli_reports_a_refused_download_in_one_line(server, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pretrained, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setenv(MAX_DOWNLOAD_ENV, "1024")
    assert main(["export", "--pretrained", f"{server.url}/endless", "--sha256", BODY_SHA]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "larger than the download limit of 1,024 bytes" in err
    assert "Traceback" not in err and _left_in(tmp_path / "cache") == []


def test_a_leftover_of_a_killed_download_is_removed_by_the_next_one(server, cache):
    """A killed process cannot remove its temporary file: the next download of the same file does, once it has not
    been written to for a day; a younger one (a download under way elsewhere) is kept."""
    cache.mkdir()
    name = f"{BODY_SHA[:16]}-body"
    old, young = cache / f".{name}.k1ll3d.tmp", cache / f".{name}.w0rk1n.tmp"
    for leftover in (old, young):
        leftover.write_bytes(BODY[:100])
    stale = time.time() - pretrained.LEFTOVER_AGE_S - 60
    os.utime(old, (stale, stale))
    path = download_weights(f"{server.url}/body", BODY_SHA, cache)
    assert _left_in(cache) == sorted([path.name, young.name])
