#!/usr/bin/env python3
"""Fails when a crate's modules import each other in a cycle.

For every crate given (default: every workspace member with a src/ folder), draws an
arrow from each module to each module it names through `crate::` paths (in `use`
lines and in code), leaving out arrows between a module and its own ancestors (a
folder's `mod.rs` is its face), and reports each strongly connected group of more than
one module.
"""
import pathlib
import re
import sys

PATH = re.compile(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*[A-Za-z_][A-Za-z0-9_]*|\{)")


def module_of(src, file):
    rel = file.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return "::".join(parts)


def crate_paths(text):
    """Every `crate::a::b` path in the text, with `crate::{a::X, b}` groups expanded.

    A `#[cfg(test)]` module at the end of a file is left out: a unit test may reach
    across the crate without making the library's modules depend on each other.
    """
    text = re.split(r"\n#\[cfg\(test\)\]\s*\nmod \w+ \{", text)[0]
    text = re.sub(r"//.*", "", text)
    paths = []
    for m in re.finditer(r"\bcrate::", text):
        rest = text[m.end():]
        if rest.startswith("{"):
            depth, end = 0, 0
            for i, ch in enumerate(rest):
                depth += ch == "{"
                depth -= ch == "}"
                if depth == 0:
                    end = i
                    break
            for item in re.split(r"[,{}\s]+", rest[1:end]):
                if item:
                    paths.append(item)
        else:
            word = re.match(r"(?:[A-Za-z_][A-Za-z0-9_]*::)*[A-Za-z_][A-Za-z0-9_]*", rest)
            if word:
                paths.append(word.group(0))
    return paths


def graph(src):
    files = sorted(src.rglob("*.rs"))
    modules = {module_of(src, f): f for f in files}
    arrows = {}
    for name, file in modules.items():
        targets = set()
        for path in crate_paths(file.read_text()):
            parts = path.split("::")
            while parts and "::".join(parts) not in modules:
                parts.pop()
            target = "::".join(parts)
            if not parts or target == name:
                continue
            related = name.startswith(target + "::") or target.startswith(name + "::")
            if target and not related:
                targets.add(target)
        arrows[name] = targets
    return arrows


def cycles(arrows):
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in arrows.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in list(arrows):
        if v not in index:
            visit(v)
    return found


def main(args):
    root = pathlib.Path(__file__).resolve().parent.parent
    crates = args or sorted(p.parent.name for p in root.glob("*/src"))
    failed = False
    for crate in crates:
        src = root / crate / "src"
        for group in cycles(graph(src)):
            failed = True
            print(f"{crate}: modules in a cycle: {' <-> '.join(group)}")
    if not failed:
        print(f"no module cycles in {len(crates)} crates")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
