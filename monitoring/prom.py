"""Run a local Prometheus against a run's processes and query it (backs `rapid monitor` and the tests).

``start_prometheus(run_dir)`` writes a config and the target list under ``<run_dir>/prometheus`` and starts the
server (1 s scrapes); ``prom.wait_ready()``, ``query(prom.url, promql)``, ``check_dashboard_queries(prom.url,
DASHBOARD_PATH, run)`` (the dashboard queries that return no data), ``prom.stop()``. ``run_monitor(run_dir)``
does all of it for `rapid monitor`, until Ctrl-C. What they are built from::

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> run_dir = Path(tmp.name)
    >>> targets = refresh_targets(run_dir, run="demo")      # after more processes registered (file_sd re-reads it)
    >>> config = json.loads(render_config(targets))
    >>> config["scrape_configs"][0]["honor_labels"], config["global"]["scrape_interval"]
    (True, '1s')
    >>> dashboard_queries(DASHBOARD_PATH, "demo")[0]        # each panel's PromQL, for one run
    'sum(rate(rapid_env_steps_total{run="demo"}[1m]))'
    >>> tmp.cleanup()

Processes register themselves with ``rapid.monitoring.metrics.register_process``; the target list Prometheus
reads is ``<run_dir>/metrics/targets.json`` (file_sd), regenerated from those registrations. The generated config
is JSON, which is valid YAML, so no YAML library is needed; it mirrors the shipped ``prometheus.yml``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TextIO

from rapid.monitoring.targets import collect_targets, write_file_sd

HERE = Path(__file__).resolve().parent
DASHBOARD_PATH = HERE / "grafana-dashboard.json"
ALERTS_PATH = HERE / "alerts.yml"
PROMETHEUS_CONFIG_PATH = HERE / "prometheus.yml"
# What Grafana would put in for its built-in variables when a query is checked outside Grafana.
GRAFANA_BUILTINS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}


class PrometheusNotFound(RuntimeError):
    """No prometheus binary on this machine."""


def find_prometheus() -> str | None:
    """Path of the prometheus binary (PATH first, then Debian's /usr/bin), or None."""
    found = shutil.which("prometheus")
    if found:
        return found
    return "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def render_config(targets_file: str | os.PathLike, rules_file: str | os.PathLike | None = ALERTS_PATH,
                  scrape_interval: str = "1s") -> str:
    """A Prometheus config (JSON text) equivalent to the shipped prometheus.yml, with absolute paths."""
    config = {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                   "evaluation_interval": scrape_interval},
        "rule_files": [str(Path(rules_file).resolve())] if rules_file else [],
        "scrape_configs": [{
            "job_name": "rapid",
            "honor_labels": True,
            "file_sd_configs": [{"files": [str(Path(targets_file).resolve())], "refresh_interval": "30s"}],
        }],
    }
    return json.dumps(config, indent=1)


def refresh_targets(run_dir: str | os.PathLike, run: str | None = None) -> Path:
    """Regenerate ``<run_dir>/metrics/targets.json`` from the processes registered so far."""
    run_dir = Path(run_dir)
    return write_file_sd(collect_targets(run_dir), run_dir / "metrics" / "targets.json", run or run_name(run_dir))


def run_name(run_dir: str | os.PathLike) -> str:
    """The ``run`` label of a run's series: the run.name its processes registered with, else the one in its
    config.toml, else the folder's name (processes label their series with run.name, never with the folder)."""
    run_dir = Path(run_dir)
    names = sorted({t["run"] for t in collect_targets(run_dir) if t["run"]})
    if names:
        return names[0]
    try:
        with open(run_dir / "config.toml", "rb") as f:
            name = tomllib.load(f).get("run", {}).get("name", "run")
    except (OSError, tomllib.TOMLDecodeError, AttributeError):  # no config.toml, or not one of rapid's
        return run_dir.name
    return str(name)


def answering(targets: list[dict], timeout: float = 0.5) -> int:
    """How many of ``targets`` accept a connection on their metrics port now."""
    up = 0
    for t in targets:
        try:
            with socket.create_connection((t["host"], t["port"]), timeout=timeout):
                up += 1
        except OSError:
            pass  # dead, or not reachable from here: Prometheus shows it as up == 0
    return up


