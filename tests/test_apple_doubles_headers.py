"""The doubles' headers (dev/apple_doubles/include) declare only what Apple's do: every Objective-C selector and
property they declare exists in the macOS SDK's headers of the same framework, every enumerator has Apple's value,
and every C function exists there. (dev/check_mac_host.py compiles the backend against the real headers, which
proves the types it uses; this proves the doubles invent nothing the backend could come to rely on.)"""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOCK = os.path.join(ROOT, "dev", "apple_doubles", "include")

# mock header -> the SDK directories (relative to the SDK root) whose headers declare the same API
FRAMEWORKS = {
    "Metal/Metal.h": ["System/Library/Frameworks/Metal.framework/Headers"],
    "Foundation/Foundation.h": ["System/Library/Frameworks/Foundation.framework/Headers", "usr/include/objc"],
    "objc/NSObject.h": ["usr/include/objc", "System/Library/Frameworks/Foundation.framework/Headers"],
    "dispatch/dispatch.h": ["usr/include/dispatch", "usr/include/os"],
    "malloc/malloc.h": ["usr/include/malloc"],
}

METHOD_START = re.compile(r"^\s*[-+]\s*\(", re.M)
PIECE = re.compile(r"([A-Za-z_]\w*)\s*:")
FUNCTION = re.compile(r"\b((?:MTL|dispatch_|malloc_)\w*)\s*\(\s*(?:void|const|dispatch|[A-Za-z_])", re.M)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def without_parens(text):
    """Removes every balanced (...) group: the types of a method declaration and attribute arguments."""
    out, depth = [], 0
    for c in text:
        if c == "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(c)
    return "".join(out)


def selectors(text):
    """The selectors of every Objective-C method declaration ("- (T)a:(A)x b:(B)y;" -> "a:b:")."""
    out = set()
    for m in METHOD_START.finditer(text):
        end = min(k for k in (text.find(";", m.start()), text.find("{", m.start()), len(text)) if k >= 0)
        decl = without_parens(text[m.start():end]).lstrip(" \t\n-+")
        decl = re.sub(r"\b(?:NS|API|MTL|CF|OBJC|DISPATCH|OS)_[A-Z_]+\b|__attribute__", " ", decl)
        pieces = PIECE.findall(decl)
        name = re.match(r"\s*([A-Za-z_]\w*)", decl)
        if pieces:
            out.add("".join(p + ":" for p in pieces))
        elif name:
            out.add(name.group(1))
    return out


