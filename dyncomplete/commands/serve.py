"""`dyncomplete serve`: the OpenAI-compatible completion server and its playground page."""

from __future__ import annotations

import os
import sys

from ..methods.registry import family_list
from ._common import EDITOR_METHOD, EDITOR_MODEL, add_model_options, load_from_args, positive


def read_api_key(args) -> str | None:
    """--api-key-file (read once, stripped), else --api-key, else $DYNCOMPLETE_API_KEY."""
    if args.api_key_file and args.api_key:
        raise ValueError("give --api-key or --api-key-file, not both")
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read --api-key-file {args.api_key_file}: {exc}") from None
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file} is empty")
        return key
    if args.api_key:
        print("dyncomplete: warning: --api-key is visible to every user in the process list; "
              "prefer --api-key-file or DYNCOMPLETE_API_KEY", file=sys.stderr)
    return args.api_key or os.environ.get("DYNCOMPLETE_API_KEY") or None


def method_list(text: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    if text is None:
        return default
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ValueError("--methods needs at least one method name")
    return names


def run(args) -> int:
    from ..engine import MAX_NEW_TOKENS_LIMIT
    from ..methods import parse_method
    from ..serve import Settings, create_app
    from ..serve.http import Limits, is_loopback, run_server

    check_cluster_options(args)
    if args.max_tokens_limit > MAX_NEW_TOKENS_LIMIT:
        raise ValueError(f"--max-tokens-limit can be at most {MAX_NEW_TOKENS_LIMIT}")
    methods = method_list(args.methods, Settings.methods)
    for name in (args.method, *methods):  # the grammar now; building (files, models) after loading
        parse_method(name)
    api_key = read_api_key(args)
    loopback = is_loopback(args.host)
    if not loopback and not api_key:
        print(f"dyncomplete: warning: listening on {args.host} without an API key", file=sys.stderr)
    settings = Settings(default_method=args.method, methods=methods, check_host=loopback,
                        limits=Limits(max_connections=args.max_connections), api_key=api_key,
                        queue_size=args.queue_size, parallel=args.parallel, request_timeout_s=args.timeout,
                        max_tokens_limit=args.max_tokens_limit, context_budget=args.context_budget,
                        suffix_budget=args.suffix_budget, cursor_line=args.cursor_line,
                        cache_bytes=int(args.cache_mb * 2**20), cache_reuse=args.cache_reuse,
                        cache_reuse_copies=args.cache_reuse_copies, cache_reuse_near=args.cache_reuse_near,
                        client_memory=args.client_memory == "on",
                        ngram_cache=args.ngram_cache == "on", suggestions=args.suggestions == "on",
                        prefetch=args.prefetch == "on", verify_budget=args.verify_budget)
    if args.ray:
        from ..serve.cluster import deploy

        model_options = {"name": args.model, "dtype": args.dtype, "device": args.device, "quant": args.quant}
        deploy(args.ray, args.replicas, args.max_replicas or args.replicas, args.routing, model_options, settings,
               args.host, args.port, args.replica_cpus)
        return 0
    model = load_from_args(args)
    app = create_app(model, settings)  # builds every allowed method: a bad one fails here, not at a request
    run_server(app, args.host, args.port, args.log_level, settings.limits)
    return 0


def check_cluster_options(args) -> None:
    cluster_only = [flag for flag, given in (("--replicas", args.replicas != 1), ("--max-replicas", args.max_replicas),
                                             ("--routing", args.routing != "editor"),
                                             ("--replica-cpus", args.replica_cpus != 1)) if given]
    if cluster_only and not args.ray:
        raise ValueError(f"{', '.join(cluster_only)} need --ray ADDRESS (a Ray cluster to deploy replicas on)")
    if args.max_replicas and args.max_replicas < args.replicas:
        raise ValueError(f"--max-replicas {args.max_replicas} is below --replicas {args.replicas}")


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve completions over HTTP (OpenAI /v1/completions) with a web page")
    add_model_options(p, EDITOR_MODEL)
    p.add_argument("--method", default=EDITOR_METHOD,
                   help=f"default decoding method (always allowed); families {family_list()}")
    p.add_argument("--methods", default=None,
                   help="comma-separated methods a request may pick besides --method, all built at start "
                        "(default: baseline,lookup, which load nothing)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: loopback only; on loopback only Host names of "
                        "loopback are answered, elsewhere any)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key-file", default=None, help="require 'Authorization: Bearer KEY', KEY read from this file")
    p.add_argument("--api-key", default=None,
                   help="the key on the command line (visible in the process list; or set DYNCOMPLETE_API_KEY)")
    p.add_argument("--queue-size", type=positive(int), default=16, help="requests waiting beyond this get 503")
    p.add_argument("--parallel", "-np", type=positive(int), default=1, metavar="N",
                   help="requests generated at once (llama-server's -np): past 1, the decode steps, lookup's "
                        "verification passes and the prompt chunks of all running requests go through the model "
                        "in one batched call")
    # the choices are worker.VERIFY_BUDGETS, not imported: the serve package imports torch, which --help need not
    p.add_argument("--verify-budget", default="shared", choices=["shared", "per-request"],
                   help="with --parallel: which drafted tokens a batched call verifies: those with the most "
                        "expected tokens per unit of work across the batch (TETRIS), or every request's own draft "
                        "whole")
    p.add_argument("--timeout", type=positive(float), default=60.0,
                   help="seconds a request may take, queue and tokenising included")
    p.add_argument("--max-tokens-limit", type=positive(int), default=1024, help="largest max_tokens accepted")
    p.add_argument("--context-budget", type=positive(int), default=1024,
                   help="prompt tokens kept; a longer prefix is cut at a stable line start (see docs)")
    p.add_argument("--suffix-budget", type=positive(int, zero=True), default=0, metavar="N",
                   help="keep at most N tokens of the suffix (fill-in-the-middle), which every change in the "
                        "prefix prefills again (0: up to a quarter of the context budget, more when the "
                        "prefix leaves room)")
    # the choices are prompts.CURSOR_LINES, not imported: the engine package imports torch, which --help need not
    p.add_argument("--cursor-line", default="middle", choices=["prefix", "middle"],
                   help="where a fill-in-the-middle prompt puts the cursor line's text before the cursor: after "
                        "the middle token as the completion's start, as llama.cpp's /infill does, so typing within "
                        "a line leaves the suffix in the prefix cache (default); or in the prefix")
    p.add_argument("--cache-mb", type=float, default=512, help="prefix-cache memory bound in MiB (0: off)")
    p.add_argument("--cache-reuse", type=positive(int, zero=True), default=32, metavar="N",
                   help="also reuse runs of at least N tokens of a recent prompt at new positions, keys rotated "
                        "(the suffix of a fill-in-the-middle prompt after the prefix grew; approximate, measured "
                        "in docs/results.md; 0: off)")
    p.add_argument("--cache-reuse-copies", type=positive(int, zero=True), default=2, metavar="N",
                   help="with --cache-reuse: a position copied N times is prefilled again, so that reused text "
                        "does not drift from what a prefill gives (0: no limit)")
    p.add_argument("--cache-reuse-near", type=positive(int, zero=True), default=64, metavar="N",
                   help="with --cache-reuse-copies: the limit holds for the N positions on either side of the "
                        "cursor only, so that a moved suffix is not prefilled again all at once (0: everywhere)")
    p.add_argument("--client-memory", default="on", choices=["on", "off"],
                   help="remember the files each editor sends (input_extra, the documents it edits) and add "
                        "the best-matching windows of them to its prompts (a request opts out with "
                        '"client_memory": false)')
    p.add_argument("--ngram-cache", default="on", choices=["on", "off"],
                   help="n-gram drafting (lookup) may copy each client's earlier completions (a request opts out "
                        'with "ngram_cache": false); outputs are the same either way')
    p.add_argument("--suggestions", default="on", choices=["on", "off"],
                   help="answer a request whose typing continues one of the editor's recent answers (same text "
                        "after the cursor) with that answer's rest, without the model, as llama.vim and Continue "
                        "do in the editor")
    p.add_argument("--prefetch", default="on", choices=["on", "off"],
                   help="with --suggestions and one slot: once a request is answered and none waits, generate the "
                        "request for the text with the answer accepted (llama.vim's speculative FIM, in the "
                        "server); any request stops it")
    p.add_argument("--max-connections", type=positive(int), default=256,
                   help="open connections; more are answered 503 at once")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="deploy on the Ray cluster at ADDRESS (e.g. 127.0.0.1:6379, or auto) with Ray Serve: "
                        "replicas of the model behind the same HTTP API, each editor kept on one replica "
                        "(needs the 'cluster' extra; see docs/serving.md)")
    p.add_argument("--replicas", type=positive(int), default=1, help="--ray: model replicas (the minimum with "
                   "--max-replicas)")
    p.add_argument("--max-replicas", type=positive(int), default=None,
                   help="--ray: scale between --replicas and this on ongoing requests per replica (target: --parallel)")
    p.add_argument("--routing", default="editor", choices=["editor", "ray-default"],
                   help="--ray: editor: each editor on its home replica (the first in the rendezvous-hash order of "
                        "its sender, key and X-Client-Id below its share of the active editors); when it is full "
                        "(where one server answers 503), the less loaded of the editor's next two; ray-default: "
                        "Ray Serve's own (the less loaded of two random replicas)")
    p.add_argument("--replica-cpus", type=positive(int), default=1,
                   help="--ray: CPUs each replica reserves, and its threads")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(run=run)
