"""Cross-file line completion, CrossCodeEval style, cut from a real multi-file Python package.

A completion point is a line that uses a name imported from another file of the same package
(`from ._models import Request`, then `... = Request(...)` further down). The cursor goes after
the code token before that name, so the target starts with the name and needs knowledge of the
other file. Each example carries the repository context an editor could send, in llama.cpp's
`input_extra` shape (`extra: [{filename, text}]`), chosen without looking at the target:
1. the definitions (signature, first docstring line; a class's method signatures) of the names
   the current file imports from the package, most similar to the code before the cursor first;
2. the windows of the package's other files most similar to the last lines before the cursor
   (CrossCodeEval's Jaccard retrieval, `engine.repo_context.rank_chunks`).
`bench --repo-context off` runs the same examples without it.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from pathlib import Path

from ..engine.repo_context import Chunk, rank_chunks, windows
from .linecut import CODE_TOKEN, tail_from_line_start
from .splits import source_files

DEFINITIONS_KEPT = 12
WINDOWS_KEPT = 4
CLASS_LINES = 16  # a class's definition keeps at most this many lines (its method signatures)
RE_EXPORT_HOPS = 3  # `from . import X` chains followed to the file that defines X


@dataclass
class Site:
    line: int  # 0-based
    cut: int  # column of the cursor
    name: str  # the imported name the target starts with
    defined_in: str


def module_of(rel: str) -> str:
    parts = rel[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(rel: str, node: ast.ImportFrom, package: str) -> str | None:
    """The dotted module (relative to the package root) an ImportFrom names, if it is inside."""
    if node.level:
        here = module_of(rel).split(".") if module_of(rel) else []
        if not rel.endswith("__init__.py"):
            here = here[:-1]
        if node.level - 1 > len(here):
            return None
        base = here[: len(here) - (node.level - 1)]
        return ".".join([*base, *(node.module.split(".") if node.module else [])])
    if node.module and (node.module == package or node.module.startswith(package + ".")):
        return node.module[len(package) + 1 :] if node.module != package else ""
    return None


class Package:
    """The parsed files of one package: definitions and intra-package imports per file."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.name = self.root.name
        self.texts, self.trees, self.files_of_module = {}, {}, {}
        self._top_level, self._imports, self._windows = {}, {}, {}  # per file, computed once
        for path in source_files(self.root, lang="python"):
            rel = path.relative_to(self.root).as_posix()
            text = path.read_text(encoding="utf-8", errors="replace")
            try:
                self.trees[rel] = ast.parse(text)
            except SyntaxError:
                continue
            self.texts[rel] = text
            self.files_of_module[module_of(rel)] = rel

    def top_level(self, rel: str) -> dict[str, ast.AST]:
        if rel not in self._top_level:
            self._top_level[rel] = self._find_top_level(rel)
        return self._top_level[rel]

    def _find_top_level(self, rel: str) -> dict[str, ast.AST]:
        found = {}
        for node in self.trees[rel].body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = node
        return found

    def imports(self, rel: str) -> dict[str, tuple[str, str, int]]:
        """Local name -> (source file, name there, line of the import) for every name imported
        from a module of the package."""
        if rel not in self._imports:
            self._imports[rel] = self._find_imports(rel)
        return self._imports[rel]

    def _find_imports(self, rel: str) -> dict[str, tuple[str, str, int]]:
        out = {}
        for node in ast.walk(self.trees[rel]):
            if isinstance(node, ast.ImportFrom):
                module = _resolve(rel, node, self.name)
                source = self.files_of_module.get(module) if module is not None else None
                if source is None:
                    continue
                for alias in node.names:
                    out[alias.asname or alias.name] = (source, alias.name, node.lineno)
        return out

    def definition(self, rel: str, name: str) -> tuple[str, ast.AST] | None:
        """(file, node) that defines `name` as seen from `rel`, following re-exports."""
        for _ in range(RE_EXPORT_HOPS + 1):
            node = self.top_level(rel).get(name)
            if node is not None:
                return rel, node
            hop = self.imports(rel).get(name)
            if hop is None:
                return None
            rel, name = hop[0], hop[1]
        return None

    def windows(self, rel: str) -> list[Chunk]:
        if rel not in self._windows:
            self._windows[rel] = windows(f"{self.name}/{rel}", self.texts[rel])
        return self._windows[rel]

    def snippet(self, rel: str, node: ast.AST) -> str:
        lines = self.texts[rel].splitlines()
        if isinstance(node, ast.ClassDef):
            keep = [lines[node.lineno - 1]]
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    keep += lines[item.lineno - 1 : item.body[0].lineno - 1][:4]
            return "\n".join(keep[:CLASS_LINES])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            head = lines[node.lineno - 1 : node.body[0].lineno - 1]
            doc = ast.get_docstring(node)
            if doc:
                head.append(" " * (node.col_offset + 4) + '"""' + doc.splitlines()[0] + '"""')
            return "\n".join(head)
        return "\n".join(lines[node.lineno - 1 : node.end_lineno][:3])


