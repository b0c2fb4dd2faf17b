"""`dyncomplete serve`: the OpenAI-compatible completion server and its playground page."""

from __future__ import annotations

import os
import sys

from ._common import add_model_options, load_from_args


def run(args) -> int:
    import uvicorn

    from ..engine import MAX_NEW_TOKENS_LIMIT
    from ..methods import make_method
    from ..serve import Settings, create_app

    if args.max_tokens_limit > MAX_NEW_TOKENS_LIMIT:
        raise ValueError(f"--max-tokens-limit can be at most {MAX_NEW_TOKENS_LIMIT}")

    api_key = args.api_key or os.environ.get("DYNCOMPLETE_API_KEY") or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(f"dyncomplete: warning: listening on {args.host} without an API key", file=sys.stderr)
    settings = Settings(default_method=args.method, api_key=api_key, queue_size=args.queue_size,
                        request_timeout_s=args.timeout, max_tokens_limit=args.max_tokens_limit,
                        context_budget=args.context_budget, cache_bytes=int(args.cache_mb * 2**20))
    model = load_from_args(args)
    make_method(args.method, model)  # fail now, not at the first request, on a bad default method
    uvicorn.run(create_app(model, settings), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise ValueError(f"must be > 0, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve completions over HTTP (OpenAI /v1/completions) with a web page")
    add_model_options(p)
    p.add_argument("--method", default="baseline", help="default decoding method (a request may name another)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or set DYNCOMPLETE_API_KEY)")
    p.add_argument("--queue-size", type=positive(int), default=16, help="requests waiting beyond this get 503")
    p.add_argument("--timeout", type=positive(float), default=60.0, help="seconds a request may take, queue included")
    p.add_argument("--max-tokens-limit", type=positive(int), default=1024, help="largest max_tokens accepted")
    p.add_argument("--context-budget", type=positive(int), default=1024,
                   help="prompt tokens kept; a longer prefix is cut at a stable line start (see docs)")
    p.add_argument("--cache-mb", type=float, default=512, help="prefix-cache memory bound in MiB (0: off)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(run=run)
