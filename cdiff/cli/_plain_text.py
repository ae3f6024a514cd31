"""Docstrings as plain text for the command line: the first sentences of a
docstring, with its LaTeX written out in Unicode and its Markdown removed."""

from __future__ import annotations

import inspect
import re


def summary(obj) -> str:
    """The summary of `obj`'s docstring in plain text, on one line: its first
    paragraph (continued, up to the end of the sentence, past the equation or list
    a paragraph ending in a colon introduces), without Markdown or LaTeX."""
    return plain(first_sentences(inspect.getdoc(obj) or ""))


def first_sentences(doc: str) -> str:
    """The first paragraph of the Markdown `doc`; if it ends with a colon (it
    introduces a display equation or a list), the blocks that follow, up to the
    end of the sentence they complete."""
    blocks = [b.strip() for b in doc.split("\n\n") if b.strip()]
    if not blocks:
        return ""
    text, rest = blocks[0], blocks[1:]
    if not text.endswith(":"):
        return text
    start = len(text)
    # (A few blocks at most: an equation, a list, the end of the sentence.)
    for block in rest[:4]:
        text += "\n\n" + block
        if sentence_end(text, start) < len(text) or text.endswith("."):
            break
    return text[:sentence_end(text, start)]


def sentence_end(text: str, start: int = 0) -> int:
    """The index just after the first full stop at or after `start` that ends a
    sentence (followed by a space and a capital, or by the end), outside brackets
    and maths; `len(text)` if there is none."""
    depth, math = 0, False
    for i in range(len(text)):
        c = text[i]
        if c == "$":
            math = not math
        elif not math and c in "([{":
            depth += 1
        elif not math and c in ")]}":
            depth = max(0, depth - 1)
        elif c == "." and not math and depth == 0 and i >= start:
            after = text[i + 1:i + 3]
            if not after or (after[0].isspace() and after[1:].isupper()):
                return i + 1
    return len(text)


#: LaTeX commands with their plain-text (Unicode) form.
_TEX_SYMBOLS = {
    **dict(zip(
        "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota "
        "kappa lambda mu nu xi pi rho sigma tau upsilon phi varphi chi psi omega "
        "Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega".split(),
        "αβγδεεζηθθικλμνξπρστυφφχψωΓΔΘΛΞΠΣΥΦΨΩ")),
    "cdot": "·", "times": "×", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥",
    "ne": "≠", "neq": "≠", "approx": "≈", "sim": "~", "lesssim": "≲",
    "gtrsim": "≳", "ll": "≪", "gg": "≫", "to": "→", "rightarrow": "→",
    "leftarrow": "←", "mapsto": "↦", "infty": "∞", "partial": "∂", "nabla": "∇",
    "pm": "±", "sum": "Σ", "prod": "Π", "int": "∫", "in": "∈", "subset": "⊂",
    "ldots": "…", "dots": "…", "cdots": "⋯", "lceil": "⌈", "rceil": "⌉",
    "lfloor": "⌊", "rfloor": "⌋", "langle": "⟨", "rangle": "⟩", "top": "ᵀ",
    "|": "‖", "{": "{", "}": "}", "%": "%", "&": "&", "#": "#", "_": "_",
    "quad": " ", "qquad": " ", ",": " ", ";": " ", ":": " ", " ": " ", "!": "",
    "left": "", "right": "", "big": "", "Big": "", "bigg": "", "Bigg": "",
    "displaystyle": "", "textstyle": "", "limits": "", "nolimits": "",
}
#: Accents: a combining character after their argument.
_TEX_ACCENTS = {"dot": "\u0307", "ddot": "\u0308", "hat": "\u0302",
                "widehat": "\u0302", "tilde": "\u0303", "widetilde": "\u0303",
                "bar": "\u0304", "overline": "\u0305", "vec": "\u20d7"}
#: Commands whose argument is kept as it is (fonts, text).
_TEX_KEEP = {"mathrm", "mathbf", "mathit", "mathsf", "mathtt", "mathcal",
             "mathbb", "boldsymbol", "bm", "text", "textrm", "textbf",
             "textit", "operatorname", "mbox"}
_SUPERSCRIPTS = dict(zip("0123456789+-=()Tabcdefghijklmnoprstuvwxyz",
                         "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ᵀᵃᵇᶜᵈᵉᶠᵍʰⁱʲᵏˡᵐⁿᵒᵖʳˢᵗᵘᵛʷˣʸᶻ"))


