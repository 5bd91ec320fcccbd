"""``optiplug`` subcommands come from the ``optiplug_cli_commands`` hook, built-in ones too."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types

import pytest

import optiplug
import optiplug.cli
from optiplug.errors import OptiplugError

BUILTIN_COMMANDS = {"commands": {"auto", "check", "list", "schedule", "show"}}
"""The core distribution's own commands, by plugin."""

APPLICATION_COMMANDS = {
    "optiplug-train": {"train", "tune", "leaderboard"},
    "optiplug-devtools": {"bench", "new-plugin"},
}
"""Commands of the distributions built on the core, as any third party's plugin provides them."""


def _plugin(*commands: optiplug.CommandSpec) -> types.ModuleType:
    """A plugin module providing ``commands`` through the hook."""
    module = types.ModuleType("acme_commands")

    @optiplug.hookimpl
    def optiplug_cli_commands() -> list[optiplug.CommandSpec]:
        return list(commands)

    module.optiplug_cli_commands = optiplug_cli_commands  # type: ignore[attr-defined]
    return module


def _configure_greet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("who")
    parser.add_argument("--exit", type=int, default=0, dest="status")


def _run_greet(args: argparse.Namespace) -> int:
    plugins = {info.name for info in args.registry.plugins()}
    print(f"hello {args.who} from {'acme' in plugins and 'acme registry'}")
    return int(args.status)


def _run_broken(args: argparse.Namespace) -> int:
    raise OptiplugError("the widget is\nmisaligned")


GREET = optiplug.CommandSpec(
    "greet", "say hello from acme", _configure_greet, _run_greet, description="Greets WHO."
)
BROKEN = optiplug.CommandSpec("broken", "always fails", lambda parser: None, _run_broken)


@pytest.fixture()
def registry() -> optiplug.Registry:
    registry = optiplug.Registry(autoload=False)
    info = registry.register(_plugin(GREET, BROKEN), "acme")
    assert info.status == "active", info.error
    return registry


def test_third_party_command_is_in_help_and_runs(
    registry: optiplug.Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        optiplug.cli.main(["--help"], registry=registry)
    assert exited.value.code == 0
    usage = capsys.readouterr().out
    assert "greet" in usage and "say hello from acme" in usage
    assert "auto" in usage and "list" in usage  # the built-ins are there too
    assert optiplug.cli.main(["greet", "world"], registry=registry) == 0
    assert capsys.readouterr().out == "hello world from acme registry\n"
    assert optiplug.cli.main(["greet", "world", "--exit", "3"], registry=registry) == 3


def test_third_party_command_help_shows_its_description(
    registry: optiplug.Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        optiplug.cli.main(["greet", "--help"], registry=registry)
    out = capsys.readouterr().out
    assert "Greets WHO." in out and "--exit" in out


def test_commands_are_listed_with_their_provider(registry: optiplug.Registry) -> None:
    assert {spec.name for spec in registry.command_specs()} == {"broken", "greet"}
    registry.load_distribution("optiplug")  # what optiplug.cli.main does: the built-ins
    specs = {spec.name: spec for spec in registry.command_specs()}
    assert set(specs) == {"broken", "greet", *set().union(*BUILTIN_COMMANDS.values())}
    assert specs["greet"].provider is not None and specs["greet"].provider.plugin == "acme"
    assert [spec.name for spec in registry.command_specs()] == sorted(specs)
    plugins = {info.name: info for info in registry.plugins()}
    assert "command:greet" in plugins["acme"].provides


def test_builtin_commands_are_provided_by_builtin_plugins() -> None:
    plugins = {info.name: info for info in optiplug.plugins()}
    for plugin, commands in BUILTIN_COMMANDS.items():
        info = plugins[plugin]
        assert (info.distribution, info.status) == ("optiplug", "active")
        assert {f"command:{name}" for name in commands} <= set(info.provides)
    for distribution, commands in APPLICATION_COMMANDS.items():
        (info,) = [info for info in plugins.values() if info.distribution == distribution]
        assert info.status == "active"
        assert {f"command:{name}" for name in commands} <= set(info.provides)


def test_a_command_error_prints_one_line_and_exits_2(
    registry: optiplug.Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    assert optiplug.cli.main(["broken"], registry=registry) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("optiplug: error: the widget is")
    assert "Traceback" not in captured.err


def test_a_command_error_in_a_subprocess_has_no_traceback() -> None:
    code = (
        "import sys, types, optiplug, optiplug.cli\n"
        "from optiplug.errors import OptiplugError\n"
        "def fail(args):\n"
        "    raise OptiplugError('out of widgets')\n"
        "module = types.ModuleType('acme')\n"
        "@optiplug.hookimpl\n"
        "def optiplug_cli_commands():\n"
        "    return [optiplug.CommandSpec('broken', 'fails', lambda parser: None, fail)]\n"
        "module.optiplug_cli_commands = optiplug_cli_commands\n"
        "registry = optiplug.Registry(autoload=False)\n"
        "registry.register(module, 'acme')\n"
        "sys.exit(optiplug.cli.main(['broken'], registry=registry))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == "optiplug: error: out of widgets\n"


def test_plugins_do_not_import_torch() -> None:
    code = "import optiplug, sys; optiplug.plugins(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_command_gets_the_registry_main_was_given(
    registry: optiplug.Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    assert optiplug.cli.main(["show", "sgd"], registry=registry) == 2  # not in this registry
    assert "unknown optimizer 'sgd'" in capsys.readouterr().err
    assert optiplug.cli.main(["list", "--json"], registry=registry) == 0
    assert '"name": "acme"' in capsys.readouterr().out


def test_train_without_numpy_is_one_line() -> None:
    code = (
        "import sys\n"
        "sys.modules['numpy'] = None  # what a missing package looks like\n"
        "import optiplug.cli\n"
        "sys.exit(optiplug.cli.main(['train', '--steps', '1']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "optiplug: error: `optiplug train` needs numpy, which is not installed; "
        "install it with: pip install numpy\n"
    )
