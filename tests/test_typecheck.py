"""The type checker ``make test`` runs (``tests/typecheck.py`` with ``[tool.mypy]``) fails on the scale model's
bug: an int passed where ``ParameterStore.publish`` annotates ``meta: dict``, inside an unannotated function as
the scale model's was (so the project's config must check untyped bodies)."""

import subprocess
import sys
from pathlib import Path

from tests.typecheck import LAYOUT, ROOT, build_layout, real_path

BAD = '''\
from rapid.envs.base import VecMultiAgentEnv  # a folder package-dir maps into rapid: the layout must find it
from rapid.run.param_store import ParameterStore


def publish_every_version(store, env):  # no annotations: checked only with check_untyped_defs
    if isinstance(env, VecMultiAgentEnv):
        ParameterStore(store).publish(1, {}, 3)
'''


def test_mypy_fails_on_an_int_for_an_annotated_dict(tmp_path):
    bad = tmp_path / "scale_model.py"
    bad.write_text(BAD)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "typecheck.py"), str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    # Exactly this one: the rapid imports resolved through the layout, and nothing else in their graph fails.
    assert len(errors) == 1, done.stdout
    # mypy's cache may name the file where an identical one was checked before (another tmp_path): the name only
    assert ("scale_model.py:7: error: Argument 3 to \"publish\" of \"ParameterStore\" has incompatible type \"int\"; "
            "expected \"dict") in errors[0], errors[0]


def test_messages_name_the_real_files():
    build_layout()
    linked = Path(LAYOUT.relative_to(ROOT)) / "rapid" / "envs" / "base.py"
    assert real_path(f"{linked}:3: error: x  [misc]") == "envs/base.py:3: error: x  [misc]"
    assert real_path("Found 1 error in 1 file") == "Found 1 error in 1 file"
