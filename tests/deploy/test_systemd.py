"""The systemd deployment (deploy/systemd, deploy/config): every unit passes ``systemd-analyze
verify``, the example configs load as the daemons load them (the token from a systemd
credential), the units have the properties an operator relies on, and a real ``gcache-server``
started from its unit's ``ExecStart`` line and the shipped config, exactly as written, serves,
stops cleanly on SIGTERM and comes back with its arena.

Everything happens under a private root, never in this host's /etc or /opt.
``systemd-analyze verify --root=ROOT`` resolves what a unit names under ROOT, so ROOT gets our
units in /etc/systemd/system, this host's own system units (the targets the default
dependencies name), the gcache user made from the shipped sysusers snippet by
``systemd-sysusers --root`` and, at each ``ExecStart`` path, a copy of the venv's console
script: a copy, because verify follows a symlink within ROOT, where a link to the venv leads
nowhere. verify reports an unknown key or a bad value as a warning and still exits 0, so any
line of its output that names one of our units fails the test. ``systemd-analyze``,
``systemd-sysusers`` and ``findmnt`` are test dependencies: their absence fails, never skips.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from gcache import Client
from gcache.cli.arenas import SHM_DIR, SIDECARS
from gcache.cli.local_cluster import READY
from gcache.cli.ports import free_port
from gcache.config import MasterConfig, ServerConfig
from gcache.config_loader import CREDENTIAL, load_config
from gcache.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
UNIT_DIR = ROOT / "deploy" / "systemd"
CONFIG_DIR = ROOT / "deploy" / "config"
UNITS = sorted(UNIT_DIR.glob("*.service"))
SYSUSERS = UNIT_DIR / "gcache.sysusers"
FSTAB = UNIT_DIR / "dev-shm.fstab"
# This host's system units: /usr/lib, or /lib where /usr is not merged.
HOST_UNITS = [Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")]
TOOL_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0
TEST_TOKEN = "systemd-test-token-0123456789abcdef"
# The environment systemd gives a system service (systemd.exec(5), "Environment Variables in
# Spawned Processes"); the directories' variables are added from the unit.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
Unit = dict[str, list[tuple[str, str]]]


def _parse_unit(path: Path) -> Unit:
    """Section -> (key, value) in file order: a unit repeats keys (After=, DeviceAllow=),
    which configparser would merge."""
    unit: Unit = {}
    section = ""
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"{path.name}:{number}: no continuation lines here"
        if line.startswith("["):
            section = line.strip("[]")
            unit.setdefault(section, [])
            continue
        key, _, value = line.partition("=")
        unit[section].append((key.strip(), value.strip()))
    return unit


def _values(unit: Unit, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def _one(unit: Unit, section: str, key: str) -> str:
    values = _values(unit, section, key)
    assert len(values) == 1, f"[{section}] {key}= is set {len(values)} times"
    return values[0]


def _exec_start(unit: Unit) -> list[str]:
    """ExecStart as argv. shlex splits as systemd does only without its specifiers (%),
    variables ($) and prefixes (-@:+!), so the line must have none."""
    line = _one(unit, "Service", "ExecStart")
    assert not re.search(r"[%$]", line), f"ExecStart={line}: no specifiers or variables"
    argv = shlex.split(line)
    assert argv[0].startswith("/"), f"ExecStart={line}: an absolute path with no prefix"
    return argv


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not on PATH: the systemd tests need it (Debian: apt-get install "
                    "systemd util-linux)", pytrace=False)
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                          check=False)


def _lay_out_root(root: Path) -> None:
    """Units, the host's system units, the gcache user and the ExecStart binaries under root."""
    host_units = next((d for d in HOST_UNITS if d.is_dir()), None)
    if host_units is None:
        pytest.fail(f"none of {HOST_UNITS} exists: verify needs this host's system units "
                    "(sysinit.target and the rest the default dependencies name)", pytrace=False)
    units = root / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    for path in UNITS:
        shutil.copy(path, units / path.name)
    shutil.copytree(host_units, root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    (root / "lib").symlink_to("usr/lib")     # the host units' links name /lib/systemd/system
    made = _run(_tool("systemd-sysusers"), f"--root={root}", str(SYSUSERS))
    complaints = [line for line in made.stderr.splitlines() if not line.startswith("Creating ")]
    assert made.returncode == 0 and not complaints, made.stderr
    venv_bin = os.path.dirname(sys.executable)
    for path in UNITS:
        binary = _exec_start(_parse_unit(path))[0]
        target = root / binary.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(venv_bin, os.path.basename(binary)), target)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    where = tmp_path / "root"
    _lay_out_root(where)
    return where


