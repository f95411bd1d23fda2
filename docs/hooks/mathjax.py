"""A MkDocs hook: the site typesets TeX with MathJax 3 served from the site
itself, since the site must build and read offline (no CDN).

MathJax comes from the django-static-mathjax package (in the docs extra): a
copy of MathJax's release files under ``mathjax/static/mathjax/es5``, as
plain static files with no dependency (Django is not needed to use them).
The hook adds to the site the ``tex-svg.js`` bundle (TeX input, SVG output:
one file that needs no web fonts) and the TeX extensions it loads on demand;
docs/assets/mathjax-config.js tells it to typeset what
pymdownx.arithmatex marks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

DEST = "assets/mathjax"
BUNDLE = "tex-svg.js"
ON_DEMAND = "input/tex/extensions"


def mathjax_root() -> Path:
    """The installed MathJax release files (the folder holding tex-svg.js)."""
    spec = importlib.util.find_spec("mathjax")
    root = None
    if spec is not None and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax" / "es5"
    if root is None or not (root / BUNDLE).is_file():
        raise PluginError("the site typesets maths with MathJax from the django-static-mathjax package: "
                          "pip install -e '.[docs]'")
    return root


def on_files(files, config):
    root = mathjax_root()
    for path in [root / BUNDLE, *sorted((root / ON_DEMAND).rglob("*.js"))]:
        files.append(File.generated(config, f"{DEST}/{path.relative_to(root).as_posix()}", abs_src_path=str(path)))
    return files
