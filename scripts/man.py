#!/usr/bin/env python3
"""Writes the manual pages of the project, as roff, into a directory.

    scripts/man.py OUTDIR [--bin DIR]

One page per source file in docs/man/ (`NAME.SECTION.txt`), written as
OUTDIR/NAME.SECTION. The three programs' pages take their SYNOPSIS and
OPTIONS from the program's own `--help` (run from --bin DIR, default
target/release), so that a page never says something else than the
program; the environment variables of the library come from the table
of docs/preload.md ("## Environment"). Only the prose is written here.

Source markup (docs/man/*.txt):

    % a comment
    summary: the one line of NAME
    help: PROGRAM            the program whose --help gives SYNOPSIS/OPTIONS
    synopsis: TEXT           a SYNOPSIS line, for pages without `help:`
    == SECTION NAME          a section (DESCRIPTION, FILES, ...)
    @options                 OPTIONS from --help (else after DESCRIPTION)
    @environment             the variables of docs/preload.md
    :: TERM                  a tagged paragraph; its text on the next lines
    * item                   a bullet item (continued on indented lines)
        literal              four spaces: kept as is, in a literal block
    `code`  {ARG}            bold, italic

Blank lines separate paragraphs. An OPTIONS entry in the source
(`:: --flag ARG` under `== OPTIONS`) describes an option that --help
names in its synopsis but does not describe; describing one that --help
does not name at all is an error, so the prose cannot outlive an option.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = os.path.join(ROOT, "docs", "man")
PRELOAD_DOC = os.path.join(ROOT, "docs", "preload.md")
PROJECT = "sdp-iwarp"

# A `--flag` in running text, for the drift checks.
FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9-]*)")


class Fault(Exception):
    pass


# ---------------------------------------------------------------- roff text


def escape(text):
    """Plain text as roff: backslashes, hyphen-minus as \\- (so that a
    flag renders and copies as ASCII), a leading dot or quote defused."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def inline(text):
    """`code` in bold, {ARG} in italic, the rest escaped."""
    out = []
    for piece in re.split(r"(`[^`]+`|\{[^{}\s]+\})", text):
        if piece.startswith("`") and piece.endswith("`") and len(piece) > 1:
            out.append("\\fB" + escape(piece[1:-1]) + "\\fR")
        elif piece.startswith("{") and piece.endswith("}") and len(piece) > 2:
            out.append("\\fI" + escape(piece[1:-1]) + "\\fR")
        else:
            out.append(escape(piece))
    line = "".join(out)
    # A line starting with a font escape is fine; one starting with a
    # dot after the escapes is not possible here (escape() handles it).
    return line


def term(spec):
    """An option as written in --help (`--config FILE`, `-c, --config
    FILE`): flags bold, their arguments italic."""
    out = []
    for word in spec.split():
        core = word.rstrip(",")
        tail = word[len(core):]
        if core.startswith("-"):
            # `--log-level error|warn`: the flag bold, any `=VALUE` italic.
            flag, eq, value = core.partition("=")
            piece = "\\fB" + escape(flag) + "\\fR"
            if eq:
                piece += "=\\fI" + escape(value) + "\\fR"
            out.append(piece + tail)
        else:
            out.append("\\fI" + escape(core) + "\\fR" + tail)
    return " ".join(out)


# ---------------------------------------------------------------- --help


