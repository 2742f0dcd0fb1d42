"""The docs keep up with the code: every builtin is in the DSL reference."""

import pathlib

import kaio.lang

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_builtin_is_documented():
    text = (ROOT / "docs" / "dsl-reference.md").read_text()
    missing = [b.name for b in kaio.lang.BUILTINS.values() if f"{b.name}(" not in text]
    assert not missing, f"undocumented builtins: {missing}"


def test_readme_quick_start_has_two_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = section.split("```", 2)[1]
    commands = [line for line in block.splitlines()[1:] if line.strip()]
    assert len(commands) == 2
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci


def test_builtin_index_is_current():
    """docs/dsl-reference.md's builtin index is what docs/gen_builtins.py makes of the
    builtins' signatures and docstrings (regenerate with that script)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_builtins", ROOT / "docs" / "gen_builtins.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.PAGE.read_text()
    assert gen.render(text) == text, "stale: run PYTHONPATH=. python3 docs/gen_builtins.py"
    assert "`kaio.shared_dynamic(dtype, shape=None, offset=None)`" in text
