"""`rapid play` (a person against the policy in the terminal, driven through stdin) and `rapid watch` (a live
moba page, loaded in a real headless Chromium: Debian's `chromium`, installed by `make test`).

Untrained policies; about 10 s in all on 2 cores (the watch test starts the server and the browser)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import urllib.request

import numpy as np
import pytest
import torch
from PIL import Image

from rapid.api import publish_untrained
from rapid.cli import main
from rapid.envs.moba.render import COLORS
from rapid.run.config_files import load_config
from tests.helpers import RAPID, ROOT

TINY = ["model.hidden=16", "model.lstm=16"]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.manual_seed(0)
    tmp = tmp_path_factory.mktemp("runs")
    return {"c4": publish_untrained(load_config(None, TINY), tmp / "c4"),
            "moba": publish_untrained(load_config(ROOT / "configs/moba-3v3.toml", TINY), tmp / "moba")}


def test_play_connect_four_through_stdin(runs):
    moves = "x\n9\n" + "3\n" * 6 + "".join(f"{c}\n" for c in (0, 1, 2, 4, 5, 6) for _ in range(6))
    out = subprocess.run([RAPID, "play", "--run-dir", str(runs["c4"])], input=moves, capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("connect four: you are X and move first; the agent (v1) is O.")
    assert " . . . . . . .\n 0 1 2 3 4 5 6\nlegal moves: 0 1 2 3 4 5 6\n" in text, "the empty board, then the moves"
    assert "x is not a legal move; legal: 0 1 2 3 4 5 6" in text and "9 is not a legal move" in text
    assert text.count("the agent plays ") >= 3 and "(its value estimate " in text
    assert " X . . . . . .\n" not in text.split("the agent plays")[0], "no X before the first move"
    board_after_first = text.split("the agent plays")[1]
    assert " . . . X" in board_after_first, "your piece where you put it"
    assert text.rstrip().splitlines()[-1] in ("game over: you won", "game over: the agent won", "game over: a draw")


def test_play_refuses_what_is_not_a_board_game(runs, capsys):
    assert main(["play", "--run-dir", str(runs["moba"])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("this run plays moba: watch it with rapid watch") and "\n" not in err


def test_watch_refuses_a_port_in_use_and_other_games(runs, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["watch", "--run-dir", str(runs["moba"]), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"cannot serve on 127.0.0.1:{port}: Address already in use; pick another --port" in err and "\n" not in err
    assert main(["watch", "--run-dir", str(runs["c4"])]) == 2
    assert "rapid watch shows moba games; this run plays pettingzoo.classic.connect_four_v3" in capsys.readouterr().err
    assert main(["watch", "--run-dir", str(runs["moba"]), "--against", "v9", "--port", "0"]) == 2
    assert "parameter version 9 is not in the store" in capsys.readouterr().err


def test_watch_page_shows_the_match_in_a_headless_browser(runs, tmp_path):
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is needed (make test installs it)"
    server = subprocess.Popen([RAPID, "watch", "--run-dir", str(runs["moba"]), "--port", "0", "--speed", "8"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        line = server.stdout.readline()
        assert "rapid watch: v1 (blue) vs lane (red) at http://127.0.0.1:" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        shot = tmp_path / "watch.png"
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900",
                        "--virtual-time-budget=4000", f"--screenshot={shot}", url],
                       capture_output=True, timeout=90, check=True)
        state = json.load(urllib.request.urlopen(url + "state", timeout=10))
        assert state["frames_served"] >= 2, "the page took frame after frame"
        assert state["time_s"] > 0 and state["players"] == ["v1", "lane"]
        pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)

        def share(color) -> float:
            return float((np.abs(pixels - np.asarray(color)).sum(1) < 12).mean())

        assert share(COLORS["ground"]) > 0.15, "the map fills the page"
        assert share(COLORS["lane"]) > 0.02, "its lanes"
        assert share(COLORS[0]) > 0.002 and share(COLORS[1]) > 0.002, "blue and red towers and heroes"
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
        assert "rapid watch: stopped (SIGTERM)" in server.stdout.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
