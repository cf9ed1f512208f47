"""`rapid watch`: a local web page that shows a moba match of a run's policy as it is played.

One game after another is stepped on a thread, ``speed`` × game time, the policy on side 0 (blue, left)
against a bot or another version on side 1 (red). Each step is drawn by the GIF renderer
(``rapid.envs.moba.render.render_frame``: the map, towers, creeps, heroes with their HP and mana, kills and
structures destroyed). The page (``watch_page.html``) shows the newest frame, the clock, the score and every
hero's HP, with pause and speed controls. Served by the standard library on loopback only.

Endpoints: ``GET /`` the page, ``GET /frame.png`` the newest frame, ``GET /state`` the match as JSON,
``POST /control`` with ``{"pause": true|false}`` or ``{"speed": 4}``.

>>> import json, tempfile, urllib.request
>>> from rapid.api import publish_untrained
>>> from rapid.run.config_files import load_config
>>> cfg = load_config(None, ["env.name=moba", "model.hidden=16", "model.lstm=16"])
>>> run = publish_untrained(cfg, tempfile.mkdtemp())
>>> match = Match(load_config(run / "config.toml", [f'run.dir="{run}"']), "latest", "lane", speed=64.0)
>>> server = start_server(match, port=0)
>>> url = f"http://127.0.0.1:{server.server_address[1]}"
>>> match.wait_for_frame(1, timeout=30)
True
>>> state = json.load(urllib.request.urlopen(url + "/state"))
>>> state["players"], len(state["heroes"]), state["paused"]
(['v1', 'lane'], 2, False)
>>> urllib.request.urlopen(url + "/frame.png").read()[:4]
b'\\x89PNG'
>>> request = urllib.request.Request(url + "/control", data=b'{"pause": true}', method="POST")
>>> json.load(urllib.request.urlopen(request))["paused"]
True
>>> server.shutdown(); match.stop()
"""

from __future__ import annotations

import io
import json
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from rapid.errors import UsageError
from rapid.run.config import Config

PAGE = Path(__file__).with_name("watch_page.html")
SPEEDS = (0.25, 64.0)


class Match:
    """Moba games of ``version`` (side 0) against ``against`` (side 1), one after another, on a thread."""

    def __init__(self, cfg: Config, version: str, against: str, speed: float = 1.0, seed: int = 0,
                 greedy: bool = False):
        from rapid.envs.moba import MobaVecEnv
        from rapid.roles.startup import open_run_store
        from rapid.run.matches import make_player
        from rapid.run.param_store import ParameterStore

        if cfg.env.name != "moba":
            raise UsageError(f"rapid watch shows moba games; this run plays {cfg.env.name}"
                             + (": play it with rapid play" if "classic" in cfg.env.name else ""))
        self.env = MobaVecEnv(num_games=1, seed=seed, **cfg.env.options)
        params = ParameterStore(open_run_store(cfg))
        self.players = [make_player(text, cfg, self.env, params, seed=seed, greedy=greedy)
                        for text in (version, against)]
        self.speed, self.paused = _speed(speed), False
        self.frame, self.games, self.wins, self.last_result = 0, 0, [0, 0], ""
        self.frames_served = 0
        self._png = b""
        self._state: dict[str, object] = {}
        self._lock = threading.Condition()
        self._stopped = threading.Event()
        self._step = self.env.reset(seed=seed)
        self._draw()
        self._thread = threading.Thread(target=self._run, name="watch-match", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        spec = self.env.spec
        side0 = (np.asarray(spec.side_of_agent) == 0)[None, :]
        while not self._stopped.is_set():
            started = time.monotonic()
            if self.paused:
                self._stopped.wait(0.05)
                continue
            step = self._step
            a = self.players[0].act(replace(step, active=step.active & side0))
            b = self.players[1].act(replace(step, active=step.active & ~side0))
            self._step = self.env.step(np.where(side0[..., None], a, b))
            for ep in self._step.episodes:
                self.games += 1
                if ep.winner >= 0:
                    self.wins[ep.winner] += 1
                how = "at the time limit" if ep.truncated else "by destroying the ancient"
                self.last_result = ("a draw" if ep.winner < 0 else
                                    f"{self.players[ep.winner].name} ({'blue' if ep.winner == 0 else 'red'}) won "
                                    f"{how} after {ep.length * spec.seconds_per_step:.0f} s")
            self._draw()
            self._stopped.wait(max(0.0, spec.seconds_per_step / self.speed - (time.monotonic() - started)))

    def _draw(self) -> None:
        from PIL import Image

        from rapid.envs.moba.render import render_frame

        buffer = io.BytesIO()
        Image.fromarray(render_frame(self.env, 0)).save(buffer, format="PNG", compress_level=1)
        st, lay, cfg = self.env.state, self.env.layout, self.env.cfg
        heroes = [{"side": int(lay.team[h]), "slot": int(h % lay.n), "hp": float(st.hp[0, h]),
                   "max_hp": float(st.max_hp[0, h]), "alive": bool(st.alive[0, h]), "level": int(st.level[0, h]),
                   "kills": int(st.kills[0, h]), "deaths": int(st.deaths[0, h])} for h in lay.heroes]
        with self._lock:
            self.frame += 1
            self._png = buffer.getvalue()
            self._state = {"time_s": float(st.step_count[0]) * cfg.seconds_per_step, "max_s": cfg.max_seconds,
                           "kills": st.kills[0].reshape(2, lay.n).sum(1).astype(int).tolist(),
                           "structures": st.towers_destroyed[0].astype(int).tolist(), "heroes": heroes}
            self._lock.notify_all()

    def state(self) -> dict:
        with self._lock:
            return {**self._state, "frame": self.frame, "paused": self.paused, "speed": self.speed,
                    "players": [p.name for p in self.players], "games": self.games, "wins": self.wins,
                    "last_result": self.last_result, "frames_served": self.frames_served}

    def png(self) -> bytes:
        with self._lock:
            self.frames_served += 1
            return self._png

    def control(self, pause: bool | None = None, speed: float | None = None) -> None:
        if pause is not None:
            self.paused = bool(pause)
        if speed is not None:
            self.speed = _speed(speed)

    def wait_for_frame(self, frame: int, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self.frame > frame, timeout)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)
        self.env.close()