def test_every_unit_passes_systemd_analyze_verify(root):
    assert UNITS, f"no units in {UNIT_DIR}"
    names = [p.name for p in UNITS]
    result = _run(_tool("systemd-analyze"), "verify", f"--root={root}",
                  *(str(root / "etc" / "systemd" / "system" / n) for n in names))
    ours = [line for line in (result.stdout + result.stderr).splitlines()
            if any(name in line for name in names)]
    assert result.returncode == 0 and not ours, "\n".join(ours) or result.stderr


def test_the_units_run_as_the_user_the_sysusers_snippet_makes(root):
    users = {line.split(":")[0]: line for line in
             (root / "etc" / "passwd").read_text(encoding="utf-8").splitlines()}
    for path in UNITS:
        unit = _parse_unit(path)
        user = _one(unit, "Service", "User")
        assert user in users and _one(unit, "Service", "Group") == user, path.name
        uid = int(users[user].split(":")[2])
        assert uid < 1000, f"{user} must be a system user: logind's RemoveIPC spares only those"


def _credentials(root: Path, unit: Unit, name: str) -> Path:
    """What systemd makes of LoadCredential=ID:PATH: a private copy of PATH (under root) in
    $CREDENTIALS_DIRECTORY/ID."""
    directory = root / "run" / "credentials" / name
    directory.mkdir(parents=True)
    for entry in _values(unit, "Service", "LoadCredential"):
        credential, _, source = entry.partition(":")
        shutil.copy(root / source.lstrip("/"), directory / credential)
        os.chmod(directory / credential, 0o400)
    return directory


def _write_token(root: Path) -> None:
    token = root / "etc" / "gcache" / "token"
    token.parent.mkdir(parents=True, exist_ok=True)
    token.write_text(TEST_TOKEN + "\n", encoding="utf-8")
    os.chmod(token, 0o600)


@pytest.mark.parametrize(("cls", "section"), [(ServerConfig, "server"), (MasterConfig, "master")])
def test_the_example_configs_load_with_the_token_from_the_credential(root, cls, section):
    unit = _parse_unit(UNIT_DIR / f"gcache-{section}.service")
    argv = _exec_start(unit)
    config_path = argv[argv.index("--config") + 1]
    assert config_path == f"/etc/gcache/{section}.toml"
    path = CONFIG_DIR / f"{section}.toml"
    _write_token(root)
    credentials = _credentials(root, unit, f"gcache-{section}.service")
    config = load_config(cls, section, path=str(path),
                         env={"CREDENTIALS_DIRECTORY": str(credentials)})
    assert config.token == TEST_TOKEN
    assert config.token_file == str(credentials / CREDENTIAL)
    with pytest.raises(ConfigError, match="not a loopback address"):
        load_config(cls, section, path=str(path), env={})      # no credential, no start


def test_the_token_reaches_the_daemons_only_as_a_credential():
    for path in UNITS:
        unit = _parse_unit(path)
        assert _values(unit, "Service", "LoadCredential") == [f"{CREDENTIAL}:/etc/gcache/token"]
        assert not any("token" in arg.lower() for arg in _exec_start(unit)), path.name
        for key in ("Environment", "EnvironmentFile", "PassEnvironment"):
            assert not any("TOKEN" in v.upper() for v in _values(unit, "Service", key))
    for path in CONFIG_DIR.glob("*.toml"):
        assert not re.search(r"^\s*token", path.read_text(encoding="utf-8"), re.M), path.name


