# The documentation tests build the site as tests/package/ does: the same fixture.
from ..package.conftest import site  # noqa: F401