class PrometheusProcess(subprocess.Popen):
    """The prometheus child process, plus where to reach it."""

    url: str
    config_path: Path

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Block until /-/ready answers; raises RuntimeError if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.poll() is not None:
                raise RuntimeError(f"prometheus exited with code {self.returncode}; see {self.config_path.parent}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready after {timeout:.0f}s at {self.url}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.poll() is None:
            self.terminate()
            try:
                self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                self.wait()


def start_prometheus(run_dir: str | os.PathLike, port: int = 0, scrape_interval: str = "1s",
                     run: str | None = None, binary: str | None = None) -> PrometheusProcess:
    """Start prometheus on 127.0.0.1:``port`` (0: a free one) scraping a run's registered processes.

    Everything it writes (config, TSDB, log) goes to ``<run_dir>/prometheus``. Raises PrometheusNotFound.
    """
    binary = binary or find_prometheus()
    if binary is None:
        raise PrometheusNotFound("prometheus not found; on Debian/Ubuntu: apt-get install prometheus")
    run_dir = Path(run_dir)
    home = run_dir / "prometheus"
    (home / "data").mkdir(parents=True, exist_ok=True)
    targets = refresh_targets(run_dir, run)
    config_path = home / "prometheus.yml"
    config_path.write_text(render_config(targets, ALERTS_PATH, scrape_interval))
    return launch_prometheus(binary, config_path, home / "data", port or free_port(), home / "prometheus.log")


def launch_prometheus(binary: str, config_path: Path, data_dir: Path, port: int, log_path: Path) -> PrometheusProcess:
    """Start ``binary`` with ``config_path`` on 127.0.0.1:``port``, its output appended to ``log_path``."""
    with open(log_path, "ab") as logfile:
        proc = PrometheusProcess(
            [binary, f"--config.file={config_path}", f"--storage.tsdb.path={data_dir}",
             f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
            stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    proc.url = f"http://127.0.0.1:{port}"
    proc.config_path = config_path
    return proc


def query(base_url: str, promql: str, timeout: float = 5.0) -> list[dict]:
    """Instant query; returns the result list (vector/matrix) or one ``{"value": ...}`` for scalars.

    Raises ValueError with Prometheus' message for a bad expression.
    """
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:  # 400/422 carry Prometheus' own error text in the body
        body = json.load(exc)
    if body.get("status") != "success":
        raise ValueError(f"{promql!r}: {body.get('errorType')}: {body.get('error')}")
    data = body["data"]
    if data["resultType"] in ("scalar", "string"):
        return [{"value": data["result"]}]
    return data["result"]


def _has_finite_value(result: list[dict]) -> bool:
    for series in result:
        samples = series.get("values") or [series.get("value")]
        if any(s is not None and math.isfinite(float(s[1])) for s in samples):
            return True
    return False


def dashboard_queries(dashboard_path: str | os.PathLike, run: str) -> list[str]:
    """Every panel target's PromQL from a Grafana dashboard JSON, with ``$run`` and Grafana built-ins filled in."""
    dashboard = json.loads(Path(dashboard_path).read_text())
    panels = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    exprs = []
    for panel in panels:
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if not expr:
                continue
            for name, value in GRAFANA_BUILTINS.items():
                expr = expr.replace(name, value)
            exprs.append(expr.replace("${run}", run).replace("$run", run))
    return exprs


def check_dashboard_queries(prom_url: str, dashboard_path: str | os.PathLike = DASHBOARD_PATH, run: str = "",
                            timeout: float = 0.0) -> list[str]:
    """Dashboard expressions that return no finite data (or fail) for ``run``; [] means every panel shows data.

    With ``timeout`` > 0, keeps re-querying the missing ones until they all answer or the time is up (a fresh
    Prometheus needs a few scrapes before rate() has two points).
    """
    missing = dashboard_queries(dashboard_path, run)
    deadline = time.monotonic() + timeout
    while True:
        still = []
        for expr in missing:
            try:
                ok = _has_finite_value(query(prom_url, expr))
            except ValueError:
                ok = False
            if not ok:
                still.append(expr)
        missing = still
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(1.0)


def run_monitor(run_dir: str | os.PathLike, port: int = 9090, scrape_interval: str = "1s", run: str | None = None,
                refresh_s: float = 2.0, stream: TextIO = sys.stdout) -> int:
    """Start Prometheus for a run, say where to look, keep the target list fresh until Ctrl-C; returns an exit code.

    Processes that start later (or restart on a new port) are picked up by re-writing targets.json every
    ``refresh_s``; Prometheus' file_sd notices the change by itself.
    """
    run_dir = Path(run_dir)
    run = run or run_name(run_dir)
    proc = start_prometheus(run_dir, port, scrape_interval, run)
    try:
        try:
            proc.wait_ready()
        except RuntimeError as exc:
            stream.write(f"error: {exc}\n")
            return 1
        stream.write(
            f"Prometheus: {proc.url} ({_scraping(run_dir)}; targets {run_dir / 'metrics' / 'targets.json'})\n"
            f"Alerts:     {proc.url}/alerts\n"
            f"Grafana:    Dashboards > New > Import > upload {DASHBOARD_PATH}, pick a Prometheus data source "
            f"pointing at {proc.url}, choose run '{run}'\n"
            f"Ctrl-C to stop.\n")
        stream.flush()
        _keep_targets(run_dir, run, refresh_s, alive=lambda: proc.poll() is None)
        log = proc.config_path.parent / "prometheus.log"
        stream.write(f"prometheus exited with code {proc.returncode}; log: {log}\n")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        proc.stop()


def write_targets(run_dir: str | os.PathLike, run: str | None = None, refresh_s: float = 2.0, once: bool = False,
                  stream: TextIO = sys.stdout) -> int:
    """`rapid monitor --targets-only`: keep ``<run_dir>/metrics/targets.json`` (file_sd) fresh for a Prometheus
    that runs elsewhere (a cluster's, reading the run dir on a shared file system), without starting one."""
    run_dir = Path(run_dir)
    run = run or run_name(run_dir)
    path = refresh_targets(run_dir, run)
    stream.write(f"{path}: {_scraping(run_dir)}, run '{run}'\n")
    stream.flush()
    if once:
        return 0
    try:
        _keep_targets(run_dir, run, refresh_s, alive=lambda: True)
    except KeyboardInterrupt:
        return 0
    return 0


def _scraping(run_dir: Path) -> str:
    targets = collect_targets(run_dir)
    return f"{len(targets)} registered processes of {run_dir}, {answering(targets)} answering now"


def _keep_targets(run_dir: Path, run: str, refresh_s: float, alive) -> None:
    known = collect_targets(run_dir)
    while alive():
        time.sleep(refresh_s)
        current = collect_targets(run_dir)
        if current != known:  # rewrite only on change: every write makes Prometheus re-read the list
            write_file_sd(current, run_dir / "metrics" / "targets.json", run)
            known = current
