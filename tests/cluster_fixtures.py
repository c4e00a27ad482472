"""Real cluster daemons for tests: a single-host Slurm cluster and PostgreSQL behind `mlflow server`.

Both come from Debian's packages (``slurmctld slurmd munge``, ``postgresql``)
and are started without systemd, everything under a temp dir on private ports,
so they never touch a system instance. Tests that need them skip with the
reason printed when the packages are missing (``.ci/run`` installs them).

Usage from a test module::

    from cluster_fixtures import slurm_cluster_fixture  # noqa: F401 - the `slurm_cluster` fixture

Also runnable by hand, for poking at a cluster: ``python tests/cluster_fixtures.py slurm|nodes|team``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "scontrol", "scancel")
PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for d in ("/usr/sbin", "/sbin") if os.access(p := f"{d}/{name}", os.X_OK)), None
    )


def slurm_missing() -> str | None:
    """Why a Slurm cluster cannot be started here, or None."""
    missing = [b for b in SLURM_BINARIES if _which(b) is None]
    if missing:
        return f"Slurm not installed (missing {', '.join(missing)}; apt-get install slurmctld slurmd munge)"
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root (slurmd starts jobs as their user)"
    return None


@contextlib.contextmanager
def stopped_on_failure(daemons: SlurmCluster | TeamServer) -> Iterator[None]:
    """A start that fails half-way stops what it already started (no daemon outlives the tests)."""
    try:
        yield
    except BaseException:
        daemons.stop()
        raise


def skip_if(what: str, why: str | None) -> None:
    """Skip the tests that need these daemons, saying why on stderr too (seen without -ra)."""
    if why:
        print(f"\nSKIP {what} tests: {why}", file=sys.stderr)
        pytest.skip(why)


def _wait_for(check, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise RuntimeError(f"{what} did not come up within {timeout:.0f} s\n{tail}")


@dataclass
class SlurmCluster:
    """slurmctld + slurmd + a private munged, one node with ``cpus`` CPUs, partitions below.

    ``debug`` (default) holds the node without limits; ``short`` holds it with
    a 1-minute MaxTime, so a longer request is refused by sbatch.
    """

    root: Path
    cpus: int = 2
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        for d in ("state", "spool", "log", "munge"):
            (self.root / d).mkdir(exist_ok=True)
        self.node = socket.gethostname().split(".")[0]
        self._start_munge()
        self.conf.write_text(self._conf_text())
        self.conf.chmod(0o644)
        env = {**os.environ, **self.env}
        self._spawn([_which("slurmctld"), "-D", "-i"], env, self.root / "log" / "slurmctld.out")
        _wait_for(self._ctld_up, 30, "slurmctld", self.root / "log" / "slurmctld.log")
        self._spawn([_which("slurmd"), "-D", "-N", self.node], env, self.root / "log" / "slurmd.out")
        _wait_for(self._node_idle, 30, "slurmd", self.root / "log" / "slurmd.log")
        return self

    def _start_munge(self) -> None:
        m = self.root / "munge"
        key = m / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        self.munge_socket = m / "munge.socket"
        self._spawn(
            [_which("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
             f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"],
            dict(os.environ),
            m / "munged.out",
        )  # fmt: skip
        _wait_for(self.munge_socket.exists, 15, "munged", m / "munged.log")

    def _conf_text(self) -> str:
        r = self.root
        return "\n".join([
            "ClusterName=dstuitest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "EnforcePartLimits=ALL",  # sbatch refuses a job over a partition's limits (not: pending forever)
            # fast tests: a cancelled or timed-out job is killed 2 s after its SIGTERM,
            # and the controller looks at time limits and the queue often
            "KillWait=2",
            "OverTimeLimit=0",
            "MinJobAge=600",
            "SchedulerParameters=sched_interval=2",
            "MessageTimeout=20",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=8000 State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName=short Nodes={self.node} MaxTime=1 State=UP",
            "",
        ])  # fmt: skip

    def _spawn(self, argv: list, env: dict[str, str], out: Path) -> None:
        with open(out, "ab") as fh:
            self.procs.append(
                subprocess.Popen([str(a) for a in argv], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
            )  # fmt: skip

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, env={**os.environ, **self.env}, timeout=30)

    def _ctld_up(self) -> bool:
        return self.scontrol("ping").stdout.find("UP") >= 0

    def _node_idle(self) -> bool:
        out = self.scontrol("show", "node", self.node).stdout
        return "State=IDLE" in out

    def cancel_all(self) -> None:
        subprocess.run(["scancel", "--full", "-u", pwd.getpwuid(os.getuid()).pw_name], env={**os.environ, **self.env},
                       capture_output=True, timeout=30)  # fmt: skip

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.cancel_all()
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)


def _serving(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """Start a cluster, point SLURM_CONF at it while the fixture lasts, stop it and restore SLURM_CONF."""
    with stopped_on_failure(cluster):
        cluster.start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


@pytest.fixture(scope="session", name="slurm_cluster")
def slurm_cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running single-node Slurm cluster; SLURM_CONF points at it for the whole session."""
    skip_if("slurm", slurm_missing())
    root = Path(tmp_path_factory.mktemp("slurm"))
    yield from _serving(SlurmCluster(root))


