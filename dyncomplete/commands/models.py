"""`dyncomplete models`: the registered models, whether they are installed and cached."""

from __future__ import annotations

import json
import math


def describe(spec) -> dict:
    from ..models.registry import cached_dir

    folder = cached_dir(spec.alias)
    cached = (folder / "config.json").is_file()
    params = None
    if cached:
        from safetensors import safe_open

        params = 0
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(f, "pt") as st:
                params += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return {
        "alias": spec.alias,
        "description": spec.description,
        "installed": spec.installed(),
        "cached": cached,
        "path": str(folder) if cached else None,
        "layers": spec.layers,
        "params": params,
        "sha256": spec.sha256,
        "install": spec.install_command(),
    }


def describe_tuned(name: str) -> dict:
    """A tuned model's row: its base's state (the adapter ships in the package) and where the
    adapter lies."""
    from ..models import REGISTRY
    from ..models.tuned import adapter_dir, tuned_base

    base = describe(REGISTRY[tuned_base(name)])
    return {**base, "alias": name, "description": f"{base['alias']} + the LITE adapter, merged at load",
            "base": base["alias"], "adapter": str(adapter_dir(name))}


def run(args) -> int:
    from ..models import REGISTRY
    from ..models.tuned import shipped

    rows = [describe(spec) for spec in REGISTRY.values()] + [describe_tuned(name) for name in shipped()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="dyncomplete models")
    for col in ("alias", "layers", "params", "installed", "cached", "to install"):
        table.add_column(col)
    for r in rows:
        params = f"{r['params'] / 1e6:.0f}M" if r["params"] else "-"
        install = "" if r["installed"] else f"dyncomplete install {r.get('base', r['alias'])}"
        table.add_row(r["alias"], str(r["layers"]), params, "yes" if r["installed"] else "no",
                      "yes" if r["cached"] else "no", install)
    Console().print(table)
    return 0


def register(sub) -> None:
    p = sub.add_parser("models", help="list the registered models and their state")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(run=run)
