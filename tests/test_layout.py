"""The package's top-level parts import only downward, in this order (lowest first), so that
none of them needs another's lazy import to load."""

import ast
from pathlib import Path

import dyncomplete

LAYERS = ["paths", "models", "energy", "engine", "exits", "methods", "data", "training", "serve", "bench",
          "commands", "cli", "__main__"]
ROOT = Path(dyncomplete.__file__).parent


def part_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_parts(path: Path) -> set[str]:
    """Top-level parts of dyncomplete that a module imports, at any depth of its code."""
    module = list(path.relative_to(ROOT).with_suffix("").parts)
    package = module[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                targets = [["dyncomplete", *base, *(node.module.split(".") if node.module else [a.name])]
                           for a in node.names]
            elif node.module:
                targets = [node.module.split(".")]
        for t in targets:
            if t[0] == "dyncomplete" and len(t) > 1:
                found.add(t[1])
    return found


def test_every_part_is_in_the_layer_list():
    parts = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} | {p.stem for p in ROOT.glob("*.py")}
    assert parts - {"__init__"} == set(LAYERS)


def test_imports_run_one_way():
    upward = []
    for path in ROOT.rglob("*.py"):
        src = part_of(path)
        if src == "__init__":
            continue
        for dst in imported_parts(path) - {src, "__version__"}:
            if dst in LAYERS and LAYERS.index(dst) > LAYERS.index(src):
                upward.append(f"{path.relative_to(ROOT)} imports {dst} ({src} is below {dst})")
    assert not upward, "\n".join(upward)


def test_the_checker_sees_upward_imports(tmp_path, monkeypatch):
    """The check itself can fail: a relative import from models up to engine is caught."""
    fake = tmp_path / "dyncomplete" / "models" / "bad.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from ..engine import Stats\nfrom . import layered\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path / "dyncomplete")
    assert imported_parts(fake) == {"engine", "models"}


def test_completing_and_serving_need_no_extra():
    """The core (complete, serve, every method) imports none of the bench/train/gpu extras."""
    import subprocess
    import sys

    code = ("import sys, dyncomplete.cli, dyncomplete.serve.app, dyncomplete.methods.speculative, "
            "dyncomplete.methods.early_exit, dyncomplete.methods.stop_rule, dyncomplete.exits.agent, "
            "dyncomplete.exits.classifier, dyncomplete.commands.complete, dyncomplete.commands.serve\n"
            "extras = ['matplotlib', 'rouge_score', 'sacrebleu', 'rapidfuzz', 'stable_baselines3', 'gymnasium',"
            " 'peft', 'httpx']\n"  # not pynvml: torch itself imports it where installed
            "print(','.join(m for m in extras if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""
