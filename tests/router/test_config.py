"""gcache-router's settings: the instance and model syntax, and defaults < TOML < env < flags."""

import pytest

from gcache.config_loader import load_config
from gcache.errors import ConfigError
from gcache.router.config import InstanceSpec, RouterConfig

BASE = {"instances": ("http://127.0.0.1:8001",), "models": ("tiny=/models/tiny",)}


def test_instances_with_their_buckets_and_event_endpoints():
    config = RouterConfig(instances=("http://10.0.0.1:8001;bucket=1;events=tcp://10.0.0.1:5557",
                                     "http://10.0.0.2:8001/"),
                          models=("a=/m/a", "b = org/b"))
    assert config.instance_specs() == [
        InstanceSpec("10.0.0.1:8001", "http://10.0.0.1:8001", 1, "tcp://10.0.0.1:5557"),
        InstanceSpec("10.0.0.2:8001", "http://10.0.0.2:8001", 0, "")]
    assert config.model_tokenizers() == {"a": "/m/a", "b": "org/b"}


@pytest.mark.parametrize("fields, key, words", [
    ({"instances": ()}, "instances", "at least one engine"),
    ({"instances": ("127.0.0.1:8001",)}, "instances", "http://HOST:PORT"),
    ({"instances": ("http://h:1;bucket=3",)}, "instances", "3 buckets"),
    ({"instances": ("http://h:1;events=udp://x",)}, "instances", "unknown option"),
    ({"instances": ("http://h:1", "http://h:1;bucket=1")}, "instances", "named twice"),
    ({"models": ("tiny",)}, "models", "NAME=TOKENIZER"),
    ({"buckets": ("10", "ten")}, "buckets", "whole numbers"),
    ({"buckets": ("20", "10")}, "router.buckets", "strictly increasing"),
    ({"listen": "8100"}, "listen", "HOST:PORT"),
    ({"health_interval_s": 0.0}, "health_interval_s", "positive"),
    ({"gcache_credit": 1.5}, "router.gcache_credit", "[0, 1]"),
])
def test_a_wrong_setting_is_refused_by_name(fields, key, words):
    with pytest.raises(ConfigError) as caught:
        RouterConfig(**{**BASE, **fields})
    assert caught.value.key == key and words in str(caught.value)


def test_toml_then_environment_then_flags(tmp_path):
    path = tmp_path / "gcache.toml"
    path.write_text('[router]\nlisten = "127.0.0.1:9000"\nblock_size = 32\n'
                    'instances = ["http://127.0.0.1:8001;bucket=0", "http://127.0.0.1:8002"]\n'
                    'models = ["tiny=/m/tiny"]\nbuckets = [1000, 2000]\n')
    env = {"GCACHE_ROUTER_BLOCK_SIZE": "64", "GCACHE_ROUTER_HEALTH_INTERVAL_S": "0.5"}
    config = load_config(RouterConfig, "router", path=str(path), env=env,
                         flags={"block_size": "128", "listen": None})
    assert (config.listen, config.block_size, config.health_interval_s) == \
        ("127.0.0.1:9000", 128, 0.5)
    assert [s.name for s in config.instance_specs()] == ["127.0.0.1:8001", "127.0.0.1:8002"]
    assert config.policy().buckets.bounds == (1000, 2000)
