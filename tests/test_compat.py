"""The supported MindSpore range (ms_kldiv/_compat.py): version parsing, the import-time check, and which
MindSpore this run is on (the CI's compatibility runs set MS_KLDIV_EXPECT_MINDSPORE)."""
import os
import sys

import pytest

import mindspore as ms

from ms_kldiv import _compat
import _procs


@pytest.mark.parametrize("text, parsed", [("2.10.0", (2, 10, 0)), ("2.7.1.post1", (2, 7, 1)), ("2.7", (2, 7, 0)),
                                          ("2.11.0rc1", (2, 11, 0)), ("dev", None), ("", None)])
def test_parse_version(text, parsed):
    assert _compat.parse_version(text) == parsed


@pytest.mark.parametrize("text", ["2.7.0", "2.7.1.post1", "2.7.2", "2.8.0", "2.9.0", "2.10.0", "2.10.7"])
def test_supported_versions(text):
    assert _compat.version_problem(text) is None


@pytest.mark.parametrize("text", ["2.6.0", "2.11.0", "3.0.0", "1.10.1", "garbage", None])
def test_unsupported_versions_are_explained(text):
    problem = _compat.version_problem(text)
    assert problem and ">=2.7,<2.11" in problem


def test_installed_mindspore_is_in_range():
    assert _compat.version_problem(_compat.installed_version()) is None
    assert _compat.MS_VERSION[:2] == _compat.parse_version(ms.__version__)[:2]


def test_running_on_the_expected_mindspore():
    """In a compatibility run, the MindSpore we test is the one the user installed (pip kept it)."""
    expected = os.environ.get("MS_KLDIV_EXPECT_MINDSPORE")
    if expected is None:
        pytest.skip("not a compatibility run (MS_KLDIV_EXPECT_MINDSPORE unset)")
    assert ms.__version__ == expected


_FAKE_VERSION = ("import importlib.metadata as m\n"
                 "real = m.version\n"
                 "m.version = lambda d: {fake!r} if d == 'mindspore' else real(d)\n")


@pytest.mark.parametrize("fake", ["2.6.0", "2.11.0"])
def test_unsupported_mindspore_fails_at_import(fake):
    code = _FAKE_VERSION.format(fake=fake) + "import ms_kldiv\n"
    proc = _procs.run([sys.executable, "-c", code], 300)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ms_kldiv supports MindSpore >=2.7,<2.11") and fake in last
    # Nothing of MindSpore ran: the check comes first.
    assert "mindspore" not in proc.stdout.lower()


def test_override_turns_the_error_into_a_warning():
    code = (_FAKE_VERSION.format(fake="2.11.0") + "import warnings\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    import ms_kldiv\n"
            "print(sum('2.11.0' in str(x.message) for x in w))\n")
    env = dict(os.environ, MS_KLDIV_ALLOW_ANY_MINDSPORE="1")
    proc = _procs.run([sys.executable, "-c", code], 300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "1"
