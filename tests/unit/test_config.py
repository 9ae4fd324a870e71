import pytest

from gcache.config import ClientConfig, ServerConfig, parse_size
from gcache.config_loader import load_config, redacted
from gcache.errors import ConfigError


@pytest.mark.parametrize("text,expected", [
    ("4GiB", 4 << 30), ("512 MiB", 512 << 20), ("64k", 64000), ("64KiB", 65536), ("1tb", 10**12),
    ("1.5MiB", 3 << 19), (123, 123), ("77", 77),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "4 parsecs", "GiB", "-1", True])
def test_parse_size_refuses_nonsense_naming_it(text):
    with pytest.raises(ConfigError, match="must be a size"):
        parse_size(text, key="memory")


def test_precedence_is_toml_then_environment_then_flags(tmp_path):
    path = tmp_path / "gcache.toml"
    path.write_text('[server]\nmemory = "1GiB"\nlisten = "127.0.0.1:1"\nlease_ttl_s = 2.5\n')
    env = {"GCACHE_SERVER_MEMORY": "2GiB", "GCACHE_SERVER_LISTEN": "127.0.0.1:2"}
    config = load_config(ServerConfig, "server", path=str(path), env=env,
                         flags={"listen": "127.0.0.1:3", "memory": None})
    assert (config.memory, config.listen, config.lease_ttl_s) == (2 << 30, "127.0.0.1:3", 2.5)


def test_unknown_keys_are_errors_everywhere(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nmemroy = 1\n")
    with pytest.raises(ConfigError, match="memroy.*unknown key"):
        load_config(ServerConfig, "server", path=str(path), env={})
    with pytest.raises(ConfigError, match="GCACHE_SERVER_NOPE"):
        load_config(ServerConfig, "server", env={"GCACHE_SERVER_NOPE": "1"})


@pytest.mark.parametrize("cls,kwargs,message", [
    (ServerConfig, {"listen": "nohost"}, "HOST:PORT"),
    (ServerConfig, {"memory": 1 << 20}, "at least two segments"),
    (ServerConfig, {"io_size": 100}, "between 4KiB"),
    (ClientConfig, {"servers": ("a:1", "a:1")}, "repeat"),
    (ClientConfig, {"timeout_s": 0}, "positive"),
    (ClientConfig, {"io_threads": 0}, "between 1 and 256"),
])
def test_rules_are_checked_with_the_value_in_the_message(cls, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        cls(**kwargs)


def test_config_is_frozen_and_secrets_are_redacted():
    config = ClientConfig(servers=("h:1",), token="s3cret")
    with pytest.raises(AttributeError):
        config.timeout_s = 1.0  # type: ignore[misc]
    assert redacted(config)["token"] == "***"


def test_booleans_and_lists_from_the_environment():
    config = load_config(ClientConfig, "client", env={"GCACHE_CLIENT_SERVERS": "a:1, b:2",
                                                      "GCACHE_CLIENT_VERIFY_CHECKSUM": "no"})
    assert config.servers == ("a:1", "b:2") and config.verify_checksum is False
    with pytest.raises(ConfigError, match="true or false"):
        load_config(ClientConfig, "client", env={"GCACHE_CLIENT_VERIFY_CHECKSUM": "maybe"})


def test_a_config_error_never_shows_the_cluster_token():
    from gcache.errors import ConfigError
    from gcache.kv import client_from_settings
    assert "s3cret" not in str(ConfigError("gcache_token", "s3cret", "must be longer"))
    assert "s3cret" not in str(ConfigError("token", "s3cret", "must be longer"))
    assert "512" in str(ConfigError("gcache_group_head_tokens", 512, "rule"))
    with pytest.raises(ConfigError) as caught:
        client_from_settings({"servers": "127.0.0.1:1", "token": "s3cret", "io_threads": 1,
                              "transport": "carrier-pigeon"})
    assert "s3cret" not in str(caught.value) and "carrier-pigeon" in str(caught.value)


def test_engine_settings_go_through_the_daemons_loader(monkeypatch):
    """Environment < the engine's extra config, as TOML < env < flags for the daemons; errors
    name the engine's ``gcache_`` key."""
    from gcache.errors import ConfigError
    from gcache.kv.connect import client_config
    monkeypatch.setenv("GCACHE_TOKEN", "a-token-from-the-environment")
    monkeypatch.setenv("GCACHE_CLIENT_IO_THREADS", "3")
    config = client_config({"servers": "127.0.0.1:1,127.0.0.1:2", "timeout_ms": 250})
    assert config.token == "a-token-from-the-environment" and config.io_threads == 3
    assert config.servers == ("127.0.0.1:1", "127.0.0.1:2") and config.timeout_s == 0.25
    assert client_config({"servers": "127.0.0.1:1", "io_threads": 2}).io_threads == 2
    with pytest.raises(ConfigError, match="gcache_io_threads"):
        client_config({"servers": "127.0.0.1:1", "io_threads": 0})
    with pytest.raises(ConfigError, match="gcache_servers"):
        client_config({"servers": "nowhere"})


def test_the_token_can_come_from_a_file_or_a_systemd_credential(tmp_path):
    """Never from a command line: ``token_file``, or systemd's ``gcache-token`` credential."""
    from gcache.config import MasterConfig
    from gcache.errors import ConfigError
    secret = tmp_path / "token"
    secret.write_text("a-token-read-from-a-file\n")
    config = load_config(ServerConfig, "server", env={}, flags={"token_file": str(secret)})
    assert config.token == "a-token-read-from-a-file" and config.token_file == str(secret)
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "gcache-token").write_text("a-token-from-systemd-credentials")
    master = load_config(MasterConfig, "master", env={"CREDENTIALS_DIRECTORY": str(credentials)},
                         flags={"data_dir": str(tmp_path)})
    assert master.token == "a-token-from-systemd-credentials"
    with pytest.raises(ConfigError, match="not both"):
        load_config(ServerConfig, "server", env={"GCACHE_TOKEN": "x" * 20},
                    flags={"token_file": str(secret)})
    with pytest.raises(ConfigError, match="readable") as caught:
        load_config(ServerConfig, "server", env={}, flags={"token_file": str(tmp_path / "no")})
    assert "a-token" not in str(caught.value)


def test_a_wildcard_listen_needs_an_advertised_address_once_the_masters_hand_it_out():
    from gcache.config import MasterConfig
    from gcache.errors import ConfigError
    token = {"token": "a-token-of-sixteen-plus"}
    with pytest.raises(ConfigError, match="advertise"):
        ServerConfig(listen="0.0.0.0:7700", master=("10.0.0.1:7600",), **token)
    assert ServerConfig(listen="0.0.0.0:7700", master=("10.0.0.1:7600",),
                        advertise="10.0.0.5:7700", **token).advertise == "10.0.0.5:7700"
    assert ServerConfig(listen="0.0.0.0:7700", **token).master == ()    # static: no map
    peers = ("10.0.0.1:7610", "10.0.0.2:7610", "10.0.0.3:7610")
    with pytest.raises(ConfigError, match="advertise"):
        MasterConfig(listen="[::]:7600", raft=peers[0], peers=peers, data_dir="/d", **token)
    assert MasterConfig(listen="0.0.0.0:7600", raft=peers[0], peers=peers, data_dir="/d",
                        advertise="10.0.0.1:7600", **token).advertise == "10.0.0.1:7600"
