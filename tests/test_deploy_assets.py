"""The deployment assets in ``infra/deploy`` (Slurm, Kubernetes, Docker, compose) are plain files that CI
cannot run (no Slurm, Kubernetes or Docker here), so check what can be checked: they parse, every rapid
command they start is a real console script of this package, every file they mount exists, and the
sbatch script is valid bash.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "infra" / "deploy"
SCRIPTS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
SHM = "/dev/shm"
_RAPID_WORD = re.compile(r"(?<![\w./-])(rapid(?:-[a-z]+)?)(?![\w./-])")


def rapid_commands(text: str) -> set[str]:
    """Words that are used as a rapid command: ``rapid``/``rapid-…`` followed by a subcommand or flag."""
    found = set()
    for line in text.splitlines():
        for match in _RAPID_WORD.finditer(line):
            rest = line[match.end():].lstrip()
            if rest.startswith(("--", "\"${", "train", "optimizer", "rollout", "league", "eval", "monitor",
                                "inference")):
                found.add(match.group(1))
    return found


def test_every_deploy_asset_listed_in_the_brief_exists():
    for rel in ("slurm/rapid.sbatch", "k8s/optimizer-mpijob.yaml", "k8s/rollout-deployment.yaml",
                "k8s/inference-daemonset.yaml", "k8s/secret-example.yaml", "docker/Dockerfile", "compose.yaml"):
        assert (DEPLOY / rel).is_file(), rel


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path):
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert documents and all(isinstance(d, dict) for d in documents)


def _containers(doc: dict) -> list[dict]:
    if doc["kind"] == "MPIJob":
        specs = doc["spec"]["mpiReplicaSpecs"].values()
        return [c for s in specs for c in s["template"]["spec"]["containers"]]
    return doc["spec"]["template"]["spec"]["containers"]


def test_kubernetes_workloads_run_real_console_scripts():
    mpijob = yaml.safe_load((DEPLOY / "k8s/optimizer-mpijob.yaml").read_text())
    assert (mpijob["apiVersion"], mpijob["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    (launcher,) = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    command = launcher["command"]
    assert command[0] in ("mpiexec", "mpirun") and "rapid-optimizer" in command
    ranks = int(command[command.index("-n") + 1])
    workers = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]
    assert ranks == workers["replicas"] * mpijob["spec"]["slotsPerWorker"]
    (worker,) = workers["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == mpijob["spec"]["slotsPerWorker"]

    deployment = yaml.safe_load((DEPLOY / "k8s/rollout-deployment.yaml").read_text())
    assert deployment["kind"] == "Deployment"
    (rollout,) = _containers(deployment)
    shell = " ".join(rollout["args"])
    assert shlex.split(shell)[:2] == ["exec", "rapid-rollout"]
    env = {e["name"]: e for e in rollout["env"]}
    assert env["RAPID_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # The seed expression is valid POSIX shell and gives different seeds to different pods.
    seeds = {subprocess.run(["sh", "-c", "echo " + shell.split("--seed ", 1)[1]], capture_output=True, text=True,
                            env={"RAPID_WORKER_ID": name, "PATH": "/usr/bin:/bin"}, check=True).stdout.strip()
             for name in ("rapid-rollout-7c9f-a1", "rapid-rollout-7c9f-b2")}
    assert len(seeds) == 2 and all(s.isdigit() for s in seeds)

    secret = yaml.safe_load((DEPLOY / "k8s/secret-example.yaml").read_text())
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"} <= set(secret["stringData"])
    for container in (launcher, worker, rollout):
        assert {"secretRef": {"name": secret["metadata"]["name"]}} in container["envFrom"]


def test_the_rollout_pods_of_a_node_share_one_node_cache(tmp_path):
    """Issue 31: every rollout pod mounts the same folder of its node and points rollout.node_cache_dir at it,
    so the pods of a node fetch a version once and read params/LATEST once per poll interval, not each."""
    from rapid.run.config_files import load_config

    deployment = yaml.safe_load((DEPLOY / "k8s/rollout-deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    (rollout,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (cache,) = [m for m in rollout["volumeMounts"] if "hostPath" in volumes[m["name"]] and m["mountPath"] != SHM]
    host = volumes[cache["name"]]["hostPath"]
    assert host["path"].startswith("/") and "$" not in host["path"]  # one fixed path on every node
    assert host["type"] == "DirectoryOrCreate" and not cache.get("readOnly") and "subPath" not in cache
    words = shlex.split(" ".join(rollout["args"]))
    overrides = [words[i + 1] for i, w in enumerate(words) if w in ("--set", "-s")]
    configmap = yaml.safe_load((DEPLOY / "k8s/config-example.yaml").read_text())
    (tmp_path / "run.toml").write_text(configmap["data"]["run.toml"])
    cfg = load_config(tmp_path / "run.toml", overrides)
    assert cfg.rollout.node_cache_dir == cache["mountPath"]  # rapid adds the run id below it


def _host_mounts(path: str) -> dict[str, str]:
    """{mount path: host path} of every hostPath volume the pod template's one container mounts."""
    pod = yaml.safe_load((DEPLOY / path).read_text())["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    mounts = {}
    for m in container["volumeMounts"]:
        host = volumes[m["name"]].get("hostPath")
        if host is not None:
            assert not m.get("readOnly") and "subPath" not in m, m
            mounts[m["mountPath"]] = host["path"]
    return mounts


def test_the_rollout_pods_and_the_node_server_share_the_hosts_shared_memory():
    """Issue 32: a worker's slots are a POSIX shared-memory block (in /dev/shm), and a pod's /dev/shm is its own,
    so the rollout pods and the node's inference server must all mount the same folder of the host's /dev/shm
    there (a folder of it, not hostIPC: the least the server needs)."""
    rollout, server = _host_mounts("k8s/rollout-deployment.yaml"), _host_mounts("k8s/inference-daemonset.yaml")
    host = rollout.get(SHM)
    assert host is not None and (host == SHM or host.startswith(SHM + "/")), rollout  # in RAM, the host's tmpfs
    assert server == rollout  # the same node cache folder and the same shared memory, at the same paths
    for path in ("k8s/rollout-deployment.yaml", "k8s/inference-daemonset.yaml"):
        pod = yaml.safe_load((DEPLOY / path).read_text())["spec"]["template"]["spec"]
        assert not pod.get("hostIPC"), path


def test_the_node_server_meets_the_rollout_pods_in_one_folder(tmp_path):
    """Uncommenting the config example's node inference lines turns it on; the DaemonSet's server and the rollout
    pods then derive the same node folder (socket, lock) from their config and overrides."""
    from rapid.cli import build_parser
    from rapid.rollout.inference_client import node_folder
    from rapid.run.config_files import load_config

    text = yaml.safe_load((DEPLOY / "k8s/config-example.yaml").read_text())["data"]["run.toml"]
    switched = re.sub(r"^(\s*)# (inference(?:_spawn)? = )", r"\1\2", text, flags=re.M)
    assert switched != text
    (tmp_path / "run.toml").write_text(switched)
    rollout_pod = yaml.safe_load((DEPLOY / "k8s/rollout-deployment.yaml").read_text())
    words = shlex.split(" ".join(_containers(rollout_pod)[0]["args"]))
    rollout_cfg = load_config(tmp_path / "run.toml", [words[i + 1] for i, w in enumerate(words) if w == "--set"])
    assert (rollout_cfg.rollout.inference, rollout_cfg.rollout.inference_spawn) == ("node", False)

    daemonset = yaml.safe_load((DEPLOY / "k8s/inference-daemonset.yaml").read_text())
    assert daemonset["kind"] == "DaemonSet"
    (server,) = _containers(daemonset)
    assert server["command"][:2] == ["rapid", "inference"]
    args = build_parser().parse_args(server["command"][1:])
    server_cfg = load_config(tmp_path / "run.toml", args.set)
    assert node_folder(server_cfg, "r1") == node_folder(rollout_cfg, "r1")
    (cache_mount,) = _host_mounts("k8s/inference-daemonset.yaml").keys() - {SHM}
    assert node_folder(server_cfg, "r1").parent == Path(cache_mount)  # on the node, not in the container
    assert {"secretRef": {"name": "rapid-s3"}} in server["envFrom"]  # it reads the parameters from the store
    assert server["ports"] == [{"name": "metrics-0", "containerPort": server_cfg.metrics.base_port}]


def test_config_example_is_a_valid_rapid_config():
    from rapid.run.config_files import build_config

    configmap = yaml.safe_load((DEPLOY / "k8s/config-example.yaml").read_text())
    cfg = build_config(tomllib.loads(configmap["data"]["run.toml"]))
    assert cfg.store.url.startswith("s3://")
    assert cfg.optimizer.batch_samples % cfg.optimizer.microbatch_samples == 0


def test_every_rapid_command_in_the_assets_is_a_console_script():
    used = set()
    for path in [DEPLOY / "slurm/rapid.sbatch", DEPLOY / "docker/Dockerfile", *YAML_FILES]:
        commands = rapid_commands(path.read_text())
        assert commands <= SCRIPTS, f"{path.name}: {sorted(commands - SCRIPTS)} are not console scripts"
        used |= commands
    assert {"rapid", "rapid-optimizer", "rapid-rollout"} <= used


def test_sbatch_script_is_valid_bash_and_starts_both_roles():
    path = DEPLOY / "slurm/rapid.sbatch"
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    text = path.read_text()
    assert "#SBATCH hetjob" in text and "AWS_ENDPOINT_URL" in text
    steps = [line.strip() for line in text.splitlines() if line.strip().startswith("srun ")]
    assert any("--het-group=0" in s and "--kill-on-bad-exit=1" in s for s in steps), steps
    assert any("--het-group=1" in s for s in steps), steps


def test_sbatch_rollouts_share_a_node_local_cache_not_the_run_dir():
    """Issue 31: in the shared run dir the node cache's lock would be one flock over NFS/Lustre for every node."""
    text = (DEPLOY / "slurm/rapid.sbatch").read_text()
    (assign,) = [line for line in text.splitlines() if line.startswith("NODE_CACHE=")]
    folder = subprocess.run(["bash", "-c", f'{assign}; echo "$NODE_CACHE"'], capture_output=True, text=True,
                            env={"SLURM_JOB_ID": "7", "RAPID_RUN_DIR": "/shared/runs/x", "PATH": "/usr/bin:/bin"},
                            check=True).stdout.strip()
    assert folder == "/tmp/rapid-node-cache-7"
    steps = [line.strip() for line in text.replace("\\\n", " ").splitlines() if line.strip().startswith("srun ")]
    (rollouts,) = [s for s in steps if "rapid-rollout" in s]
    assert "--het-group=1" in rollouts and '--set "rollout.node_cache_dir=\\"$NODE_CACHE\\""' in rollouts
    assert any("--het-group=1" in s and s.endswith('rm -rf "$NODE_CACHE" || true') for s in steps), steps


def test_compose_mounts_files_that_exist():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert {"minio", "prometheus", "grafana"} <= set(compose["services"])
    mounted = []
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                mounted.append((DEPLOY / source).resolve())
    assert ROOT / "monitoring" / "grafana-dashboard.json" in mounted
    assert ROOT / "monitoring" / "prometheus.yml" in mounted and ROOT / "monitoring" / "alerts.yml" in mounted
    missing = [str(p) for p in mounted if not p.exists()]
    assert not missing, missing


def test_dockerfile_installs_torch_from_a_build_arg_index_then_the_package():
    text = (DEPLOY / "docker/Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.\d+-slim", text, re.M)
    assert re.search(r"^ARG TORCH_INDEX=", text, re.M)
    torch_line = next(i for i, line in enumerate(text.splitlines()) if "pip install" in line and "torch" in line)
    package_line = next(i for i, line in enumerate(text.splitlines()) if re.search(r"pip install \"?\.", line))
    assert "--index-url \"$TORCH_INDEX\"" in text.splitlines()[torch_line] and torch_line < package_line
    for source in re.findall(r"^COPY (\S+) ", text, re.M):
        assert (ROOT / source).exists(), source
