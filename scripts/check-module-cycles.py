#!/usr/bin/env python3
"""No crate of the workspace has an import cycle between its modules.

For every lib and bin target of each workspace member (the lib root, src/main.rs and each
src/bin/*.rs start module trees of their own), module A depends on module B when A names
an item B defines; a cycle of such dependencies between two or more modules fails the
check and is printed, each edge with the file:line places that make it.

From the source text alone, stdlib Python: it replaced cargo-modules, which took ~14 min
to build from source and ~6 min to run (docs/decisions.md). A lexer that knows comments
(nested too), strings (raw, byte, C), chars and lifetimes, so none of them makes an edge;
the module tree; a resolver for `use` and paths.

The tree: `mod x;` (x.rs or x/mod.rs, or `#[path = "..."]`), inline `mod x { ... }`.
What counts as an edge A -> B:
  - a `use` leaf, in nested groups too, naming an item of B or module B itself
    (`use crate::b;`, `use b as arch;`), followed through re-exports to where the item
    is defined: with `pub use child::Y` in m, a user of `crate::m::Y` depends on
    m::child, not on m; m itself depends on m::child (its re-export names it);
  - a path in A's items outside function bodies (field and variant types, signatures,
    impl headers, consts and statics, generic arguments): `crate::b::B`, `super::X`,
    `self::c::Y`, `super::super::Z`, `b::Y` through a child or imported module b, `E::V`
    through an imported enum E. Function bodies are not read, as cargo-modules did not
    read them; an import at the top of a file counts even if only a body uses it;
  - a glob import `use b::*`: an edge to b itself, used or not (so did cargo-modules).
    The importer takes every name b has, b's imports included, so it depends on all of
    them; outside a test module, a child's `use super::*` ties it to its parent. A glob
    of an enum's variants (`use Kind::*`) is an edge to the enum's module. A name found
    through a glob (`crate::m::Y`, with `pub use child::*` in m) resolves to where it is
    defined;
  - a trait impl counts for the module it is written in and for its Self type's module
    (as cargo-modules counted it): trait impls cannot be left out by not importing them,
    so whoever uses the type uses the impl; `impl From<ParseError> for ShoalError` in
    parse.rs makes error -> parse, and with parse -> error a cycle. Bare names count
    there too (the trait, the parameter types), not parameters' names.
What is no edge:
  - "owns": a parent declaring `mod child;` is the tree;
  - anything under `#[cfg(test)]`, `#[test]` or `#[tokio::test]`: test modules (inline,
    `#[cfg(test)] mod tests;` files, `#![cfg(test)]` files) are left out, and so are
    test-only imports, functions and impls; a test module only ever depends on others,
    so it could not close a cycle either;
  - items of one module naming each other (`fn new() -> Self`, two types pointing at
    each other);
  - other crates' names, `::`-paths, `Self::`, generic parameters, macro metavariables;
  - attributes, doc comments (intra-doc links), macro_rules' textual scope.
Every other `#[cfg]` (a target_arch, a feature) is taken: the union of configurations.
A name a module's text does not define (made by a macro, include!) counts for that
module.

Stricter, not run by scripts/test.sh (on 0feb785 each finds cycles cargo-modules missed):
  --bodies          function bodies count too: shoal-daemon tiers <-> tiers::listener,
                    ops <-> ops::restore; shoal-fuse fs <-> fs::{drafts, kernel, op}.
  --inherent-impls  an inherent impl (`impl Ops { ... }` in ops/create.rs) counts for its
                    Self type's module too, as cargo-modules counted it, but it did not
                    see types inside generic arguments (`-> Result<RemoteFound>`) nor
                    type aliases: shoal-daemon ops <-> ops::create, cluster::state <->
                    cluster::remote_get; shoal-tiers engine <-> recover.

Usage: scripts/check-module-cycles.py [--skip CRATE]... [--bodies] [--inherent-impls] [ROOT]
  --skip CRATE  leaves CRATE (a package name) out, said loudly: for a known cycle, until
                it is removed.
  ROOT          the workspace (default: this checkout).
Exit status 1 if there is a cycle, 2 if a declared module has no file or a file does
not lex.
"""

from __future__ import annotations

import argparse
import bisect
import glob
import re
import sys
import tomllib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

PROG = "check-module-cycles"

