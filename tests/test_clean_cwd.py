"""Using the package leaves the user's working directory untouched: no rank_0/ (failed graph compiles),
custom_kernel_meta/, akg_kernel_meta/, kernel_build_tmp.key, dsa_transfrom.log, ...

Runs in a fresh interpreter, in an empty temporary cwd, without the MS_OM_PATH/MS_COMPILER_CACHE_PATH a
developer may have exported, so that only the package's own redirection is tested."""
import os
import sys
import textwrap

import ms_kldiv
import _procs

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ms_kldiv.__file__)))

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import mindspore as ms
    import ms_kldiv

    backend = sys.argv[1]
    x = ms.Tensor(np.log(np.full((4, 8), 0.125, np.float32)))
    t = ms.Tensor(np.full((4, 8), 0.125, np.float32))
    bad = ms.Tensor(np.ones((4, 8), np.int32))

    def f(a, b):
        return ms_kldiv.kl_div(a, b, 'batchmean', backend=backend)

    # PyNative: value and both gradients.
    f(x, t).asnumpy()
    [g.asnumpy() for g in ms.grad(f, grad_position=(0, 1))(x, t)]
    # ms.jit, including a failing compile (it is what writes rank_0/om/analyze_fail.ir).
    ms.jit(f)(x, t).asnumpy()
    try:
        ms.jit(f)(x, bad)
        raise SystemExit('expected a TypeError from the failing compile')
    except TypeError:
        pass
    # GRAPH_MODE Cell: value, gradients, and a failing compile.
    ms.set_context(mode=ms.GRAPH_MODE)
    loss = ms_kldiv.KLDivLoss('sum', log_target=False, backend=backend)
    loss(x, t).asnumpy()
    [g.asnumpy() for g in ms.grad(loss, grad_position=(0, 1))(x, t)]
    try:
        loss(bad, t)
        raise SystemExit('expected a TypeError from the failing graph compile')
    except TypeError:
        pass
    print('done')
""")


def test_running_leaves_cwd_empty(backend, tmp_path):
    cwd = tmp_path / "user_cwd"
    cwd.mkdir()
    # MindSpore parses jit functions from their source file, so the script must be a file (outside the cwd).
    script = tmp_path / "use_kl_div.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("MS_OM_PATH", "MS_COMPILER_CACHE_PATH")}
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("GLOG_v", "3")
    proc = _procs.run([sys.executable, str(script), backend], 300, cwd=cwd, env=env)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
    left = sorted(os.listdir(cwd))
    assert left == [], f"files left in the working directory: {left}"