def test_nothing_in_the_units_removes_the_arena_or_hides_its_socket():
    for path in UNITS:          # both run as gcache: either one's RemoveIPC= deletes the arena
        unit = _parse_unit(path)
        assert _values(unit, "Service", "RemoveIPC") == ["no"], path.name
        assert _values(unit, "Service", "DynamicUser") in ([], ["no"]), path.name
    server = _parse_unit(UNIT_DIR / "gcache-server.service")
    for key in ("PrivateTmp", "PrivateIPC", "PrivateDevices", "ProtectHostname"):
        assert _values(server, "Service", key) in ([], ["no"]), key
    assert _one(server, "Service", "Restart") == "on-failure"       # exit 0 after SIGTERM
    assert _one(server, "Service", "KillSignal") == "SIGTERM"


def test_every_path_a_daemon_writes_is_writable_under_protect_system_strict():
    server_unit = _parse_unit(UNIT_DIR / "gcache-server.service")
    server = load_config(ServerConfig, "server", path=str(CONFIG_DIR / "server.toml"),
                         env={"GCACHE_TOKEN": TEST_TOKEN})
    master_unit = _parse_unit(UNIT_DIR / "gcache-master.service")
    master = load_config(MasterConfig, "master", path=str(CONFIG_DIR / "master.toml"),
                         env={"GCACHE_TOKEN": TEST_TOKEN})

    def writable(unit: Unit) -> list[str]:
        assert _one(unit, "Service", "ProtectSystem") == "strict"
        state = [f"/var/lib/{d}" for v in _values(unit, "Service", "StateDirectory")
                 for d in v.split()]
        runtime = [f"/run/{d}" for v in _values(unit, "Service", "RuntimeDirectory")
                   for d in v.split()]
        return state + runtime + " ".join(_values(unit, "Service", "ReadWritePaths")).split()

    assert server.disk_dir in writable(server_unit)
    assert os.path.dirname(server.unix_socket) in writable(server_unit)
    assert SHM_DIR in writable(server_unit)
    assert master.data_dir in writable(master_unit)


_TMPFS_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def test_the_fstab_line_sizes_dev_shm_above_the_example_arena():
    checked = _run(_tool("findmnt"), "--verify", "--tab-file", str(FSTAB))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = [ln.split() for ln in FSTAB.read_text(encoding="utf-8").splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(lines) == 1 and lines[0][1:3] == ["/dev/shm", "tmpfs"], lines
    options = dict(o.partition("=")[::2] for o in lines[0][3].split(","))
    size = re.fullmatch(r"(\d+)([kmgt]?)", options["size"].lower())
    assert size, f"size={options['size']}: a byte count with k, m, g or t (binary, as tmpfs)"
    memory = load_config(ServerConfig, "server", path=str(CONFIG_DIR / "server.toml"),
                         env={"GCACHE_TOKEN": TEST_TOKEN}).memory
    assert int(size.group(1)) * _TMPFS_UNITS[size.group(2)] > memory


# ---- the server, started as its unit starts it -------------------------------------------


def _service_environment(root: Path, unit: Unit, name: str) -> dict[str, str]:
    """What systemd puts in the service's environment (paths under root), plus the unit's own
    Environment= assignments."""
    user = _one(unit, "Service", "User")
    env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8", "USER": user, "LOGNAME": user,
           "HOME": str(root / "var" / "lib" / "gcache"),       # the user's, from sysusers
           "CREDENTIALS_DIRECTORY": str(_credentials(root, unit, name))}
    for key, variable in (("StateDirectory", "STATE_DIRECTORY"),
                          ("RuntimeDirectory", "RUNTIME_DIRECTORY")):
        base = root / ("var/lib" if key == "StateDirectory" else "run")
        made = [base / d for v in _values(unit, "Service", key) for d in v.split()]
        for directory in made:
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, int(_one(unit, "Service", f"{key}Mode"), 8))
        if made:
            env[variable] = ":".join(map(str, made))
    for assignments in _values(unit, "Service", "Environment"):
        env.update(a.split("=", 1) for a in shlex.split(assignments))
    return env


