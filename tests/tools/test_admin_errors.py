"""kbroker-admin under wrong flags and values, and without a broker: every user error is one line and a non-zero
exit, never a traceback, never a wait for librdkafka's timeouts. Seeded fuzzing drives every subcommand's flags with
bad values against a real broker."""

from __future__ import annotations

import argparse
import io
import random
import subprocess
import sys
import time

import pytest

from kbroker_tools.admin import acls, configs, console, groups, main, topics
from tests.broker_process import ROOT, free_port

PARSERS = {
    "topics": topics.parser,
    "consumer-groups": groups.parser,
    "configs": configs.parser,
    "acls": acls.parser,
    "console-producer": console.producer_parser,
    "console-consumer": console.consumer_parser,
    "get-offsets": console.get_offsets_parser,
}
BAD_VALUES = ("", "[", "x", "-1", "99999999999", "a=b", ":", "*", "ünïcode", "0,x", "-", "=", "1-")


def run_admin(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, stdin: str = ""
) -> tuple[int, str, str]:
    """kbroker-admin in this process (as its console script runs it): exit code, stdout, stderr. Any exception
    that escapes main() fails the test: that is the traceback a user would see."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    try:
        rc = main.main(argv)
    except SystemExit as e:  # --help
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, argv: list[str]) -> None:
    assert rc != 0, f"{argv}: exit 0 for a wrong invocation"
    assert "Traceback" not in err, f"{argv}: {err}"
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("WARN", "Processed"))]
    assert len(lines) == 1 and lines[0].startswith("Error: "), f"{argv}: not one error line: {err!r}"


def wrong_invocations(bootstrap: str) -> list[list[str]]:
    b = ["--bootstrap-server", bootstrap]
    cases = [
        # every command: no flags, an unknown flag, a missing bootstrap, a malformed bootstrap
        *([name] for name in PARSERS),
        *([name, *b, "--no-such-flag"] for name in PARSERS),
        *([name, "--bootstrap-server", "no-port-here", "--list"] for name in PARSERS),
        ["topics", *b, "--describe", "--topic", "["],
        ["topics", *b, "--delete", "--topic", "(unclosed"],
        ["topics", *b, "--create", "--topic", "t", "--partitions", "x"],
        ["topics", *b, "--create", "--topic", "t", "--partitions", "-5"],
        ["topics", *b, "--create"],
        ["topics", *b, "--create", "--topic", "t", "--config", "novalue"],
        ["topics", *b, "--alter", "--topic", "no-such-topic", "--partitions", "3"],
        ["topics", *b, "--list", "--describe"],
        ["consumer-groups", *b, "--describe"],
        ["consumer-groups", *b, "--describe", "--group", "no-such-group"],
        ["consumer-groups", *b, "--reset-offsets", "--group", "g"],
        [
            "consumer-groups",
            *b,
            "--reset-offsets",
            "--group",
            "g",
            "--topic",
            "no-such-topic",
            "--to-earliest",
        ],
        ["consumer-groups", *b, "--reset-offsets", "--group", "g", "--topic", "fz:x", "--to-earliest"],
        ["consumer-groups", *b, "--reset-offsets", "--group", "g", "--topic", "fz:7", "--to-earliest"],
        [
            "consumer-groups",
            *b,
            "--reset-offsets",
            "--group",
            "g",
            "--all-topics",
            "--to-datetime",
            "yesterday",
        ],
        ["consumer-groups", *b, "--reset-offsets", "--group", "g", "--all-topics", "--to-offset", "x"],
        ["consumer-groups", *b, "--reset-offsets", "--group", "g", "--all-topics", "--by-duration", "P1X"],
        ["consumer-groups", *b, "--delete-offsets", "--group", "g"],
        ["configs", *b, "--describe"],
        ["configs", *b, "--describe", "--entity-type", "planets"],
        ["configs", *b, "--alter", "--entity-type", "topics", "--entity-name", "fz"],
        ["configs", *b, "--alter", "--entity-type", "topics", "--entity-name", "fz", "--add-config", "x"],
        [
            "configs",
            *b,
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            "fz",
            "--add-config",
            "no.such=1",
        ],
        ["configs", *b, "--describe", "--entity-type", "topics", "--entity-default"],
        [
            "configs",
            *b,
            "--alter",
            "--entity-type",
            "brokers",
            "--entity-default",
            "--add-config",
            "no.such=1",
        ],
        [
            "configs",
            *b,
            "--alter",
            "--entity-type",
            "clients",
            "--entity-name",
            "c",
            "--add-config",
            "producer_byte_rate=x",
        ],
        [
            "configs",
            *b,
            "--alter",
            "--entity-type",
            "users",
            "--entity-name",
            "u",
            "--add-config",
            "SCRAM-SHA-1=[password=p]",
        ],
        [
            "configs",
            *b,
            "--alter",
            "--entity-type",
            "users",
            "--entity-name",
            "u",
            "--add-config",
            "SCRAM-SHA-256=[iterations=x,password=p]",
        ],
        ["configs", *b, "--alter", "--entity-type", "users", "--add-config", "SCRAM-SHA-256=[password=p]"],
        ["acls", *b, "--add", "--topic", "t", "--operation", "Fly"],
        ["acls", *b, "--add", "--topic", "t", "--operation", "Read"],
        ["acls", *b, "--add", "--group", "g", "--allow-principal", "User:a", "--operation", "Write"],
        ["console-producer", *b],
        ["console-producer", *b, "--topic", "fz", "--property", "novalue"],
        ["console-producer", *b, "--topic", "fz", "--producer-property", "no.such.property=1"],
        ["console-consumer", *b, "--topic", "fz", "--partition", "x"],
        ["console-consumer", *b, "--topic", "fz", "--offset", "5"],
        [
            "console-consumer",
            *b,
            "--topic",
            "fz",
            "--partition",
            "0",
            "--offset",
            "soon",
            "--timeout-ms",
            "500",
        ],
        ["console-consumer", *b, "--include", "[", "--timeout-ms", "500"],
        ["console-consumer", *b, "--topic", "fz", "--max-messages", "x"],
        ["get-offsets", *b, "--time", "yesterday"],
        ["get-offsets", *b, "--time", "-7"],
        ["get-offsets", *b, "--topic", "["],
        ["get-offsets", *b, "--partitions", "0,x"],
        ["get-offsets", *b, "--topic-partitions", "fz:x"],
        ["get-offsets", *b, "--topic-partitions", "fz:0", "--topic", "fz"],
    ]
    return cases


def test_wrong_invocations_are_one_line_errors(broker, capsys, monkeypatch):
    assert (
        run_admin(
            ["topics", "--bootstrap-server", broker.bootstrap, "--create", "--topic", "fz"],
            capsys,
            monkeypatch,
        )[0]
        == 0
    )
    for argv in wrong_invocations(broker.bootstrap):
        rc, _, err = run_admin(argv, capsys, monkeypatch, stdin="no-separator\n")
        assert_one_line_error(rc, err, argv)


def _fuzzed_argv(rng: random.Random, name: str, parser: argparse.ArgumentParser, bootstrap: str) -> list[str]:
    flags = [a for a in parser._actions if a.option_strings and a.dest not in ("help", "bootstrap_server")]
    argv = [name, "--bootstrap-server", bootstrap]
    for action in rng.sample(flags, k=min(len(flags), rng.randint(1, 4))):
        argv.append(rng.choice(action.option_strings))
        if action.nargs != 0:
            argv.append(rng.choice(BAD_VALUES))
    if name == "console-consumer":
        argv += ["--timeout-ms", "300"]  # a consumer that found a topic would otherwise read until stopped
    return argv


def test_fuzzed_flags_never_give_a_traceback(broker, capsys, monkeypatch):
    """Seeded: 20 invocations per subcommand of 1-4 random flags with bad values. Whatever the outcome, a
    failure is one line; nothing raises out of main()."""
    rng = random.Random(38)
    destructive = {"--delete", "--execute", "--alter", "--add", "--remove", "--create", "--delete-offsets"}
    for name, make in PARSERS.items():
        for _ in range(20):
            argv = _fuzzed_argv(rng, name, make(), broker.bootstrap)
            if destructive & set(argv):
                argv = [a if a not in destructive else "--list" for a in argv]
            t0 = time.monotonic()
            rc, _, err = run_admin(argv, capsys, monkeypatch, stdin="k\tv\nbad\n")
            assert time.monotonic() - t0 < 40, argv
            assert "Traceback" not in err, f"{argv}: {err}"
            if rc != 0:
                assert_one_line_error(rc, err, argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["topics", "--list"],
        ["console-consumer", "--topic", "t"],
        ["configs", "--describe", "--entity-type", "clients"],
    ],
)
def test_broker_down_is_one_line_within_seconds(argv):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "kbroker_tools.admin", argv[0], "--bootstrap-server", address, *argv[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        input="x\n",
    )
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    assert r.stderr == f"Error: cannot connect to the broker at {address} (Connection refused) within 3 s\n"
    assert elapsed < 15, f"{elapsed:.1f} s"


def test_console_consumer_without_timeout_stops_when_the_broker_goes_away(tmp_path):
    from tests.broker_process import BrokerProcess

    b = BrokerProcess(tmp_path)
    b.start()
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kbroker_tools.admin",
                "topics",
                "--bootstrap-server",
                b.bootstrap,
                "--create",
                "--topic",
                "gone",
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=60,
        )
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kbroker_tools.admin",
                "console-consumer",
                "--bootstrap-server",
                b.bootstrap,
                "--topic",
                "gone",
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(4)  # connected and polling
        assert proc.poll() is None
    finally:
        b.stop()
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert err.splitlines()[-1].startswith("Error: lost the connection to the brokers"), err
    assert "Traceback" not in err
    assert time.monotonic() - t0 < 15
