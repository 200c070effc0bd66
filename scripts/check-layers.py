#!/usr/bin/env python3
"""Check the import structure of src/: no circles between files, and no folder importing a
folder above it in the declared order (docs/architecture.md, "Module map").

    scripts/check-layers.py            # check; exits 1 listing each cycle and each upward import
    scripts/check-layers.py --graph    # also print every file-level edge (importer -> imported)
    scripts/check-layers.py --src DIR  # check another source tree (the checker's own tests)

Every `use` tree (`use crate::a::{b, c::d}`, `use super::x`, `pub use ...`) and every inline path
(`crate::a::b::f()`, `super::super::T`, `kiln::x` in the binary) of src/**/*.rs is resolved to
the file that defines the named item: the longest module prefix of the path, then the item in
that module, followed through `pub use` re-exports (named, renamed and glob) to the file that
defines it, so `use crate::kernels::Foo` where kernels/mod.rs re-exports `ops::Foo` counts as an
import of kernels/ops.rs. Names brought in by `use crate::a::module;` resolve the same way when
the file later writes `module::item`. A module declaration (`mod x;`) is not an import.

Two checks:
(a) a cycle among files, once each file's imports of its own ancestors (a submodule naming
    `super::T` of the mod.rs it lives under) are set aside: a parent module and its children
    may use each other, siblings and strangers may not (`kernels/ops.rs` and
    `kernels/f16ops/mod.rs`, `backend/mod.rs` and `model/forward.rs`). KNOWN_CYCLE_EDGES lists
    the imports that close a cycle and are not yet untangled.
(b) an import from a folder to a folder above it in LAYERS (a path's layer is that of its
    longest prefix listed there, so `model/forward` sits above `backend` and `model` below).

Edges from test code (`#[cfg(test)]` modules and functions, inline or in their own file) are
left out: a test beside the code may reach upward for its fixtures.
"""
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = Path(sys.argv[sys.argv.index("--src") + 1]).resolve() if "--src" in sys.argv else ROOT / "src"

# The folder order, bottom to top (docs/architecture.md, "Module map"). A folder may import its
# own layer and any layer below; never one above. A path is matched by its longest prefix here.
LAYERS = [
    # the environment's settings (KILN_*), read by every layer
    ["tuning"],
    # the file format and the block formats (with their SIMD dot-product kernels)
    ["gguf", "quant"],
    # files: getting models (and the GPU's runtime compiler), making the test models
    ["fetch", "fixtures"],
    # text and tokens: vocabularies, chat templates, structured output, sampling
    ["tokenizer", "grammar", "sampler"],
    # the compute kernels and the op vocabulary (activation, RoPE kind, KV element type)
    ["kernels"],
    # hyper-parameters, weights and the architectures' differences
    ["model"],
    # the KV cache and the scratch buffers, sized from the model's hyper-parameters
    ["cache"],
    # the Backend seam and its devices (CPU, CUDA)
    ["backend"],
    # the forward pass, written once over the seam; the executors that drive it on each
    # device, and the choice of one
    ["model/forward", "backend/cpu/exec", "backend/cuda/exec", "backend/vulkan/exec", "backend/open"],
    # sessions, generation, the batching scheduler
    ["engine"],
    # the HTTP server
    ["server"],
    # the command line (the binary crate)
    ["cli"],
]


# Imports that close a cycle, known and not yet untangled: the cycle check runs without them,
# and fails on an entry that no longer closes a cycle (so the list can only shrink).
KNOWN_CYCLE_EDGES = {
    # A connection's I/O reports its byte counts to the connection state that owns it.
    ("server/io.rs", "server/conn.rs"),
}