# -- a multi-node Slurm cluster: one network namespace per node ------------------

NS_TOOLS = ("ip", "unshare", "nsenter")


def netns_cluster_missing() -> str | None:
    """Why the namespace cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "the two-node Slurm cluster needs root (network namespaces, veth links, a bridge, slurmd)"
    why = slurm_missing()
    if why:
        return why
    missing = [b for b in NS_TOOLS if _which(b) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install iproute2 util-linux)"
    probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True)
    if probe.returncode:
        return f"cannot create network namespaces here (unshare --net: {probe.stderr.strip()[:200]})"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _free_subnet() -> str:
    """A /24 of 10.0.0.0/8 that no address or route of this machine touches: 'a.b.c' of a.b.c.0/24."""
    used = _ip("-4", "-o", "addr", "show").stdout + _ip("-4", "route", "show", "table", "all").stdout
    for _ in range(200):
        third = os.urandom(2)
        prefix = f"10.{200 + third[0] % 50}.{third[1]}"
        if f"{prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.x.y.0/24 subnet for the namespace cluster")


@dataclass
class NamespaceCluster(SlurmCluster):
    """slurmctld + a private munged on this host, and ``nodes`` slurmds each in its own network namespace.

    Each node is a network namespace (``ip netns``) with its own hostname (a UTS
    namespace: ``node1``, ``node2``, ...), wired by a veth pair to a bridge that
    holds the controller's address; the addresses are a private /24 the cluster
    picks and no other interface of this machine uses. A ``hosts`` file in the cluster's folder
    is the cluster's "DNS" (bind-mounted on ``/etc/hosts`` in each node's own mount namespace),
    so a node name resolves to its address as on a real cluster. munge's socket,
    the spool and the run folders are shared through the file system, as a
    cluster's shared storage would be. :meth:`stop` kills every process in the
    namespaces and the daemons by PID, then deletes namespaces, links and files.
    """

    nodes: int = 2
    procs_by_node: dict[str, subprocess.Popen] = field(default_factory=dict)
    made: list[tuple[str, str]] = field(default_factory=list)  # ("netns"|"link", name), torn down in reverse

    @property
    def node_names(self) -> list[str]:
        return [f"node{i + 1}" for i in range(self.nodes)]

    def netns(self, node: str) -> str:
        return f"{self.tag}-{node}"

    def start(self) -> NamespaceCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        for d in ("state", "spool", "log", "munge"):
            (self.root / d).mkdir(exist_ok=True)
        self.tag = "dsc" + os.urandom(3).hex()
        self.node = socket.gethostname().split(".")[0]  # slurmctld runs here, in this host's network
        self.subnet = _free_subnet()
        self.ctl_addr = f"{self.subnet}.1"
        self.addrs = {n: f"{self.subnet}.{i + 2}" for i, n in enumerate(self.node_names)}
        self._network()
        self._start_munge()
        self.conf.write_text(self._conf_text())
        self.conf.chmod(0o644)
        env = {**os.environ, **self.env}
        self._spawn([_which("slurmctld"), "-D", "-i"], env, self.root / "log" / "slurmctld.out")
        _wait_for(self._ctld_up, 30, "slurmctld", self.root / "log" / "slurmctld.log")
        for n in self.node_names:
            self.start_node(n)
        _wait_for(self._node_idle, 60, "the nodes' slurmds", self.root / "log" / "slurmctld.log")
        return self

    def _network(self) -> None:
        bridge = f"{self.tag}br"
        _ip("link", "add", bridge, "type", "bridge")
        self.made.append(("link", bridge))
        _ip("addr", "add", f"{self.ctl_addr}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        hosts = "127.0.0.1 localhost\n" + f"{self.ctl_addr} {self.node}\n" + "".join(f"{a} {n}\n" for n, a in self.addrs.items())
        for i, n in enumerate(self.node_names):
            ns, veth = self.netns(n), f"{self.tag}v{i + 1}"
            _ip("netns", "add", ns)
            self.made.append(("netns", ns))
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.made.append(("link", veth))
            _ip("link", "set", veth, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addrs[n]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            (self.root / "spool" / n).mkdir(parents=True, exist_ok=True)
        (self.root / "hosts").write_text(hosts)

    def start_node(self, node: str) -> None:
        """(Re)start ``node``'s slurmd inside its namespace, with the node's hostname."""
        env = {**os.environ, **self.env}
        q = shlex.quote
        # its own hostname (UTS) and /etc/hosts (a private mount namespace: the host's file is untouched)
        inner = (f"mount --bind {q(str(self.root / 'hosts'))} /etc/hosts && hostname {q(node)}"
                 f" && exec {q(_which('slurmd') or 'slurmd')} -D -N {q(node)}")
        with open(self.root / "log" / f"slurmd-{node}.out", "ab") as fh:
            self.procs_by_node[node] = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.netns(node)}", "unshare", "--uts", "--mount", "--propagation", "private",
                 "--", "sh", "-c", inner],
                stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip

    def kill_node(self, node: str) -> None:
        """``kill -9`` of every process in the node's namespace: its slurmd and whatever it started."""
        for pid in self.pids_in(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        p = self.procs_by_node.pop(node, None)
        if p is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)

    def pids_in(self, node: str) -> list[int]:
        out = _ip("netns", "pids", self.netns(node), check=False).stdout
        return [int(x) for x in out.split()]

    def _conf_text(self) -> str:
        r = self.root
        names = ",".join(self.node_names)
        text = super()._conf_text()
        text = text.replace(f"SlurmctldHost={self.node}(127.0.0.1)", f"SlurmctldHost={self.node}({self.ctl_addr})")
        text = text.replace(f"SlurmdSpoolDir={r}/spool", f"SlurmdSpoolDir={r}/spool/%n")
        text = text.replace(f"SlurmdPidFile={r}/slurmd.pid", f"SlurmdPidFile={r}/slurmd-%n.pid")
        text = text.replace(f"SlurmdLogFile={r}/log/slurmd.log", f"SlurmdLogFile={r}/log/slurmd-%n.log")
        text = text.replace("JobAcctGatherType=jobacct_gather/none", "JobAcctGatherType=jobacct_gather/linux")
        text = text.replace("SelectTypeParameters=CR_CPU", "SelectTypeParameters=CR_CPU_Memory")
        lines = [ln for ln in text.splitlines() if not ln.startswith(("NodeName=", "PartitionName="))]
        lines += [f"NodeName={n} NodeAddr={a} CPUs={self.cpus} RealMemory=8000 State=UNKNOWN" for n, a in self.addrs.items()]
        lines += [
            f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName=short Nodes={names} MaxTime=1 State=UP",
            # a job in 'urgent' takes its nodes from the others' jobs, which end PREEMPTED
            f"PartitionName=urgent Nodes={names} MaxTime=INFINITE State=UP PriorityTier=2",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=CANCEL",
            "SlurmdTimeout=10",  # a node whose slurmd died is DOWN (its job NODE_FAIL) within seconds
            "SlurmdParameters=config_overrides",  # nodes of more CPUs than the machine has: slurm.conf's count
            # memory enforced as on clusters without cgroups: a step over its job's --mem is killed
            "JobAcctGatherParams=OverMemoryKill",
            "JobAcctGatherFrequency=1",
            f"DefMemPerCPU={8000 // self.cpus}",
            "",
        ]
        return "\n".join(lines)

    def _node_idle(self) -> bool:
        out = self.scontrol("--oneliner", "show", "node").stdout
        return out.count("State=IDLE") >= self.nodes

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.cancel_all()
        for n in list(self.procs_by_node):
            self.kill_node(n)
        for n in self.node_names:  # a slurmstepd left behind by a killed slurmd
            if any(kind == "netns" and name == self.netns(n) for kind, name in self.made):
                self.kill_node(n)
        super().stop()
        for kind, name in reversed(self.made):
            if kind == "netns":
                _ip("netns", "del", name, check=False)
            elif kind == "link":
                _ip("link", "del", name, check=False)
        self.made.clear()

    def leftovers(self) -> list[str]:
        """What of this cluster is still there: daemons, processes in its namespaces, namespaces, links."""
        out = []
        for p in [*self.procs, *self.procs_by_node.values()]:
            if p.poll() is None:
                out.append(f"process {p.pid} ({p.args[0]})")
        netns = _ip("netns", "list", check=False).stdout
        links = _ip("-o", "link", "show", check=False).stdout
        out += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith(self.tag)]
        out += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if f" {self.tag}" in line]
        out += [f"process {p}" for p in _processes_of(self.root, str(self.conf))]
        return out


