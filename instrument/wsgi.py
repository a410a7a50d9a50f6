"""`instrument.wsgi.Middleware`: a root stage per request of any WSGI app (Flask, Django, plain WSGI),
named by method and route template.

    app.wsgi_app = instrument.wsgi.Middleware(app.wsgi_app)     # Flask; or wrap any WSGI callable
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Iterable, Iterator, List, Optional

from .auto.http import RequestMiddleware, record


def flask_template(app: Any, environ: dict) -> Optional[str]:
    """The rule Flask (werkzeug) would route `environ` to (`/items/<int:item_id>`), or None."""
    url_map = getattr(getattr(app, "__self__", app), "url_map", None)   # the Flask app, or its bound wsgi_app
    if url_map is None:
        return None
    try:
        rule, _ = url_map.bind_to_environ(environ).match(return_rule=True)
    except Exception:   # not found, method not allowed, a redirect: no template
        return None
    return rule.rule


class _Input:
    """wsgi.input counting the bytes the app reads."""
    __slots__ = ("stream", "count")

    def __init__(self, stream: Any) -> None:
        self.stream, self.count = stream, 0

    def read(self, *args: Any) -> bytes:
        data = self.stream.read(*args)
        self.count += len(data)
        return data

    def readline(self, *args: Any) -> bytes:
        data = self.stream.readline(*args)
        self.count += len(data)
        return data

    def readlines(self, *args: Any) -> List[bytes]:
        lines = self.stream.readlines(*args)
        self.count += sum(map(len, lines))
        return lines

    def __iter__(self) -> Iterator[bytes]:
        for line in self.stream:
            self.count += len(line)
            yield line


class _Request:
    """One request in flight: its stage stays open until the server closes the response body."""
    __slots__ = ("stage", "input", "sent", "status", "error", "result", "body", "open")

    def __init__(self, stage: Any, input_: Optional[_Input]) -> None:
        self.stage, self.input = stage, input_
        self.sent, self.status, self.error, self.result, self.body, self.open = 0, None, None, None, None, True
        stage.__enter__()

    def start_response(self, start_response: Callable) -> Callable:
        def start(status: str, headers: list, exc_info: Any = None) -> Callable:
            try:
                self.status = int(status.split(None, 1)[0])
            except ValueError:
                pass
            write = start_response(status, headers, exc_info) if exc_info is not None else \
                start_response(status, headers)

            def counted_write(data: bytes) -> Any:
                self.sent += len(data)
                return write(data)
            return counted_write
        return start

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            chunk = next(self.body)
        except StopIteration:
            raise
        except BaseException:   # the server closes the body next: the stage ends with this error
            self.error = sys.exc_info()
            raise
        self.sent += len(chunk)
        return chunk

    def close(self) -> None:
        try:
            close = getattr(self.result, "close", None)
            if close is not None:
                close()
        finally:
            self.finish(*(self.error or (None, None, None)))

    def finish(self, et: Any, ev: Any, tb: Any) -> None:
        if not self.open:
            return
        self.open = False
        status = self.status if self.status is not None or et is None else 500
        try:
            record(self.input.count if self.input is not None else 0, self.sent, status)
        finally:
            self.stage.__exit__(et, ev, tb)


class Middleware(RequestMiddleware):
    """A root stage per request, named `METHOD /route/<template>` (never the raw path: `GET (unmatched)`
    where no route matched, `OTHER` for methods outside the standard ones), timed until the server closes
    the response, after its last body chunk.  Its items: `request_bytes` (the body the app read),
    `response_bytes` (the body sent) and `http_4xx`/`http_5xx` per error response (an app that raised
    before answering counts as a 5xx, and as an error of the stage).  The app's own stages nest under it.

    Flask's routes are read from its url_map; route(environ) -> template or None names those of other
    frameworks.  remove() makes the middleware pass everything through unrecorded."""

    request_kind = "WSGI environ"

    def _template(self, environ: dict) -> Optional[str]:
        return flask_template(self.app, environ)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if not self._enabled:
            return self.app(environ, start_response)
        stage = self._stage(environ.get("REQUEST_METHOD", ""), environ)
        input_ = None
        if environ.get("wsgi.input") is not None:
            input_ = environ["wsgi.input"] = _Input(environ["wsgi.input"])
        request = _Request(stage, input_)
        try:
            request.result = self.app(environ, request.start_response(start_response))
            request.body = iter(request.result)
        except BaseException:
            request.finish(*sys.exc_info())
            raise
        return request
