"""The suite's own switches (tests/conftest.py): with MS_KLDIV_TEST_SYNC=1 (as CI runs) PyNative dispatch is
synchronous, except in tests marked ``async_dispatch``, which keep MindSpore's default; without it, the default
everywhere."""
import mindspore as ms
import pytest

from conftest import SYNC_DISPATCH


def test_dispatch_follows_the_switch():
    assert ms.get_context("pynative_synchronize") is SYNC_DISPATCH


@pytest.mark.async_dispatch
def test_marked_tests_keep_the_default_dispatch():
    assert ms.get_context("pynative_synchronize") is False


def test_the_switch_is_back_after_a_marked_test():
    assert ms.get_context("pynative_synchronize") is SYNC_DISPATCH
