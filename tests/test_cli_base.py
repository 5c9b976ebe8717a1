"""The command line's base: version, help, usage errors."""

import json
import sys
from pathlib import Path

import pytest
from child_env import child_env
from side_by_side import run_side_by_side

import shardsearch as ss
from shardsearch.cli import main as _cli

SCRIPT = Path(sys.executable).with_name("shardsearch")

# What the subprocess tests run: each command in a fresh interpreter.
IMPORTS = ("import json, sys\n"
           "from shardsearch.cli import main\n"
           "main.build_parser().parse_args(['bench', '--suite', 'x'])\n"
           "print(json.dumps(sorted(m for m in sys.modules if m.startswith('shardsearch'))))\n")
COMMANDS = {
    "version": [str(SCRIPT), "--version"],
    "help": [sys.executable, "-m", "shardsearch", "--help"],
    "unknown": [sys.executable, "-m", "shardsearch", "--no-such-option"],
    "imports": [sys.executable, "-c", IMPORTS],
}


@pytest.fixture(scope="module")
def ran():
    """Every command of COMMANDS run in its own process, all side by side (each
    spends its time importing jax): a CompletedProcess by name. The console
    script's is None when it is not installed."""
    env = child_env()
    commands = {name: argv for name, argv in COMMANDS.items()
                if name != "version" or SCRIPT.exists()}
    return {name: None for name in COMMANDS} | run_side_by_side(
        commands, Path(__file__).parent, env)


def test_console_script_version(ran):
    if ran["version"] is None:
        pytest.skip("the shardsearch console script is not installed in this environment")
    out = ran["version"]
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"shardsearch {ss.__version__}"


def test_module_help(ran):
    out = ran["help"]
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: shardsearch")
    assert "--version" in out.stdout


def test_unknown_option_is_one_line_exit_2(ran):
    out = ran["unknown"]
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("shardsearch: error:")
    assert "--no-such-option" in lines[0]
    assert "Traceback" not in out.stderr


def _exit_code(argv):
    """`main(argv)`'s exit code, whether it returns it or argparse exits with it."""
    try:
        return _cli.main(argv)
    except SystemExit as exit_:
        return exit_.code


def test_main_in_process(capsys):
    assert _exit_code(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"shardsearch {ss.__version__}"
    assert _exit_code(["--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: --bogus" in err


def test_each_command_module_registers_one_subcommand(capsys):
    from shardsearch.cli import (
        bench,
        calibrate,
        confirm,
        dashboard,
        explain,
        export,
        launch,
        optimize,
        show,
    )

    modules = (optimize, export, show, explain, bench, calibrate, confirm, launch, dashboard)
    assert sorted(c.name for c in _cli.COMMANDS) == sorted(m.__name__.rpartition(".")[2]
                                                          for m in modules)
    assert {id(c) for c in _cli.COMMANDS} == {id(m.COMMAND) for m in modules}
    assert _cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in _cli.COMMANDS:
        assert command.name in out and command.help in " ".join(out.split())


def test_parsing_and_help_import_no_benchmark_code(ran):
    # The commands import the library's heavy parts when they run, not before
    # (the process runs IMPORTS).
    out = ran["imports"]
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert "shardsearch.cli.bench" in loaded
    assert not [m for m in loaded if m.startswith("shardsearch.bench")]
