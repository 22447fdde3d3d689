"""Every file path, ``#anchor`` and named section that the docs and the code comments point at exists.

Sources: README.md, docs/*.md and custom_ops/**/README.md (the docs), and the source files of ms_kldiv/,
custom_ops/, tests/, examples/ and benchmarks/ (their comments and docstrings). What counts as a reference:

* a markdown link ``[text](path#anchor)`` (docs only), resolved against the linking file's folder; URLs
  (``https:``, ``mailto:``...) are not references; ``(#anchor)`` points into the same file;
* a plain mention of a repository path: a token starting with a top-level entry (``docs/``, ``ms_kldiv/``,
  ``custom_ops/``, ``tests/``, ``examples/``, ``benchmarks/``, ``tools/``, ``.ci/``, ``README.md``, ``setup.py``...),
  resolved against the repository root or, failing that, the mentioning file's folder or one above it (a README
  inside custom_ops/ascend says ``tests/...`` for its own tests); ``*`` and ``<name>`` are wildcards that must
  match a file at least, and each alternative of ``{a,b}`` must exist;
* after a mention, ``#anchor`` (``docs/cpu_aot.md#developer-switches``), ``::name`` (a pytest node or a symbol:
  ``def name`` / ``class name`` must be in the file), or a quoted section title
  (``docs/cpu_aot.md, "Software prefetch"``, ``docs/cpu_aot.md ("Software prefetch")``, ``..., section "X"``),
  which must be a heading of that markdown file.

Anchors follow GitHub's rules: a heading's text without its markup, lower-cased, every character that is not a
letter, digit, ``_``, ``-`` or space dropped, spaces turned into ``-``; a repeated slug gets ``-1``, ``-2``...
Headings inside fenced code blocks do not count. Comment markers at line starts are removed and lines joined
before matching, so a mention may wrap over comment lines.
"""
import fnmatch
import glob
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SELF = pathlib.Path(__file__).resolve()  # its made-up references are test data, not references

DOC_GLOBS = ("README.md", "docs/*.md", "custom_ops/**/README.md")
CODE_GLOBS = ("ms_kldiv/**/*.py", "custom_ops/**/*.h", "custom_ops/**/*.cc", "custom_ops/**/*.cu",
              "custom_ops/**/*.cuh", "custom_ops/**/*.cpp", "custom_ops/**/*.inc", "tests/**/*.py", "examples/*.py",
              "benchmarks/**/*.py", "benchmarks/**/*.cc", "benchmarks/**/*.h", "benchmarks/**/*.cu",
              "benchmarks/**/*.sh", "benchmarks/**/*.md")
SKIP_PARTS = {"__pycache__", ".git", ".venv", "build", "_lib", "_csrc", ".hypothesis", ".pytest_cache"}

#: Paths the docs name that exist only after a build or an install (see .gitignore), not in a checkout.
GENERATED = ("ms_kldiv/_lib", "ms_kldiv/_csrc")

#: Broken references known and left to the owners of the files (as broken_references() reports them). Each must
#: still be broken: once a comment is fixed, the test fails until its line here is removed.
KNOWN_BROKEN = ()

TOP = r"(?:docs|ms_kldiv|custom_ops|tests|examples|benchmarks|tools|\.ci)/"
ROOT_FILES = r"(?:README\.md|setup\.py|MANIFEST\.in|pytest\.ini)"
# A path token: a top-level folder then path characters, not ending in '.', '-' or ','; not part of a longer path
# (../x, ~/x, $X/x, a/b/x), a URL (the scheme's '//' or a host's '.' come before it) or a Python module (x.tests/).
PATH = (r"(?<![\w./~$@:%=+-])(?P<path>" + ROOT_FILES + r"(?![\w/])|" + TOP + r"(?:[\w.*<>{},/-]*[\w*>}/])?)")
TAIL = (r"(?:#(?P<anchor>[\w-]+)"
        r"|::(?P<symbol>\w+)"
        r"|(?:,\s*(?:section\s+)?|\s*\(\s*(?:section\s+)?)[\"\u201c](?P<section>[^\"\u201d\n]{1,100})[\"\u201d])?")
