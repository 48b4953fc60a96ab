"""``gateway run``: start the broker from its embedded default, a TOML file and flags; ``gateway passwd``/``token``: its users and tokens files."""
from __future__ import annotations

import argparse
import gc
import resource
import signal
import sys
from typing import Any, Sequence, cast

from twisted.logger import (
    FilteringLogObserver,
    ILogFilterPredicate,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogBeginner,
    textFileLogObserver,
)

from gateway import config as configuration
from gateway.auth import passwd as passwd_command
from gateway.auth import tokens as token_command
from gateway.clients.ops import commands as ops_commands
from gateway.clients.perf import command as perf_command
from gateway.clients.perf import hotpath as hotpath_command
from gateway.twisted_types import installed_reactor


class _Version(argparse.Action):
    """``gateway --version``: what a bug report needs, the version first (``gateway 0.1.0``).

    Computed only when asked for: finding the compiled modules walks the packages.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        from gateway import __version__
        from gateway.compiled import describe

        python = ".".join(str(part) for part in sys.version_info[:3])
        print(f"gateway {__version__}\nPython {python} ({sys.executable}), hot path: {describe()}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="STOMP/MQTT/WebSocket message broker")
    parser.add_argument("-V", "--version", action=_Version, help="print the version, the Python and the hot path, then exit")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the broker (embedded default: STOMP on 127.0.0.1:61613, MQTT on 1883, WebSocket on 61614, data in ./data)")
    run.add_argument("--config", metavar="FILE", help="TOML configuration file (relative paths in it are read from its directory)")
    run.add_argument("--host", help="address every listener binds to (default 127.0.0.1)")
    run.add_argument("--data-dir", metavar="DIR", help="data directory (default ./data; relative to the current directory)")
    run.add_argument("--stomp-port", type=int, metavar="N", help="STOMP over TCP port (default 61613, 0 disables)")
    run.add_argument("--mqtt-port", type=int, metavar="N", help="MQTT over TCP port (default 1883, 0 disables)")
    run.add_argument("--ws-port", type=int, metavar="N", help="WebSocket port, STOMP and MQTT (default 61614, 0 disables)")
    run.add_argument("--admin-port", type=int, metavar="N", help="admin HTTP port: web console at /console/, /metrics, JSON API (default 8161, 0 disables)")
    run.add_argument("--log-level", choices=configuration.LOG_LEVELS, help="default info")
    perf_command.add_parser(commands)
    hotpath_command.add_parser(commands)
    passwd_command.add_parser(commands)
    token_command.add_parser(commands)
    ops_commands.add_parsers(commands)
    return parser


def _start_logging(level: str) -> None:
    # These classes provide the interfaces by zope's @implementer, which mypy (without
    # the mypy-zope plugin) does not take for subclassing: cast() says what Twisted declares.
    predicate = cast(ILogFilterPredicate, LogLevelFilterPredicate(defaultLogLevel=LogLevel.levelWithName(level)))
    observer = FilteringLogObserver(cast(ILogObserver, textFileLogObserver(sys.stderr)), [predicate])
    globalLogBeginner.beginLoggingTo([cast(ILogObserver, observer)], redirectStandardIO=False)


def _raise_file_limit() -> None:
    """Every client is a descriptor: take the hard limit, as Mosquitto and ActiveMQ's scripts do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def _tune_gc() -> None:
    """Collect the young generation every 50,000 allocations instead of 700.

    Every message allocates a few tracked objects (its headers, an entry), so
    the default threshold ran a collection every few hundred messages and
    showed up on the hot path's profile; messages are acyclic, so collecting
    less often frees the same memory, a little later.
    """
    gc.set_threshold(50_000, 20, 100)


def run(args: argparse.Namespace) -> int:
    overrides = {
        "host": args.host, "data_dir": args.data_dir, "stomp_port": args.stomp_port,
        "mqtt_port": args.mqtt_port, "ws_port": args.ws_port, "admin_port": args.admin_port, "log_level": args.log_level,
    }
    try:
        config = configuration.load(args.config, overrides)
    except configuration.ConfigError as exc:
        print(f"gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    _start_logging(config.log_level)
    _raise_file_limit()
    _tune_gc()

    reactor = installed_reactor()

    from gateway.server import Gateway

    gateway = Gateway(config, reactor)
    # SIGHUP reads the file again, with the same flags on top.
    gateway.reload_config = lambda: configuration.load(args.config, overrides)
    outcome = {"code": 0}

    def stop_soon(signum: int, frame: Any) -> None:
        # A signal before the reactor runs (its own handlers are not in place yet, and
        # the listeners may already be up): stop as soon as it starts, cleanly.
        reactor.callFromThread(reactor.stop)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop_soon)
    # SIGHUP re-reads [auth] (users, groups, rules) and the TLS certificates.
    signal.signal(signal.SIGHUP, lambda signum, frame: reactor.callFromThread(gateway.reload))

    def failed(failure: Any) -> None:
        # A port in use, an unreadable store: say so and exit non-zero.
        print(f"gateway: cannot start: {failure.getErrorMessage()}", file=sys.stderr)
        outcome["code"] = 1
        if reactor.running:  # a standby that failed later; an immediate failure never ran it
            reactor.stop()

    def fatal(why: str) -> None:
        # The store failed beyond repair in this process: stop serving, exit non-zero.
        print(f"gateway: stopping: {why}", file=sys.stderr)
        outcome["code"] = 3
        if reactor.running:
            reactor.stop()

    gateway.on_fatal = fatal

    def started(_: Any) -> None:
        # SIGINT/SIGTERM stop the reactor; this trigger runs first and is waited for.
        reactor.addSystemEventTrigger("before", "shutdown", gateway.stop)

    gateway.start_when_master().addCallbacks(started, failed)
    if outcome["code"]:
        return outcome["code"]
    reactor.run()
    return outcome["code"]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return run(args)
    if args.command == "perf":
        return perf_command.run(args)
    if args.command == "hotpath":
        return hotpath_command.run(args)
    if args.command == "passwd":
        return passwd_command.run(args)
    if args.command == "token":
        return token_command.run(args)
    if args.command in ops_commands.COMMANDS:
        return ops_commands.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
