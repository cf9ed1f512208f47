"""The deploy assets and docs/cluster.md as a user pastes them (issue 24): what they run works as written."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib

import yaml

from rapid.cli import build_parser
from rapid.run.config_files import build_config, load_config
from tests.test_deploy_assets import DEPLOY, ROOT

CLUSTER_MD = ROOT / "docs" / "cluster.md"


def test_docker_build_context_leaves_runs_and_virtual_environments_out():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"runs/", ".venv/", ".git/"} <= set(ignored)


def test_the_image_lets_mpi_operator_ssh_in_with_secret_mounted_keys(tmp_path):
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    written = dict(re.findall(r"printf '([^']*)' > (/etc/ssh/\S+)", text))
    client = {path: body for body, path in written.items() if path.startswith("/etc/ssh/ssh_config.d/")}
    server = {path: body for body, path in written.items() if path.startswith("/etc/ssh/sshd_config.d/")}
    assert list(server.values()) == ["StrictModes no\\n"]
    (path, body), = client.items()
    config = tmp_path / "ssh_config"
    subprocess.run(["sh", "-c", f"printf '{body}' > {config}"], check=True)
    effective = subprocess.run(["ssh", "-G", "-F", str(config), "rapid-optimizer-worker-1.rapid-optimizer-worker"],
                               capture_output=True, text=True, check=True).stdout.splitlines()
    assert "stricthostkeychecking false" in effective and "userknownhostsfile /dev/null" in effective


def test_the_mpijob_names_rank_0_reachably_and_every_rank_is_a_scrape_target():
    job = yaml.safe_load((DEPLOY / "k8s" / "optimizer-mpijob.yaml").read_text())
    name, slots = job["metadata"]["name"], job["spec"]["slotsPerWorker"]
    (launcher,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    genv = [launcher["command"][i + 1] for i, word in enumerate(launcher["command"]) if word == "-genv"]
    # mpi-operator names worker i's pod <job>-worker-<i> under the headless Service <job>-worker.
    assert f"RAPID_MASTER_ADDR={name}-worker-0.{name}-worker" in genv
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    assert worker["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    cfg = load_config_map()
    ports = {p["name"]: p["containerPort"] for p in worker["spec"]["containers"][0]["ports"]}
    assert ports == {f"metrics-{k}": cfg.metrics.base_port + k for k in range(slots)}
    assert cfg.metrics.addr == "0.0.0.0"
    scrape = yaml.safe_load((DEPLOY / "k8s" / "prometheus-scrape.yaml").read_text())["scrape_configs"][0]
    keep = [r["regex"] for r in scrape["relabel_configs"] if r.get("action") == "keep"]
    assert all(re.fullmatch(keep[1], port) for port in ports) and scrape["honor_labels"] is True


def load_config_map():
    configmap = yaml.safe_load((DEPLOY / "k8s" / "config-example.yaml").read_text())
    return build_config(tomllib.loads(configmap["data"]["run.toml"]))


def test_the_compose_walk_trains_long_enough_to_update():
    text = (DEPLOY / "compose.yaml").read_text()
    (line,) = [ln[1:].strip() for ln in text.splitlines() if ln.lstrip("# ").startswith("rapid train")]
    args = build_parser().parse_args(shlex.split(line)[1:])
    cfg = load_config(args.config, [*args.set, *([f"run.minutes={args.minutes}"] if args.minutes else [])])
    assert cfg.run.minutes > 0 and 10 * cfg.rollout.upload_interval_s <= 60 * cfg.run.minutes, line


def shell_commands(markdown: str) -> list[str]:
    """The commands of the ```sh blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", markdown, re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split("  #")[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def test_every_rapid_command_in_cluster_md_parses_with_its_overrides():
    parser = build_parser()
    seen = 0
    for command in shell_commands(CLUSTER_MD.read_text()):
        words = shlex.split(command.replace("$PWD", "/tmp").replace("$IMAGE", "img"))
        words = words[:next((i for i, w in enumerate(words) if w in (">", "|", "&&", ";")), len(words))]
        for i, word in enumerate(words):
            if word in ("rapid", "rapid-optimizer", "rapid-rollout"):
                argv = words[i + 1:] if word == "rapid" else [word.split("-")[1], *words[i + 1:]]
                args = parser.parse_args(argv)
                if getattr(args, "set", None) is not None and args.command not in ("monitor", "league"):
                    load_config(None, args.set)  # every --set names a real key with a value of its type
                seen += 1
                break
    assert seen >= 12