def run_help(bindir, program):
    path = os.path.join(bindir, program)
    if not os.access(path, os.X_OK):
        raise Fault(f"{path} is not there: build it first (cargo build --release)")
    try:
        done = subprocess.run(
            [path, "--help"], capture_output=True, text=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise Fault(f"{path} --help did not end within 30 s") from e
    if done.returncode != 0 or not done.stdout.strip():
        raise Fault(f"{path} --help: exit {done.returncode}, output {done.stdout!r}")
    return done.stdout


OPTION_LINE = re.compile(r"^  (-\S.*?)(?:\s{2,}(\S.*))?$")


def parse_help(text, program):
    """(synopsis lines, option groups).

    Synopsis: what follows `usage:` up to the first blank line, each line
    that starts with the program's name a new entry, deeper lines its
    continuation. Options: lines of two spaces, the option, two or more
    spaces, the description; lines indented further continue the
    description (an option alone on its line takes them all). A group is
    (heading, options): the heading is the unindented paragraph ending in
    `:` right above the group's first option, or None."""
    lines = text.splitlines()
    synopsis = []
    groups = []
    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i < len(lines) and lines[i].lower().startswith("usage:"):
        first = lines[i][len("usage:"):].strip()
        if first:
            synopsis.append(first)
        i += 1
        while i < len(lines) and lines[i].strip():
            stripped = lines[i].strip()
            if stripped.split()[0] == program or not synopsis:
                synopsis.append(stripped)
            else:
                synopsis[-1] += " " + stripped
            i += 1
    paragraph = []
    current = None
    for line in lines[i:]:
        match = OPTION_LINE.match(line)
        if match:
            if current is None:
                heading = " ".join(paragraph) if paragraph else ""
                groups.append((heading if heading.endswith(":") else None, []))
                paragraph = []
            current = [match.group(1).strip(), match.group(2) or ""]
            groups[-1][1].append(current)
            continue
        if current is not None and line.startswith("   ") and line.strip():
            current[1] = (current[1] + " " + line.strip()).strip()
            continue
        current = None
        if line.strip():
            paragraph.append(line.strip())
        else:
            paragraph = []
    if not synopsis:
        raise Fault(f"{program} --help has no `usage:` line")
    return synopsis, [(h, [tuple(o) for o in opts]) for h, opts in groups]


def flag_of(spec):
    """The long flag an option term names (`-c, --config FILE` -> --config)."""
    flags = FLAG.findall(spec)
    return flags[-1] if flags else spec.split()[0].rstrip(",")


def synopsis_options(synopsis):
    """Each `[--flag ARG]` of the synopsis, in order, once: (term, flag)."""
    seen = {}
    for line in synopsis:
        for group in re.findall(r"\[([^\[\]]+)\]", line):
            group = group.strip()
            if not group.startswith("-"):
                continue
            flag = flag_of(group)
            seen.setdefault(flag, group)
    return [(spec, flag) for flag, spec in seen.items()]


# ---------------------------------------------------------------- preload.md


def environment_rows(path=PRELOAD_DOC):
    """The rows of the variable table under `## Environment`:
    (names, meaning, default)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    match = re.search(r"^## Environment\n(.*?)(?=^## )", text, re.M | re.S)
    if not match:
        raise Fault(f"{path}: no '## Environment' section")
    rows = []
    for line in match.group(1).splitlines():
        if not line.startswith("|") or re.match(r"^\|\s*-", line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] == "variable":
            continue
        rows.append(tuple(cells))
    if not rows:
        raise Fault(f"{path}: the Environment table has no rows")
    return rows


def markdown_inline(text):
    """The little markdown of a table cell, in this generator's markup."""
    return text.replace("\\|", "|")


# ---------------------------------------------------------------- sources


class Page:
    def __init__(self, path):
        base = os.path.basename(path)
        match = re.match(r"^(.+)\.(\d\w*)\.txt$", base)
        if not match:
            raise Fault(f"{path}: name it NAME.SECTION.txt")
        self.path = path
        self.name, self.section = match.group(1), match.group(2)
        self.summary = None
        self.help = None
        self.synopsis = []
        self.sections = []  # (title, [lines])
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f.read().splitlines(), 1):
                self._line(number, line)
        if not self.summary:
            raise Fault(f"{path}: no `summary:` line")

    def _line(self, number, line):
        if line.startswith("%"):
            return
        if not self.sections:
            key, sep, value = line.partition(":")
            if line.startswith("== "):
                pass
            elif not line.strip():
                return
            elif sep and key in ("summary", "help", "synopsis"):
                value = value.strip()
                if key == "summary":
                    self.summary = value
                elif key == "help":
                    self.help = value
                else:
                    self.synopsis.append(value)
                return
            else:
                raise Fault(f"{self.path}:{number}: expected summary:, help:, synopsis: or == SECTION")
        if line.startswith("== "):
            self.sections.append((line[3:].strip().upper(), []))
        else:
            self.sections[-1][1].append(line)


