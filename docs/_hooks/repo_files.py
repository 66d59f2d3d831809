"""mkdocs hook: files outside docs/ that the manual links to become pages and files of the site, so
that `mkdocs build --strict` checks those links (and their anchors) as it checks links between pages.

The manual links to the rest of the repository by the path a reader of the files sees:
`../benchmarks/RESULTS.md#serving`, `../examples/korean.py`, `../fastbert/ops/gemm.py`. mkdocs finds
no such file among its documentation files and would warn (an error under --strict). So, before the
build:

- on_files adds every repository file that a page links to, at its repository path (docs/x.md stays
  x.md; benchmarks/RESULTS.md becomes the page benchmarks/RESULTS.md; the root README.md is put at
  readme/ so that it does not take the manual's index), and does the same for the files that those
  added pages link to, until none is left;
- on_page_markdown rewrites each link that leaves docs/ into the same link between the site's paths
  (`../benchmarks/RESULTS.md` from docs/int8.md is `benchmarks/RESULTS.md` from int8.md), which mkdocs
  then resolves and checks: a missing file or a missing heading is a warning, and --strict fails.
- on_config makes heading anchors GitHub's (lower case, punctuation dropped, each space a hyphen), so
  an anchor that mkdocs accepts is one that works where the Markdown files are read on GitHub.

Links inside code (fenced blocks, `inline code`) are left alone.
"""
from __future__ import annotations

import logging
import os
import posixpath
import re

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.repo_files")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = "docs"
# an inline link or image: [text](target) or [text](target "title"); the text may hold `code`
LINK = re.compile(r"(!?\[(?:[^\[\]]|\[[^\]]*\])*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.S)
# where a file outside docs/ would take a page's place: README.md at the root becomes index.html
PLACES = {"README.md": "readme/index.html"}


def github_slug(text: str, separator: str = "-") -> str:
    """GitHub's anchor for a heading: lower case, every character but letters, digits, '_', '-' and
    spaces dropped, each space a hyphen (no collapsing of runs, as GitHub does not)."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", separator)


def prose_parts(markdown: str):
    """(text, is_prose) pieces of markdown, in order: fenced code blocks and code spans are not prose."""
    lines = markdown.splitlines(keepends=True)
    block, fence = [], None
    for line in lines:
        m = FENCE.match(line)
        if fence is None and m:
            if block:
                yield from _spans("".join(block))
            block, fence = [line], m.group(1)
        elif fence is not None:
            block.append(line)
            if line.strip().startswith(fence):
                yield "".join(block), False
                block, fence = [], None
        else:
            block.append(line)
    if block:
        yield from (_spans("".join(block)) if fence is None else [("".join(block), False)])


def _spans(text: str):
    start = 0
    for m in CODE_SPAN.finditer(text):
        yield text[start:m.start()], True
        yield m.group(0), False
        start = m.end()
    yield text[start:], True


def relative_target(url: str):
    """The path part of a relative link, or None for a link to elsewhere (a scheme, an absolute
    path, an anchor of the same page, mail)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", url) or url.startswith(("/", "#")):
        return None
    path = url.split("#", 1)[0].split("?", 1)[0]
    return path or None


def repo_path_of(file: File, config) -> str:
    """The file's path in the repository."""
    if os.path.abspath(file.src_dir) == os.path.abspath(config["docs_dir"]):
        return posixpath.join(DOCS, file.src_uri)
    return file.src_uri


def site_path(repo_path: str) -> str:
    """Where a repository file sits among the site's files (its src_uri)."""
    return repo_path[len(DOCS) + 1:] if repo_path.startswith(DOCS + "/") else repo_path


def resolve(page_repo_path: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), path))


def on_config(config):
    config["mdx_configs"].setdefault("toc", {})["slugify"] = github_slug
    return config


def on_files(files, config):
    pending = [f for f in files.documentation_pages()]
    seen = {repo_path_of(f, config) for f in files}
    while pending:
        page = pending.pop()
        page_path = repo_path_of(page, config)
        for text, prose in prose_parts(page.content_string):
            if not prose:
                continue
            for m in LINK.finditer(text):
                path = relative_target(m.group(2))
                if path is None:
                    continue
                target = resolve(page_path, path)
                if target in seen or target.startswith(DOCS + "/") or target.startswith("../"):
                    continue  # a page of the manual (mkdocs checks it), or outside the repository (left to mkdocs)
                if not os.path.isfile(os.path.join(REPO, target)):
                    continue  # mkdocs reports the link as not found
                seen.add(target)
                added = File(target, REPO, config["site_dir"], config["use_directory_urls"], dest_uri=PLACES.get(target))
                files.append(added)
                if added.is_documentation_page():
                    pending.append(added)
    return files


def on_page_markdown(markdown, page, config, files):
    page_path = repo_path_of(page.file, config)
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(m):
        url = m.group(2)
        path = relative_target(url)
        if path is None:
            return m.group(0)
        target = resolve(page_path, path)
        if target.startswith("../"):
            return m.group(0)
        new = posixpath.relpath(site_path(target), here or ".")
        if new == posixpath.normpath(path):
            return m.group(0)  # a link between pages of docs/: mkdocs checks it as it is
        if not os.path.exists(os.path.join(REPO, target)):
            log.warning(f"Doc file '{page_path}' contains a link '{url}', but the repository has no {target}.")
            return m.group(0)
        return m.group(1) + new + url[len(path):] + m.group(3)

    return "".join(LINK.sub(rewrite, text) if prose else text for text, prose in prose_parts(markdown))
