"""The demo's web server: the page (plain HTML, JS and CSS from ``static/``) and its JSON API, on FastAPI.

Endpoints (every error is a 4xx with ``{"detail": message}``):

- ``GET /api/info``: the model, its classes, where it comes from, what the page can show for it.
- ``GET /api/samples``: test images of the model's data set, to pick instead of drawing.
- ``POST /api/predict``: an image (an image file as the body, or JSON ``{"image": base64 or data URL}`` or
  ``{"pixels": [[...]]}``, with ``"frame": true`` for a drawing and ``"capsule": k`` to reconstruct class ``k``)
  -> scores, class capsules, the reconstruction and the routing pictures.
- ``POST /api/reconstruct``: JSON ``{"capsule": [D numbers], "class": k}`` -> the decoded image.
- ``POST /api/perturbations``: an image as for predict (``"capsule": k`` for class ``k``'s capsule) -> the
  winning (or asked for) capsule's perturbation grid (Sabour et al. 2017, Fig. 4): one PNG mosaic, rows are
  capsule dimensions, columns the perturbations listed in ``steps``.

Limits on what one request can ask for: a body over :data:`MAX_BODY_BYTES` gets 413, a body not all in within
:data:`BODY_TIMEOUT_S` of its headers 408, an integer of more than :data:`MAX_INTEGER_DIGITS` digits in a JSON body
422 (Python's int-string conversion takes time quadratic in the digits, and refuses more than 4300 with a
``ValueError``), JSON nested deeper than the parser's recursion limit 400. A client that goes away before its body
is in is one line in the log at INFO level, not a traceback.

Which ``Host`` it answers (:func:`host_allowed`): a request whose ``Host`` header names anything else gets 403, so
that a web page elsewhere cannot reach the demo by DNS rebinding (a name of the attacker's that resolves to this
machine): ``localhost``, an IP address (a page cannot rebind an address), this machine's own names, and the name
the server was started on (``host=``, ``--host``), with any port. Every response carries
:data:`SECURITY_HEADERS`: a Content-Security-Policy that allows the page its own scripts, styles, API and the
``data:`` images it shows and nothing else, and no framing.

:func:`serve` binds the socket (:func:`listen`, localhost by default) and runs uvicorn on it
(:func:`run_server`). Needs the ``demo`` extra: ``pip install -e '.[demo]'``.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capsnets.demo.capsules import Analysis, DemoModel
from capsnets.demo.images import (
    data_url,
    decode_base64,
    display,
    grid_png,
    heat_png,
    map_png,
    read_image,
    tensor_png,
)
from capsnets.images import IMAGE_FORMATS, IMAGE_FORMATS_TEXT, NORB_LIKE
from capsnets.validation import ArgumentError

__all__ = [
    "BODY_TIMEOUT_S",
    "MAX_BODY_BYTES",
    "MAX_INTEGER_DIGITS",
    "SECURITY_HEADERS",
    "create_app",
    "host_allowed",
    "listen",
    "run_server",
    "serve",
]

logger = logging.getLogger(__name__)

#: Request bodies larger than this are refused (413): a canvas drawing as PNG is ~10-30 kB.
MAX_BODY_BYTES = 2 * 1024 * 1024
#: A request's whole body must arrive within this many seconds of its headers (408 otherwise), so that a client
#: sending half a body, or a byte at a time, cannot hold the server. 2 MiB in 30 s is 70 kB/s.
BODY_TIMEOUT_S = 30.0
#: Integers in a JSON body have at most this many digits (422 otherwise): class indices and pixels need few, and
#: int64 has 19.
MAX_INTEGER_DIGITS = 20
STATIC = Path(__file__).parent / "static"
#: Headers of every response. The page loads its own script and style sheet, calls its own API and shows images
#: the API sends as ``data:`` URLs; nothing else is loaded, no inline script or style runs, and no other page
#: may frame it (clickjacking).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
#: Addresses that listen on every interface: no name of their own to answer to.
_WILDCARDS = {"", "0.0.0.0", "::", "[::]", "*"}
#: File signatures of images sent as the body itself: the :data:`~capsnets.images.IMAGE_FORMATS` (PNG, JPEG, GIF,
#: BMP, TIFF of either byte order, WebP).
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM", b"II*\x00", b"MM\x00*", b"RIFF")
#: Headers of an answer given before the body was read: the connection is closed, not read to the body's end.
_CLOSE = {"Connection": "close"}

Pixels = list[list[float]] | list[list[list[float]]]


class ImageInput(BaseModel):
    """An input image: ``image`` (an image file as base64 or a data URL) or ``pixels`` (the model's input,
    ``H x W`` or ``C x H x W`` numbers: in ``[0, 1]``, standardised for smallNORB-like data sets)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    image: str | None = Field(
        None, description=f"an image file ({IMAGE_FORMATS_TEXT}), base64 or data:image/...;base64, URL"
    )
    pixels: Pixels | None = Field(None, description="the model's input, H x W or C x H x W numbers")
    frame: bool = Field(False, description="a drawing: crop its strokes and scale them as the training digits")
    capsule: int | None = Field(None, description="the class capsule to reconstruct (default: the winner)")