def body(lines, out, where):
    """Emits the markup of one section."""
    i = 0
    paragraph = []

    def flush():
        if paragraph:
            out.append(".PP")
            out.extend(inline(p) for p in paragraph)
            paragraph.clear()

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            flush()
            i += 1
        elif line.startswith("    "):
            flush()
            block = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                block.append(lines[i][4:])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            out.append(".PP")
            out.append(".RS 4")
            out.append(".nf")
            out.extend(escape(b) if b.strip() else "" for b in block)
            out.append(".fi")
            out.append(".RE")
        elif line.startswith(":: "):
            flush()
            out.append(".TP")
            spec = line[3:].strip()
            out.append(term(spec) if spec.startswith("-") else inline(spec))
            i += 1
            text = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith((":: ", "* ", "@")):
                text.append(lines[i].strip())
                i += 1
            if not text:
                raise Fault(f"{where}: `:: {spec}` has no text")
            out.extend(inline(t) for t in text)
        elif line.startswith("* "):
            flush()
            out.append(".IP \\(bu 2")
            out.append(inline(line[2:].strip()))
            i += 1
            while i < len(lines) and lines[i].startswith("  ") and lines[i].strip():
                out.append(inline(lines[i].strip()))
                i += 1
        elif line.startswith("@"):
            raise Fault(f"{where}: {line.strip()} must stand alone in its section")
        else:
            paragraph.append(line.strip())
            i += 1
    flush()


def options_section(page, groups, synopsis, prose):
    """OPTIONS: the options --help describes, in its groups, then those
    its synopsis names that only the page's own OPTIONS prose describes."""
    out = [".SH OPTIONS"]
    help_options = [o for _, options in groups for o in options]
    described = {flag_of(spec) for spec, _ in help_options}
    named = {flag for _, flag in synopsis_options(synopsis)} | described
    # Prose descriptions: `:: --flag ARG` then text.
    extra = {}
    spec = None
    for line in prose:
        if line.startswith(":: "):
            spec = line[3:].strip()
            extra[flag_of(spec)] = [spec, []]
        elif spec and line.strip():
            extra[flag_of(spec)][1].append(line.strip())
        elif not line.strip():
            spec = None
        else:
            raise Fault(f"{page.path}: OPTIONS holds only `:: --flag` entries")
    stale = sorted(set(extra) - named)
    if stale:
        raise Fault(
            f"{page.path}: OPTIONS describes {', '.join(stale)}, which "
            f"`{page.help} --help` does not name"
        )
    redundant = sorted(set(extra) & described)
    if redundant:
        # --help describes them now: its words win, the prose is stale.
        print(f"man.py: {page.path}: --help describes {', '.join(redundant)}; "
              "drop them from OPTIONS", file=sys.stderr)
    for heading, options in groups:
        if heading:
            # `daemon options (more words):` -> a subsection and a paragraph.
            title, _, rest = heading.rstrip(":").partition(" (")
            out.append(".SS " + escape(title[:1].upper() + title[1:]))
            if rest:
                out.append(".PP")
                out.append(inline(rest[:1].upper() + rest[1:].rstrip(")") + "."))
        for spec, text in options:
            out.append(".TP")
            out.append(term(spec))
            out.append(inline(text) if text else "")
    for spec, flag in synopsis_options(synopsis):
        if flag in described:
            continue
        out.append(".TP")
        if flag in extra:
            out.append(term(extra[flag][0]))
            out.extend(inline(t) for t in extra[flag][1])
        else:
            print(f"man.py: {page.path}: {flag} has no description", file=sys.stderr)
            out.append(term(spec))
            out.append("See SYNOPSIS.")
    return out