def strip(text):
    """Comments, string and char literals blanked (kept as spaces so offsets stay put)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 20]) and not (
            i and (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)  # a lifetime
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Module:
    def __init__(self, path, file, crate, parent, test):
        self.path = path  # tuple of segments below the crate root
        self.file = file  # Path of the file that holds it
        self.crate = crate  # "lib" or "bin"
        self.parent = parent
        self.test = test
        self.children = {}
        self.items = set()  # names defined here (fn, struct, ... and child modules)
        self.reexports = []  # (name or "*", absolute target path tuple, crate)
        self.uses = []  # (local name, absolute path tuple, crate): names a `use` binds
        self.refs = []  # (absolute path tuple, crate, test): every path this module names


ITEM = re.compile(
    r"\b(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+([A-Za-z_][A-Za-z0-9_]*)"
)
MOD_DECL = re.compile(
    r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*([;{])"
)
USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]*);")
PATH = re.compile(
    r"(?<![A-Za-z0-9_:])((?:crate|super|self|kiln)(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)"
)


def matching_brace(text, i):
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


def split_top(s):
    parts, depth, cur = [], 0, ""
    for c in s:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def use_leaves(tree, prefix=()):
    """(path segments, bound name) for each leaf of a use tree; name "*" for a glob."""
    tree = re.sub(r"\s+", " ", tree).strip()
    if tree.startswith("::"):
        tree = tree[2:]
    m = re.match(r"^(.*?)\{(.*)\}$", tree, re.S)
    if m:
        head = [s.strip() for s in m.group(1).split("::") if s.strip()]
        for part in split_top(m.group(2)):
            yield from use_leaves(part, prefix + tuple(head))
        return
    alias = None
    am = re.match(r"^(.*)\s+as\s+([A-Za-z_][A-Za-z0-9_]*)$", tree)
    if am:
        tree, alias = am.group(1), am.group(2)
    segs = tuple(s.strip() for s in tree.split("::") if s.strip())
    full = prefix + segs
    if not full:
        return
    if full[-1] == "self":
        full = full[:-1]
    if full[-1] == "*":
        yield full[:-1], "*"
    else:
        yield full, alias or full[-1]


class Tree:
    def __init__(self):
        self.mods = {}  # (crate, path) -> Module
        self.errors = []

    def load(self, crate, root_file):
        root = Module((), root_file, crate, None, False)
        self.mods[(crate, ())] = root
        self.parse_file(root, root_file, root_file.parent)

    def parse_file(self, mod, file, child_dir):
        text = strip(file.read_text())
        self.parse_body(mod, file, text, child_dir)

    def parse_body(self, mod, file, text, child_dir):
        # inline modules first: cut them out of the text, parse them as their own modules
        pos, rest = 0, []
        for m in MOD_DECL.finditer(text):
            if m.start() < pos:
                continue
            attrs, name, end = m.group(1), m.group(2), m.group(3)
            test = mod.test or "cfg(test)" in attrs.replace(" ", "")
            child_path = mod.path + (name,)
            mod.items.add(name)
            if end == ";":
                pm = re.search(r'path\s*=\s*"([^"]*)"', attrs)
                raw = file.read_text()
                if pm is None:
                    # attribute strings were blanked; read the original text at the same spot
                    pm = re.search(r'path\s*=\s*"([^"]*)"', raw[m.start():m.end()])
                if pm:
                    cfile = file.parent / pm.group(1)
                    cdir = cfile.parent / cfile.stem
                elif (child_dir / (name + ".rs")).exists():
                    cfile = child_dir / (name + ".rs")
                    cdir = child_dir / name
                else:
                    cfile = child_dir / name / "mod.rs"
                    cdir = child_dir / name
                child = Module(child_path, cfile, mod.crate, mod, test)
                mod.children[name] = child
                self.mods[(mod.crate, child_path)] = child
                self.parse_file(child, cfile, cdir)
                rest.append(text[pos:m.end()])
                pos = m.end()
            else:
                close = matching_brace(text, m.end() - 1)
                child = Module(child_path, file, mod.crate, mod, test)
                mod.children[name] = child
                self.mods[(mod.crate, child_path)] = child
                self.parse_body(child, file, text[m.end():close], child_dir / name)
                rest.append(text[pos:m.start()])
                pos = close + 1
        rest.append(text[pos:])
        own = "".join(rest)
        mod.items.update(ITEM.findall(own))
        test_spans = []
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub\s+)?(?:fn|impl)\b[^{;]*\{", own):
            test_spans.append((m.start(), matching_brace(own, m.end() - 1)))

        def in_test(i):
            return mod.test or any(a <= i <= b for a, b in test_spans)

        for m in USE.finditer(own):
            public = m.group(1) is not None
            for segs, name in use_leaves(m.group(2)):
                ab = self.absolute(mod, segs)
                if ab is None:
                    continue
                crate, path = ab
                mod.refs.append((path, crate, in_test(m.start())))
                if name != "*":
                    mod.uses.append((name, path, crate))
                elif public:
                    mod.reexports.append(("*", path, crate))
                if public and name != "*":
                    mod.reexports.append((name, path, crate))
                    mod.items.add(name)
        no_use = USE.sub(lambda m: " " * len(m.group(0)), own)
        no_use = re.sub(r"pub\s*\(\s*in\s[^)]*\)", lambda m: " " * len(m.group(0)), no_use)
        for m in PATH.finditer(no_use):
            segs = tuple(s.strip() for s in m.group(1).split("::"))
            ab = self.absolute(mod, segs)
            if ab:
                mod.refs.append((ab[1], ab[0], in_test(m.start())))
        # paths through a module a `use` bound: `use crate::engine; ... engine::session::X`
        mod.raw_text = no_use

    def absolute(self, mod, segs):
        """(crate, absolute path) of a path written in `mod`, or None for an external one."""
        if not segs:
            return None
        head = segs[0]
        if head == "crate":
            return mod.crate, tuple(segs[1:])
        if head == "kiln":
            return "lib", tuple(segs[1:])
        if head in ("self", "super"):
            base = mod.path
            rest = list(segs)
            if rest[0] == "self":
                rest = rest[1:]
            while rest and rest[0] == "super":
                base = base[:-1]
                rest = rest[1:]
            return mod.crate, base + tuple(rest)
        if head in mod.children:
            return mod.crate, mod.path + tuple(segs)
        return None

    def resolve(self, crate, path, seen=None):
        """(the Module that defines the item `path` names, following re-exports, and whether
        the path names an item in it rather than the module itself)."""
        seen = seen or set()
        if (crate, path) in seen:
            return None, False
        seen.add((crate, path))
        # the longest prefix that is a module
        k = len(path)
        while k >= 0 and (crate, path[:k]) not in self.mods:
            k -= 1
        if k < 0:
            return None, False
        mod = self.mods[(crate, path[:k])]
        if k == len(path):
            return mod, False
        name = path[k]
        for rname, target, tcrate in mod.reexports:
            if rname == name:
                got = self.resolve(tcrate, target + path[k + 1:], seen)
                if got[0] is not None:
                    return got
        if name in mod.items:
            return mod, True
        for rname, target, tcrate in mod.reexports:
            if rname == "*":
                got = self.resolve(tcrate, target + (name,) + path[k + 1:], seen)
                if got[0] is not None and got[1]:
                    return got
        return mod, True

    def edges(self):
        out = defaultdict(set)  # file -> {file}
        for mod in list(self.mods.values()):
            refs = list(mod.refs)
            # later uses of a name a `use` bound to a module: `use crate::engine;` then
            # `engine::session::Session` is an import of engine/session.rs
            for name, path, crate in mod.uses:
                target, item = self.resolve(crate, path)
                if target is None or item:
                    continue
                pat = r"(?<![A-Za-z0-9_:])" + re.escape(name) + r"((?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)"
                for m in re.finditer(pat, mod.raw_text):
                    segs = tuple(s.strip() for s in m.group(1).split("::") if s.strip())
                    refs.append((target.path + segs, target.crate, mod.test))
            for path, crate, test in refs:
                if test:
                    continue
                got, item = self.resolve(crate, path)
                # a path that names a module itself is no import: what it names there is
                if got is None or not item or got.test or got.file == mod.file:
                    continue
                out[mod.file].add(got.file)
        return out


def rel(p):
    return p.relative_to(SRC).as_posix()


def layer_of(f):
    r = rel(f)[:-3]
    if r.endswith("/mod"):
        r = r[:-4]
    best, idx = "", None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (r == name or r.startswith(name + "/")) and len(name) > len(best):
                best, idx = name, i
    return idx, best


def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    tree = Tree()
    tree.load("lib", SRC / "lib.rs")
    if (SRC / "main.rs").exists():
        tree.load("bin", SRC / "main.rs")
    graph = tree.edges()
    files = {m.file for m in tree.mods.values()}
    for f in files:
        graph.setdefault(f, set())
    if "--graph" in sys.argv:
        for f in sorted(graph):
            for g in sorted(graph[f]):
                print(f"{rel(f)} -> {rel(g)}")
    bad = []
    # (a) cycles: strongly connected components once a module's imports of its own ancestors
    # (`super::T`, the folder's mod.rs it lives under) are set aside
    modpath = {}
    for m in tree.mods.values():
        if m.file not in modpath or len(m.path) < len(modpath[m.file][1]):
            modpath[m.file] = (m.crate, m.path)
    def ancestor(a, b):
        (ca, pa), (cb, pb) = modpath[a], modpath[b]
        return ca == cb and len(pb) < len(pa) and pa[: len(pb)] == pb
    sideways = {f: {g for g in graph[f] if not ancestor(f, g)} for f in graph}
    on_cycle = set()
    for comp in sccs(sideways):
        on_cycle.update((rel(a), rel(b)) for a in comp for b in sideways[a] if b in comp)
    known = KNOWN_CYCLE_EDGES if SRC == ROOT / "src" else set()
    for a, b in sorted(known - on_cycle):
        bad.append(f"{a} -> {b} no longer closes a cycle: drop it from KNOWN_CYCLE_EDGES")
    allowed = {(SRC / a, SRC / b) for a, b in known}
    sideways = {f: {g for g in gs if (f, g) not in allowed} for f, gs in sideways.items()}
    for comp in sccs(sideways):
        if len(comp) < 2:
            continue
        files = ", ".join(sorted(rel(f) for f in comp))
        inner = sorted(f"{rel(a)} -> {rel(b)}" for a in comp for b in sideways[a] if b in comp)
        bad.append(f"cycle: {files}\n    " + "\n    ".join(inner))
    # (b) imports against the layer order
    for f in sorted(graph):
        if f in (SRC / "lib.rs", SRC / "main.rs"):
            continue  # the crate roots declare the modules, above every layer
        lf, nf = layer_of(f)
        if lf is None:
            bad.append(f"{rel(f)}: in no layer (add its folder to LAYERS)")
            continue
        for g in sorted(graph[f]):
            lg, ng = layer_of(g)
            if lg is not None and lg > lf:
                bad.append(f"upward import: {rel(f)} ({nf}) -> {rel(g)} ({ng})")
    for b in bad:
        print(b)
    edges = sum(len(v) for v in graph.values())
    print(f"{len(graph)} files, {edges} imports: {len(bad)} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
