"""Shared fixtures: a real kbroker process per test module, and unique topic names."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator

import pytest

from tests.broker_process import BrokerProcess
from tests.oauth_idp import CLIENTS, IdentityProvider, OAuthBroker

_counter = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the whole test module (embedded mode, no ZooKeeper)."""
    b = BrokerProcess(tmp_path_factory.mktemp("broker"))
    b.start()
    yield b
    b.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    return f"t-{base}-{next(_counter)}"


def have_kcat() -> bool:
    return shutil.which("kcat") is not None


@pytest.fixture(scope="module")
def oauth_idp() -> Iterator[IdentityProvider]:
    """A token endpoint and JWKS (tests/oauth_idp.py) for the OAUTHBEARER tests of one module."""
    p = IdentityProvider(CLIENTS).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def oauth_broker(tmp_path_factory: pytest.TempPathFactory, oauth_idp: IdentityProvider) -> Iterator[OAuthBroker]:
    """A broker whose listeners take unsecured tokens (DEV, SCOPED) and the IdP's signed ones (OIDC)."""
    b = OAuthBroker(tmp_path_factory.mktemp("oauth"), oauth_idp)
    b.start()
    yield b
    b.stop()
