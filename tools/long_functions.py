#!/usr/bin/python3
"""Lists the functions longer than N lines (default 80), longest first.

    tools/long_functions.py [-n LINES] [--count] [PATH ...]

PATHs are files or folders (default: src/ and python/ of the tree this script is in);
C++ files (.cc .cu .h .hpp .cpp) are scanned with a small brace matcher, Python files
(.py) with the standard library's ast. Dependency-free (/usr/bin/python3).

A function's length is the lines from its name to its closing brace (C++) or from its
`def` to its last line (Python), both inclusive. C++ functions are the bodies at
namespace, class or `extern "C"` scope (free functions, methods defined in a class,
macro bodies such as PYBIND11_MODULE(...) { ... }); lambdas and blocks count as part
of the function that holds them. Python functions are every `def`, nested ones too
(a nested def is also counted within its parent).

Output: one line per function, `LINES  PATH:LINE  NAME`, then `N functions over L
lines`; with --count only that last line. Exit status 0 (it measures, it does not judge).
"""

import argparse
import ast
import os
import signal
import re
import sys

CXX_EXT = (".cc", ".cu", ".cpp", ".h", ".hpp", ".cuh")
IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def strip_cxx(text):
    """Returns text with comments, string and character literals and preprocessor lines
    blanked out (newlines kept, so offsets and line numbers stay)."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while j < n:  # a directive, with its continuation lines
                if text[j] == "\n" and text[j - 1] != "\\":
                    break
                j += 1
            blank(i, j)
            i = j
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            blank(i + 1, j)
            i = j
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # 1'000 digit separators
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def matching(text, i, open_c, close_c):
    """Index of the bracket closing the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_c:
            depth += 1
        elif text[j] == close_c:
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def classify(header):
    """What a `{` opened after `header` (the text since the scope's last ; { or }) is:
    ("namespace"|"class"|"extern", None), ("function", (name, offset of the name in
    header)) or ("other", None)."""
    h = re.sub(r"^\s*(?:(?:public|private|protected)\s*:\s*)+", lambda m: " " * len(m.group(0)), header)
    words = h.split()
    if not words:
        return "other", None
    if words[0] in ("namespace", "inline") and "namespace" in words[:2]:
        return "namespace", None
    if words[0] == "extern" and "(" not in h:
        return "extern", None
    # the first top-level parenthesis, skipping template argument lists' contents
    depth_angle = 0
    paren = -1
    for k, ch in enumerate(h):
        if ch == "(":
            paren = k
            break
        if ch == "=" and not re.search(r"operator\s*\S*$", h[:k + 1]):
            return "other", None  # an initializer: x = {..}, f = [](..){..}
    prefix = h if paren < 0 else h[:paren]
    if re.search(r"\b(class|struct|union|enum)\b", prefix) and paren < 0:
        return "class", None
    if re.search(r"\b(class|struct|union|enum)\b", prefix) and not re.search(r"\boperator\b", prefix):
        # struct X : Base<(1)> or a function returning `struct x` (rare): call it a class
        # unless the parenthesis comes right after a name at the end of prefix
        if not re.search(r"[A-Za-z_0-9>]\s*$", prefix) or re.search(r"\b(class|struct|union|enum)\s+[A-Za-z_0-9:]+\s*$", prefix):
            return "class", None
    if paren < 0:
        return "other", None
    close = matching(h, paren, "(", ")")
    tail = h[close + 1:]
    # what may follow a parameter list before a body
    if tail.strip() and not re.match(r"^\s*(?:(?:const|noexcept(?:\s*\([^)]*\))?|override|final|mutable|volatile|&|&&|try"
                                     r"|->[^{;]*|:.*)\s*)*$", tail, re.S):
        return "other", None
    m = re.search(r"((?:[A-Za-z_][A-Za-z_0-9]*\s*(?:<[^;{}()]*>)?\s*::\s*~?)*"
                  r"(?:operator\s*(?:\(\s*\)|[^\sA-Za-z_(][^\s(]*|\s+[A-Za-z_][\w:<>*& ]*)|~?[A-Za-z_][A-Za-z_0-9]*))\s*$", prefix)
    if not m:
        return "other", None
    name = re.sub(r"\s+", "", m.group(1))
    if name in ("if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignas", "static_assert"):
        return "other", None
    return "function", (name, m.start(1))


def cxx_functions(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        raw = f.read()
    text = strip_cxx(raw)
    line_of = []
    ln = 1
    for ch in text:
        line_of.append(ln)
        if ch == "\n":
            ln += 1
    results = []
    stack = []  # scope kinds
    start = 0  # where the current scope's current header begins
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == ";":
            start = i + 1
        elif c == "}":
            if stack:
                stack.pop()
            start = i + 1
        elif c == "{":
            header = text[start:i]
            kind, info = classify(header)
            if kind == "function":
                name, off = info
                # a constructor's initializer list: member{...} braces precede the body
                body = i
                while re.search(r"(?:[A-Za-z_0-9>]|\.\.\.)\s*$", text[start:body]) and re.search(r"\)\s*(?:noexcept\s*)?:", text[start:body]):
                    body = matching(text, body, "{", "}") + 1
                    nxt = text.find("{", body)
                    if nxt < 0:
                        break
                    body = nxt
                end = matching(text, body, "{", "}")
                first = line_of[start + off + len(header[off:]) - len(header[off:].lstrip())]
                results.append((line_of[end] - first + 1, path, first, name))
                i = end + 1
                start = i
                continue
            if kind in ("namespace", "class", "extern"):
                stack.append(kind)
                start = i + 1
            else:  # a brace initializer or enum body at this scope: skip it whole
                i = matching(text, i, "{", "}") + 1
                continue
        i += 1
    return results


def py_functions(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        source = f.read()
    try:
        tree = ast.parse(source, path)
    except SyntaxError as e:
        print(f"{path}: not parsed: {e}", file=sys.stderr)
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((node.end_lineno - first + 1, path, first, node.name))
    return out


def files(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
            continue
        for root, dirs, names in os.walk(p):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            for name in sorted(names):
                if name.endswith(CXX_EXT) or name.endswith(".py"):
                    yield os.path.join(root, name)


def main(argv):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--lines", type=int, default=80, help="list functions longer than this (default 80)")
    ap.add_argument("--count", action="store_true", help="print only the count")
    ap.add_argument("paths", nargs="*")
    a = ap.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = a.paths or [os.path.relpath(os.path.join(root, d)) for d in ("src", "python")]
    found = []
    for f in files(paths):
        found += py_functions(f) if f.endswith(".py") else cxx_functions(f)
    long_ones = sorted((x for x in found if x[0] > a.lines), key=lambda x: (-x[0], x[1], x[2]))
    if not a.count:
        for lines, path, line, name in long_ones:
            print(f"{lines:5d}  {path}:{line}  {name}")
    print(f"{len(long_ones)} functions over {a.lines} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
