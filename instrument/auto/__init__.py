"""Instrumentation without code edits: one call instruments a torch model's modules
(`instrument.modules`), an ASGI or WSGI service (`instrument.asgi.Middleware`,
`instrument.wsgi.Middleware`) or a Hugging Face pipeline, tokenizer or `generate()`
(`instrument.transformers`).

These modules build on the facade's public functions only (`instrument.stage`,
`instrument.add`): they are what a user could have written by hand, with each stage
object made once and reused.  Each wraps methods of the one object it is given (never
its class) and returns or is a handle whose `remove()` puts back what was there.

`instrument.asgi`, `instrument.wsgi` and `instrument.transformers` are modules at the package's top, the
names users import; this package holds `instrument.modules` and what they share (`http`, `patch`).
"""
