"""`instrument.asgi.Middleware`: a root stage per HTTP request of any ASGI app (FastAPI, Starlette),
named by method and route template.

    app = instrument.asgi.Middleware(app)          # or: app.add_middleware(instrument.asgi.Middleware)
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from .auto.http import RequestMiddleware, record


def starlette_template(routes: Sequence[Any], scope: dict) -> Optional[str]:
    """The route template Starlette's router would pick for `scope` (`/items/{item_id}`; mounts joined:
    `/api/users/{user_id}`), or None: the first full match, else the first partial one (a method the
    route does not allow), as the router itself does."""
    from starlette.routing import Host, Match, Mount
    partial = None
    for route in routes:
        match, child = route.matches(scope)
        if match is Match.NONE:
            continue
        if isinstance(route, (Mount, Host)) and route.routes:
            rest = starlette_template(route.routes, {**scope, **child})
            prefix = route.path_format[:-len("/{path}")] if isinstance(route, Mount) else ""
            template = None if rest is None else prefix + rest
        else:   # a route, or a mount of an app without routes (static files): `/static/{path}`
            template = getattr(route, "path_format", None)
        if match is Match.FULL:
            return template
        if partial is None:
            partial = template
    return partial


def _routes(app: Any) -> Optional[Sequence[Any]]:
    """The route table of `app`, or of the app it wraps: middlewares keep the app they wrap as `.app`."""
    for _ in range(32):
        routes = getattr(app, "routes", None)
        if routes:
            return routes
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


class Middleware(RequestMiddleware):
    """A root stage per HTTP request, named `METHOD /route/{template}` (never the raw path: `GET (unmatched)`
    where no route matched, `OTHER` for methods outside the standard ones), timed until the app returns,
    after its last response body chunk.  Its items: `request_bytes` (the body the app received),
    `response_bytes` (the body sent) and `http_4xx`/`http_5xx` per error response (a request whose app
    raised before answering counts as a 5xx, and as an error of the stage).  The app's own stages nest
    under it.  Lifespan and websocket scopes pass through untimed.

    route(scope) -> template or None names the routes of apps without a Starlette route table.
    remove() makes the middleware pass everything through unrecorded."""

    request_kind = "ASGI scope"

    def _template(self, scope: dict) -> Optional[str]:
        routes = _routes(self.app) or getattr(scope.get("app"), "routes", None)   # added inside: scope["app"]
        return starlette_template(routes, scope) if routes else None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not self._enabled:
            return await self.app(scope, receive, send)
        stage = self._stage(scope.get("method", ""), scope)
        sizes = [0, 0]
        status: list = [None]

        async def receive_counted() -> dict:
            message = await receive()
            if message.get("type") == "http.request":
                sizes[0] += len(message.get("body") or b"")
            return message

        async def send_counted(message: dict) -> None:
            kind = message.get("type")
            if kind == "http.response.start":
                status[0] = message.get("status")
            elif kind == "http.response.body":
                sizes[1] += len(message.get("body") or b"")
            await send(message)

        with stage:
            try:
                await self.app(scope, receive_counted, send_counted)
            except Exception:
                if status[0] is None:   # the server answers 500 for an app that raised before answering
                    status[0] = 500
                raise
            finally:
                record(sizes[0], sizes[1], status[0])