class _Started:
    """One gcache-server process started from argv, its log, and its address once ready."""

    def __init__(self, argv: list[str], env: dict[str, str], *, cwd: Path, umask: int,
                 log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.offset = log.tell()
            self.proc = subprocess.Popen(argv, env=env, cwd=cwd, umask=umask, stdout=log,
                                         stderr=log, stdin=subprocess.DEVNULL)
        self.address = self._wait_ready()

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                fh.seek(self.offset)
                for line in fh:
                    if line.startswith(READY):
                        return line[len(READY):].strip()
            if self.proc.poll() is not None:
                pytest.fail(f"gcache-server exited with {self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.05)
        pytest.fail(f"gcache-server not ready after {READY_TIMEOUT_S}s:\n{self.tail()}")

    def tail(self) -> str:
        return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-20:])

    def terminate(self, timeout_s: float) -> int:
        """SIGTERM by PID, as systemd's KillSignal=; its return code."""
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _metrics_status(port: int, token: str | None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_server_started_from_its_units_exec_start_serves_stops_and_keeps_its_arena(root):
    name = "gcache-server.service"
    unit = _parse_unit(UNIT_DIR / name)
    argv = _exec_start(unit)
    # Only the root moves: the binary and the config are the shipped files' copies under root.
    config_path = root / argv[argv.index("--config") + 1].lstrip("/")
    config_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIG_DIR / "server.toml", config_path)
    argv = [str(root) + arg if arg.startswith("/") else arg for arg in argv]
    _write_token(root)
    env = _service_environment(root, unit, name)
    shipped = load_config(ServerConfig, "server", path=str(config_path), env=env)
    shm_name = f"gcache-systemd-{uuid.uuid4().hex[:8]}"
    metrics_port = free_port()
    # What a test on a shared machine must change, by environment (above the file, below
    # flags): loopback and free ports, its own arena name and a small arena, no masters, and
    # the config's own paths under root.
    env |= {"GCACHE_SERVER_LISTEN": "127.0.0.1:0",
            "GCACHE_SERVER_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
            "GCACHE_SERVER_SHM_NAME": shm_name,
            "GCACHE_SERVER_MEMORY": "64MiB",
            "GCACHE_SERVER_MASTER": "",
            "GCACHE_SERVER_DISK_DIR": str(root) + shipped.disk_dir,
            "GCACHE_SERVER_UNIX_SOCKET": str(root) + shipped.unix_socket}
    socket_path = Path(env["GCACHE_SERVER_UNIX_SOCKET"])
    stop_s = float(_one(unit, "Service", "TimeoutStopSec"))

    def start() -> _Started:
        return _Started(argv, env, cwd=root, umask=int(_one(unit, "Service", "UMask"), 8),
                        log_path=root.parent / "server.log")

    server = None
    try:
        server = start()
        with Client([server.address], token=TEST_TOKEN, timeout_s=5.0) as client:
            assert client.put("systemd/k", b"v" * 4096)
            assert client.get("systemd/k") == b"v" * 4096
            assert client.stats()["shm_servers"] == [server.address]   # through the socket
        assert _metrics_status(metrics_port, TEST_TOKEN) == 200
        assert _metrics_status(metrics_port, None) == 401
        assert server.terminate(stop_s) == 0, server.tail()
        assert os.path.exists(os.path.join(SHM_DIR, shm_name)), "the arena must outlive it"
        assert not socket_path.exists()
        server = start()                                 # a restart re-attaches to it
        with Client([server.address], token=TEST_TOKEN, timeout_s=5.0) as client:
            assert client.get("systemd/k") == b"v" * 4096
        assert server.terminate(stop_s) == 0, server.tail()
    finally:
        if server is not None:
            server.kill()
        arena = os.path.join(SHM_DIR, shm_name)
        for leftover in (arena, *(arena + suffix for suffix in SIDECARS), str(socket_path)):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass
