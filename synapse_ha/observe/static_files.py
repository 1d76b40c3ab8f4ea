"""The dashboard's files served as they are from the package's ``static`` folder (package
data, so an installed wheel serves them too): the charts page's script and the charting
library it draws with, uPlot (https://github.com/leeoniya/uPlot, MIT licence, its
``dist/uPlot.iife.min.js`` and ``dist/uPlot.min.css`` unchanged; the licence beside them
as ``uPlot.LICENSE``). Nothing is fetched from another origin: the Content-Security-Policy
allows scripts and stylesheets from this one only.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

STATIC_PREFIX = "/static/"
CHARTS_SCRIPT = "/static/charts.js"
UPLOT_SCRIPT = "/static/uPlot.iife.min.js"
UPLOT_STYLESHEET = "/static/uPlot.min.css"
UPLOT_VERSION = "1.6.32"
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".LICENSE": "text/plain; charset=utf-8",
}
FILES = (CHARTS_SCRIPT, UPLOT_SCRIPT, UPLOT_STYLESHEET, "/static/uPlot.LICENSE")


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    content_type: str


def load_static() -> dict[str, StaticFile]:
    """Every file of :data:`FILES` by its path, read from the package. Raises
    ``FileNotFoundError`` when the package was installed without them."""
    folder = resources.files("synapse_ha.observe").joinpath("static")
    out = {}
    for path in FILES:
        name = path.removeprefix(STATIC_PREFIX)
        kind = next(t for suffix, t in _TYPES.items() if name.endswith(suffix))
        out[path] = StaticFile(folder.joinpath(name).read_bytes(), kind)
    return out
