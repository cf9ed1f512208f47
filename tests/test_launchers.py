"""Every launcher's environment, injected: the identity rapid reads from it (rank, world size, local rank, local
size) and the device a rank then takes; the check that refuses two ranks on one GPU by their UUIDs, over a real
torch key-value store. The environments are what each launcher sets: MPICH's, torchrun's and a heterogeneous
srun step's as captured from the real ones on this machine (Debian's Slurm 22.05 for srun; the real srun itself
runs in tests/test_srun_identity.py), the multi-node srun, Open MPI and MPIJob ones from their documentation,
with the variables that must not be read (SLURM_NTASKS_PER_NODE) included where the launcher sets them."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist

import rapid.infra.identity as identity_module
from rapid.cli import main
from rapid.infra.distributed import Identity, LayoutError, Placement, check_placements, placement_problem
from rapid.infra.distributed import choose_device_and_backend as device_for
from rapid.infra.identity import detect_identity, identity_from_env, tasks_per_node

TORCHRUN = {"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "OMP_NUM_THREADS": "1", "RANK": "5", "ROLE_RANK": "5",
            "ROLE_WORLD_SIZE": "8", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_RUN_ID": "c0ffee",
            "TORCHELASTIC_USE_AGENT_STORE": "True", "WORLD_SIZE": "8"}
SRUN_STEP = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
             "SLURM_NTASKS": "8", "SLURM_NPROCS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "6",
             "SLURM_LOCALID": "2", "SLURM_NODEID": "1", "SLURM_GTIDS": "4,5,6,7", "SLURMD_NODENAME": "gpu2",
             "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}

# (launcher, environment, GPUs the rank sees, expected (rank, size, local rank, local size, launcher), device)
LAUNCHERS = [
    ("MPICH mpiexec -n 4 (without mpi4py)",
     {"PMI_RANK": "2", "PMI_SIZE": "4", "PMI_FD": "9", "PMI_HOSTNAME": "vm", "MPI_LOCALRANKID": "2",
      "MPI_LOCALNRANKS": "4"}, 4, (2, 4, 2, 4, "mpich"), "cuda:2"),
    ("Open MPI mpirun -n 16 on 2 nodes (without mpi4py)",
     {"OMPI_COMM_WORLD_RANK": "11", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "OMPI_COMM_WORLD_NODE_RANK": "3", "OMPI_UNIVERSE_SIZE": "16",
      "PMIX_RANK": "11", "PMIX_NAMESPACE": "prterun-node0-1234@1"}, 8, (11, 16, 3, 8, "openmpi"), "cuda:3"),
    ("srun -N2 --ntasks-per-node=4", {**SRUN_STEP, "SLURM_NTASKS_PER_NODE": "4"}, 4, (6, 8, 2, 4, "slurm"),
     "cuda:2"),
    ("srun -N4 -n7 (no --ntasks-per-node: 2, 2, 2, 1 tasks)",
     {**SRUN_STEP, "SLURM_NNODES": "4", "SLURM_NTASKS": "7", "SLURM_NPROCS": "7", "SLURM_PROCID": "5",
      "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_GTIDS": "4,5", "SLURM_TASKS_PER_NODE": "2(x3),1",
      "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}, 8, (5, 7, 1, 2, "slurm"), "cuda:1"),
    ("srun -N4 -n7, the node with one task",
     {**SRUN_STEP, "SLURM_NTASKS": "7", "SLURM_PROCID": "6", "SLURM_LOCALID": "0", "SLURM_NODEID": "3",
      "SLURM_GTIDS": "6", "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}, 8,
     (6, 7, 0, 1, "slurm"), "cuda:0"),
    ("srun -N4 -n7 without SLURM_GTIDS and SLURM_STEP_*: the count of SLURM_TASKS_PER_NODE at SLURM_NODEID",
     {"SLURM_JOB_ID": "42", "SLURM_NNODES": "4", "SLURM_NTASKS": "7", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
      "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "2(x3),1"}, 8, (5, 7, 1, 2, "slurm"), "cuda:1"),
    ("srun -p gpu -n 1 : -p cpu -n 2 (heterogeneous: SLURM_NODEID follows the components, the counts the names)",
     {"SLURM_HET_SIZE": "2", "SLURM_JOB_NODELIST": "cpu1,gpu1", "SLURM_LOCALID": "1", "SLURM_NNODES": "2",
      "SLURM_NODEID": "1", "SLURM_NPROCS": "3", "SLURM_NTASKS": "3", "SLURM_PROCID": "2", "SLURM_STEP_ID": "0",
      "SLURM_STEP_NODELIST": "cpu1,gpu1", "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1",
      "SLURM_TASKS_PER_NODE": "2,1", "SLURM_GTIDS": "1,2", "SLURMD_NODENAME": "cpu1"}, 0, (2, 3, 1, 2, "slurm"),
     "cpu"),
    ("srun -N2 --ntasks-per-node=4 --gpus-per-task=1 (one GPU bound to each task)",
     {**SRUN_STEP, "SLURM_NTASKS_PER_NODE": "4", "SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "2"}, 1,
     (6, 8, 2, 4, "slurm"), "cuda:0"),
    ("srun --mpi=pmi2 -N2 --ntasks-per-node=4 (PMI without a local rank: Slurm's variables tell it)",
     {**SRUN_STEP, "PMI_RANK": "6", "PMI_SIZE": "8", "PMI_FD": "7"}, 4, (6, 8, 2, 4, "slurm"), "cuda:2"),
    ("torchrun --nnodes 2 --nproc_per_node 4", TORCHRUN, 4, (5, 8, 1, 4, "torchrun"), "cuda:1"),
    ("srun -N2 --ntasks-per-node=1 torchrun --nproc_per_node 4 (torchrun is the inner launcher)",
     {**SRUN_STEP, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_GTIDS": "1",
      "SLURM_TASKS_PER_NODE": "1(x2)",
      "SLURM_STEP_TASKS_PER_NODE": "1(x2)", **TORCHRUN}, 4, (5, 8, 1, 4, "torchrun"), "cuda:1"),
    ("Kubernetes MPIJob (MPICH), 4 pods x 8 slots, a rank on worker 1",
     {"PMI_RANK": "13", "PMI_SIZE": "32", "PMI_FD": "9", "PMI_HOSTNAME": "rapid-optimizer-worker-1",
      "MPI_LOCALRANKID": "5", "MPI_LOCALNRANKS": "8", "HOSTNAME": "rapid-optimizer-worker-1",
      "RAPID_MASTER_ADDR": "rapid-optimizer-worker-0.rapid-optimizer-worker", "KUBERNETES_SERVICE_HOST": "10.0.0.1",
      "OMP_NUM_THREADS": "1"}, 8, (13, 32, 5, 8, "mpich"), "cuda:5"),
    ("Kubernetes MPIJob (Open MPI), 4 pods x 8 slots, a rank on worker 3",
     {"OMPI_COMM_WORLD_RANK": "30", "OMPI_COMM_WORLD_SIZE": "32", "OMPI_COMM_WORLD_LOCAL_RANK": "6",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "PMIX_RANK": "30", "HOSTNAME": "rapid-optimizer-worker-3",
      "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, 8, (30, 32, 6, 8, "openmpi"), "cuda:6"),
    ("RAPID_* by hand win over Slurm's",
     {**SRUN_STEP, "RAPID_RANK": "1", "RAPID_WORLD_SIZE": "3", "RAPID_LOCAL_RANK": "0",
      "RAPID_LOCAL_WORLD_SIZE": "1"}, 2, (1, 3, 0, 1, "rapid"), "cuda:0"),
]


@pytest.mark.parametrize("env, gpus, expected, device", [case[1:] for case in LAUNCHERS],
                         ids=[case[0] for case in LAUNCHERS])
def test_each_launcher_gives_rank_local_rank_world_size_and_device(env, gpus, expected, device):
    found = identity_from_env(env, "host")
    assert (found.rank, found.size, found.local_rank, found.local_size, found.launcher) == expected
    backend = "nccl" if device.startswith("cuda") else "gloo"
    assert device_for("auto", found.local_rank, found.local_size, gpus > 0, gpus) == (device, backend)
    assert device_for("auto", found.local_rank, found.local_size, False, 0) == ("cpu", "gloo")


def test_slurm_tasks_per_node_forms():
    assert tasks_per_node("8") == [8]
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("1,3(x2),2") == [1, 3, 3, 2]
    for bad in ("", "2(x)", "x3", "2(3)", "-1"):
        with pytest.raises(LayoutError, match="SLURM_TASKS_PER_NODE"):
            tasks_per_node(bad)


@pytest.mark.parametrize("env, words", [
    ({"RANK": "3", "WORLD_SIZE": "2"}, "torchrun says rank 3 of 2"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' is not a whole number"),
    ({**SRUN_STEP, "SLURM_GTIDS": "", "SLURM_NODEID": "2"}, "SLURM_GTIDS='' is not a list of whole numbers"),
    ({**{k: v for k, v in SRUN_STEP.items() if k != "SLURM_GTIDS"}, "SLURM_NODEID": "2"},
     "SLURM_NODEID=2 but SLURM_STEP_TASKS_PER_NODE='4(x2)' names 2 node"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"}, "without SLURM_GTIDS or SLURM_TASKS_PER_NODE"),
    ({**SRUN_STEP, "SLURM_GTIDS": "4,5,x"}, "SLURM_GTIDS='4,5,x' is not a list of whole numbers"),
    ({**SRUN_STEP, "SLURM_GTIDS": "0,1"}, "SLURM_PROCID=6 is not among this node's SLURM_GTIDS='0,1'"),
    ({**SRUN_STEP, "SLURM_LOCALID": "4"}, "local rank 4 of 4"),
])
def test_launcher_variables_that_contradict_each_other_are_one_clear_error(env, words):
    with pytest.raises(LayoutError, match=words.replace("(", r"\(").replace(")", r"\)")):
        identity_from_env(env, "host")


def test_no_launcher_is_none():
    assert identity_from_env({"PATH": "/bin", "SLURM_JOB_ID": "42"}, "host") is None


def test_torchrun_under_an_mpi_launcher_never_touches_mpi(monkeypatch):
    """srun --mpi=pmix torchrun …: PMIx's variables describe torchrun's agent; initializing MPI in each of its
    workers would give every worker the agent's rank."""
    for name, value in {**TORCHRUN, "PMIX_RANK": "1", "PMI_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    for name in ("RAPID_RANK", "RAPID_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def no_mpi():
        raise AssertionError("MPI initialized under torchrun")
    monkeypatch.setattr(identity_module, "mpi", no_mpi)
    found = detect_identity()
    assert (found.rank, found.size, found.local_rank, found.local_size, found.launcher) == (5, 8, 1, 4, "torchrun")


# Eight ranks of one node, each seeing only the GPU bound to it: all take cuda:0, and each cuda:0 is another GPU.
BOUND = [Placement(r, "gpu1", "nccl", "cuda:0", f"GPU-{r:04d}") for r in range(8)]


def test_ranks_with_a_gpu_each_pass_two_on_one_are_refused():
    assert placement_problem(BOUND) == ""
    assert placement_problem([Placement(r, f"n{r}", "gloo", "cpu") for r in range(4)]) == ""  # CPUs: no GPU
    # Two ranks that see the node's two GPUs while four ranks run there: each takes cuda:0, the same GPU.
    shared = [Placement(r, "gpu1", "nccl", device_for("auto", r, 4, True, 2)[0], "GPU-aaaa")
              for r in range(2)]
    assert placement_problem(shared).startswith("ranks 0 (gpu1, cuda:0) and 1 (gpu1, cuda:0) would share one GPU "
                                                "(GPU-aaaa): start at most one rank per GPU")
    mixed = [*BOUND[:3], Placement(3, "gpu2", "gloo", "cpu")]
    assert placement_problem(mixed) == ("rank 3 on gpu2 trains on cpu (gloo) but rank 0 on gpu1 on cuda:0 (nccl): "
                                        "every rank needs the same kind of device")


def meet(placements: list[Placement]) -> list[str]:
    """Every rank's outcome of the placement check, each rank a thread with its own client of a real TCPStore."""
    timeout = datetime.timedelta(seconds=10)
    master = dist.TCPStore("127.0.0.1", 0, len(placements), is_master=True, timeout=timeout, wait_for_workers=False)
    outcomes = [""] * len(placements)

    def rank(p: Placement) -> None:
        store = master if p.rank == 0 else dist.TCPStore("127.0.0.1", master.port, len(placements), False,
                                                         timeout=timeout)
        me = Identity(p.rank, len(placements), p.rank, len(placements), p.host, "rapid")
        try:
            check_placements(store, me, p)
            outcomes[p.rank] = "ok"
        except LayoutError as e:
            outcomes[p.rank] = str(e)
    threads = [threading.Thread(target=rank, args=(p,)) for p in placements]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcomes


def test_the_placement_check_stops_every_rank_or_none_over_a_real_store():
    assert meet(BOUND[:4]) == ["ok"] * 4
    clash = [*BOUND[:3], Placement(3, "gpu1", "nccl", "cuda:0", BOUND[1].gpu)]
    outcomes = meet(clash)
    assert len(set(outcomes)) == 1 and "ranks 1 (gpu1, cuda:0) and 3 (gpu1, cuda:0) would share" in outcomes[0]


def test_a_launcher_that_contradicts_itself_stops_the_role_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "one")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["optimizer"]) == 2
    assert capsys.readouterr().err.splitlines() == ["rapid: error: RANK='one' is not a whole number"]