class CapsuleInput(BaseModel):
    """A class capsule vector to decode."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    capsule: list[float] = Field(description="the capsule's D numbers")
    class_index: Annotated[int, Field(alias="class", description="the class capsule it is (the others are masked)")]


class _DemoApp(FastAPI):
    """FastAPI with :class:`_HostGuard` outside all of its middleware, so that the server error handler's 500s
    carry the headers too."""

    def __init__(self, names: frozenset[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.host_names = names

    def build_middleware_stack(self) -> ASGIApp:
        return _HostGuard(super().build_middleware_stack(), self.host_names)


def create_app(demo: DemoModel, host: str = "127.0.0.1") -> FastAPI:
    """The FastAPI application serving ``demo``'s page and API, answering the ``Host`` names of
    :func:`host_allowed` with ``host``, the address or name the server listens on."""
    app = _DemoApp(
        _names(host), title="capsnets demo", summary="See what capsules encode.", docs_url=None, redoc_url=None
    )
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(ArgumentError)
    async def bad_input(request: Request, error: ArgumentError) -> JSONResponse:
        return JSONResponse({"detail": str(error).splitlines()[0]}, status_code=422)

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, error: ClientDisconnect) -> Response:
        logger.info(
            "capsnets demo: %s %s: the client went away before its body was in", request.method, request.url.path
        )
        return Response(status_code=400)  # sent to no one

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        logger.exception("capsnets demo: %s %s failed", request.method, request.url.path)
        return JSONResponse({"detail": f"internal error ({type(error).__name__})"}, status_code=500)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/api/info")
    async def info() -> dict:
        return {**demo.info(), "max_body_bytes": MAX_BODY_BYTES}

    @app.get("/api/samples")
    async def samples() -> dict:
        images, labels = await run_in_threadpool(demo.samples)
        return {
            "samples": [
                {"class": int(k), "label": demo.classes[int(k)], "image": _png(demo, x), "pixels": _pixels(x)}
                for x, k in zip(images, labels)
            ],
            "note": demo.samples_note,
        }

    @app.post("/api/predict", openapi_extra=_body_schema(ImageInput, image=True))
    async def predict(request: Request) -> dict:
        image, notes, request_input = await _image(request, demo)
        analysis = await run_in_threadpool(demo.analyse, image, request_input.capsule)
        return _analysis(demo, image, analysis, notes)

    @app.post("/api/reconstruct", openapi_extra=_body_schema(CapsuleInput))
    async def reconstruct(request: Request) -> dict:
        body = _parse(CapsuleInput, await _read_body(request))
        decoded = await run_in_threadpool(demo.reconstruct, body.capsule, body.class_index)
        return {"class": body.class_index, "reconstruction": data_url(tensor_png(decoded)), "pixels": _pixels(decoded)}

    @app.post("/api/perturbations", openapi_extra=_body_schema(ImageInput, image=True))
    async def perturbations(request: Request) -> dict:
        image, _, request_input = await _image(request, demo)
        grid, shown, steps = await run_in_threadpool(demo.perturbations, image, request_input.capsule)
        return {
            "class": shown,
            "label": demo.classes[shown],
            "grid": data_url(grid_png(display(grid, demo.dataset))),
            "steps": steps,
            "dimensions": int(grid.shape[0]),
        }

    return app


def _names(host: str) -> frozenset[str]:
    """The host names a server listening on ``host`` answers to, besides IP addresses: ``localhost``, this
    machine's names and ``host`` itself (unless it is an address or listens everywhere)."""
    names = {"localhost", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except (OSError, UnicodeError):  # pragma: no cover - a broken resolver: the short name still answers
        pass
    if isinstance(host, str) and host.strip() not in _WILDCARDS:
        names.add(host.strip())
    return frozenset(name.lower().rstrip(".") for name in names if name)


def host_allowed(host_header: str | None, names: frozenset[str] | set[str] = frozenset({"localhost"})) -> bool:
    """Whether a request's ``Host`` header (``name``, ``address``, ``[IPv6]``, each with or without ``:port``) is
    one the demo answers: any IP address (a web page cannot make an address point elsewhere, as it can a name it
    owns: DNS rebinding), or one of ``names`` (lower case; a final dot and the case of the header are ignored).
    A missing or malformed header is refused."""
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host.startswith("["):  # [IPv6] or [IPv6]:port
        address, bracket, port = host[1:].partition("]")
        if not bracket or (port and not (port[0] == ":" and _port(port[1:]))):
            return False
        return _is_address(address)
    if host.count(":") > 1:  # a bare IPv6 address (browsers send it in brackets)
        return _is_address(host)
    name, colon, port = host.partition(":")
    if colon and not _port(port):
        return False
    return _is_address(name) or (name.rstrip(".") in names if name else False)


def _port(text: str) -> bool:
    return text == "" or (text.isascii() and text.isdigit() and len(text) <= 5)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class _HostGuard:
    """ASGI middleware: HTTP requests whose ``Host`` is not :func:`host_allowed` get 403 and one line; every
    response gets :data:`SECURITY_HEADERS`."""

    def __init__(self, app: ASGIApp, names: frozenset[str]) -> None:
        self.app = app
        self.names = names
        self.headers = [(key.lower().encode(), value.encode()) for key, value in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.headers]
            await send(message)

        header = next((value for key, value in scope["headers"] if key == b"host"), None)
        host = header.decode("latin-1") if header is not None else None
        if host_allowed(host, self.names):
            await self.app(scope, receive, send_with_headers)
            return
        shown = f"for Host {host[:100]!r}" if host is not None else "without a Host header"
        logger.warning("capsnets demo: refused a request %s", shown)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        response = PlainTextResponse(
            f"capsnets demo: refused a request {shown}: the demo answers only to localhost, an IP address, this "
            "machine's name or the name given to --host (so that no other web site can reach it by DNS rebinding)\n",
            status_code=403,
        )
        await response(scope, receive, send_with_headers)


async def _read_body(request: Request) -> bytes:
    """The request body: 413 past :data:`MAX_BODY_BYTES` (as declared, or as it arrives), 408 when it is not all in
    within :data:`BODY_TIMEOUT_S` (both close the connection, leaving the rest unread); :class:`ClientDisconnect`
    when the client goes away."""
    if _declared_too_large(request.headers.get("content-length")):
        raise _too_large()
    chunks, size, start = [], 0, time.monotonic()
    try:
        with anyio.fail_after(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise _too_large()
                chunks.append(chunk)
    except TimeoutError:
        waited = time.monotonic() - start
        logger.info("capsnets demo: %s %s: body not in after %.1f s", request.method, request.url.path, waited)
        raise HTTPException(
            408,
            f"request body not received within {BODY_TIMEOUT_S:g} s ({size:,} bytes came); send the whole body at once",
            headers=_CLOSE,
        ) from None
    return b"".join(chunks)


def _too_large() -> HTTPException:
    return HTTPException(413, f"request body too large: at most {MAX_BODY_BYTES:,} bytes", headers=_CLOSE)


def _declared_too_large(declared: str | None) -> bool:
    """Whether a ``Content-Length`` header says more than :data:`MAX_BODY_BYTES` (or is not a number), read
    without converting a long digit string."""
    if declared is None:
        return False
    digits = declared.strip().lstrip("0") or "0"
    if not (digits.isascii() and digits.isdigit()):
        return True
    return len(digits) > len(str(MAX_BODY_BYTES)) or int(digits) > MAX_BODY_BYTES


class _LongInteger(ValueError):
    """An integer in a JSON body with more than :data:`MAX_INTEGER_DIGITS` digits."""


def _integer(text: str) -> int:
    """A JSON integer, refused past :data:`MAX_INTEGER_DIGITS` digits before it is converted."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_INTEGER_DIGITS:
        raise _LongInteger(f"integers in the body have at most {MAX_INTEGER_DIGITS} digits, got one of {digits:,}")
    return int(text)


def _parse(schema: type[BaseModel], body: bytes) -> Any:
    """``body`` (JSON) validated against ``schema``; 400 for what is not JSON, 422 naming the first wrong field."""
    try:
        data = json.loads(body, parse_int=_integer)
    except _LongInteger as err:
        raise HTTPException(422, str(err)) from None
    except RecursionError:
        raise HTTPException(400, "body nests JSON too deeply (the parser stops at about 1000 levels)") from None
    except (UnicodeDecodeError, ValueError):  # json.JSONDecodeError is a ValueError
        raise HTTPException(
            400, f"body must be JSON (or, for an image, the image file itself: {IMAGE_FORMATS_TEXT})"
        ) from None
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        # the location without the names of a union's members ("pixels.list[list[float]].0.0": "pixels.0.0")
        where = ".".join(str(part) for part in first["loc"] if "[" not in str(part)) or "body"
        raise HTTPException(422, f"{where}: {first['msg']}") from None


async def _image(request: Request, demo: DemoModel) -> tuple[torch.Tensor, list[str], ImageInput]:
    """The model input a request sends: an image file as the body, or :class:`ImageInput` JSON."""
    body = await _read_body(request)
    if body.startswith(_IMAGE_MAGIC) or request.headers.get("content-type", "").startswith("image/"):
        request_input = ImageInput()
        tensor, notes = await run_in_threadpool(read_image, body, demo.input_size, demo.dataset)
        return tensor, notes, request_input
    request_input = _parse(ImageInput, body)
    if (request_input.image is None) == (request_input.pixels is None):
        raise HTTPException(422, "send one of image (an image file as base64) and pixels")
    if request_input.image is not None:
        tensor, notes = await run_in_threadpool(
            read_image, decode_base64(request_input.image), demo.input_size, demo.dataset, frame=request_input.frame
        )
        return tensor, notes, request_input
    return _from_pixels(request_input.pixels, demo), [], request_input


def _from_pixels(pixels: list, demo: DemoModel) -> torch.Tensor:
    try:
        tensor = torch.tensor(pixels, dtype=torch.float32)
    except (ValueError, TypeError, OverflowError):
        raise ArgumentError("pixels must be a rectangular array of numbers") from None
    if tensor.dim() == 2:
        tensor = tensor[None]
    channels, height, width = demo.input_size
    if tuple(tensor.shape) != demo.input_size:
        wanted = f"{channels} x {height} x {width}" + (f" or {height} x {width}" if channels == 1 else "")
        raise ArgumentError(f"pixels must be {wanted} numbers for this model, got {' x '.join(map(str, tensor.shape))}")
    if not bool(tensor.isfinite().all()):
        raise ArgumentError("pixels must be finite numbers")
    if demo.dataset not in NORB_LIKE and (tensor.min() < 0 or tensor.max() > 1):
        raise ArgumentError("pixels must lie in [0, 1]")
    return tensor


def _analysis(demo: DemoModel, image: torch.Tensor, analysis: Analysis, notes: list[str]) -> dict:
    """An :class:`Analysis` as the JSON the page reads."""
    result = {
        "input": _png(demo, image),
        "notes": notes,
        "classes": demo.classes,
        "scores": analysis.scores.tolist(),
        "prediction": analysis.prediction,
        "label": demo.classes[analysis.prediction],
        "uncertain": bool(analysis.doubts),
        "doubt": "; ".join(analysis.doubts) or None,
        "shown": analysis.shown,
        "capsules": analysis.capsules.tolist(),
        "reconstruction": None,
        "couplings": None,
    }
    if analysis.reconstruction is not None:
        result["reconstruction"] = data_url(tensor_png(analysis.reconstruction))
    if analysis.couplings is not None:
        maps = analysis.couplings.float()
        top = float(maps.max())
        result["couplings"] = {
            "grid": list(maps.shape[1:]),
            "values": maps.tolist(),
            "what": _couplings_text(demo, maps),
            "overlay": data_url(heat_png(display(image, demo.dataset), maps[analysis.shown], top=top)),
            "maps": [data_url(map_png(m, top)) for m in maps],
        }
    return result


def _couplings_text(demo: DemoModel, maps: torch.Tensor) -> str:
    height, width = maps.shape[1:]
    if demo.kind == "vector":
        return (
            f"c_ij |u_i|: each primary capsule's final routing coupling to class j times its length, summed "
            f"over the capsule types at each position of the {height}x{width} primary capsule grid"
        )
    return (
        f"R_ij a_i: each ConvCaps2 capsule's final EM assignment to class j times its activation, summed over "
        f"the capsule types at each position of the {height}x{width} grid"
    )


def _png(demo: DemoModel, image: torch.Tensor) -> str:
    return data_url(tensor_png(display(image, demo.dataset)))


def _pixels(image: torch.Tensor) -> list:
    """A ``(C, H, W)`` image as nested lists (``H x W`` for one channel), rounded to 4 decimals."""
    image = image.detach().float().cpu()
    values = (image[0] if image.shape[0] == 1 else image).mul(1e4).round().div(1e4)
    return values.tolist()


def _body_schema(schema: type[BaseModel], image: bool = False) -> dict:
    """The OpenAPI request body of an endpoint that reads its body itself."""
    content: dict[str, Any] = {"application/json": {"schema": schema.model_json_schema()}}
    if image:
        content.update(
            {f"image/{name.lower()}": {"schema": {"type": "string", "format": "binary"}} for name in IMAGE_FORMATS}
        )
    return {"requestBody": {"required": True, "content": content}}


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (port 0: a free one).

    Raises:
        ArgumentError: an empty host or a port outside 0-65535.
        OSError: the address cannot be used (naming it and why).
    """
    if not isinstance(host, str) or not host.strip():
        raise ArgumentError(f"host must name an address to listen on, such as 127.0.0.1, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ArgumentError(f"port must be an integer in [0, 65535] (0: a free port), got {port!r}")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family)
    except (OSError, UnicodeError, ValueError) as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise OSError(f"cannot listen on {host}:{port}: {reason}") from None


def run_server(app: FastAPI, sock: socket.socket) -> None:
    """Serve ``app`` with uvicorn on the listening socket ``sock`` until interrupted."""
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[sock])


def serve(demo: DemoModel, host: str = "127.0.0.1", port: int = 8000, announce: Callable[[str], None] = print) -> None:
    """Serve ``demo`` on ``host``:``port`` until interrupted, announcing its address."""
    with listen(host, port) as sock:
        announce(f"capsnets demo: {url(sock)}")
        run_server(create_app(demo, host), sock)


def url(sock: socket.socket) -> str:
    """The page's address on a listening socket."""
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/"
