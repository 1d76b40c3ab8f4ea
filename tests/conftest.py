"""Session-wide rules of the test suite.

Nothing a test starts may outlive it: see :mod:`tests.leftovers`. After every test whose
wider-scoped fixtures (class, module, package) have all been torn down, the processes
of this session and its non-daemon threads must be gone; whatever is left is killed and
fails the run as an error of that test's teardown, naming the test that started it.
"""

from __future__ import annotations

# First: gRPC must load with its fork handlers off (see synapse_ha.programs), also in this
# process, where replicas run in-process and fork their snapshot writers.
import synapse_ha.programs  # noqa: F401  isort: skip
import uuid
from collections.abc import Generator

import pytest

from tests.leftovers import LeftoverCheck, LeftoverError, boot_seconds, join_session

pytest_plugins = ["pytester"]  # tests/test_leftovers.py runs the check in a session of its own

_CHECK = pytest.StashKey[LeftoverCheck]()
_STARTED = pytest.StashKey[float]()
# Fixtures of a scope wider than a test that are set up now: processes they own (a
# module's shared cluster) are theirs until they are torn down. Session-scoped fixtures
# are not counted: they hold files (a CA), never processes, and live until the end.
_WIDE_SCOPES = frozenset({"class", "module", "package"})
_active_wide: set[int] = set()


def pytest_configure(config: pytest.Config) -> None:
    # Inherited by every process a test starts.
    config.stash[_CHECK] = LeftoverCheck(join_session(uuid.uuid4().hex))


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    if fixturedef.scope in _WIDE_SCOPES:
        _active_wide.add(id(fixturedef))
    return (yield)


def pytest_fixture_post_finalizer(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> None:
    _active_wide.discard(id(fixturedef))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = boot_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    failed: BaseException | None = None
    try:
        yield
    except BaseException as exc:  # a fixture's own teardown error comes first
        failed = exc
    check = item.config.stash[_CHECK]
    check.test_ran(item.nodeid, item.stash.get(_STARTED, boot_seconds()), boot_seconds())
    leftovers = [] if _active_wide else check.settle()
    if failed is not None:
        raise failed
    if leftovers:
        raise LeftoverError(leftovers)
