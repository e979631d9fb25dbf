"""scripts/check-module-cycles.py on scratch crates: each case of its header, each
fixture that has a cycle must fail (and name it), each that has none must pass."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-module-cycles.py"


def write_crate(root: Path, files: dict[str, str], package: str = "demo", manifest: str = "") -> None:
    """A workspace at root with one member, crates/<package>, holding `files`."""
    (root / "Cargo.toml").write_text('[workspace]\nmembers = ["crates/*"]\n')
    crate = root / "crates" / package
    for name, text in files.items():
        (crate / name).parent.mkdir(parents=True, exist_ok=True)
        (crate / name).write_text(textwrap.dedent(text))
    (crate / "Cargo.toml").write_text(f'[package]\nname = "{package}"\nversion = "0.1.0"\n{manifest}')


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_module_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


CHECK = load_script()


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def check(root: Path, *args: str) -> Result:
    """The script's main, in this process (a fixture a run, fast)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = CHECK.main([*args, str(root)])
    return Result(code, out.getvalue(), err.getvalue())


# name: (the crate's files, the modules of the cycle it has, or None)
CASES: dict[str, tuple[dict[str, str], set[str] | None]] = {
    # Two siblings naming each other's items: a cycle, though A and B never meet.
    "siblings": (
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub struct A;\npub fn f(_: B) {}\n",
            "src/b.rs": "use crate::a::A;\npub struct B;\npub fn g(_: A) {}\n",
        },
        {"demo::a", "demo::b"},
    ),
    # Only one way: no cycle.
    "one_way": (
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub struct A(B);\n",
            "src/b.rs": "pub struct B;\n",
        },
        None,
    ),
    # "Owns" is the tree: a parent declaring its child, the child importing the parent.
    "owns_is_no_edge": (
        {
            "src/lib.rs": "mod m;\n",
            "src/m/mod.rs": "mod child;\npub struct P;\n",
            "src/m/child.rs": "use super::P;\npub struct C(P);\n",
        },
        None,
    ),
    # The child's `use super::P` with the parent naming the child's type in a field.
    "child_parent_field": (
        {
            "src/lib.rs": "mod m;\n",
            "src/m/mod.rs": "mod child;\npub struct P { c: child::C }\n",
            "src/m/child.rs": "use super::P;\npub struct C;\nfn f(_: &P) {}\n",
        },
        {"demo::m", "demo::m::child"},
    ),
    # The same through `crate::` and a signature's return type.
    "child_crate_path_signature": (
        {
            "src/lib.rs": "mod child;\npub struct P;\npub fn make() -> child::C { todo!() }\n",
            "src/child.rs": "pub struct C;\nimpl C { pub fn p(&self) -> crate::P { crate::P } }\n",
        },
        {"demo", "demo::child"},
    ),
    # A re-export in mod.rs of a type whose module implements mod.rs's trait.
    "reexport_of_implementor": (
        {
            "src/lib.rs": "pub mod m;\n",
            "src/m/mod.rs": "mod child;\npub use child::Y;\npub trait Shape {}\n",
            "src/m/child.rs": "use super::Shape;\npub struct Y;\nimpl Shape for Y {}\n",
        },
        {"demo::m", "demo::m::child"},
    ),
    # A user of a re-exported item depends on its defining module, not on the
    # re-exporting one: user -> m::child, m -> user, no cycle.
    "reexport_resolved": (
        {
            "src/lib.rs": "pub mod m;\nmod user;\n",
            "src/m/mod.rs": "mod child;\npub use child::Y;\npub fn uses(_: crate::user::U) {}\n",
            "src/m/child.rs": "pub struct Y;\n",
            "src/user.rs": "use crate::m::Y;\npub struct U(Y);\n",
        },
        None,
    ),
    # ... and through a chain of re-exports and a renaming: the crate root re-exports
    # m's re-export as Z.
    "reexport_chain": (
        {
            "src/lib.rs": "pub mod m;\nmod user;\npub use m::Y as Z;\n",
            "src/m/mod.rs": "mod child;\npub use self::child::Y;\npub fn uses(_: crate::user::U) {}\n",
            "src/m/child.rs": "pub struct Y;\n",
            "src/user.rs": "pub struct U(crate::Z);\n",
        },
        None,
    ),
    # When m defines Y itself, the same user closes a cycle.
    "reexport_control": (
        {
            "src/lib.rs": "pub mod m;\nmod user;\n",
            "src/m/mod.rs": "pub struct Y;\npub fn uses(_: crate::user::U) {}\n",
            "src/user.rs": "use crate::m::Y;\npub struct U(Y);\n",
        },
        {"demo::m", "demo::user"},
    ),
    # A re-exported item reached through a glob re-export (`pub use child::*`).
    "glob_reexport_resolved": (
        {
            "src/lib.rs": "pub mod m;\nmod user;\n",
            "src/m/mod.rs": "mod child;\npub use child::*;\npub fn uses(_: crate::user::U) {}\n",
            "src/m/child.rs": "pub struct Y;\n",
            "src/user.rs": "pub struct U(crate::m::Y);\n",
        },
        None,
    ),
    # Test modules are left out, inline or in a file, and so are test-only items.
    "cfg_test": (
        {
            "src/lib.rs": textwrap.dedent(
                """\
                mod a;
                mod b;
                pub struct Root;
                #[cfg(test)]
                mod tests;
                #[cfg(test)]
                use crate::b::Helper;
                #[cfg(all(test, unix))]
                fn helper() -> a::A { todo!() }
                #[test]
                fn t() { let _ = crate::a::A; }
                """
            ),
            "src/a.rs": textwrap.dedent(
                """\
                use crate::Root;
                pub struct A(Root);
                #[cfg(test)]
                mod tests {
                    use super::*;
                    use crate::b::Helper;
                    fn f(_: Helper) {}
                }
                #[cfg(test)]
                impl crate::b::Helper { fn g(&self) -> A { todo!() } }
                """
            ),
            "src/b.rs": textwrap.dedent(
                """\
                #![allow(dead_code)]
                use crate::a::A;
                pub struct Helper;
                #[cfg(test)]
                fn make() -> A { todo!() }
                """
            ),
            "src/tests.rs": "use super::*;\nuse crate::a::A;\nmod helpers;\n"
            "fn f(_: A, _: Root, _: helpers::H) {}\n",
            "src/tests/helpers.rs": "pub struct H;\nfn g(_: super::Root) {}\n",
        },
        None,
    ),
    # A test module's own children may name each other: all left out. Here the module is
    # test-only by its inner attribute.
    "cfg_test_inner": (
        {
            "src/lib.rs": "mod t;\n",
            "src/t/mod.rs": "#![cfg(test)]\nmod helpers;\npub struct X(helpers::H);\n",
            "src/t/helpers.rs": "pub struct H;\nfn f(_: super::X) {}\n",
        },
        None,
    ),
    # cfg(any(test, unix)) is not test-only: root -> a counts, and a -> root closes a cycle.
    "cfg_any_test_counts": (
        {
            "src/lib.rs": "mod a;\npub struct R;\n#[cfg(any(test, unix))]\nfn f() -> a::A { todo!() }\n",
            "src/a.rs": "pub struct A;\nfn g() -> crate::R { todo!() }\n",
        },
        {"demo", "demo::a"},
    ),
    # Items of one module naming each other: no module cycle.
    "same_module": (
        {
            "src/lib.rs": "mod a;\n",
            "src/a.rs": textwrap.dedent(
                """\
                pub struct S { next: Option<Box<T>> }
                pub struct T { s: S }
                impl S { pub fn new() -> Self { todo!() } pub fn t(&self) -> self::T { todo!() } }
                """
            ),
        },
        None,
    ),
    # A name used only in a function body is not seen (cargo-modules' view)...
    "body_only": (
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub struct A(B);\n",
            "src/b.rs": "pub struct B;\npub fn g() { let _ = crate::a::A(B); }\n",
        },
        None,
    ),
    # ... but an import at the top of the file counts, even if only a body uses it.
    "import_used_in_body": (
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub struct A(B);\n",
            "src/b.rs": "use crate::a::A;\npub struct B;\npub fn g() { let _ = A(B); }\n",
        },
        {"demo::a", "demo::b"},
    ),
    # A trait impl counts for its Self type's module too: the From impl a leaf writes
    # for the crate's error makes error -> leaf, and the leaf names the error.
    "trait_impl_for_other_module": (
        {
            "src/lib.rs": "mod error;\nmod leaf;\n",
            "src/error.rs": "pub struct ShoalError;\n",
            "src/leaf.rs": textwrap.dedent(
                """\
                use crate::error::ShoalError;
                pub struct ParseError;
                impl From<ParseError> for ShoalError {
                    fn from(_: ParseError) -> Self { ShoalError }
                }
                """
            ),
        },
        {"demo::error", "demo::leaf"},
    ),
    # ... a generic impl for a generic type too.
    "trait_impl_generic": (
        {
            "src/lib.rs": "mod error;\nmod leaf;\n",
            "src/error.rs": "pub struct Wrapped<T>(pub T);\n",
            "src/leaf.rs": textwrap.dedent(
                """\
                use crate::error::Wrapped;
                pub struct ParseError;
                impl<T: Fn() -> u8> From<(ParseError, T)> for &'static Wrapped<T> {
                    fn from(_: (ParseError, T)) -> Self { todo!() }
                }
                """
            ),
        },
        {"demo::error", "demo::leaf"},
    ),
    # The same conversion written in error.rs: error -> leaf only.
    "trait_impl_in_type_module": (
        {
            "src/lib.rs": "mod error;\nmod leaf;\n",
            "src/error.rs": textwrap.dedent(
                """\
                use crate::leaf::ParseError;
                pub struct ShoalError;
                impl From<ParseError> for ShoalError {
                    fn from(_: ParseError) -> Self { ShoalError }
                }
                """
            ),
            "src/leaf.rs": "pub struct ParseError;\n",
        },
        None,
    ),
    # A parameter's name is no name of an item: `parse_error` is one of leaf's fns.
    "trait_impl_parameter_names": (
        {
            "src/lib.rs": "mod error;\nmod leaf;\n",
            "src/error.rs": "pub struct ShoalError;\npub trait Convert { fn convert(parse_error: u8); }\n",
            "src/leaf.rs": textwrap.dedent(
                """\
                use crate::error::{Convert, ShoalError};
                pub fn parse_error() {}
                impl Convert for ShoalError { fn convert(parse_error: u8) {} }
                """
            ),
        },
        None,
    ),
    # An inherent impl split into a child's file counts where it is written (unless
    # --inherent-impls, test_inherent_impls).
    "inherent_impl_in_child": (
        {
            "src/lib.rs": "mod ops;\n",
            "src/ops/mod.rs": "mod create;\npub struct Ops;\npub struct Generic<T>(T);\n",
            "src/ops/create.rs": textwrap.dedent(
                """\
                use super::Ops;
                pub struct Spec;
                impl Ops { pub fn create(&self, _: &[Spec]) -> Option<Spec> { None } }
                impl super::Generic<u8> { pub fn spec(&self) -> Spec { Spec } }
                """
            ),
        },
        None,
    ),
    # Glob imports: `use super::*` outside a test module is an edge to the parent.
    "glob_parent": (
        {
            "src/lib.rs": "mod m;\n",
            "src/m/mod.rs": "mod child;\npub struct P { c: child::C }\n",
            "src/m/child.rs": "use super::*;\npub struct C;\n",
        },
        {"demo::m", "demo::m::child"},
    ),
    # A glob of an enum's variants is an edge to the enum's module.
    "glob_enum": (
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "pub enum Kind { One, Two }\npub struct A(crate::b::B);\n",
            "src/b.rs": "use crate::a::Kind::*;\npub struct B;\n",
        },
        {"demo::a", "demo::b"},
    ),
    # A glob of another crate's module is no edge.
    "glob_extern": (
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use std::collections::*;\npub struct A(crate::b::B);\n",
            "src/b.rs": "use std::io::prelude::*;\npub struct B;\n",
        },
        None,
    ),
    # Inline modules are modules: `super::` from inside one is its enclosing module.
    "inline_mod": (
        {
            "src/lib.rs": textwrap.dedent(
                """\
                pub struct Outer(inner::Inside);
                pub mod inner {
                    use super::Outer;
                    pub struct Inside;
                    pub fn f(_: &Outer) {}
                }
                """
            ),
        },
        {"demo", "demo::inner"},
    ),
    # An inline module's `mod x;` lives in a directory named after it; its user is a
    # sibling, one way: no cycle.
    "inline_mod_file_child": (
        {
            "src/lib.rs": "mod outer {\n    pub mod deep;\n}\nmod user;\n",
            "src/outer/deep.rs": "pub struct D;\n",
            "src/user.rs": "pub struct U(crate::outer::deep::D);\n",
        },
        None,
    ),
    "inline_mod_file_child_cycle": (
        {
            "src/lib.rs": "mod outer {\n    pub mod deep;\n}\nmod user;\n",
            "src/outer/deep.rs": "pub struct D(super::super::user::U);\n",
            "src/user.rs": "pub struct U(crate::outer::deep::D);\n",
        },
        {"demo::outer::deep", "demo::user"},
    ),
    # Nested use groups, `self` in a group, renaming: the leaf deep inside counts.
    "nested_use_group": (
        {
            "src/lib.rs": "mod a;\nmod b;\nmod c;\n",
            "src/a.rs": textwrap.dedent(
                """\
                use crate::{
                    c::C,
                    b::{self as bee, inner::{Deep as D}},
                };
                pub struct A(C, D);
                """
            ),
            "src/b.rs": "pub mod inner;\n",
            "src/b/inner.rs": "pub struct Deep;\npub struct I(crate::a::A);\n",
            "src/c.rs": "pub struct C;\n",
        },
        {"demo::a", "demo::b::inner"},
    ),
    # `self::` and `super::super::` paths.
    "self_and_super_super": (
        {
            "src/lib.rs": "pub mod a;\n",
            "src/a/mod.rs": "pub mod b;\npub struct A(self::b::c::C);\n",
            "src/a/b/mod.rs": "pub mod c;\n",
            "src/a/b/c.rs": "pub struct C;\npub fn f(_: super::super::A) {}\n",
        },
        {"demo::a", "demo::a::b::c"},
    ),
    # A path through a module imported by name.
    "imported_module": (
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b;\npub struct A(b::B);\n",
            "src/b.rs": "pub struct B(crate::a::A);\n",
        },
        {"demo::a", "demo::b"},
    ),
    # Comments, strings, raw strings, chars and lifetimes name nothing; a real path after
    # them still counts (see literals_then_real_path).
    "literals": (
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "pub struct A(crate::b::B);\n",
            "src/b.rs": textwrap.dedent(
                r"""
                // use crate::a::A;
                /* crate::a::A /* nested */ crate::a::A */
                /// [`crate::a::A`] in a doc comment
                #[doc = "crate::a::A"]
                pub struct B;
                pub const S: &str = "crate::a::A \" crate::a::A";
                pub const R: &str = r#"crate::a::A "quoted" crate::a::A"#;
                pub const BS: &[u8] = br"crate::a::A";
                pub const Q: char = '"';
                pub const T: &str = "}";
                pub const E: char = '\'';
                pub fn f<'a>(x: &'a str, _: [char; 2]) -> &'a str { x }
                pub const U: char = '\u{7f}';
                pub const Y: u8 = b'"';
                """
            ),
        },
        None,
    ),
    "literals_then_real_path": (
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "pub struct A(crate::b::B);\n",
            "src/b.rs": textwrap.dedent(
                r"""
                pub const Q: char = '"';
                pub const R: &str = r#"a "#;
                pub struct B;
                pub fn f<'a>(x: &'a str) -> &'a str { x }
                pub fn g(_: crate::a::A) {}
                """
            ),
        },
        {"demo::a", "demo::b"},
    ),
    # #[path] names the file.
    "path_attribute": (
        {
            "src/lib.rs": 'mod a;\n#[path = "elsewhere/bee.rs"]\nmod b;\n',
            "src/a.rs": "pub struct A(crate::b::B);\n",
            "src/elsewhere/bee.rs": "pub struct B;\nfn f(_: crate::a::A) {}\n",
        },
        {"demo::a", "demo::b"},
    ),
    # pub(in path) is a visibility, not a dependency; other crates' paths are none.
    "visibility_and_extern": (
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "pub struct A(crate::b::B);\npub(in crate::a) struct Z;\n",
            "src/b.rs": "pub(crate) struct B(::std::string::String, std::vec::Vec<u8>);\n",
        },
        None,
    ),
}


