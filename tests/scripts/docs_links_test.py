#!/usr/bin/env python3
"""python3 tests/scripts/docs_links_test.py REPO

Every relative link of README.md, BENCHMARKS.md and docs/*.md leads somewhere: the file exists
in the repository (or, for ../shared/, beside it), and a #anchor names a heading of that file
(GitHub's anchors); every source path they name under a top-level folder exists; every
docs/*.md is linked from README.md, so a newcomer reaches each one. Standard library only."""
import glob
import os
import re
import sys
import unittest

REPO = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def read(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def anchors(path):
    text = re.sub(r"```.*?```", "", read(path), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def documents():
    return [os.path.join(REPO, "README.md"), os.path.join(REPO, "BENCHMARKS.md")] + \
        sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


class Links(unittest.TestCase):
    def test_every_relative_link_resolves(self):
        bad = []
        for doc in documents():
            text = re.sub(r"```.*?```", "", read(doc), flags=re.S)
            for target in LINK.findall(text):
                if re.match(r"[a-z]+:", target):
                    continue  # http:, mailto: ...
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
                where = os.path.relpath(doc, REPO)
                if "shared" in dest.split(os.sep) and not dest.startswith(REPO):
                    continue  # the design documents beside the repository
                if not os.path.exists(dest):
                    bad.append(f"{where}: {target}: no file {os.path.relpath(dest, REPO)}")
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    bad.append(f"{where}: {target}: no heading with that anchor")
        self.assertEqual(bad, [])

    def test_source_paths_named_exist(self):
        """A `folder/file.ext` under one of the repository's top-level folders, named in the
        documents (the layout and data-flow tables cite them), exists: a file moved by a
        restructuring is found here, not by a reader."""
        tops = {e for e in os.listdir(REPO) if os.path.isdir(os.path.join(REPO, e))
                and not e.startswith(".") and not e.startswith("build")} - {"output", "log"}
        bad = []
        for doc in documents():
            text = read(doc)
            for p in sorted(set(re.findall(r"`([A-Za-z_][\w.-]*(?:/[\w.-]+)+)`", text))):
                if p.split("/")[0] in tops and re.search(r"\.(cpp|hpp|cu|cuh|h|sh|py|yaml|json)$", p) \
                        and not os.path.exists(os.path.join(REPO, p)):
                    bad.append(f"{os.path.relpath(doc, REPO)}: {p}")
        self.assertEqual(bad, [])

    def test_readme_links_every_document(self):
        readme = read(os.path.join(REPO, "README.md"))
        for doc in sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))):
            name = "docs/" + os.path.basename(doc)
            self.assertIn(f"]({name}", readme, f"README.md does not link {name}")

    def test_the_checker_sees_a_broken_anchor(self):
        self.assertIn("limits-today", anchors(os.path.join(REPO, "docs", "user-guide.md")))
        self.assertNotIn("limits-tomorrow", anchors(os.path.join(REPO, "docs", "user-guide.md")))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
