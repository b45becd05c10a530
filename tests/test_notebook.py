"""The example notebook runs top to bottom on the sample store (so it never rots)."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from ._util import REPO


def test_analysis_notebook_executes() -> None:
    nb = nbformat.read(REPO / "examples" / "analysis.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "examples")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "\n".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "exposed_comm_ms" in text and "pg:0:call:0" in text