@pytest.mark.parametrize("bodies", [False, True], ids=["signatures", "bodies"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_case(tmp_path: Path, name: str, bodies: bool) -> None:
    """Each case, also with --bodies, which only adds body_only's cycle."""
    files, cycle = CASES[name]
    if bodies and name == "body_only":
        cycle = {"demo::a", "demo::b"}
    write_crate(tmp_path, files)
    result = check(tmp_path, *(["--bodies"] if bodies else []))
    if cycle is None:
        assert result.returncode == 0, result.stderr
        assert "check-module-cycles: demo (lib demo): no cycle" in result.stdout
    else:
        assert result.returncode == 1, result.stdout
        assert f"  modules: {', '.join(sorted(cycle))}\n" in result.stderr


def test_cycle_report_names_the_lines(tmp_path: Path) -> None:
    write_crate(tmp_path, CASES["siblings"][0])
    report = check(tmp_path).stderr
    assert "demo (lib demo): import cycle between modules:" in report
    assert "a loop: demo::a -> demo::b -> demo::a" in report
    assert "demo::a -> demo::b: crates/demo/src/a.rs:1\n" in report
    assert "demo::b -> demo::a: crates/demo/src/b.rs:1\n" in report


def test_bodies_counts_function_bodies(tmp_path: Path) -> None:
    write_crate(tmp_path, CASES["body_only"][0])
    assert check(tmp_path).returncode == 0
    result = check(tmp_path, "--bodies")
    assert result.returncode == 1
    assert "demo::b -> demo::a: crates/demo/src/b.rs:2\n" in result.stderr


def test_inherent_impls(tmp_path: Path) -> None:
    write_crate(tmp_path, CASES["inherent_impl_in_child"][0])
    result = check(tmp_path, "--inherent-impls")
    assert result.returncode == 1
    made_at = "crates/demo/src/ops/create.rs:3, crates/demo/src/ops/create.rs:4"
    assert f"demo::ops -> demo::ops::create: {made_at}\n" in result.stderr


def test_bin_targets_are_roots_of_their_own(tmp_path: Path) -> None:
    write_crate(
        tmp_path,
        {
            "src/lib.rs": "pub struct L;\n",
            "src/main.rs": "mod a;\nfn main() {}\n",
            "src/a.rs": "pub struct A;\n",
            "src/bin/tool.rs": "mod x;\nmod y;\nfn main() {}\n",
            "src/bin/x.rs": "pub struct X(crate::y::Y);\n",
            "src/bin/y.rs": "pub struct Y(crate::x::X, demo::L);\n",
        },
    )
    result = check(tmp_path)
    assert result.returncode == 1
    assert "demo (lib demo): no cycle" in result.stdout
    assert "demo (bin demo): no cycle" in result.stdout
    assert "demo (bin tool): import cycle between modules:" in result.stderr
    assert "modules: tool::x, tool::y\n" in result.stderr


def test_skip(tmp_path: Path) -> None:
    write_crate(tmp_path, CASES["siblings"][0])
    result = check(tmp_path, "--skip", "demo")
    assert result.returncode == 0
    assert "SKIPPED demo" in result.stdout


def test_missing_module_file(tmp_path: Path) -> None:
    write_crate(tmp_path, {"src/lib.rs": "mod gone;\n"})
    result = check(tmp_path)
    assert result.returncode == 2
    assert "`mod gone;` has no file" in result.stderr


def test_runs_as_a_program(tmp_path: Path) -> None:
    write_crate(tmp_path, CASES["siblings"][0])
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "modules: demo::a, demo::b" in result.stderr
