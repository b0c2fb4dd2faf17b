"""`bench-session` with each /infill answer's latency and the server's own timings logged to
$TRACE (one JSON line a request): `TRACE=out.jsonl python3 trace.py bench-session ...`."""
import json, os, sys, threading, time

import httpx

from dyncomplete.cli import main

post, lock, t0 = httpx.Client.post, threading.Lock(), time.perf_counter()
log = open(os.environ["TRACE"], "a")


def traced(self, url, *args, **kwargs):
    started = time.perf_counter()
    r = post(self, url, *args, **kwargs)
    body, ms = kwargs.get("json") or {}, (time.perf_counter() - started) * 1000
    if "input_prefix" in body:
        data = r.json()
        with lock:
            log.write(json.dumps({"start": round(started - t0, 3), "ms": round(ms, 1), "t_max": body.get("t_max_predict_ms"),
                                  "editor": threading.get_ident() % 10000, "prompt": data.get("tokens_evaluated"),
                                  **{k: data.get(f"timings/{k}") for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")}}) + "\n")
            log.flush()
    return r


httpx.Client.post = traced
sys.exit(main(sys.argv[1:]))
