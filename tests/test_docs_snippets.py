"""Every ```python block of the documentation runs, page by page, like a notebook.

Pages: README.md, CONTRIBUTING.md, docs/**/*.md (docs/reference/ included), benchmarks/README.md and
benchmarks/NOTES.md. Each page that has ```python blocks is one test case: its blocks run in order, in
one namespace, in a subprocess (PAGE_TIMEOUT seconds) whose working directory is a fresh temporary
directory. A traceback names the page and the line of the block (``docs/guide/sources.md:42``).

Only ```python blocks run. bash, cmake, cpp and text blocks never do; a C++ snippet says in its page
which test compiles the same calls (tests/cpp_package, tests/test_cpp_package.py).

Three markers, HTML comments (neither GitHub nor the docs site shows them):

``<!-- setup: NAME[, NAME ...] -->``
    anywhere in a page: before its first block, each named function of SETUPS below writes the files
    the page's snippets name into the working directory (``cells.h5ad``, ``collection.zarr``, ...).
    Add a function there for new data; keep files small (the whole run stays well under 2 minutes).

``<!-- setup: python`` ... ``-->``
    hidden code, run where it stands in the page, in the page's namespace: stand-ins for what a
    snippet takes as given (a model, a step count, ``rank``), or environment for a one-process
    ``torch.distributed`` group. Keep it short; what a reader needs belongs in the visible block.

``<!-- not-runnable: REASON -->``
    on the last non-blank line before a ```python fence: that block is not run. REASON must say
    why (no GPU here, needs an S3 bucket, another Python for annbatch, ...); an empty one fails
    test_markers.
"""

import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE_TIMEOUT = 120

DIRECTIVE = re.compile(r"^:::\s*(?P<name>[\w.]+)\s*$")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)")
SETUP_NAMES = re.compile(r"<!--\s*setup:\s*(?P<names>[\w, -]+?)\s*-->")
NOT_RUNNABLE = re.compile(r"^\s*<!--\s*not-runnable:(?P<reason>.*?)-->\s*$")


def doc_pages():
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md"]
    pages += [ROOT / "benchmarks" / "NOTES.md"]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    return [page for page in pages if page.is_file()]


class Page:
    """A page's python blocks (origin, code, reason not to run or None), its hidden setup code and
    the names of its setup functions, and its markers' problems."""

    def __init__(self, name, text):
        self.name = name
        self.steps = []  # ("code", origin, source) and ("skip", origin, reason), in page order
        self.setups = []
        self.problems = []
        self._parse(text.split("\n"))

    def _docstring_blocks(self, name):
        """The ```python blocks of the docstrings mkdocstrings renders for `::: name`: the object's
        and its public members'."""
        module_name, _, attribute = name.rpartition(".")
        target = getattr(importlib.import_module(module_name), attribute)
        objects = [(name, target)]
        if inspect.isclass(target):
            for member, value in vars(target).items():
                if member == "__init__" or not member.startswith("_"):  # __init__: merged into the class
                    objects.append((f"{name}.{member}", getattr(value, "__func__", value)))
        for label, obj in objects:
            doc = obj.__doc__ if isinstance(obj, property) else inspect.getdoc(obj)
            if not doc or (obj is not target and doc == inspect.getdoc(type(obj))):
                continue
            inner = Page(f"{label} (docstring)", inspect.cleandoc(doc))
            self.steps += inner.steps
            self.problems += inner.problems

    def _parse(self, lines):
        pending_reason = None
        i = 0
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if stripped.startswith("<!--") and "setup: python" in stripped:
                start = i
                body = []
                i += 1
                while i < len(lines) and "-->" not in lines[i]:
                    body.append(lines[i])
                    i += 1
                if i == len(lines):
                    self.problems.append(f"{self.name}:{start + 1}: hidden setup block never closed with -->")
                self.steps.append(("code", f"{self.name}:{start + 2}", textwrap.dedent("\n".join(body))))
                pending_reason = None
                i += 1
                continue
            directive = DIRECTIVE.match(line)
            if directive:
                self._docstring_blocks(directive.group("name"))
                i += 1
                continue
            names = SETUP_NAMES.search(line)
            if names:
                for name in (n.strip() for n in names.group("names").split(",")):
                    if name not in SETUPS:
                        self.problems.append(f"{self.name}:{i + 1}: unknown setup {name!r} (see SETUPS)")
                    self.setups.append(name)
            marker = NOT_RUNNABLE.match(line)
            if marker:
                pending_reason = marker.group("reason").strip()
                if not pending_reason:
                    self.problems.append(f"{self.name}:{i + 1}: not-runnable needs a reason")
                    pending_reason = "(no reason)"
                i += 1
                continue
            fence = FENCE.match(line)
            if fence:
                start = i
                indent, delimiter, lang = fence.group("indent"), fence.group("fence"), fence.group("lang")
                body = []
                i += 1
                while i < len(lines) and not lines[i].strip().startswith(delimiter):
                    body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
                    i += 1
                origin = f"{self.name}:{start + 2}"
                if lang == "python":
                    if pending_reason is not None:
                        self.steps.append(("skip", origin, pending_reason))
                    else:
                        self.steps.append(("code", origin, "\n".join(body)))
                elif pending_reason is not None:
                    self.problems.append(f"{self.name}:{start + 1}: not-runnable before a {lang or 'plain'} block")
                pending_reason = None
                i += 1
                continue
            if stripped and pending_reason is not None:
                self.problems.append(f"{self.name}:{i + 1}: not-runnable is not followed by a ```python block")
                pending_reason = None
            i += 1
        if pending_reason is not None:
            self.problems.append(f"{self.name}: not-runnable at the end of the page")


