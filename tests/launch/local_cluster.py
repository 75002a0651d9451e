"""A real two-node Ray cluster on this machine, started with launch/ray/start_head.sh and
start_worker.sh, and stopped by signalling only the processes those scripts started.

Other people run Ray on the same machine at the same time: nothing here calls `ray stop`. Each node
gets its own --temp-dir under the test's tmp path, free ports, its own worker-port range, and runs
in the foreground (RAY_BLOCK=1) in its own process group; stopping a node signals that group and
then any process of its tree that outlived it (Ray starts workers in their own sessions).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch" / "ray"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def free_ports(count: int, avoid: set[int] = frozenset(), low: int = 30000, high: int = 60000) -> list[int]:
    """``count`` distinct ports that are free now and not in ``avoid`` (random, so parallel sessions rarely
    collide)."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(low, high)
        if port not in ports and port not in avoid and _port_free(port):
            ports.append(port)
    return ports


def free_range(size: int, avoid: set[int] = frozenset(), low: int = 30000, high: int = 60000) -> range:
    """A block of ``size`` consecutive free ports, none in ``avoid`` (Ray's worker-port range for one node)."""
    for _ in range(200):
        start = random.randint(low, high - size)
        block = range(start, start + size)
        if avoid.isdisjoint(block) and all(_port_free(p) for p in block[::7]) and _port_free(block[-1]):
            return block
    raise RuntimeError("no free port range")


def port_plan(nodes: int, singles: int, range_size: int = 200) -> tuple[list[range], list[int]]:
    """One worker-port range per node and ``singles`` other ports, all disjoint.

    Ray refuses to start a node whose fixed ports fall inside its own worker-port range, and two nodes on
    one host must not share worker ports; choosing each independently collided about once in a hundred
    cluster starts (the worker's agent port once landed in its worker range)."""
    taken: set[int] = set()
    ranges = []
    for _ in range(nodes):
        block = free_range(range_size, avoid=taken)
        taken.update(block)
        ranges.append(block)
    return ranges, free_ports(singles, avoid=taken)


@dataclass
class NodeProc:
    name: str
    proc: subprocess.Popen
    log: Path
    tree: dict[int, float] = field(default_factory=dict)  # pid -> create_time, for a safe kill

    def remember_tree(self) -> None:
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                self.tree[p.pid] = p.create_time()
        except psutil.NoSuchProcess:
            pass


@dataclass
class LocalCluster:
    root: Path
    gcs_address: str
    dashboard_url: str
    env: dict[str, str]
    nodes: list[NodeProc] = field(default_factory=list)

    def logs(self) -> str:
        return "\n".join(f"==== {n.name}\n{n.log.read_text()[-3000:]}" for n in self.nodes if n.log.exists())

    def stop(self, grace_s: float = 10.0) -> list[int]:
        """Stop our nodes only. Returns the pids that had to be killed after the grace period."""
        for node in self.nodes:
            node.remember_tree()
        for node in reversed(self.nodes):
            if node.proc.poll() is None:
                try:
                    os.killpg(node.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        survivors: list[int] = []
        for node in self.nodes:
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        time.sleep(1.0)
        for node in self.nodes:
            for pid, created in node.tree.items():
                try:
                    proc = psutil.Process(pid)
                    if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                        proc.kill()
                        survivors.append(pid)
                except psutil.NoSuchProcess:
                    pass
            if node.proc.poll() is None:
                node.proc.kill()
            node.proc.wait(timeout=10)
        return survivors

    def own_processes(self) -> list[int]:
        """Processes still alive that mention our temp dir (none after stop())."""
        mine = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if any(str(self.root) in part for part in proc.info["cmdline"] or []):
                    mine.append(proc.info["pid"])
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return mine


def _wait_for(predicate, timeout: float, what: str, cluster: LocalCluster) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for node in cluster.nodes:
            if node.proc.poll() is not None:
                raise RuntimeError(
                    f"{node.name} exited ({node.proc.returncode}) while waiting for {what}\n{cluster.logs()}"
                )
        time.sleep(0.5)
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s\n{cluster.logs()}")


def start_cluster(
    root: Path, shared_dir: Path, num_cpus: int = 8, num_gpus: int = 1, timeout: float = 120
) -> LocalCluster:
    """Head + one worker node on this machine, each with ``num_gpus`` logical GPU slots."""
    root.mkdir(parents=True, exist_ok=True)
    (head_range, worker_range), (gcs, dash, client, agent_h, agent_w) = port_plan(nodes=2, singles=5)
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    base.update(
        RAY_NODE_IP="127.0.0.1",  # Ray maps loopback to the host's own address; nothing leaves the machine
        RAY_DASHBOARD_HOST="127.0.0.1",
        RAY_NUM_CPUS=str(num_cpus),
        RAY_NUM_GPUS=str(num_gpus),
        RAY_BLOCK="1",
        STAPO_CHECKPOINT_DIR=str(shared_dir),
        RAY_USAGE_STATS_ENABLED="0",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
    )
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        if key in os.environ:
            base[key] = os.environ[key]
    cluster = LocalCluster(root=root, gcs_address="", dashboard_url=f"http://127.0.0.1:{dash}", env=base)

    def launch(name: str, script: str, ports: range, extra: dict[str, str]) -> NodeProc:
        env = dict(
            base, RAY_TEMP_DIR=str(root / name), RAY_MIN_WORKER_PORT=str(ports[0]),
            RAY_MAX_WORKER_PORT=str(ports[-1]), **extra
        )
        log = root / f"{name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                ["bash", str(LAUNCH / script)], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                start_new_session=True,
            )
        node = NodeProc(name, proc, log)
        cluster.nodes.append(node)
        return node

    def started(node: NodeProc) -> bool:
        return "Ray runtime started" in node.log.read_text()

    try:
        head_ports = dict(
            RAY_HEAD_PORT=str(gcs), RAY_DASHBOARD_PORT=str(dash), RAY_CLIENT_PORT=str(client),
            RAY_DASHBOARD_AGENT_LISTEN_PORT=str(agent_h),
        )
        head = launch("head", "start_head.sh", head_range, head_ports)
        _wait_for(lambda: started(head), timeout, "the head node", cluster)
        text = head.log.read_text()
        marker = "ray start --address='"
        cluster.gcs_address = text[text.index(marker) + len(marker):].split("'")[0]
        worker = launch("worker", "start_worker.sh", worker_range, dict(RAY_HEAD_ADDRESS=cluster.gcs_address,
                                                          RAY_DASHBOARD_AGENT_LISTEN_PORT=str(agent_w)))
        _wait_for(lambda: started(worker), timeout, "the worker node", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def smoke(cluster: LocalCluster, *overrides: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`stapo doctor --smoke --json` with the tiny CPU preset in place of the GPU smoke preset, 2 nodes x 1 slot."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "stapo.cli", "doctor", "--smoke", "--json", *flags, "--address", cluster.dashboard_url,
         "model_preset=tiny", "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
         *overrides],
        check=False, cwd=REPO, env=cluster.env, capture_output=True, text=True, timeout=900,
    )
    print(f"[smoke] {' '.join(overrides)}: rc={result.returncode} in {time.monotonic() - started:.0f} s")
    return result
