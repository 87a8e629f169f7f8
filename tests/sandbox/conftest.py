import pytest

from sandbox_helpers import SECRET, TEST_ARGS
from wmrl_sandbox.local import LocalServer


@pytest.fixture(scope="module")
def server():
    """One real server process (root mode here: per-slot uid, netns, mount ns) with a secret in its env."""
    with LocalServer(slots=1, args=TEST_ARGS, env={"WMRL_TEST_SECRET": SECRET}) as srv:
        yield srv
