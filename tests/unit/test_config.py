import pytest

from gateway.config import ConfigError, load


def test_embedded_default():
    config = load()
    assert config.host == "127.0.0.1" and config.stomp.port == 61613
    assert config.data_dir == "./data" and config.policy.max_redeliveries == 6


def test_toml_then_flags_override(tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text(
        '[broker]\nhost = "0.0.0.0"\nlog_level = "debug"\n'
        '[stomp]\nport = 1234\nmax_frame_size = 2048\nheartbeat_grace = 3\n'
        '[policy]\nmax_redeliveries = 2\nindividual_dlq = true\n'
    )
    config = load(str(path), {"stomp_port": 4321, "data_dir": "/tmp/x", "host": None})
    assert config.host == "0.0.0.0" and config.log_level == "debug"
    assert config.stomp.port == 4321 and config.data_dir == "/tmp/x"
    assert config.stomp_settings.limits.max_frame_size == 2048
    assert config.stomp_settings.heartbeat_grace == 3.0
    assert config.policy.max_redeliveries == 2 and config.policy.individual_dlq is True


@pytest.mark.parametrize("text, error", [
    ("[broker]\nhots = 'x'\n", "unknown setting \\[broker\\] hots"),
    ("[stomp]\nport = 'x'\n", "port must be int"),
    ("[stomp]\nport = 70000\n", "0-65535"),
    ("[nope]\na = 1\n", "unknown section"),
    ("[policy]\nmax_redeliveries = true\n", "must be int"),
    ("[broker]\nlog_level = 'loud'\n", "log level"),
    ("[policy]\ndead_letter_queue = '/queue/DLQ'\n", "queue://"),
    ("not toml [", "gw.toml"),
    ("[persistence]\ndisk_free_limit = '5'\n", "disk_free_limit: .*percentage"),
    ("[persistence]\ndisk_free_limit = -1\n", "disk_free_limit: bytes must be 0 or more"),
    ("[persistence]\ndisk_check_interval = 0\n", "must be positive"),
    ("[persistence]\ninline_sync_below_ms = -1\n", r"inline_sync_below_ms must be 0 \(never\) or more"),
    ("[persistence]\nstream_sync_interval_ms = -5\n", r"stream_sync_interval_ms must be from 0 \(at once\) to 1000"),
    ("[persistence]\nstream_sync_interval_ms = 5000\n", r"stream_sync_interval_ms must be from 0 \(at once\) to 1000"),
])
def test_bad_files_name_the_problem(tmp_path, text, error):
    path = tmp_path / "gw.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load(str(path))


def test_missing_file():
    with pytest.raises(ConfigError, match="cannot read"):
        load("/nonexistent/gw.toml")


def test_disk_free_limit_is_a_gibibyte_by_default_bytes_or_a_share(tmp_path):
    assert load().persistence.disk_free_limit == 1 << 30
    path = tmp_path / "gw.toml"
    path.write_text("[persistence]\ndisk_free_limit = '5%'\nfault_exit_after = 30\n")
    config = load(str(path))
    assert config.persistence.disk_free_limit == 0.05 and config.persistence.fault_exit_after == 30.0
    path.write_text("[persistence]\ndisk_free_limit = 536870912\n")
    assert load(str(path)).persistence.disk_free_limit == 536870912


# -- paths: a configuration file's are its neighbours; flags' are the current directory's -------------

PATHS = '''
[broker]
data_dir = "var/data"
[tls]
cert = "tls/server.pem"
key = "tls/server.key"
ca = "tls/ca.pem"
[auth]
users_file = "users"
tokens_file = "tokens"
audit_log = "log/audit.jsonl"
'''


def test_every_relative_path_in_a_file_is_read_from_the_files_directory(tmp_path, monkeypatch):
    """A file is written once and run from anywhere (a shell, a service manager in /): its paths mean one place."""
    etc = tmp_path / "etc" / "gateway"
    etc.mkdir(parents=True)
    (etc / "gw.toml").write_text(PATHS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load("../etc/gateway/gw.toml")  # the file named relative to the current directory, as on a command line
    assert config.data_dir == str(etc / "var/data")
    assert (config.tls.cert, config.tls.key, config.tls.ca) == (
        str(etc / "tls/server.pem"), str(etc / "tls/server.key"), str(etc / "tls/ca.pem"),
    )
    auth = config.auth
    assert (auth.users_file, auth.tokens_file, auth.audit_log) == (
        str(etc / "users"), str(etc / "tokens"), str(etc / "log/audit.jsonl"),
    )


def test_absolute_paths_in_a_file_stay(tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text('[broker]\ndata_dir = "/srv/gateway"\n[auth]\naudit_log = "/var/log/gateway/audit.jsonl"\n')
    config = load(str(path))
    assert config.data_dir == "/srv/gateway" and config.auth.audit_log == "/var/log/gateway/audit.jsonl"


def test_flags_and_the_default_stay_relative_to_the_current_directory(tmp_path):
    """Only what the file says moves: --data-dir is a command line's path, ./data the embedded default."""
    path = tmp_path / "conf" / "gw.toml"
    path.parent.mkdir()
    path.write_text('[broker]\ndata_dir = "from-file"\n')
    assert load(str(path), {"data_dir": "from-flag"}).data_dir == "from-flag"
    path.write_text('[stomp]\nport = 1234\n')
    assert load(str(path)).data_dir == "./data"


def test_an_empty_data_dir_is_an_error(tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text('[broker]\ndata_dir = ""\n')
    with pytest.raises(ConfigError, match="data_dir must name a directory"):
        load(str(path))
