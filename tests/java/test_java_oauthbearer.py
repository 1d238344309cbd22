"""The Java client (kafka-clients 3.9) with SASL/OAUTHBEARER: Kafka's unsecured login module against the unsecured
validator, and the OIDC login callback handler fetching signed JWTs from a token endpoint against the JWKS
validator; a token the broker refuses surfaces as the client's SaslAuthenticationException (SecurityCompat.java)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.java.test_java_client import HERE, JAVA_LOG, _missing, compile_java, find_jar_dir
from tests.oauth_idp import CLIENTS, LOGIN_MODULE, IdentityProvider, OAuthBroker

_why = _missing()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")

SOURCES = [HERE / "SecurityCompat.java", HERE / "org" / "slf4j" / "impl" / "StaticLoggerBinder.java"]
# The client parses tokens with Jackson, which kafka-clients leaves to the application.
JACKSON = ["jackson-databind", "jackson-core", "jackson-annotations"]
JAVA_TIMEOUT = 180


@pytest.fixture(scope="module")
def java_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    cp = compile_java(tmp_path_factory, SOURCES, "java-oauth-classes")
    jar_dir = find_jar_dir()
    assert jar_dir is not None
    missing = [j for j in JACKSON if not (jar_dir / f"{j}.jar").is_file()]
    if missing:
        pytest.skip(f"the Java jars have no {', '.join(missing)} (needed by the client's OAUTHBEARER login)")
    return os.pathsep.join([cp, *(str(jar_dir / f"{j}.jar") for j in JACKSON)])


@pytest.fixture(scope="module")
def idp(oauth_idp: IdentityProvider) -> IdentityProvider:
    return oauth_idp


@pytest.fixture(scope="module")
def broker(oauth_broker: OAuthBroker) -> OAuthBroker:
    return oauth_broker


def java(classpath: str, b: OAuthBroker, idp: IdentityProvider, listener: str, scenario: str,
         **args: str) -> list[str]:
    cmd = ["java", f"-Dkcompat.log={JAVA_LOG}",
           # Kafka 3.9.1+ and 4.x fetch tokens only from URLs allowed here.
           f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={idp.token_url}",
           "-cp", classpath, "SecurityCompat", b.addr(listener), scenario, *(f"{k}={v}" for k, v in args.items())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=JAVA_TIMEOUT)
    if r.returncode != 0 or r.stdout.splitlines()[-1:] != [f"DONE {scenario}"]:
        raise AssertionError(f"SecurityCompat {scenario} on {listener} exited {r.returncode}\n--- stdout:\n{r.stdout}\n"
                             f"--- stderr:\n{r.stderr[-6000:]}\n--- broker log:\n{b.read_log()[-3000:]}")
    return [line[3:] for line in r.stdout.splitlines() if line.startswith("OK ")]


def unsecured_login(sub: str, **options: str) -> dict[str, str]:
    extra = "".join(f' {k}="{v}"' for k, v in options.items())
    return {"prop.security.protocol": "SASL_PLAINTEXT", "prop.sasl.mechanism": "OAUTHBEARER",
            "prop.sasl.jaas.config": f'{LOGIN_MODULE} required unsecuredLoginStringClaim_sub="{sub}"{extra};'}


def oidc_login(idp: IdentityProvider, client: str, secret: str) -> dict[str, str]:
    return {"prop.security.protocol": "SASL_PLAINTEXT", "prop.sasl.mechanism": "OAUTHBEARER",
            "prop.sasl.login.callback.handler.class":
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
            "prop.sasl.oauthbearer.token.endpoint.url": idp.token_url,
            "prop.sasl.jaas.config": f'{LOGIN_MODULE} required clientId="{client}" clientSecret="{secret}";'}


def test_unsecured_login_module(java_classpath: str, broker: OAuthBroker, idp: IdentityProvider,
                                topic_name: str) -> None:
    ok = java(java_classpath, broker, idp, "DEV", "roundtrip", topic=topic_name, count="500",
              **unsecured_login("alice"))
    assert ok == ["produced 500", "consumed 500"]


def test_oidc_login_callback_handler(java_classpath: str, broker: OAuthBroker, idp: IdentityProvider,
                                     topic_name: str) -> None:
    before = idp.token_requests
    ok = java(java_classpath, broker, idp, "OIDC", "roundtrip", topic=topic_name, count="500",
              **oidc_login(idp, "svc-orders", CLIENTS["svc-orders"]))
    assert ok == ["produced 500", "consumed 500"]
    assert idp.token_requests > before


def test_refused_token_is_an_authentication_exception(java_classpath: str, broker: OAuthBroker,
                                                      idp: IdentityProvider) -> None:
    """An unsecured token sent to the listener that wants signed ones: the client reports Kafka's challenge."""
    [line] = java(java_classpath, broker, idp, "OIDC", "badauth", **unsecured_login("mallory"))
    assert line.startswith("authfail SaslAuthenticationException"), line
    assert '{"status":"invalid_token"}' in line, line


def test_missing_scope(java_classpath: str, broker: OAuthBroker, idp: IdentityProvider) -> None:
    [line] = java(java_classpath, broker, idp, "SCOPED", "badauth", **unsecured_login("alice"))
    assert '{"status":"insufficient_scope", "scope":"kafka"}' in line, line