# ---- setups: the data the pages' snippets name, written into the working directory ---------------


def _anndata(path, n_obs, n_vars, *, seed, layers=False, obsm=False, sparse=True):
    import anndata
    import numpy as np
    import pandas as pd
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    counts = sp.random(n_obs, n_vars, density=0.05, format="csr", random_state=seed, dtype=np.float32)
    obs = pd.DataFrame(
        {
            "cell_type": pd.Categorical(rng.choice(["B", "T", "NK", "monocyte"], n_obs)),
            "n_counts": np.asarray(counts.sum(axis=1)).ravel().astype(np.int32),
        },
        index=[f"cell{i}" for i in range(n_obs)],
    )
    var = pd.DataFrame(index=[f"gene{j}" for j in range(n_vars)])
    adata = anndata.AnnData(X=counts if sparse else counts.toarray(), obs=obs, var=var)
    if layers:
        adata.layers["counts"] = counts.copy()
    if obsm:
        adata.obsm["X_pca"] = rng.standard_normal((n_obs, 50)).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    adata.write_h5ad(path)


def setup_cells(directory):
    """cells.h5ad: 2,000 cells x 200 genes, CSR, obs cell_type (categorical) and n_counts."""
    _anndata(directory / "cells.h5ad", 2000, 200, seed=0)


def setup_plates(directory):
    """plate1.h5ad (with layers/counts and obsm/X_pca) and tahoe/plate1.h5ad ... plate3.h5ad."""
    _anndata(directory / "plate1.h5ad", 500, 100, seed=1, layers=True, obsm=True)
    for k in range(1, 4):
        _anndata(directory / "tahoe" / f"plate{k}.h5ad", 300, 100, seed=10 + k)


def setup_collection(directory):
    """collection.zarr: the annbatch 0.3.1 DatasetCollection of the test data (obs cell_type)."""
    shutil.copytree(
        ROOT / "tests" / "data" / "anndata" / "annbatch-0.3.1" / "collection.zarr", directory / "collection.zarr"
    )


SETUPS = {"cells": setup_cells, "plates": setup_plates, "collection": setup_collection}


# ---- running a page -------------------------------------------------------------------------------

# Each block's source is put in linecache under its origin, so tracebacks show its lines and
# inspect.getsource (torch.jit.script needs it) finds them.
RUNNER = """\
import json, linecache, sys
steps = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for origin, source in steps:
    linecache.cache[origin] = (len(source), None, source.splitlines(True), origin)
    exec(compile(source, origin, "exec"), namespace)
"""


def run_page(page, directory):
    for name in dict.fromkeys(page.setups):
        SETUPS[name](directory)
    steps = [[origin, source] for kind, origin, source in page.steps if kind == "code"]
    (directory / ".steps.json").write_text(json.dumps(steps))
    (directory / ".runner.py").write_text(RUNNER)
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return subprocess.run(
        [sys.executable, ".runner.py", ".steps.json"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT,
    )


PAGES = [Page(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")) for path in doc_pages()]
RUNNABLE = [page for page in PAGES if any(kind == "code" for kind, _, _ in page.steps)]


@pytest.mark.timeout(PAGE_TIMEOUT + 60)
@pytest.mark.parametrize("page", RUNNABLE, ids=[page.name for page in RUNNABLE])
def test_page_snippets_run(page, tmp_path):
    result = run_page(page, tmp_path)
    assert result.returncode == 0, f"{page.name}: its snippets failed\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"


def test_markers():
    problems = [problem for page in PAGES for problem in page.problems]
    assert not problems, "\n".join(problems)


def test_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#\s]+)", readme))
    pages = {path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").rglob("*.md")}
    assert not pages - linked, f"README.md links no page {sorted(pages - linked)}"


def test_every_page_is_seen():
    names = {page.name for page in PAGES}
    assert "README.md" in names
    assert any(name.startswith("docs/guide/") for name in names)


PARSER_PAGE = """\
<!-- setup: cells -->
```python
a = 1
```

<!-- not-runnable: needs a GPU -->
```python
b = 2
```

<!-- not-runnable:   -->
```python
c = 3
```

<!-- setup: python
d = 4
-->

- a list item:

  ```python
  e = 5
  ```

```bash
echo never
```
"""


def test_parser():
    page = Page("page.md", PARSER_PAGE)
    assert page.setups == ["cells"]
    assert [(kind, source) for kind, _, source in page.steps] == [
        ("code", "a = 1"),
        ("skip", "needs a GPU"),
        ("skip", "(no reason)"),
        ("code", "d = 4"),
        ("code", "e = 5"),
    ]
    assert page.problems == ["page.md:11: not-runnable needs a reason"]
    page = Page("page.md", "<!-- not-runnable: no GPU -->\n\n```bash\nls\n```\n")
    assert page.problems == ["page.md:3: not-runnable before a bash block"]
    page = Page("page.md", "<!-- not-runnable: no GPU -->\nsome text\n")
    assert page.problems == ["page.md:2: not-runnable is not followed by a ```python block"]