def drop_macro_calls(text):
    """Removes availability and other macro calls (API_AVAILABLE(...), NS_SWIFT_NAME(...)) with their arguments."""
    out, i = [], 0
    for m in re.finditer(r"\b(?:API|NS|MTL|CF|OBJC)_[A-Z_]+\b\s*", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        j = m.end()
        if j < len(text) and text[j] == "(":
            depth = 0
            while j < len(text):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
        i = j
    out.append(text[i:])
    return "".join(out)


def enumerators(text):
    """name -> value of every enumerator written `Name = value` (MTL*/NS*), evaluated; #define constants too."""
    text = drop_macro_calls(re.sub(r"\bNS_(?:ENUM|OPTIONS|CLOSED_ENUM|ERROR_ENUM)\b", "enum", text))
    raw = dict(re.findall(r"#define\s+((?:MTL|NS)\w+)\s+\(?(\w+\s*<<\s*\w+|\d+[uUlL]*)\)?", text))
    for body in re.findall(r"\benum\b[^{;]*\{([^}]*)\}", text):
        for entry in body.split(","):
            m = re.match(r"\s*((?:MTL|NS)\w+)\s*=\s*(.+?)\s*$", entry, re.S)
            if m:
                raw[m.group(1)] = m.group(2)
    values = {}

    def value(name, depth=0):
        if name in values or depth > 20:
            return values.get(name)
        expr = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", raw[name])
        for ident in set(re.findall(r"\b(?!0[xX])[A-Za-z_]\w*", expr)):
            v = value(ident, depth + 1) if ident in raw else None
            if v is None:
                return None
            expr = re.sub(r"\b" + ident + r"\b", str(v), expr)
        try:
            values[name] = int(eval(expr, {"__builtins__": {}}))  # integer constant expressions only
        except Exception:
            return None
        return values[name]

    return {name: value(name) for name in raw}


def properties(text):
    """The names of every @property declaration (the last identifier before `;`, attributes removed)."""
    out = set()
    for m in re.finditer(r"@property\b", text):
        decl = without_parens(text[m.end():text.find(";", m.end())])
        decl = re.sub(r"\b(?:NS|API|MTL|CF|OBJC|DISPATCH|OS)_[A-Z_]+\b|__attribute__", " ", decl)
        names = re.findall(r"[A-Za-z_]\w*", decl)
        if names:
            out.add(names[-1])
    return out


def sdk_text(sdk, dirs):
    chunks = []
    for d in dirs:
        base = os.path.join(sdk, d)
        for dirpath, _, files in os.walk(base):
            for f in files:
                if f.endswith(".h"):
                    with open(os.path.join(dirpath, f), errors="replace") as fh:
                        chunks.append(strip_comments(fh.read()))
    assert chunks, f"no SDK headers under {dirs}"
    return "\n".join(chunks)


@pytest.fixture(scope="module")
def sdk(mac_host_check):
    return mac_host_check.find_sdk()


@pytest.mark.parametrize("header", sorted(FRAMEWORKS))
def test_mock_header_declares_only_apples_api(sdk, header):
    with open(os.path.join(MOCK, header)) as f:
        mock = strip_comments(f.read())
    apple = sdk_text(sdk, FRAMEWORKS[header])
    apple_selectors = selectors(apple)
    missing = sorted(s for s in selectors(mock) if s not in apple_selectors)
    assert not missing, f"{header}: selectors Apple's headers do not declare: {missing}"
    props = properties(mock)
    apple_props = properties(apple) | {s for s in apple_selectors if ":" not in s}
    missing = sorted(p for p in props if p not in apple_props)
    assert not missing, f"{header}: properties Apple's headers do not declare: {missing}"
    apple_enums, mock_enums = enumerators(apple), enumerators(mock)
    if header == "Metal/Metal.h":  # its enums must be parsed, or the comparison below checks nothing
        assert len(mock_enums) > 20, mock_enums
    wrong = {k: (v, apple_enums.get(k)) for k, v in mock_enums.items() if v is None or apple_enums.get(k) != v}
    assert not wrong, f"{header}: enumerators absent from Apple's headers or with other values (mock, Apple): {wrong}"
    functions = {f for f in FUNCTION.findall(mock) if not f.startswith("MTLSize") or f == "MTLSizeMake"}
    missing = sorted(f for f in functions if not re.search(r"\b" + re.escape(f) + r"\s*\(", apple))
    assert not missing, f"{header}: functions Apple's headers do not declare: {missing}"


def test_the_parsers_see_what_an_invented_declaration_would_change(sdk):
    apple = sdk_text(sdk, FRAMEWORKS["Metal/Metal.h"])
    assert "newBufferWithLength:options:" in selectors(apple)
    assert selectors("- (id)newBufferWithLength:(NSUInteger)n\n options:(int)o zeroed:(BOOL)z;") == \
        {"newBufferWithLength:options:zeroed:"}
    assert "newBufferWithLength:options:zeroed:" not in selectors(apple)
    assert enumerators(apple)["MTLDataTypeFloat"] == 3 and enumerators(apple)["MTLLanguageVersion3_0"] == 3 << 16
    assert enumerators("typedef NS_ENUM(NSUInteger, MTLDataType) { MTLDataTypeFloat = 4, };") == {"MTLDataTypeFloat": 4}
    assert properties("@property (readonly) NSUInteger maxWidgets API_AVAILABLE(macos(14.0));") == {"maxWidgets"}
    assert "maxWidgets" not in properties(apple)
