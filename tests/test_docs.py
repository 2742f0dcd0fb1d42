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
