"""``poprun``: start the instances of a PopDist program (Graphcore's PopRun command line).

``poprun [options] program [args...]`` starts ``--num-instances`` copies of the program, each
with PopDist's environment (:mod:`openipu.popdist`) naming its place: instance ``i`` drives the
global replicas ``[i * local, (i + 1) * local)`` with ``local = --num-replicas /
--num-instances``. The instances are local processes, or with ``--host h1,h2,...`` spread over
the hosts in consecutive blocks (a host other than this one is reached with ``ssh``; the program
and openipu must be installed there at the same path). The instances meet over
``torch.distributed`` at instance 0's host (``MASTER_ADDR`` / ``MASTER_PORT``).

When an instance exits with an error, poprun stops the other instances (SIGTERM, then SIGKILL
after ``--kill-grace`` seconds) and exits with that instance's code; an instance that hangs is
detected by the others' collective timeout (``--collective-timeout``, seconds).

Options of PopRun accepted here: ``--num-instances``, ``--num-replicas``,
``--ipus-per-replica``, ``--host``, ``--mpi-global-args`` (``--tag-output``,
``-x NAME[=VALUE]`` and ``--allow-run-as-root`` take effect; other MPI arguments are accepted and
ignored with a note), ``--mpi-local-args`` (ignored with a note), ``--vipu-partition``,
``--vipu-server-host``, ``--reset-partition`` (no V-IPU: the simulated devices need no partition;
ignored with a note), ``--only-output-from-instance``, ``--numa-aware`` (accepted), ``-v``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

__all__ = ["main", "build_parser", "instance_env", "host_slots"]

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", socket.gethostname()}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="poprun", description="Start the instances of a PopDist program on the simulated IPUs "
        "(openipu: local processes, or one block per --host).")
    p.add_argument("--num-instances", type=int, default=1, help="program instances (processes) to start")
    p.add_argument("--num-replicas", type=int, default=None, help="global replicas (default: one per instance)")
    p.add_argument("--ipus-per-replica", type=int, default=1, help="IPUs of each replica")
    p.add_argument("-H", "--host", default="", help="comma-separated hosts; instances are spread over them in blocks")
    p.add_argument("--mpi-global-args", default="", help="arguments for mpirun (see the module docstring)")
    p.add_argument("--mpi-local-args", default="", help="accepted and ignored")
    p.add_argument("--vipu-partition", default="", help="ignored: the simulated IPUs need no V-IPU partition")
    p.add_argument("--vipu-server-host", default="", help="ignored")
    p.add_argument("--reset-partition", default="", help="ignored")
    p.add_argument("--vipu-allocation", default="", help="ignored")
    p.add_argument("--update-partition", default="", help="ignored")
    p.add_argument("--only-output-from-instance", type=int, default=None,
                   help="show the output of this instance only")
    p.add_argument("--numa-aware", default="", help="accepted (no effect on the simulation)")
    p.add_argument("--collective-timeout", type=float, default=None,
                   help="seconds a cross-instance collective waits before it reports a lost instance "
                        "(POPDIST_COLLECTIVE_TIMEOUT; default 300)")
    p.add_argument("--kill-grace", type=float, default=10.0,
                   help="seconds between SIGTERM and SIGKILL when stopping the instances")
    p.add_argument("--master-port", type=int, default=0, help="rendezvous port (default: a free one)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("program", help="the program to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def _note(msg: str) -> None:
    print(f"poprun: {msg}", file=sys.stderr, flush=True)


def _parse_mpi(args: str) -> tuple[dict, bool, bool]:
    """(environment exported with -x, --tag-output, notes printed) from ``--mpi-global-args``."""
    env, tag = {}, False
    words = shlex.split(args or "")
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("-x", "--x") and i + 1 < len(words):
            name, _, val = words[i + 1].partition("=")
            env[name] = val if val or "=" in words[i + 1] else os.environ.get(name, "")
            i += 2
            continue
        if w == "--tag-output":
            tag = True
        elif w == "--allow-run-as-root":
            pass
        else:
            _note(f"--mpi-global-args: '{w}' has no effect on local and ssh instances (ignored)")
        i += 1
    return env, tag, bool(words)


def host_slots(n: int, hosts: int) -> list[tuple[int, int, int, int]]:
    """``(host, local_rank, local_size, cross_size)`` of each of ``n`` instances spread over
    ``hosts`` hosts in consecutive blocks of ``ceil(n / hosts)`` (the last host may hold fewer);
    ``cross_size`` counts the hosts holding an instance with that local rank (Horovod's
    ``cross_size()``)."""
    per_host = -(-n // hosts)
    sizes = [min(per_host, n - h * per_host) for h in range(hosts) if n - h * per_host > 0]
    out = []
    for i in range(n):
        h, lr = divmod(i, per_host)
        out.append((h, lr, sizes[h], sum(1 for s in sizes if s > lr)))
    return out


def instance_env(index: int, n: int, total: int, ipus: int, master: str, port: int, extra: dict | None = None,
                 timeout: float | None = None, slot: tuple[int, int, int, int] | None = None,
                 hostname: str = "localhost") -> dict:
    """PopDist's environment of instance ``index`` (the POPDIST_* variables, the Open MPI ones
    PopTorch's ``Options.Distributed`` reads, torch.distributed's rendezvous, and Horovod's
    ``HOROVOD_RANK`` / ``SIZE`` / ``LOCAL_RANK`` / ``LOCAL_SIZE`` / ``CROSS_RANK`` / ``CROSS_SIZE``
    / ``HOSTNAME`` as ``horovodrun`` sets them). ``slot`` is the instance's ``(host, local_rank,
    local_size, cross_size)`` from :func:`host_slots` (default: every instance on one host)."""
    local = total // n
    host, local_rank, local_size, cross_size = slot if slot is not None else (0, index, n, 1)
    env = {"POPDIST_NUM_INSTANCES": str(n), "POPDIST_INSTANCE_INDEX": str(index),
           "POPDIST_NUM_TOTAL_REPLICAS": str(total), "POPDIST_NUM_LOCAL_REPLICAS": str(local),
           "POPDIST_REPLICA_INDEX_OFFSET": str(index * local), "POPDIST_NUM_IPUS_PER_REPLICA": str(ipus),
           "POPDIST_DEVICE_ID": "0",
           "OMPI_COMM_WORLD_SIZE": str(n), "OMPI_COMM_WORLD_RANK": str(index),
           "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
           "OMPI_COMM_WORLD_NODE_RANK": str(host),
           "HOROVOD_RANK": str(index), "HOROVOD_SIZE": str(n), "HOROVOD_LOCAL_RANK": str(local_rank),
           "HOROVOD_LOCAL_SIZE": str(local_size), "HOROVOD_CROSS_RANK": str(host),
           "HOROVOD_CROSS_SIZE": str(cross_size), "HOROVOD_HOSTNAME": hostname,
           "MASTER_ADDR": master, "MASTER_PORT": str(port)}
    if timeout is not None:
        env["POPDIST_COLLECTIVE_TIMEOUT"] = str(timeout)
    env.update(extra or {})
    return env


def _horovod_rendezvous(hosts: list[str], slots, note) -> tuple[object, dict] | None:
    """Start Horovod's own rendezvous server (``horovod.runner.http.http_server.RendezvousServer``,
    what ``horovodrun``'s gloo launcher starts) when a real Horovod is importable here, and return
    it with the environment its gloo controller needs (``HOROVOD_GLOO_RENDEZVOUS_ADDR`` / ``PORT``,
    ``HOROVOD_CONTROLLER`` / ``HOROVOD_CPU_OPERATIONS`` = gloo, ``HOROVOD_GLOO_IFACE`` = lo for
    local runs). None without Horovod (openipu's ``horovod.torch`` stand-in needs no server) or
    with ``OPENIPU_HOROVOD_RENDEZVOUS=0``."""
    if os.environ.get("OPENIPU_HOROVOD_RENDEZVOUS") == "0":
        return None
    try:
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousServer
    except Exception:  # noqa: BLE001 - no (usable) Horovod: nothing to serve
        return None
    n = len(slots)
    plan = [SlotInfo(hostname=hosts[h], rank=i, local_rank=lr, cross_rank=h, size=n, local_size=ls, cross_size=cs)
            for i, (h, lr, ls, cs) in enumerate(slots)]
    server = RendezvousServer()
    port = server.start()
    server.init(plan)
    local = all(h in _LOCAL_HOSTS for h in hosts)
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1" if local else socket.getfqdn(),
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
    if local:
        env["HOROVOD_GLOO_IFACE"] = "lo"
    note(f"Horovod's rendezvous server on port {port} (horovod.torch's gloo controller)")
    return server, env


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def _pump(stream, prefix: str, out, show: bool) -> None:
    for line in iter(stream.readline, b""):
        if show:
            out.write(prefix + line.decode(errors="replace"))
            out.flush()
    stream.close()


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    n = a.num_instances
    total = a.num_replicas if a.num_replicas is not None else n
    if n < 1:
        _note("--num-instances must be at least 1")
        return 2
    if total < n or total % n:
        _note(f"--num-replicas ({total}) must be a multiple of --num-instances ({n}): each instance drives the "
              "same number of replicas")
        return 2
    if a.ipus_per_replica < 1:
        _note("--ipus-per-replica must be at least 1")
        return 2
    for opt in ("vipu_partition", "vipu_server_host", "reset_partition", "vipu_allocation", "update_partition"):
        if getattr(a, opt):
            _note(f"--{opt.replace('_', '-')} ignored: the simulated IPUs need no V-IPU partition")
    if a.mpi_local_args:
        _note("--mpi-local-args ignored")
    extra, tag, _ = _parse_mpi(a.mpi_global_args)
    hosts = [h.strip() for h in a.host.split(",") if h.strip()] or ["localhost"]
    if len(hosts) > n:
        _note(f"{len(hosts)} hosts for {n} instances: the last {len(hosts) - n} hosts are not used")
        hosts = hosts[:n]
    remote = any(h not in _LOCAL_HOSTS for h in hosts)
    # instance 0's address as the others see it
    master = hosts[0] if hosts[0] not in _LOCAL_HOSTS else (socket.getfqdn() if remote else "127.0.0.1")
    port = a.master_port or _free_port(master if master == "127.0.0.1" else "0.0.0.0")
    if a.verbose:
        _note(f"{n} instances x {total // n} replicas x {a.ipus_per_replica} IPUs on {', '.join(hosts)}; "
              f"rendezvous {master}:{port}")
    slots = host_slots(n, len(hosts))
    hvd = _horovod_rendezvous(hosts, slots, _note if a.verbose else (lambda msg: None))
    try:
        return _start_and_wait(a, n, total, hosts, slots, master, port, {**extra, **(hvd[1] if hvd else {})}, tag)
    finally:
        if hvd:
            hvd[0].stop()


def _start_and_wait(a, n, total, hosts, slots, master, port, extra, tag) -> int:
    procs = []
    pumps = []
    cmd = [a.program, *a.args]
    for i in range(n):
        host = hosts[slots[i][0]]
        env_i = instance_env(i, n, total, a.ipus_per_replica, master, port, extra, a.collective_timeout,
                             slot=slots[i], hostname=host)
        show = a.only_output_from_instance is None or a.only_output_from_instance == i
        if host in _LOCAL_HOSTS:
            argv_i, env = cmd, {**os.environ, **env_i}
        else:
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env_i.items())
            argv_i = ["ssh", host, f"cd {shlex.quote(os.getcwd())} && env {exports} {shlex.join(cmd)}"]
            env = dict(os.environ)
        piped = tag or not show
        p = subprocess.Popen(argv_i, env=env, stdout=subprocess.PIPE if piped else None,
                             stderr=subprocess.PIPE if piped else None, start_new_session=True)
        procs.append(p)
        if piped:
            for stream, out, name in ((p.stdout, sys.stdout, "stdout"), (p.stderr, sys.stderr, "stderr")):
                t = threading.Thread(target=_pump, args=(stream, f"[1,{i}]<{name}>:" if tag else "", out, show),
                                     daemon=True)
                t.start()
                pumps.append(t)
    code = _wait(procs, a.kill_grace)
    for t in pumps:
        t.join(timeout=5)
    return code


def _stop(procs, grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _wait(procs, grace: float) -> int:
    """Wait for every instance; on the first failure stop the others. Returns the exit code
    (0, or the first failing instance's)."""
    try:
        while True:
            done = [(i, p.poll()) for i, p in enumerate(procs)]
            failed = [(i, c) for i, c in done if c not in (None, 0)]
            if failed:
                i, c = failed[0]
                running = [j for j, cc in done if cc is None]
                if running:
                    _note(f"instance {i} exited with code {c}; stopping instances {', '.join(map(str, running))}")
                else:
                    _note(f"instance {i} exited with code {c}")
                _stop(procs, grace)
                return c if c > 0 else 128 - c
            if all(c == 0 for _, c in done):
                return 0
            time.sleep(0.1)
    except KeyboardInterrupt:
        _note("interrupted: stopping the instances")
        _stop(procs, grace)
        return 130


if __name__ == "__main__":
    sys.exit(main())
