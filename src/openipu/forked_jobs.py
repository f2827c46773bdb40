"""Tasks in forked worker processes that inherit the parent's prepared state copy-on-write.

The parent prepares what every task shares (a model read and converted, caches warmed by a
first task) and then forks one process per task, at most ``jobs`` at a time
(``multiprocessing``'s ``fork`` context: nothing is pickled on the way in, and a worker starts
without importing anything). A worker sends each result back through a pipe as soon as it has it
(results are pickled: keep them small and plain), so a task of several items reports them one by
one. One process per task keeps the parent's state shared (a worker's memory is what its task
adds) and tells which task a worker that died was running.

Host behaviour (this machine, not an IPU figure):

- a worker ignores SIGINT (Ctrl-C goes to the whole foreground process group); the parent, on
  ``KeyboardInterrupt`` or any other exception while it waits, terminates its workers, reaps
  them and re-raises, so no worker outlives it; a Ctrl-C that arrives while a worker is being
  forked is held until the fork is done (raised in ``os.fork``'s hooks it would be printed and
  dropped); a worker also asks the kernel to kill it if the
  parent dies (``PR_SET_PDEATHSIG``, Linux);
- a worker that dies before finishing its task (killed by a signal, the out-of-memory killer, an
  ``os._exit``) is reported through ``on_lost`` with the items it had not sent and the reason, and
  the other tasks go on;
- torch, if imported, runs single-threaded in a worker (its OpenMP thread team does not survive
  ``fork``: a worker using it would wait forever);
- the parent's objects are moved to the collector's permanent generation while workers are forked
  (``gc.freeze``), so a collection in a worker does not write to, and so copy, every page holding
  a shared object's header.

Linux only (``fork``, ``/proc``); the caller runs tasks in its own process where ``fork`` is
unavailable (:func:`fork_available`).
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
from collections import deque


def fork_available() -> bool:
    """True where worker processes can be forked (``fork`` start method: Linux, not Windows)."""
    return "fork" in multiprocessing.get_all_start_methods()


def usable_cores() -> int:
    """CPU cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_bytes() -> int | None:
    """This process's resident set now (``VmRSS``), in bytes; None where ``/proc`` has none."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def peak_rss_bytes() -> int | None:
    """This process's peak resident set (``VmHWM``, since the start or the last
    :func:`reset_peak_rss`), in bytes; None where ``/proc`` has none."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set to the current one (``/proc/self/clear_refs``,
    Linux 4.0 and later). Returns False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux ``prctl``)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)        # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:          # the parent died before the request took effect
        os._exit(1)


def _single_threaded_torch() -> None:
    """One intra-op thread for torch in a worker. Its OpenMP runtime (libgomp) does not survive
    ``fork``: a parallel region in the child waits for the parent's thread team, which the child
    does not have, forever. With one thread torch runs its kernels inline (and the workers, one a
    core, should not each start a team anyway)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _worker(conn, parent: int, work, task) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the parent handles Ctrl-C and stops us
    _die_with_parent(parent)
    _single_threaded_torch()
    try:
        work(task, lambda item: conn.send(("item", item)))
        conn.send(("done", peak_rss_bytes()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent as the task's failure
        try:
            conn.send(("failed", f"{type(e).__name__}: {' '.join(str(e).split())}"))
        except Exception:  # noqa: BLE001 - the pipe itself is gone: the parent sees the exit
            pass
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()


def died_because(exitcode: int | None) -> str:
    """A worker's exit as words: "killed by SIGKILL (signal 9)", "exited with status 1"."""
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        text = f"killed by {name} (signal {-exitcode})"
        if -exitcode == signal.SIGKILL:
            text += "; the kernel's out-of-memory killer sends SIGKILL when the host runs out of memory"
        return text
    return f"exited with status {exitcode}"


def run_tasks(tasks, work, jobs: int, on_result, on_lost) -> list:
    """Run ``work(task, send)`` for each of ``tasks`` in forked workers, at most ``jobs`` at once,
    in the order given.

    Args:
        tasks: the tasks (any objects; not pickled, the worker inherits them).
        work: called in the worker; calls ``send(item)`` for each result (pickled to the parent).
        jobs: worker processes at most at once (>= 1).
        on_result: called in the parent with each ``item``, in the order a worker sent them.
        on_lost: called in the parent as ``on_lost(task, items received, reason)`` when a worker
            ends without finishing its task (``reason``: its exception, or how it died).
    Returns:
        The peak resident set of each worker, in bytes (None where unknown), in the order they
        finished.
    Raises:
        whatever interrupts the parent while it waits (``KeyboardInterrupt``): the workers are
        terminated and reaped first.
    """
    ctx = multiprocessing.get_context("fork")
    parent = os.getpid()
    pending = deque(tasks)
    running: dict = {}          # reader -> [process, task, items received, finished]
    peaks = []
    # Ctrl-C while forking would be lost: os.fork's hooks (logging's lock release among them)
    # print a KeyboardInterrupt raised in them and go on. It is held until the fork is done.
    forking, held = [False], []

    def on_sigint(signum, frame):
        if forking[0]:
            held.append(signum)
        else:
            raise KeyboardInterrupt
    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:          # not the main thread: Python's default handling
        previous = None
    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                task = pending.popleft()
                reader, writer = ctx.Pipe(duplex=False)
                gc.freeze()
                forking[0] = True
                try:
                    proc = ctx.Process(target=_worker, args=(writer, parent, work, task), daemon=True)
                    proc.start()
                finally:
                    forking[0] = False
                    gc.unfreeze()
                writer.close()
                running[reader] = [proc, task, 0, False]
                if held:
                    raise KeyboardInterrupt
            for reader in multiprocessing.connection.wait(list(running)):
                state = running[reader]
                try:
                    msg = reader.recv()
                except (EOFError, OSError):
                    msg = None
                if msg is None:                         # the worker has gone
                    proc, task, received, finished = running.pop(reader)
                    reader.close()
                    proc.join()
                    if not finished:
                        on_lost(task, received, f"its worker process {died_because(proc.exitcode)}")
                elif isinstance(msg, tuple) and msg and msg[0] == "done":
                    state[3] = True
                    peaks.append(msg[1])
                elif isinstance(msg, tuple) and msg and msg[0] == "failed":
                    state[3] = True
                    on_lost(state[1], state[2], msg[1])
                else:
                    state[2] += 1
                    on_result(msg[1])
    except BaseException:
        for proc, *_ in running.values():
            proc.terminate()
        for reader, (proc, *_) in running.items():
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
            reader.close()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return peaks