def _processes_of(root: Path, conf: str) -> list[str]:
    """'pid name' of live processes started for a cluster: SLURM_CONF=conf in their environment
    (slurmctld, slurmd, slurmstepd, job steps) or its folder on their command line (munged)."""
    import psutil

    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get("SLURM_CONF") == conf or any(str(root) in a for a in p.info["cmdline"] or []):
                found.append(f"{p.pid} {p.info['name']}")
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module", name="netns_cluster")
def netns_cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    """A running two-node Slurm cluster (node1, node2: one network namespace each); SLURM_CONF points at it."""
    skip_if("multi-node slurm", netns_cluster_missing())
    root = Path(tmp_path_factory.mktemp("nscluster"))
    yield from _serving(NamespaceCluster(root, cpus=4))  # 4 ranks fit on one node too (the 1-node side of a comparison)


# -- PostgreSQL + mlflow server ---------------------------------------------


def pg_bin() -> Path | None:
    import glob

    found = sorted(glob.glob(PG_BIN_GLOB))
    return Path(found[-1]) if found and (Path(found[-1]) / "initdb").exists() else None


def team_server_missing() -> str | None:
    if pg_bin() is None:
        return "PostgreSQL not installed (apt-get install postgresql)"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "the PostgreSQL driver is not installed (pip install psycopg2-binary)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "PostgreSQL refuses to run as root and there is no 'postgres' user"
    return None


