"""Bounded downloads of weight files: https only, a maximum size checked while streaming, a timeout on every read.

:func:`fetch` streams a URL into a file the caller owns (:func:`capsnets.models.pretrained.download_weights` gives
it a temporary file in the cache, removed on any error) and returns the SHA-256 of the bytes. It refuses:

- plain ``http://`` (the bytes could be altered on the way), except to this machine's loopback (``localhost``,
  ``127.0.0.1``, ``::1``), which a local server or a test uses; ``file://`` reads a local file through the same
  bounds. The check is made before any connection, and again on every redirect: an ``https://`` URL redirected to
  ``http://`` (any host), or to anything but https or loopback http, is refused;
- a file larger than ``max_bytes`` (:func:`max_download_bytes`: the argument, else the environment variable
  ``CAPSNETS_MAX_DOWNLOAD_BYTES``, else :data:`MAX_DOWNLOAD_BYTES`): at once when the server declares a larger
  ``Content-Length``, else as soon as one byte more than the limit has arrived;
- a server that sends nothing for ``timeout`` seconds, at the connection or within the body;
- a body cut short of its declared ``Content-Length`` (a connection dropped mid-body).

Each refusal is a :class:`DownloadError` that names the URL, what happened and what to do.

Examples::

    >>> check_url("http://example.org/w.safetensors")
    Traceback (most recent call last):
        ...
    capsnets.models.download.DownloadError: 'http://example.org/w.safetensors': plain http:// is refused ...
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

from capsnets.validation import ArgumentError, positive_int

__all__ = [
    "MAX_DOWNLOAD_BYTES",
    "MAX_DOWNLOAD_ENV",
    "DownloadError",
    "check_redirect",
    "check_url",
    "fetch",
    "is_loopback",
    "max_download_bytes",
]

#: The largest file :func:`fetch` reads, in bytes (1 GiB): several times the float32 weights of the largest
#: registered model, and a bound on what one URL can write to the disk.
MAX_DOWNLOAD_BYTES = 1 << 30
#: The environment variable that raises (or lowers) :data:`MAX_DOWNLOAD_BYTES`, in bytes.
MAX_DOWNLOAD_ENV = "CAPSNETS_MAX_DOWNLOAD_BYTES"
#: Host names read over plain http: this machine's loopback (any ``127.0.0.0/8`` or ``::1`` address too).
LOOPBACK_NAMES = frozenset({"localhost"})
_CHUNK = 1 << 16


class DownloadError(ValueError):
    """A download was refused or failed; nothing of it is kept. The message names the URL and the fix."""


def max_download_bytes(max_bytes: int | None = None) -> int:
    """The download limit in bytes: ``max_bytes`` if given, else ``$CAPSNETS_MAX_DOWNLOAD_BYTES``, else
    :data:`MAX_DOWNLOAD_BYTES`.

    Raises:
        ArgumentError: ``max_bytes`` or the environment variable is not a positive integer.

    Examples::

        >>> max_download_bytes(), max_download_bytes(4096)
        (1073741824, 4096)
    """
    if max_bytes is not None:
        return positive_int("max_bytes", max_bytes)
    text = os.environ.get(MAX_DOWNLOAD_ENV, "").strip()
    if not text:
        return MAX_DOWNLOAD_BYTES
    try:
        return positive_int(MAX_DOWNLOAD_ENV, int(text))
    except (ValueError, ArgumentError):
        raise ArgumentError(
            f"{MAX_DOWNLOAD_ENV}={text[:40]!r} is invalid: expected a positive number of bytes, e.g. "
            f"{2 * MAX_DOWNLOAD_BYTES}",
            MAX_DOWNLOAD_ENV,
        ) from None


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a URL's host name, without brackets) names this machine's loopback."""
    if not host:
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str) -> None:
    """Raise :class:`DownloadError` unless ``url`` is ``https://``, ``file://``, or ``http://`` to a loopback host."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "http" and not is_loopback(parts.hostname):
        raise DownloadError(
            f"{url!r}: plain http:// is refused (what arrives could have been altered on the way); use "
            "https:// (plain http:// is read from this machine's loopback only: localhost, 127.0.0.1, ::1)"
        )
    if scheme not in ("http", "https", "file"):
        raise DownloadError(f"{url!r}: only https:// and file:// URLs are read")


def fetch(url: str, path: str | os.PathLike, *, max_bytes: int, timeout: float) -> str:
    """Stream ``url`` into the file ``path`` (created or emptied) within the bounds above; return its SHA-256.

    Args:
        url: an ``https://`` or ``file://`` URL, or ``http://`` to a loopback host.
        path: the file to write; on an error it holds part of the download, and the caller removes it.
        max_bytes: the most bytes accepted (:func:`max_download_bytes`).
        timeout: the most seconds to wait for the connection or for each read of the body.

    Raises:
        DownloadError: the URL is refused, unreachable, larger than ``max_bytes``, stalled or cut short.
        OSError: ``path`` could not be written (a full disk).
    """
    check_url(url)
    sha = hashlib.sha256()
    with open(path, "wb") as out:
        for chunk in _stream(url, max_bytes, timeout):
            sha.update(chunk)
            out.write(chunk)
    return sha.hexdigest()


def check_redirect(source: str, location: str) -> None:
    """Raise :class:`DownloadError` unless a redirect from ``source`` to ``location`` (relative or absolute) may be
    followed: to a URL :func:`check_url` accepts other than ``file://``, and never from https to plain http."""
    target = urllib.parse.urljoin(source, location)
    scheme = urllib.parse.urlsplit(target).scheme.lower()
    if scheme == "file" or (scheme == "http" and urllib.parse.urlsplit(source).scheme.lower() == "https"):
        raise DownloadError(f"{source!r} redirects to {target!r}, which is not https://; refused")
    try:
        check_url(target)
    except DownloadError as err:
        raise DownloadError(f"{source!r} redirects to {err}") from None


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only where :func:`check_redirect` allows it."""

    def http_error_302(self, req, fp, code, msg, headers):
        location = headers.get("location") or headers.get("uri")
        if location:
            try:
                check_redirect(req.full_url, location)
            except DownloadError:
                fp.close()
                raise
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _stream(url: str, max_bytes: int, timeout: float) -> Iterator[bytes]:
    """The body of ``url`` in chunks, its size and its timing checked; network failures as :class:`DownloadError`."""
    handlers: list[urllib.request.BaseHandler] = [_CheckedRedirects()]
    if is_loopback(urllib.parse.urlsplit(url).hostname):
        handlers.append(urllib.request.ProxyHandler({}))  # a proxy cannot reach this machine's loopback
    received, length, answered = 0, None, False
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=timeout) as response:
            answered = True
            length = _content_length(response)
            if length is not None and length > max_bytes:
                raise _too_large(url, max_bytes, f"its Content-Length is {length:,} bytes")
            read = getattr(response, "read1", response.read)  # read1: what has arrived, without waiting for more
            while chunk := read(min(_CHUNK, max_bytes + 1 - received)):
                received += len(chunk)
                if received > max_bytes:
                    raise _too_large(url, max_bytes, "more than that arrived")
                yield chunk
    except DownloadError:
        raise
    except (OSError, http.client.HTTPException) as err:  # URLError, HTTPError, timeouts, resets, IncompleteRead
        raise _failed(url, err, timeout, received if answered else None) from err
    if length is not None and received < length:
        raise DownloadError(
            f"downloading {url}: the connection closed after {received:,} of {length:,} bytes; nothing is kept. "
            "Try again"
        )


def _content_length(response) -> int | None:
    try:
        value = int(response.headers.get("Content-Length", ""))
    except (AttributeError, ValueError):
        return None
    return value if value >= 0 else None


def _too_large(url: str, max_bytes: int, why: str) -> DownloadError:
    return DownloadError(
        f"{url} is larger than the download limit of {max_bytes:,} bytes ({why}); refused, nothing is kept. "
        f"If the file is the one you want, raise the limit: max_bytes=... or {MAX_DOWNLOAD_ENV}=<bytes>"
    )


def _failed(url: str, err: BaseException, timeout: float, received: int | None) -> DownloadError:
    """``err`` as a :class:`DownloadError`; ``received`` is None before the server answered."""
    reason = (
        err.reason if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError) else err
    )
    if isinstance(reason, TimeoutError):
        where = "before an answer" if received is None else f"after {received:,} bytes"
        return DownloadError(
            f"downloading {url}: no data for {timeout:g} s {where} (the server stalled); nothing is kept. Try "
            "again later, or allow a slower server more seconds with timeout="
        )
    if isinstance(err, http.client.IncompleteRead) or isinstance(reason, ConnectionError):
        return DownloadError(
            f"downloading {url}: the connection broke ({type(reason).__name__}) after {received or 0:,} bytes; "
            "nothing is kept. Try again"
        )
    return DownloadError(f"could not download {url} ({reason}); nothing is kept")