def _speed(value: float) -> float:
    if not SPEEDS[0] <= float(value) <= SPEEDS[1]:
        raise UsageError(f"speed {value}: use {SPEEDS[0]:g} to {SPEEDS[1]:g} (× game time)")
    return float(value)


class Handler(BaseHTTPRequestHandler):
    match: Match

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/":
            self._send(200, PAGE.read_bytes(), "text/html; charset=utf-8")
        elif path == "/frame.png":
            self._send(200, self.match.png(), "image/png")
        elif path == "/state":
            self._send(200, json.dumps(self.match.state()).encode(), "application/json")
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        if self.path != "/control":
            return self._send(404, b"not found", "text/plain")
        try:
            body = json.loads(self.rfile.read(min(int(self.headers.get("Content-Length", 0)), 4096)) or b"{}")
            self.match.control(pause=body.get("pause"), speed=body.get("speed"))
        except (ValueError, TypeError, AttributeError, UsageError) as e:
            return self._send(400, str(e).encode(), "text/plain")
        self._send(200, json.dumps(self.match.state()).encode(), "application/json")

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        """Quiet: a page polling ten times a second would fill the terminal."""


def start_server(match: Match, port: int, addr: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve ``match`` on ``addr:port`` (0: any free port) from a thread; UsageError when the port is taken."""
    handler = type("MatchHandler", (Handler,), {"match": match})
    try:
        server = ThreadingHTTPServer((addr, port), handler)
    except OSError as e:
        match.stop()
        raise UsageError(f"cannot serve on {addr}:{port}: {e.strerror or e}; pick another --port") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="watch-http", daemon=True).start()
    return server


def watch(cfg: Config, version: str, against: str, port: int, speed: float, seed: int, greedy: bool) -> int:
    """`rapid watch`: serve until Ctrl-C or SIGTERM."""
    from rapid.roles.startup import StopFlag

    stop = StopFlag()
    match = Match(cfg, version, against, speed=speed, seed=seed, greedy=greedy)
    server = start_server(match, port)
    print(f"rapid watch: {match.players[0].name} (blue) vs {match.players[1].name} (red) at "
          f"http://127.0.0.1:{server.server_address[1]}/ — Ctrl-C stops", flush=True)
    while not stop.wait(3600):
        pass
    server.shutdown()
    match.stop()
    print(f"rapid watch: stopped ({stop.reason}) after {match.games} game(s)", flush=True)
    return 0
