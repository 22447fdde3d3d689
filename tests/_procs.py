"""Child processes of the test suite, started and ended one way.

Every child starts in a process group (a session) of its own. One that runs past its timeout is killed together with
everything it started, and the test fails with the tail of its output: ``subprocess.run(timeout=...)`` kills the
child alone, and a ``g++`` it was waiting for (a kernel build), a stand-in compiler or msrun's workers went on running,
taking CPU from the rest of the suite. Whatever a child leaves in its group when it exits is ended too.

``LOAD_BUILD`` is the prologue of child scripts that only need the kernel library (``_build.ensure_library`` and
ctypes): it loads ``ms_kldiv/_build.py`` by path, as ``setup.py`` does, which imports neither ``ms_kldiv`` nor
MindSpore (whose import costs seconds in every child). It binds the module to ``_build``.
"""
import os
import signal
import subprocess

import pytest

from ms_kldiv import _build as _build_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOAD_BUILD = ("import importlib.util as _iu\n"
              f"_spec = _iu.spec_from_file_location('_ms_kldiv_build', {_build_module.__file__!r})\n"
              "_build = _iu.module_from_spec(_spec)\n"
              "_spec.loader.exec_module(_build)\n")


def with_repo_path(env):
    """``env`` with this checkout first on PYTHONPATH, so that a child imports the ms_kldiv under test."""
    env = dict(env)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def start(cmd, **kwargs):
    """``subprocess.Popen`` in a new session, output captured as text unless ``kwargs`` say otherwise."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    kwargs.setdefault("text", True)
    return subprocess.Popen(cmd, start_new_session=True, **kwargs)


def kill_group(proc):
    """SIGKILL to the child's process group: the child and whatever it started and left running."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


def finish(proc, timeout, what=None):
    """Wait for ``proc`` (from :func:`start`) at most ``timeout`` seconds; a ``CompletedProcess``. Past the timeout the
    whole group is killed and the test fails; nothing the child started outlives this call either way."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"{what or proc.args} timed out after {timeout} s (its process group was killed):\n"
                    f"{(out or '')[-3000:]}\n{(err or '')[-3000:]}")
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run(cmd, timeout, what=None, **kwargs):
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)`` that ends the child's whole
    process group on timeout (see the module doc)."""
    return finish(start(cmd, **kwargs), timeout, what)


# ----------------------------------------------------------------------------- msrun (MindSpore's launcher)
def msrun_path():
    """The msrun next to this interpreter (or on PATH), or None."""
    import shutil  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    return shutil.which("msrun", path=os.path.dirname(sys.executable)) or shutil.which("msrun")


def _free_port():
    import socket  # pylint: disable=import-outside-toplevel
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def msrun_env():
    """The environment of msrun and its workers: this interpreter first on PATH (msrun starts workers as plain
    `python`), the ms_kldiv under test (installed, or this checkout) first on PYTHONPATH, MindSpore's INFO/WARNING
    chatter off (it would bury a real failure in the logs)."""
    import sys  # pylint: disable=import-outside-toplevel
    import ms_kldiv  # pylint: disable=import-outside-toplevel
    parent = os.path.dirname(os.path.dirname(os.path.abspath(ms_kldiv.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("GLOG_v", "3")
    return env


def msrun(workers, script, args, log_dir, cwd, timeout, what="msrun"):
    """Run ``script`` on ``workers`` local CPU workers (a free port, its own process group); (returncode, output,
    the tail of every worker's log)."""
    cmd = [msrun_path(), f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "--join=True", f"--cluster_time_out={timeout}", f"--log_dir={log_dir}",
           script] + list(args)
    proc = run(cmd, timeout, what=what, cwd=cwd, env=msrun_env(), stderr=subprocess.STDOUT)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted(log_dir.glob("*.log")))
    return proc.returncode, proc.stdout, logs