def environment_section():
    out = []
    for names, meaning, default in environment_rows():
        out.append(".TP")
        out.append(inline(markdown_inline(names)))
        out.append(inline(markdown_inline(meaning)))
        out.append(".br")
        out.append("Default: " + inline(markdown_inline(default)) + ".")
    return out


def render(page, bindir):
    title = page.name.upper().replace("-", "\\-")
    out = [
        f'.\\" Generated by scripts/man.py from {os.path.relpath(page.path, ROOT)}'
        + (f" and `{page.help} --help`" if page.help else "")
        + ": do not edit.",
        f'.TH {title} {page.section} "" "{PROJECT}" '
        f'"{section_title(page.section)}"',
        ".nh",
        # The man macros turn hyphenation on again at each paragraph
        # unless HY is 0: no option or path is ever split.
        ".nr HY 0",
        ".ad l",
        ".SH NAME",
        f"{escape(page.name)} \\- {inline(page.summary)}",
        ".SH SYNOPSIS",
    ]
    groups = []
    synopsis = page.synopsis
    if page.help:
        synopsis, groups = parse_help(run_help(bindir, page.help), page.help)
    if not synopsis:
        raise Fault(f"{page.path}: no synopsis (help: or synopsis:)")
    for line in synopsis:
        # .SY/.YS (groff's man extensions): the command, then its
        # arguments filled with a hanging indent.
        words = line.split(" ", 1)
        out.append(".SY " + escape(words[0]))
        if len(words) > 1:
            out.append(synopsis_words(words[1]))
        out.append(".YS")
    titles = [t for t, _ in page.sections]
    placed = False
    for title, lines in page.sections:
        where = f"{page.path} ({title})"
        stripped = [l for l in lines if l.strip()]
        if title == "OPTIONS":
            if not page.help:
                raise Fault(f"{where}: OPTIONS needs help:")
            out.extend(options_section(page, groups, synopsis, lines))
            placed = True
            continue
        out.append(".SH " + escape(title))
        if stripped == ["@options"]:
            raise Fault(f"{where}: write `== OPTIONS` instead of @options")
        if stripped == ["@environment"]:
            out.extend(environment_section())
        else:
            body(lines, out, where)
        if title == "DESCRIPTION" and page.help and "OPTIONS" not in titles:
            out.extend(options_section(page, groups, synopsis, []))
            placed = True
    if page.help and not placed:
        raise Fault(f"{page.path}: no DESCRIPTION for the OPTIONS to follow")
    return "\n".join(out) + "\n"


def synopsis_words(text):
    """A synopsis line's arguments: flags bold, placeholders italic."""
    out = []
    for token in re.split(r"([\[\]|\s]+)", text):
        if not token:
            continue
        if re.fullmatch(r"[\[\]|\s]+", token):
            out.append(escape(token))
        elif token.startswith("-"):
            out.append("\\fB" + escape(token) + "\\fR")
        elif token.isupper() or token.rstrip(".").isupper():
            out.append("\\fI" + escape(token) + "\\fR")
        else:
            out.append(escape(token))
    return "".join(out)


def section_title(section):
    return {
        "1": "User Commands",
        "5": "File Formats",
        "7": "Miscellanea",
        "8": "System Administration",
    }.get(section[0], "")


def main(argv):
    args = argv[1:]
    bindir = os.path.join(ROOT, "target", "release")
    if "--bin" in args:
        at = args.index("--bin")
        if at + 1 >= len(args):
            print("man.py: --bin needs a directory", file=sys.stderr)
            return 2
        bindir = args[at + 1]
        del args[at : at + 2]
    if len(args) != 1 or args[0].startswith("-"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    outdir = args[0]
    os.makedirs(outdir, exist_ok=True)
    try:
        names = sorted(n for n in os.listdir(SOURCES) if n.endswith(".txt"))
        if not names:
            raise Fault(f"no page sources in {SOURCES}")
        for name in names:
            page = Page(os.path.join(SOURCES, name))
            target = os.path.join(outdir, f"{page.name}.{page.section}")
            text = render(page, bindir)
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
            print(target)
    except (Fault, OSError) as e:
        print(f"man.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