def test_rank_0_hosting_the_store_leaves_only_once_every_rank_read_the_verdict():
    """Rank 0 hosts the store under MPI: had it left as soon as it posted a refusal, a slower rank would read the
    verdict from a store that was gone and end with a traceback, not the line (seen in the suite under load)."""
    timeout = datetime.timedelta(seconds=5)
    clash = [BOUND[0], Placement(1, "gpu1", "nccl", "cuda:0", BOUND[0].gpu)]
    port: list[int] = []
    outcomes = [""] * 2

    class Slow:  # rank 1's client: it reads the verdict half a second late
        def __init__(self, store):
            self.store = store

        def get(self, key):
            time.sleep(0.5)
            return self.store.get(key)

        def __getattr__(self, name):
            return getattr(self.store, name)

    def rank0() -> None:
        master = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=timeout, wait_for_workers=False)
        port.append(master.port)
        try:
            check_placements(master, Identity(0, 2, 0, 2, "gpu1", "mpi"), clash[0])
        except LayoutError as e:
            outcomes[0] = str(e)
        del master  # the process ends: its store goes with it

    def rank1() -> None:
        while not port:
            time.sleep(0.01)
        store = Slow(dist.TCPStore("127.0.0.1", port[0], 2, False, timeout=timeout))
        try:
            check_placements(store, Identity(1, 2, 1, 2, "gpu1", "mpi"), clash[1])
        except LayoutError as e:
            outcomes[1] = str(e)
        except Exception as e:  # noqa: BLE001 - what rank 1 met instead of the line is the finding
            outcomes[1] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=rank0), threading.Thread(target=rank1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes[0] == outcomes[1] and "would share" in outcomes[0], outcomes


def test_a_pinned_run_sizes_itself_by_the_cores_it_may_use(monkeypatch):
    """A run pinned to 2 of 16 cores (taskset, a container's cpuset, Slurm's binding) starts 1 rollout worker
    and 1 decode process, not the 15 and 2 that the machine's count gives: 8 such runs on a 16-core box once
    ran 15 workers each, and learnt a tenth as fast."""
    from rapid.optimizer.decode_pool import auto_workers
    from rapid.roles.launcher import default_workers

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {6, 7}, raising=False)
    assert default_workers() == 1 and auto_workers() == 1


def test_usable_cpus_reads_the_affinity_a_launcher_sets():
    script = "import os; from rapid.infra.identity import usable_cpus; print(usable_cpus(), os.cpu_count())"
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "1" and int(out[1]) >= 2, out
