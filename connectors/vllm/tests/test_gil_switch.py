"""``gcache_switch_interval_us``: the worker's GIL switch interval is lowered, never raised."""

import sys

import pytest

from gcache.errors import ConfigError
from gcache_vllm.connector import DEFAULT_SWITCH_INTERVAL_US, shorten_gil_switch


@pytest.fixture(autouse=True)
def restore_interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_the_default_lowers_pythons_five_milliseconds():
    sys.setswitchinterval(0.005)
    shorten_gil_switch({})
    assert sys.getswitchinterval() == pytest.approx(DEFAULT_SWITCH_INTERVAL_US / 1e6)


def test_a_shorter_interval_already_set_is_kept_and_zero_leaves_it():
    sys.setswitchinterval(0.0001)
    shorten_gil_switch({"switch_interval_us": 500})
    assert sys.getswitchinterval() == pytest.approx(0.0001)
    sys.setswitchinterval(0.005)
    shorten_gil_switch({"switch_interval_us": 0})
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_bad_value_names_the_setting():
    with pytest.raises(ConfigError, match="gcache_switch_interval_us"):
        shorten_gil_switch({"switch_interval_us": -1})