# One token at a time; alternatives in order, so strings and chars win over the identifiers
# (r, b, br, c) and lifetimes that start them. Block comments and raw strings are handled by
# hand (nesting, matching #s).
TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*)
  | (?P<raw_string>(?:br|cr|r)\#*")
  | (?P<string>(?:b|c)?"(?:[^"\\]|\\.)*")
  | (?P<char>b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F_]{1,8}\}|.)|[^\\'\n])')
  | (?P<lifetime>'(?:r\#)?[^\W\d]\w*)
  | (?P<dollar_crate>\$crate\b)
  | (?P<raw_ident>r\#[^\W\d]\w*)
  | (?P<ident>[^\W\d]\w*)
  | (?P<number>\d\w*(?:\.\d\w*)?)
  | (?P<path_sep>::)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)
OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {")", "]", "}"}
# Item keywords whose following identifier is the name the item defines in its module.
NAMED_ITEMS = {"fn", "struct", "enum", "union", "trait", "type", "const", "static"}
QUALIFIERS = {"unsafe", "extern", "async", "safe", "mut"}
KEYWORDS = NAMED_ITEMS | QUALIFIERS | {
    "as", "break", "continue", "crate", "dyn", "else", "enum", "false", "for", "if", "impl",
    "in", "let", "loop", "match", "mod", "move", "pub", "ref", "return", "self", "Self",
    "super", "true", "use", "where", "while",
}  # fmt: skip


class SourceError(Exception):
    """A file that does not lex, or a declared module without a file."""


@dataclass
class Token:
    kind: str  # "id", "p" (punctuation, `::` one token), "str", "lit" (char, number), "lt"
    text: str
    line: int


def lex(text: str, path: Path) -> tuple[list[Token], dict[int, int]]:
    """The tokens of a Rust file, comments and whitespace left out, and for every bracket
    the index of its partner."""
    newlines = [i for i, c in enumerate(text) if c == "\n"]
    tokens: list[Token] = []
    pos = 0
    if text.startswith("#!") and not text.startswith("#!["):  # a shebang line
        pos = text.find("\n") if "\n" in text else len(text)
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if m is None:  # cannot happen: `punct` takes any character
            raise SourceError(f"{path}: cannot lex at offset {pos}")
        kind = m.lastgroup
        line = bisect.bisect_right(newlines, pos - 1) + 1
        end = m.end()
        if kind == "block_comment":
            end, depth = pos + 2, 1
            while depth:
                nxt = min((i for i in (text.find("/*", end), text.find("*/", end)) if i >= 0), default=-1)
                if nxt < 0:
                    raise SourceError(f"{path}:{line}: unterminated block comment")
                depth += 1 if text.startswith("/*", nxt) else -1
                end = nxt + 2
        elif kind == "raw_string":
            hashes = m.group().count("#")
            close = text.find('"' + "#" * hashes, end)
            if close < 0:
                raise SourceError(f"{path}:{line}: unterminated raw string")
            tokens.append(Token("str", text[end:close], line))
            end = close + 1 + hashes
        elif kind == "string":
            body = m.group()
            tokens.append(Token("str", body[body.index('"') + 1 : -1], line))
        elif kind in ("char", "number"):
            tokens.append(Token("lit", m.group(), line))
        elif kind == "lifetime":
            tokens.append(Token("lt", m.group(), line))
        elif kind in ("ident", "dollar_crate"):
            tokens.append(Token("id", m.group(), line))
        elif kind == "raw_ident":
            tokens.append(Token("id", m.group()[2:], line))
        elif kind in ("path_sep", "punct"):
            tokens.append(Token("p", m.group(), line))
        pos = end
    partner: dict[int, int] = {}
    stack: list[int] = []
    for i, tok in enumerate(tokens):
        if tok.kind != "p":
            continue
        if tok.text in OPENERS:
            stack.append(i)
        elif tok.text in CLOSERS:
            if not stack or OPENERS[tokens[stack[-1]].text] != tok.text:
                raise SourceError(f"{path}:{tok.line}: unbalanced {tok.text!r}")
            opener = stack.pop()
            partner[opener], partner[i] = i, opener
    if stack:
        raise SourceError(f"{path}:{tokens[stack[-1]].line}: unclosed {tokens[stack[-1]].text!r}")
    return tokens, partner


@dataclass
class Ref:
    """A path a module's code names: a `use` leaf, a glob import or a path in code."""

    segments: tuple[str, ...]
    file: Path
    line: int
    single: bool = False  # a bare name in an impl: counts only if it names an item


@dataclass
class Module:
    name: str
    parent: Module | None
    file: Path
    child_dir: Path  # where its `mod x;` children's files are
    children: dict[str, Module] = field(default_factory=dict)
    items: set[str] = field(default_factory=set)
    imports: dict[str, tuple[str, ...]] = field(default_factory=dict)
    globs: list[tuple[str, ...]] = field(default_factory=list)
    refs: list[Ref] = field(default_factory=list)
    impls: list[Impl] = field(default_factory=list)


@dataclass
class Impl:
    """A trait impl (or, with --inherent-impls, any impl) written in a module: its Self
    type's path, and the refs of its header and signatures, which count for the Self
    type's module too."""

    self_type: tuple[str, ...]
    refs: list[Ref]


def is_test_only(attr: list[Token]) -> bool:
    """Whether an attribute's tokens (inside `#[...]`) compile its item only for tests:
    `test`, `tokio::test` and the like, or a `cfg` that needs `test`."""
    words = [t.text for t in attr]
    if words[:2] == ["cfg", "("]:
        return cfg_needs_test(attr, 2)[0]
    head = []
    for t in attr:  # the attribute's path: test, tokio::test, ...
        if t.kind == "id" or t.text == "::":
            head.append(t.text)
        else:
            break
    return bool(head) and head[-1] in ("test", "bench")


def cfg_needs_test(attr: list[Token], i: int) -> tuple[bool, int]:
    """Whether the cfg predicate at attr[i] holds only when `test` does, and the index
    after it."""
    name = attr[i].text
    i += 1
    if i < len(attr) and attr[i].text == "=":
        return False, i + 2
    if i < len(attr) and attr[i].text == "(":
        needs = []
        i += 1
        while attr[i].text != ")":
            need, i = cfg_needs_test(attr, i)
            needs.append(need)
            if attr[i].text == ",":
                i += 1
        i += 1
        if name == "all":
            return any(needs), i
        if name == "any":
            return bool(needs) and all(needs), i
        return False, i  # not(...)
    return name == "test", i


def path_attr(attr: list[Token]) -> str | None:
    if len(attr) == 3 and attr[0].text == "path" and attr[1].text == "=" and attr[2].kind == "str":
        return attr[2].text
    return None


class CrateParser:
    """Reads one target's module tree and each module's names, imports and paths."""

    def __init__(self, root_file: Path, crate_name: str, bodies: bool, inherent_impls: bool):
        self.bodies = bodies
        self.inherent_impls = inherent_impls
        self.root = Module(crate_name, None, root_file, root_file.parent)
        self.modules = [self.root]
        self.parse_file(self.root)

    # -- files and module bodies

    def parse_file(self, module: Module) -> bool:
        """Parses a file module; False if the file is for tests only (`#![cfg(test)]`)."""
        try:
            text = module.file.read_text()
        except OSError as e:
            raise SourceError(f"{module.file}: {e.strerror} (module {module.name})") from e
        self.tokens, self.partner = lex(text, module.file)
        return self.parse_body(module, 0, len(self.tokens))

    def attribute(self, i: int) -> tuple[int, bool, list[Token]] | None:
        """The attribute at i, if one starts there: (index after it, inner?, its tokens)."""
        toks = self.tokens
        if toks[i].text != "#" or i + 1 >= len(toks):
            return None
        inner = toks[i + 1].text == "!"
        bracket = i + 2 if inner else i + 1
        if bracket >= len(toks) or toks[bracket].text != "[":
            return None
        close = self.partner[bracket]
        return close + 1, inner, toks[bracket + 1 : close]

    def parse_body(self, module: Module, i: int, end: int) -> bool:
        """The items of a module body, tokens [i, end); False if an inner attribute makes
        the whole module test-only."""
        toks = self.tokens
        while i < end:
            attrs = []
            while i < end and (found := self.attribute(i)):
                i, inner, attr = found
                if inner:
                    if is_test_only(attr):
                        return False
                else:
                    attrs.append(attr)
            if i >= end:
                break
            if any(is_test_only(a) for a in attrs):
                i = self.item_end(i, end)
                continue
            j = self.skip_visibility(i)
            word = toks[j].text
            if word == "mod" and toks[j + 1].kind == "id" and toks[j + 2].text in (";", "{"):
                i = self.parse_mod(module, j, attrs)
                continue
            if word == "use":
                i = self.parse_use(module, j)
                continue
            item_end = self.item_end(i, end)
            module.items.update(self.item_names(j, item_end))
            first_ref = len(module.refs)
            self_type, is_trait = self.impl_self_type(j, item_end)
            counts_for_type = self_type is not None and (is_trait or self.inherent_impls)
            # In such an impl bare names count too: the Self type's module gets what they name.
            self.scan_code(module, j, item_end, singles=counts_for_type)
            if counts_for_type:
                module.impls.append(Impl(self_type, module.refs[first_ref:]))
            i = item_end
        return True

    def skip_visibility(self, i: int) -> int:
        if self.tokens[i].text == "pub":
            i += 1
            if self.tokens[i].text == "(":  # pub(crate), pub(in crate::a): not a dependency
                i = self.partner[i] + 1
        return i

    def item_end(self, i: int, end: int) -> int:
        """The index after the item or statement starting at i: after its `;`, or after
        its body's `}` (fn, struct, impl, mod, ...)."""
        toks = self.tokens
        words = []
        k = self.skip_visibility(i)
        while k < end and toks[k].text not in ("{", ";", "=", "(") and len(words) < 6:
            words.append(toks[k].text)
            k += 1
        to_semicolon = "fn" not in words and bool(
            {"use", "const", "static", "type", "let"} & set(words) or words[:2] == ["extern", "crate"]
        )
        k = i
        while k < end:
            text = toks[k].text
            if text == ";":
                return k + 1
            if text in OPENERS:
                close = self.partner[k]
                if text == "{" and not to_semicolon:
                    return close + 1
                k = close
            k += 1
        return end

    def item_names(self, j: int, end: int) -> list[str]:
        """The names an item defines in its module (fn, struct, macro_rules!, the items of
        an extern block)."""
        toks = self.tokens
        if toks[j].text == "macro_rules" and j + 2 < end and toks[j + 1].text == "!":
            return [toks[j + 2].text]
        k = j
        while k < end and toks[k].text not in ("{", ";", "=", "(", "<", ":"):
            if toks[k].text in NAMED_ITEMS and k + 1 < end and toks[k + 1].kind == "id":
                name = k + 2 if toks[k + 1].text == "mut" else k + 1  # static mut X
                if toks[name].text not in NAMED_ITEMS | QUALIFIERS:  # const fn, unsafe fn: on to fn
                    return [toks[name].text]
            k += 1
        if toks[j].text == "extern" and k < end and toks[k].text == "{":  # extern "C" { fn f(); }
            body = range(k + 1, self.partner[k])
            return [
                toks[n + 1].text
                for n in body
                if toks[n].text in ("fn", "static") and toks[n + 1].kind == "id"
            ]
        return []

    def impl_self_type(self, j: int, end: int) -> tuple[tuple[str, ...] | None, bool]:
        """For an `impl` at j, the path of its Self type (`Foo` in `impl<T> Tr for &Foo<T>`),
        and whether it is a trait's impl."""
        toks = self.tokens
        k = j + 1 if toks[j].text == "unsafe" else j
        if toks[k].text != "impl":
            return None, False
        k += 1
        if toks[k].text == "<":  # impl<...>
            k = self.angle_end(k, end)
        start, depth, is_trait = k, 0, False
        while k < end and toks[k].text not in ("{", ";", "where"):
            text = toks[k].text
            if text == "-" and toks[k + 1].text == ">":  # Fn() -> T: no bracket
                k += 1
            elif text in ("<", ">"):
                depth += 1 if text == "<" else -1
            elif text == "for" and depth == 0 and toks[k + 1].text != "<":  # not for<'a>
                start, is_trait = k + 1, True
            k += 1
        while start < k and (toks[start].kind != "id" or toks[start].text in ("mut", "dyn", "const")):
            start += 1  # &, &'a mut, dyn, (, [
        segments = []
        while start < k and toks[start].kind == "id":
            segments.append(toks[start].text)
            if toks[start + 1].text != "::":
                break
            start += 2
        return tuple(segments) or None, is_trait

    def angle_end(self, k: int, end: int) -> int:
        """The index after the `>` closing the `<` at k."""
        toks = self.tokens
        depth = 0
        while k < end:
            text = toks[k].text
            if text == "-" and toks[k + 1].text == ">":
                k += 1
            elif text == "<":
                depth += 1
            elif text == ">":
                depth -= 1
                if depth == 0:
                    return k + 1
            k += 1
        return end

    def parse_mod(self, module: Module, j: int, attrs: list[list[Token]]) -> int:
        toks = self.tokens
        name = toks[j + 1].text
        explicit = next((p for a in attrs if (p := path_attr(a)) is not None), None)
        child_name = f"{module.name}::{name}"
        if toks[j + 2].text == "{":
            close = self.partner[j + 2]
            child_dir = module.child_dir / (explicit if explicit is not None else name)
            child = Module(child_name, module, module.file, child_dir)
            if self.parse_body(child, j + 3, close):
                module.children[name] = child
                self.modules.append(child)
            return close + 1
        if explicit is not None:
            # Outside an inline module, #[path] is relative to the declaring file's directory;
            # inside one, to the directory its children would have.
            file = (module.child_dir if self.is_inline(module) else module.file.parent) / explicit
            child_dir = file.parent  # a #[path] file is a mod-rs file: its children sit beside it
        else:
            file = module.child_dir / f"{name}.rs"
            child_dir = module.child_dir / name
            if not file.is_file() and (module.child_dir / name / "mod.rs").is_file():
                file = module.child_dir / name / "mod.rs"
        if not file.is_file():
            raise SourceError(f"{module.file}:{toks[j].line}: `mod {name};` has no file {file}")
        child = Module(child_name, module, file, child_dir)
        saved = self.tokens, self.partner
        if self.parse_file(child):
            module.children[name] = child
            self.modules.append(child)
        self.tokens, self.partner = saved
        return j + 3

    def is_inline(self, module: Module) -> bool:
        return module.parent is not None and module.parent.file == module.file

    # -- use trees and paths

    def parse_use(self, module: Module, j: int) -> int:
        """A `use` declaration at j: each leaf is a ref (an edge to be), and a name bound
        in the module (a glob, a source of names)."""
        toks = self.tokens

        def tree(k: int, prefix: tuple[str, ...]) -> int:
            segments = prefix
            if toks[k].text == "::":  # ::name: another crate
                segments, k = ("::",), k + 1
            while True:
                tok = toks[k]
                if tok.text == "*":
                    module.globs.append(segments)
                    module.refs.append(Ref(segments, module.file, tok.line))
                    return k + 1
                if tok.text == "{":
                    close = self.partner[k]
                    k += 1
                    while k < close:
                        k = tree(k, segments)
                        if toks[k].text == ",":
                            k += 1
                    return close + 1
                if tok.kind != "id":  # `$x` in a macro's body: not a path to follow
                    return k
                segments += (tok.text,)
                k += 1
                if toks[k].text == "::":
                    k += 1
                    continue
                binding = segments[-1]
                if binding == "self":  # a::{self}: a itself
                    segments = segments[:-1]
                    binding = segments[-1] if segments else "self"
                if toks[k].text == "as":
                    binding = toks[k + 1].text
                    k += 2
                if binding != "_":
                    module.imports.setdefault(binding, segments)
                module.refs.append(Ref(segments, module.file, tok.line))
                return k

        k = tree(j + 1, ())
        while k < len(toks) and toks[k].text != ";":  # only after a `$x` in a macro's body
            k = self.partner[k] + 1 if toks[k].text in OPENERS else k + 1
        return k + 1

    def scan_code(self, module: Module, i: int, end: int, singles: bool = False) -> None:
        """The paths named in the code at [i, end), skipping test-only statements and
        items, attributes and visibilities, and taking nested `use`s; with `singles`, bare
        names too (not a parameter's, a fn's or a field's)."""
        toks = self.tokens
        k = i
        while k < end:
            tok = toks[k]
            if tok.text == "#" and (found := self.attribute(k)):
                test_only = False
                while k < end and (found := self.attribute(k)):
                    k, _, attr = found
                    test_only = test_only or is_test_only(attr)
                if test_only:
                    k = self.item_end(k, end)
                continue
            if tok.kind != "id":
                k += 1
                continue
            before = toks[k - 1].text if k > 0 else ""
            if tok.text == "fn" and not self.bodies and toks[k + 1].kind == "id":
                # The signature counts, the body does not (cargo-modules' view).
                body = k + 2
                while body < end and toks[body].text not in ("{", ";"):
                    body = self.partner[body] + 1 if toks[body].text in ("(", "[") else body + 1
                self.scan_code(module, k + 2, body, singles)
                k = self.partner[body] + 1 if body < end and toks[body].text == "{" else body + 1
            elif tok.text == "pub" and toks[k + 1].text == "(":
                k = self.partner[k + 1] + 1
            elif tok.text == "use" and before != ".":
                k = self.parse_use(module, k)
            elif before in (".", "::", "$"):  # a field or method, a path's tail, a macro variable
                k += 1
            else:
                segments = [tok.text]
                k += 1
                while k + 1 < end and toks[k].text == "::" and toks[k + 1].kind == "id":
                    segments.append(toks[k + 1].text)
                    k += 2
                if len(segments) > 1:
                    module.refs.append(Ref(tuple(segments), module.file, tok.line))
                elif singles and tok.text not in KEYWORDS and before != "fn" and toks[k].text != ":":
                    module.refs.append(Ref(tuple(segments), module.file, tok.line, single=True))


@dataclass(frozen=True)
class Target:
    """What a path names: a module, or an item of a module."""

    module: Module
    is_module: bool


class Resolver:
    def __init__(self, root: Module):
        self.root = root
        self.active: set[tuple[int, str]] = set()

    def resolve(self, ctx: Module, segments: tuple[str, ...]) -> Target | None:
        """What a path written in module ctx names, re-exports followed to the defining
        module; None for another crate's names and for names not in scope (locals,
        generics, Self)."""
        head, rest = segments[0], list(segments[1:])
        if head in ("crate", "$crate"):
            target = Target(self.root, True)
        elif head == "self":
            target = Target(ctx, True)
        elif head == "super":
            module = ctx.parent
            while rest and rest[0] == "super" and module is not None:
                module, rest = module.parent, rest[1:]
            if module is None:
                return None
            target = Target(module, True)
        elif head == "::":
            return None
        else:
            found = self.lookup(ctx, head)
            if found is None:
                return None
            target = found
        for name in rest:
            if not target.is_module:
                break  # an item's variant or associated item: the item's module
            found = self.lookup(target.module, name)
            # A name the module's text does not define (from a macro, include!): its module.
            target = found if found is not None else Target(target.module, False)
        return target

    def lookup(self, module: Module, name: str) -> Target | None:
        """Name `name` in module's scope: its child modules, its items, its imports, then
        its globs."""
        if name in module.children:
            return Target(module.children[name], True)
        if name in module.items:
            return Target(module, False)
        key = (id(module), name)
        if key in self.active:  # imports naming each other in a circle: nothing found
            return None
        self.active.add(key)
        try:
            if name in module.imports:
                return self.resolve(module, module.imports[name])
            for pattern in module.globs:
                source = self.resolve(module, pattern)
                if source is not None and source.is_module and source.module is not module:
                    found = self.lookup(source.module, name)
                    if found is not None:
                        return found
            return None
        finally:
            self.active.discard(key)


@dataclass
class CrateTarget:
    package: str
    kind: str  # lib or bin
    name: str
    root_file: Path


def workspace_targets(root: Path) -> list[CrateTarget]:
    """The lib and bin targets of the workspace's members, as Cargo finds them."""
    manifest = tomllib.loads((root / "Cargo.toml").read_text())
    members = []
    for pattern in manifest.get("workspace", {}).get("members", ["."]):
        members += sorted(
            Path(p) for p in glob.glob(str(root / pattern)) if (Path(p) / "Cargo.toml").is_file()
        )
    targets = []
    for member in members:
        package = tomllib.loads((member / "Cargo.toml").read_text())
        name = package["package"]["name"]
        lib = package.get("lib")
        lib_path = member / (lib or {}).get("path", "src/lib.rs")
        if lib is not None or lib_path.is_file():
            lib_name = (lib or {}).get("name", name.replace("-", "_"))
            targets.append(CrateTarget(name, "lib", lib_name, lib_path))
        bins: dict[str, Path] = {}
        for entry in package.get("bin", []):
            default = "src/main.rs" if entry["name"] == name else f"src/bin/{entry['name']}.rs"
            bins[entry["name"]] = member / entry.get("path", default)
        if package["package"].get("autobins", True):
            found = [(name, member / "src/main.rs")] if (member / "src/main.rs").is_file() else []
            found += [(p.stem, p) for p in sorted((member / "src/bin").glob("*.rs"))]
            found += [(p.parent.name, p) for p in sorted((member / "src/bin").glob("*/main.rs"))]
            for bin_name, path in found:  # Cargo adds a found bin unless one is declared by that name or file
                if bin_name not in bins and path not in bins.values():
                    bins[bin_name] = path
        targets += [CrateTarget(name, "bin", b, path) for b, path in bins.items()]
    return targets


@dataclass
class Graph:
    edges: dict[str, dict[str, list[tuple[Path, int]]]]  # from -> to -> the lines making it


def module_graph(target: CrateTarget, bodies: bool = False, inherent_impls: bool = False) -> Graph:
    crate = CrateParser(target.root_file, target.name.replace("-", "_"), bodies, inherent_impls)
    resolver = Resolver(crate.root)
    edges: dict[str, dict[str, list[tuple[Path, int]]]] = {m.name: {} for m in crate.modules}

    def add(source: Module, ref: Ref, written_in: Module) -> None:
        found = resolver.resolve(written_in, ref.segments)
        if ref.single and (found is None or found.is_module):
            return
        if found is not None and found.module is not source:
            sites = edges[source.name].setdefault(found.module.name, [])
            if (ref.file, ref.line) not in sites:  # `use b::{X, Y};` is one place
                sites.append((ref.file, ref.line))

    for module in crate.modules:
        for ref in module.refs:
            add(module, ref, module)
        for impl in module.impls:
            owner = resolver.resolve(module, impl.self_type)
            if owner is not None and not owner.is_module and owner.module is not module:
                for ref in impl.refs:
                    add(owner.module, ref, module)
    return Graph(edges)


def strong_components(edges: dict[str, dict[str, list]]) -> list[list[str]]:
    """Tarjan's, without recursion: the sets of two or more modules that reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def shortest_loop(edges: dict[str, dict[str, list]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, for the report."""
    inside = set(component)
    start = component[0]
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges[node]):
            if nxt not in inside:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    return component