@dataclass
class TeamServer:
    """PostgreSQL (initdb + pg_ctl, private port) and `mlflow server` on top of it."""

    root: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def _as_pg(self, argv: list[str]) -> list[str]:
        # PostgreSQL will not run as root: as root, run its programs as the 'postgres' user
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def start(self) -> TeamServer:
        bin_ = pg_bin()
        assert bin_ is not None
        data = self.root / "pgdata"
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            self.root.chmod(0o755)
            shutil.chown(self.root, "postgres", "postgres")
        self.pg_port = free_port()

        def run(argv: list[str]) -> None:
            proc = subprocess.run(self._as_pg(argv), capture_output=True, text=True, timeout=120)
            if proc.returncode:
                raise RuntimeError(f"{Path(argv[0]).name} failed: {proc.stderr.strip() or proc.stdout.strip()}")

        run([str(bin_ / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        self.pg_ctl = [str(bin_ / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]
        run([str(bin_ / "pg_ctl"), "-D", str(data), "-l", str(self.root / "pg.log"), "-w", "-o",
             f"-p {self.pg_port} -k {self.root} -c listen_addresses=127.0.0.1", "start"])  # fmt: skip
        run([str(bin_ / "createdb"), "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", "postgres", "mlflow"])
        # the driver named: SQLAlchemy >= 2.1 reads a bare postgresql:// as psycopg 3
        self.db_uri = f"postgresql+psycopg2://postgres@127.0.0.1:{self.pg_port}/mlflow"
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        art = self.root / "artifacts"
        log = self.root / "mlflow-server.log"
        with open(log, "ab") as fh:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.db_uri,
                 "--artifacts-destination", str(art), "--serve-artifacts", "--host", "127.0.0.1",
                 "--port", str(self.port), "--workers", "1"],
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "MLFLOW_TRACKING_URI": ""},
            ))  # fmt: skip
        _wait_for(self._up, 180, "mlflow server", log)
        return self

    def _up(self) -> bool:
        import urllib.request

        if self.procs[-1].poll() is not None:
            raise RuntimeError(f"mlflow server exited {self.procs[-1].returncode}: " + (self.root / "mlflow-server.log").read_text()[-2000:])
        try:
            with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=15)
        if getattr(self, "pg_ctl", None):
            with contextlib.suppress(Exception):
                subprocess.run(self._as_pg(self.pg_ctl), capture_output=True, timeout=60)


@pytest.fixture(scope="session", name="team_server")
def team_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TeamServer]:
    """A running `mlflow server` backed by a private PostgreSQL."""
    skip_if("team-server", team_server_missing())
    import tempfile

    # not under pytest's temp dir: that is private to this user, and PostgreSQL runs as 'postgres'
    root = Path(tempfile.mkdtemp(prefix="dstui-team-"))
    server = TeamServer(root)
    with stopped_on_failure(server):
        server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":  # python tests/cluster_fixtures.py slurm|nodes|team  (Ctrl-C stops it)
    import tempfile

    what = sys.argv[1] if len(sys.argv) > 1 else "slurm"
    base = Path(tempfile.mkdtemp(prefix=f"dstui-{what}-"))
    thing = {"slurm": SlurmCluster, "nodes": NamespaceCluster, "team": TeamServer}[what](base)
    with stopped_on_failure(thing):
        thing.start()
    print(f"export SLURM_CONF={base}/slurm.conf" if what != "team" else f"export MLFLOW_TRACKING_URI={thing.uri}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        signal.pause()
    finally:
        thing.stop()
