"""Every module's examples run as doctests, and every ``Usage::`` block is such an example."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import re

import pytest

# The installed packages: rapid's subpackages rapid.envs, rapid.opt, rapid.infra, rapid.monitoring live in
# folders of their own, so each is walked from its own path.
ROOTS = ("rapid", "rapid.envs", "rapid.opt", "rapid.infra", "rapid.monitoring")

# A literal block introduced by a line ending in "Usage…::" whose first line is not a ">>>" example.
PROSE_USAGE = re.compile(r"Usage[^\n]*::\n\s*\n(?!\s*>>>)")


def module_names() -> list[str]:
    names = set()
    for root in ROOTS:
        package = importlib.import_module(root)
        names.add(root)
        names.update(m.name for m in pkgutil.walk_packages(package.__path__, root + "."))
    return sorted(names)


MODULES = module_names()


def test_every_package_is_walked():
    assert {"rapid.cli", "rapid.roles.launcher", "rapid.envs.moba.env", "rapid.opt.losses", "rapid.infra.s3",
            "rapid.monitoring.report", "rapid.formats.codec", "rapid.league.state"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} failing example(s) in {name} (report in the captured output)"


@pytest.mark.parametrize("name", MODULES)
def test_usage_blocks_are_examples(name):
    source = inspect.getsource(importlib.import_module(name))
    assert not PROSE_USAGE.search(source), f"{name}: a Usage:: block that is not >>> examples"
