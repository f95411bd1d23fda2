"""Building the site where the README says to (``mkdocs build``, into site/)
leaves nothing for git to add."""

import re
import shutil

import pytest

from .. import safety_net
from ..paths import REPO


def test_the_built_site_is_ignored():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    named = re.search(r"^site_dir:\s*(\S+)", (REPO / "mkdocs.yml").read_text(encoding="utf-8"), re.MULTILINE)
    site_dir = named.group(1) if named else "site"  # mkdocs's default
    done = safety_net.run(["git", "check-ignore", "-q", f"{site_dir}/index.html"], cwd=REPO)
    assert done.returncode == 0, f"{site_dir}/ (mkdocs build's output) is not in .gitignore"