def from_tex(tex: str) -> str:
    """LaTeX maths in plain text: Greek letters and symbols in Unicode, fractions
    as a/b, accents as combining characters, simple superscripts raised, matrices
    as [a, b; c, d]; an unknown command keeps its name without the backslash."""
    out: list[str] = []
    i = 0

    def argument(i: int) -> tuple[str, int]:
        while i < len(tex) and tex[i].isspace():
            i += 1
        if i >= len(tex):
            return "", i
        if tex[i] == "{":
            depth, j = 0, i
            while j < len(tex):
                depth += {"{": 1, "}": -1}.get(tex[j], 0)
                if depth == 0:
                    break
                j += 1
            return from_tex(tex[i + 1:j]), j + 1
        if tex[i] == "\\":
            j = _command_end(tex, i)
            return from_tex(tex[i:j]), j
        return tex[i], i + 1

    while i < len(tex):
        c = tex[i]
        if c == "\\":
            j = _command_end(tex, i)
            name = tex[i + 1:j]
            i = j
            if name in ("frac", "tfrac", "dfrac", "cfrac"):
                num, i = argument(i)
                den, i = argument(i)
                out.append(f"{_group(num)}/{_group(den)}")
            elif name == "sqrt":
                arg, i = argument(i)
                out.append(f"√{_group(arg)}")
            elif name in _TEX_ACCENTS:
                arg, i = argument(i)
                out.append(arg + _TEX_ACCENTS[name] if len(arg) == 1
                           else f"({arg}){_TEX_ACCENTS[name]}")
            elif name in _TEX_KEEP:
                arg, i = argument(i)
                out.append(arg)
            elif name in ("begin", "end"):
                _, i = argument(i)  # the environment's name
                out.append("[" if name == "begin" else "]")
            elif name == "\\":
                out.append("; ")
            else:
                out.append(_TEX_SYMBOLS.get(name, name))
        elif c == "^":
            arg, i = argument(i + 1)
            raised = "".join(_SUPERSCRIPTS.get(ch, "") for ch in arg)
            out.append(raised if arg and len(raised) == len(arg)
                       else "^" + _group(arg))
        elif c == "_":
            arg, i = argument(i + 1)
            out.append("_" + _group(arg))
            # (A_v w, not A_vw: a letter after a subscript starts a new symbol.)
            following = tex[i + 1:_command_end(tex, i)] if tex[i:i + 1] == "\\" else ""
            if tex[i:i + 1].isalnum() or following in _TEX_ACCENTS or (
                    _TEX_SYMBOLS.get(following, "").isalpha()):
                out.append(" ")
        elif c in "{}":
            i += 1
        elif c == "&":
            out.append(", ")
            i += 1
        elif c == "~":
            out.append(" ")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _command_end(tex: str, i: int) -> int:
    """The end of the LaTeX command at `tex[i] == '\\'`: a run of letters, or one
    other character."""
    j = i + 1
    if j < len(tex) and tex[j].isalpha():
        while j < len(tex) and tex[j].isalpha():
            j += 1
        return j
    return min(j + 1, len(tex))


def _group(text: str) -> str:
    """`text`, in brackets if it is more than one symbol (a name with a
    subscript, a number or a bracketed group counts as one)."""
    text = text.strip()
    if (re.fullmatch(r"[\w.\u0300-\u036f\u20d7ᵀ⁻¹⁺]+", text)
            or (text[:1] in "([" and _closes_at_end(text))):
        return text
    return f"({text})"


def _closes_at_end(text: str) -> bool:
    """Whether the bracket opening `text` closes at its last character."""
    depth = 0
    for k, ch in enumerate(text):
        depth += (ch in "([") - (ch in ")]")
        if depth == 0:
            return k == len(text) - 1
    return False


def plain(markdown: str) -> str:
    """Markdown with LaTeX maths (cdiff's docstrings) as plain text on one line:
    cross-references and links by their text, code without backticks, emphasis
    without stars, maths through `tex`."""
    # Cross-references, [`cdiff.GGL`][] or [`x`][ref], by their code.
    text = re.sub(r"\[(`[^`\]]+`)\]\[[^\]]*\]", r"\1", markdown)
    pieces = re.split(r"(\$\$.+?\$\$|\$[^$]+\$|`[^`]*`)", text, flags=re.DOTALL)
    out = []
    for k, piece in enumerate(pieces):
        if k % 2 == 0:
            # Links, [text][ref] or [text](url), by their text; emphasis.
            piece = re.sub(r"\[([^\]]+)\](\[[^\]]*\]|\([^)]*\))", r"\1", piece)
            piece = re.sub(r"\*\*(.+?)\*\*", r"\1", piece, flags=re.DOTALL)
            piece = re.sub(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])", r"\1",
                           piece, flags=re.DOTALL)
            out.append(piece.replace("\\", ""))
        elif piece.startswith("`"):
            out.append(piece[1:-1])
        else:
            out.append(from_tex(piece.strip("$")))
    text = " ".join("".join(out).split())
    return re.sub(r" ([,.;:)\]])", r"\1", text)


def list_items(doc: str) -> list[str]:
    """The Markdown list items (`- ...` with their indented continuation lines)
    of `doc`, each on one string."""
    items, current = [], None
    for line in doc.splitlines():
        if line.startswith("- "):
            current = [line[2:]]
            items.append(current)
        elif current is not None and line.startswith("  ") and line.strip():
            current.append(line.strip())
        else:
            current = None
    return [" ".join(item) for item in items]