def report(target: CrateTarget, graph: Graph, components: list[list[str]], root: Path) -> None:
    def where(file: Path, line: int) -> str:
        try:
            file = file.relative_to(root)
        except ValueError:
            pass
        return f"{file}:{line}"

    out = sys.stderr
    print(f"{PROG}: {target.package} ({target.kind} {target.name}): import cycle between modules:", file=out)
    for component in components:
        print(f"  modules: {', '.join(component)}", file=out)
        print(f"  a loop: {' -> '.join(shortest_loop(graph.edges, component))}", file=out)
        print("  its edges, each with the lines that make it:", file=out)
        inside = set(component)
        for source in component:
            for dest, sites in sorted(graph.edges[source].items()):
                if dest in inside:
                    shown = ", ".join(where(f, n) for f, n in sites[:4])
                    more = f" and {len(sites) - 4} more" if len(sites) > 4 else ""
                    print(f"    {source} -> {dest}: {shown}{more}", file=out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--skip", action="append", default=[], metavar="CRATE", help="leave a package out (a known cycle)"
    )
    parser.add_argument("--bodies", action="store_true", help="function bodies count too")
    parser.add_argument(
        "--inherent-impls", action="store_true", help="an inherent impl counts for its Self type's module too"
    )
    parser.add_argument(
        "root", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent, help="the workspace"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    failed = False
    try:
        targets = workspace_targets(root)
        for target in targets:
            if target.package in args.skip:
                print(f"{PROG}: SKIPPED {target.package} (--skip: a known cycle, not checked)")
                continue
            graph = module_graph(target, args.bodies, args.inherent_impls)
            components = strong_components(graph.edges)
            if components:
                failed = True
                report(target, graph, components, root)
            else:
                print(f"{PROG}: {target.package} ({target.kind} {target.name}): no cycle")
    except SourceError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
