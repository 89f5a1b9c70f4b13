"""The docs: the site builds with `mkdocs build --strict` (no broken link, no page left out of the nav), the reference
pages are what the code generates, and the README stays short, its links resolve and its annotated spec is the
shipped one."""

import os
import re
import subprocess
import sys

import yaml

from .conftest import REPO


def test_the_docs_site_builds_strictly(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "spec" / "index.html").is_file()


def test_the_reference_pages_are_what_the_code_generates():
    out = subprocess.run([sys.executable, "docs/gen_reference.py", "--check"], cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr


def test_the_readme_is_short_its_links_resolve_and_its_spec_is_the_shipped_one():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert (REPO / target).exists(), target
    block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    assert yaml.safe_load(block) == yaml.safe_load((REPO / "search_spaces" / "smoke.yaml").read_text())