MENTION_RE = re.compile(PATH + TAIL)
LINK_RE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?(?P<target>[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
URL_RE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")
FENCE_RE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING_RE = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HTML_ANCHOR_RE = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


# --- helpers ------------------------------------------------------------------------------------------------------

def slug(heading):
    """GitHub's anchor for a heading's source text (without the leading #'s)."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(markdown):
    """The anchors a markdown text defines: its headings' slugs (outside fenced code) and explicit HTML anchors."""
    found, seen, fence = set(), {}, None
    for line in markdown.splitlines():
        m = FENCE_RE.match(line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence:
            continue
        h = HEADING_RE.match(line)
        if h:
            base = slug(h.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    found.update(HTML_ANCHOR_RE.findall(markdown))
    return found


def join_lines(text):
    """Lines joined into one, comment markers at line starts (//, #, *, ;) and indentation dropped, so that a
    mention wrapped over comment lines reads as one."""
    return re.sub(r"[ \t]*\n[ \t]*(?:(?://+|#+|\*(?!/)|;+)[ \t]?)?[ \t]*", " ", text)


def references(text, is_markdown):
    """(kind, path, detail) for every reference in a text: kind 'link' (path relative to the file; '' is the file
    itself) or 'mention' (relative to the root, else the file's folder); detail ('anchor'|'symbol'|'section', value)
    or None."""
    refs = []
    flat = join_lines(text)
    if is_markdown:
        for m in LINK_RE.finditer(flat):
            target = m.group("target")
            if URL_RE.match(target):
                continue
            path, _, anchor = target.partition("#")
            refs.append(("link", path, ("anchor", anchor) if anchor else None))
    for m in MENTION_RE.finditer(flat):
        detail = next(((k, m.group(k)) for k in ("anchor", "symbol", "section") if m.group(k)), None)
        refs.append(("mention", m.group("path"), detail))
    return refs


def _expand(pattern):
    """{a,b} alternatives, then <placeholder> as a wildcard: a list of glob patterns."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m:
        return [p for alt in m.group(1).split(",") for p in _expand(pattern[:m.start()] + alt + pattern[m.end():])]
    return [re.sub(r"<[^<>/]*>", "*", pattern)]


def resolve(path, base):
    """The existing files/folders `path` names under `base`, or [] when one of its {a,b} alternatives names none (a
    wildcard needs one match at least)."""
    out = []
    for pattern in _expand(path.rstrip("/")):
        found = [pathlib.Path(p) for p in glob.glob(str(base / pattern), recursive=True)] \
            if any(c in pattern for c in "*?[") else [base / pattern] if (base / pattern).exists() else []
        if not found:
            return []
        out += found
    return out


def _files(globs):
    seen = set()
    for g in globs:
        for p in sorted(ROOT.glob(g)):
            if p.is_file() and not SKIP_PARTS.intersection(p.relative_to(ROOT).parts) and p not in seen \
                    and p != SELF:
                seen.add(p)
                yield p


def _defines(path, symbol):
    """A pytest node or Python symbol (`def name`, `class name`); in C/C++ sources, a function `name(`."""
    text = path.read_text(encoding="utf-8", errors="replace")
    pattern = r"\b(?:def|class)\s+" + re.escape(symbol) + r"\b" if path.suffix == ".py" else \
        r"\b" + re.escape(symbol) + r"\s*\("
    return re.search(pattern, text) is not None


def check(source, kind, path, detail):
    """None if the reference from `source` holds, else why not."""
    if kind == "link":
        targets = [source] if path == "" else resolve(path, source.parent)
    else:
        targets = resolve(path, ROOT)
        for folder in source.parents:  # a README or a source inside custom_ops/ascend names its own tests/...
            if targets or folder == ROOT:
                break
            targets = resolve(path, folder)
        if not targets and any(path == g or path.startswith(g + "/") for g in GENERATED):
            return None
    if not targets:
        return f"{path}: no such file or folder"
    if detail is None:
        return None
    what, value = detail
    target = targets[0]
    if what == "symbol":
        return None if target.is_file() and _defines(target, value) else f"{path}::{value}: not defined there"
    if target.suffix != ".md" or not target.is_file():
        return f"{path}: a {what} of a file that is not markdown ({value!r})"
    wanted = value if what == "anchor" else slug(value)
    if wanted in anchors(target.read_text(encoding="utf-8")):
        return None
    return f"{path}#{wanted}: no such heading" + (f" (section {value!r})" if what == "section" else "")


def broken_references():
    broken, count = [], 0
    for globs, is_md in ((DOC_GLOBS, True), (CODE_GLOBS, False)):
        for source in _files(globs):
            text = source.read_text(encoding="utf-8", errors="replace")
            for ref in references(text, is_md or source.suffix == ".md"):
                count += 1
                why = check(source, *ref)
                line = f"{source.relative_to(ROOT)}: {why}"
                if why and line not in broken:  # a link's target is also a plain mention: report it once
                    broken.append(line)
    return broken, count


# --- the helpers on made-up text ----------------------------------------------------------------------------------

@pytest.mark.parametrize("heading, expected", [
    ("Developer switches", "developer-switches"),
    ("Where a call's time goes", "where-a-calls-time-goes"),
    ("The ms.jit launch floor", "the-msjit-launch-floor"),
    ("The fused distillation operators (`DistillCustom`, `DistillCustomGrad`)",
     "the-fused-distillation-operators-distillcustom-distillcustomgrad"),
    ("Build and install (CANN ≥ 8.0, Atlas A2: `ascend910b`)", "build-and-install-cann--80-atlas-a2-ascend910b"),
    ("A [linked](other.md#x) **bold** word_with_underscores", "a-linked-bold-word_with_underscores"),
    ("Why: the gaps it closes", "why-the-gaps-it-closes"),
])
def test_slug_follows_github(heading, expected):
    assert slug(heading) == expected


def test_anchors_skip_code_and_number_repeats():
    md = "# Title\n## Part\n```bash\n# 1. not a heading\n```\n## Part\n### Part\n<a name=\"custom\"></a>\n"
    assert anchors(md) == {"title", "part", "part-1", "part-2", "custom"}


def test_references_in_made_up_text():
    md = ("See [the spec](docs/SPEC.md), [here](#usage), [site](https://example.com/docs/x.md#y), "
          "[mail](mailto:a@b.c) and `docs/cpu_aot.md#developer-switches`; also ../examples/x.py and "
          "https://github.com/o/r/blob/main/tests/test_api.py, ~/.cache/ms_kldiv/lib/ and "
          "`tests/gpu/test_x.py::test_y`. Ends with docs/gpu.md.")
    assert references(md, True) == [
        ("link", "docs/SPEC.md", None), ("link", "", ("anchor", "usage")),
        ("mention", "docs/SPEC.md", None),
        ("mention", "docs/cpu_aot.md", ("anchor", "developer-switches")),
        ("mention", "tests/gpu/test_x.py", ("symbol", "test_y")),
        ("mention", "docs/gpu.md", None)]
    code = ('// as measured (docs/cpu_aot.md, "Where\n// a call\'s time goes"); docs/cpu_aot.md ("Software prefetch")\n'
            '# and docs/cpu_aot.md, section "Threads" and custom_ops/cpu/isa_{avx2,avx512}.cc\n'
            'x = "custom_ops/gpu/*.cu"  # a glob\n')
    assert references(code, False) == [
        ("mention", "docs/cpu_aot.md", ("section", "Where a call's time goes")),
        ("mention", "docs/cpu_aot.md", ("section", "Software prefetch")),
        ("mention", "docs/cpu_aot.md", ("section", "Threads")),
        ("mention", "custom_ops/cpu/isa_{avx2,avx512}.cc", None),
        ("mention", "custom_ops/gpu/*.cu", None)]


def test_check_fails_on_a_broken_path_anchor_section_or_symbol(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Doc\n## Real part\n", encoding="utf-8")
    src = ROOT / "README.md"
    assert check(doc, "link", "", ("anchor", "real-part")) is None
    assert "no such heading" in check(doc, "link", "", ("anchor", "fake-part"))
    assert check(doc, "link", "doc.md", ("anchor", "doc")) is None
    assert "no such file" in check(doc, "link", "nope.md", None)
    assert "no such file" in check(src, "mention", "docs/no_such_page.md", None)
    assert check(src, "mention", "custom_ops/cpu/isa_{avx2,avx512}.cc", None) is None
    assert "no such file" in check(src, "mention", "custom_ops/cpu/isa_{avx2,sse9}.cc", None)
    assert check(src, "mention", "custom_ops/gpu/*.cu", None) is None
    assert "no such file" in check(src, "mention", "custom_ops/gpu/*.cuda", None)
    assert check(src, "mention", "tests/test_links.py", ("symbol", "test_docs_and_comments_point_at_what_exists")) \
        is None
    assert "not defined" in check(src, "mention", "tests/test_links.py", ("symbol", "test_no_such_test"))
    assert "no such heading" in check(src, "mention", "README.md", ("section", "No such section here"))
    assert check(src, "mention", "ms_kldiv/_lib", None) is None  # generated at install


def test_sources_cover_docs_and_code():
    docs = {p.relative_to(ROOT).as_posix() for p in _files(DOC_GLOBS)}
    code = {p.relative_to(ROOT).as_posix() for p in _files(CODE_GLOBS)}
    assert {"README.md", "docs/cpu_aot.md", "custom_ops/ascend/README.md"} <= docs
    assert {"custom_ops/cpu/kldiv_cpu.cc", "ms_kldiv/functional.py", "tests/test_readme.py"} <= code
    assert any(fnmatch.fnmatch(p, "benchmarks/*.py") for p in code)


# --- the repository ------------------------------------------------------------------------------------------------

def test_docs_and_comments_point_at_what_exists():
    broken, count = broken_references()
    assert count > 200, f"only {count} references found: is the extractor still matching?"
    new = [b for b in broken if b not in KNOWN_BROKEN]
    assert not new, "broken references:\n  " + "\n  ".join(new)
    fixed = [k for k in KNOWN_BROKEN if k not in broken]
    assert not fixed, "fixed, remove from KNOWN_BROKEN:\n  " + "\n  ".join(fixed)


if __name__ == "__main__":  # print what is broken: python tests/test_links.py
    for line in broken_references()[0]:
        print(line)
    sys.exit(0)
