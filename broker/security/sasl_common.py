"""What the SASL mechanisms share: their errors, and Kafka's JAAS configuration syntax."""

from __future__ import annotations

import re


class SaslError(Exception):
    """Kafka's SaslException: the client's credentials or messages are wrong. The client is told
    "Authentication failed during authentication due to invalid credentials with SASL mechanism <m>"."""


class SaslAuthenticationError(Exception):
    """Kafka's SaslAuthenticationException: its message is sent to the client as it is."""


_JAAS_OPTION = re.compile(r'\s*([A-Za-z0-9_.\-]+)\s*=\s*(?:"((?:\\.|[^"\\])*)"|([^\s;"]+))')


def parse_jaas(text: str) -> tuple[str, dict[str, str]]:
    """`<LoginModule class> required key="value" ...;` -> (class, options), as Kafka's JaasConfig reads one
    login module of sasl.jaas.config."""
    text = text.strip()
    m = re.match(r"([A-Za-z0-9_.$]+)\s+(required|requisite|sufficient|optional)\b", text)
    if not m:
        raise ValueError("expected '<LoginModuleClass> required key=\"value\" ... ;'")
    pos = m.end()
    options: dict[str, str] = {}
    while True:
        rest = text[pos:].lstrip()
        if rest.startswith(";") or not rest:
            if rest[1:].strip():
                raise ValueError("only one login module is allowed")
            return m.group(1), options
        om = _JAAS_OPTION.match(text, pos)
        if om is None:
            raise ValueError(f"cannot parse JAAS options at {text[pos:pos + 40]!r}")
        value = om.group(2) if om.group(2) is not None else om.group(3)
        options[om.group(1)] = re.sub(r"\\(.)", r"\1", value)
        pos = om.end()
