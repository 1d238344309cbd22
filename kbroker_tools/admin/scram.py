"""kbroker-admin configs --entity-type users: SCRAM credentials, as kafka-configs.sh shows and changes them."""

from __future__ import annotations

import argparse
from typing import Any

from kbroker_tools.admin.common import CommandError, parse_key_values, result, split_config_list

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_ITERATIONS = 4096  # Kafka's ScramMechanism minimum, and kafka-configs' default


def user_credentials(admin: Any, args: argparse.Namespace) -> int:
    if args.entity_default:
        raise CommandError("--entity-default is not valid for SCRAM credentials of users")
    if args.describe:
        return describe(admin, args.entity_name)
    return alter(admin, args)


def _mechanism_name(m: Any) -> str:
    return m.name.replace("_", "-")


def describe(admin: Any, user: str | None) -> int:
    if user:
        descriptions = {
            user: _described(admin.describe_user_scram_credentials([user], request_timeout=30)[user], user)
        }
    else:
        descriptions = result(
            admin.describe_user_scram_credentials(None, request_timeout=30), "describing SCRAM credentials"
        )
    for name, d in sorted(descriptions.items()):
        if d is None:
            continue
        creds = ", ".join(
            f"{_mechanism_name(i.mechanism)}=iterations={i.iterations}" for i in d.scram_credential_infos
        )
        print(f"SCRAM credential configs for user-principal '{name}' are {creds}")
    return 0


def _described(future: Any, user: str) -> Any:
    try:
        return result(future, f"describing SCRAM credentials of user {user}")
    except CommandError as e:
        if "RESOURCE_NOT_FOUND" in str(e):  # a user without credentials: nothing to show, as kafka-configs
            return None
        raise


def _upsertion(user: str, mechanism: str, spec: str) -> Any:
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    fields = parse_key_values([spec], f"--add-config {mechanism}")
    unknown = set(fields) - {"password", "iterations"}
    if unknown or "password" not in fields:
        raise CommandError(
            f"--add-config {mechanism}=[iterations=N,password=SECRET]: "
            f"{'unknown ' + ', '.join(sorted(unknown)) if unknown else 'password is required'}"
        )
    try:
        iterations = int(fields.get("iterations", DEFAULT_ITERATIONS))
    except ValueError:
        raise CommandError(f"--add-config {mechanism}: iterations must be a number") from None
    info = ScramCredentialInfo(ScramMechanism[mechanism.replace("-", "_")], iterations)
    return UserScramCredentialUpsertion(user, info, fields["password"].encode())


def _top_level(text: str) -> list[str]:
    """`A=[x=1,y=2],B=[z=3]` split at the commas outside brackets, the brackets kept."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p.strip() for p in [*parts, cur] if p.strip()]


def alter(admin: Any, args: argparse.Namespace) -> int:
    from confluent_kafka.admin import ScramMechanism, UserScramCredentialDeletion

    user = args.entity_name
    if not user:
        raise CommandError("--alter needs --entity-name for users")
    changes: list[Any] = []
    for item in args.add_config or ():
        for kv in _top_level(item):
            mechanism, sep, spec = kv.partition("=")
            if mechanism.strip() not in MECHANISMS or not sep:
                raise CommandError(
                    f"--add-config {kv!r}: expected SCRAM-SHA-256 or SCRAM-SHA-512="
                    "[iterations=N,password=SECRET]"
                )
            changes.append(
                _upsertion(user, mechanism.strip(), spec.strip().removeprefix("[").removesuffix("]"))
            )
    for item in args.delete_config or ():
        for mechanism in split_config_list(item):
            if mechanism not in MECHANISMS:
                raise CommandError(f"--delete-config {mechanism!r}: expected SCRAM-SHA-256 or SCRAM-SHA-512")
            changes.append(UserScramCredentialDeletion(user, ScramMechanism[mechanism.replace("-", "_")]))
    if not changes:
        raise CommandError("--alter needs --add-config and/or --delete-config")
    for _, fut in admin.alter_user_scram_credentials(changes, request_timeout=30).items():
        result(fut, f"altering SCRAM credentials of user {user}")
    print(f"Completed updating config for user {user}.")
    return 0