def sites_of(package: Package, rel: str) -> list[Site]:
    """Lines of `rel` that use a name imported from another file of the package, with a code
    token before the name on the same line."""
    imported = {}
    for local, (source, original, line) in package.imports(rel).items():
        if source != rel and package.definition(source, original) is not None:
            imported[local] = (source, line)
    lines = package.texts[rel].splitlines()
    seen, out = set(), []
    for node in ast.walk(package.trees[rel]):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in imported):
            continue
        source, import_line = imported[node.id]
        if node.lineno <= import_line or node.lineno in seen:
            continue
        line = lines[node.lineno - 1]
        ends = [m.end() for m in CODE_TOKEN.finditer(line[: node.col_offset])]
        if not ends or len(line[ends[-1] :].strip()) < 3:
            continue
        seen.add(node.lineno)
        out.append(Site(node.lineno - 1, ends[-1], node.id, source))
    return sorted(out, key=lambda s: s.line)


def repo_context(package: Package, rel: str, before: str) -> list[dict]:
    defs = []
    for local, (source, original, _) in package.imports(rel).items():
        found = package.definition(source, original)
        if found is not None and found[0] != rel:
            defs.append(Chunk(f"{package.name}/{found[0]}", package.snippet(*found)))
    others = [w for other in package.texts if other != rel for w in package.windows(other)]
    chosen = rank_chunks(before, defs, DEFINITIONS_KEPT) + rank_chunks(before, others, WINDOWS_KEPT)
    return [{"filename": c.filename, "text": c.text} for c in chosen]


def build_cross_file(repo: Path, n: int, seed: int = 0, max_input_chars: int = 2500) -> list[dict]:
    """n cross-file completion examples from the package at `repo`, spread over its files (one
    site per file per round, in a seeded order)."""
    if n < 1:
        raise ValueError(f"--n must be at least 1, got {n}")
    package = Package(repo)
    rng = random.Random(seed)
    pools = {}
    for rel in sorted(package.texts):
        sites = sites_of(package, rel)
        if sites:
            rng.shuffle(sites)
            pools[rel] = sites
    if not pools:
        raise ValueError(f"no line in {repo} uses a name imported from another of its files")
    order = sorted(pools)
    rng.shuffle(order)
    examples = []
    while len(examples) < n and order:
        for rel in list(order):
            if not pools[rel]:
                order.remove(rel)
                continue
            site = pools[rel].pop()
            lines = package.texts[rel].split("\n")
            start = sum(len(line) + 1 for line in lines[: site.line])
            line = lines[site.line].rstrip()
            before = tail_from_line_start(package.texts[rel][:start] + line[: site.cut], max_input_chars)
            examples.append({
                "id": f"{package.name}/{rel}:{site.line + 1}", "lang": "python", "repo": package.name,
                "path": f"{package.name}/{rel}", "input": before, "gt": line[site.cut :],
                "cross_file_name": site.name, "defined_in": f"{package.name}/{site.defined_in}",
                "extra": repo_context(package, rel, before),
            })
            if len(examples) == n:
                break
    return examples
