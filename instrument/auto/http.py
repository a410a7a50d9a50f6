"""What the ASGI and WSGI middlewares share: a root stage per request named by method and route
template (a bounded set of names), and the request's items recorded on it."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import instrument

# The methods of RFC 9110 and PATCH; any other token a client sends is named OTHER, so names stay bounded.
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"))
UNMATCHED = "(unmatched)"


def stage_name(method: str, template: Optional[str]) -> str:
    """`GET /items/{item_id}`; `GET (unmatched)` where no route template matched."""
    return f"{method if method in METHODS else 'OTHER'} {template or UNMATCHED}"


class RequestMiddleware:
    """What the ASGI and WSGI middlewares share: the app, how its routes are named, the root stage of each
    request (one object per name, made on first use), and remove()."""
    request_kind = "request"

    def __init__(self, app: Callable, route: Optional[Callable[[Any], Optional[str]]] = None) -> None:
        if route is not None and not callable(route):
            raise TypeError(f"route must be a function of the {self.request_kind} that returns its route template, "
                            f"not {type(route).__name__}")
        self.app = app
        self._route = route
        self._enabled = True
        self._stages: Dict[str, Any] = {}

    def remove(self) -> None:
        """From now on every request passes through unrecorded."""
        self._enabled = False

    def _template(self, request: Any) -> Optional[str]:
        """The app's route template for `request`, read from its framework; None where it has none."""
        return None

    def _stage(self, method: str, request: Any) -> Any:
        try:
            template = (self._route or self._template)(request)
        except Exception:   # a route resolver that fails never fails the request: it is named unmatched
            template = None
        name = stage_name(method, template if isinstance(template, str) else None)
        st = self._stages.get(name)
        if st is None:
            st = self._stages[name] = instrument.stage(name)
        return st


def record(request_bytes: int, response_bytes: int, status: Optional[int]) -> None:
    """Items of the innermost open stage (the request's, when the app has closed its own): bytes each
    way, and a 4xx or 5xx response counted as `http_4xx` or `http_5xx`."""
    if request_bytes:
        instrument.add("request_bytes", request_bytes)
    if response_bytes:
        instrument.add("response_bytes", response_bytes)
    if status is not None and 400 <= status < 600:
        instrument.add(f"http_{status // 100}xx")
