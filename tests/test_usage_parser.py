"""dynamics.usage.OneLineParser as the command line builds it: what each command's --help says."""

import argparse

import pytest

from dynamics.cli import build_parser


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub


def test_each_commands_help_opens_with_the_line_dynamics_help_lists_it_by():
    # `dynamics status --help` gave its usage and nothing of what status prints.
    sub = _subcommands(build_parser())
    listed = {a.dest: a.help for a in sub._choices_actions}
    assert set(listed) == {"run", "sweep", "status", "analyse", "predict", "report", "gates", "demo"}
    for name, parser in sub.choices.items():
        assert listed[name] and parser.description == listed[name]
        assert " ".join(listed[name].split()) in " ".join(parser.format_help().split())
    status = " ".join(sub.choices["status"].format_help().split())
    # the steps and loss the store records: "steps done" and "at the last step reached" were of memory
    assert ("swept values, status, steps the store records (+N unrecorded past the last checkpoint; ? where refused), "
            "the step a resume restarts from, last loss recorded (a finished run's at its last step, an unfinished "
            "one's before its checkpoint)") in status


def test_a_description_given_is_kept():
    from dynamics.usage import OneLineParser

    sub = OneLineParser(prog="x").add_subparsers()
    assert sub.add_parser("a", help="short", description="long").description == "long"
    assert sub.add_parser("b").description is None  # no help, no description: argparse's own


def test_a_huge_unknown_flag_is_cut_in_the_parsers_one_line(capsys):
    # the parser's own refusals echo what was given, as the commands' do: cut to its start and end
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["analyse", "s.zarr", "--bogus" + "z" * 5000])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"dynamics: error: unrecognized arguments: --bogus{'z' * 193}...(5,007 characters)..."
                                       f"{'z' * 40} (see dynamics analyse --help)\n")
