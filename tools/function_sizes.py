#!/usr/bin/env python3
"""function_sizes.py — the longest functions and files of the tree, to keep them readable.

Usage: tools/function_sizes.py [--max-lines 80] [--max-file-lines 300] DIR...
A function is a definition that opens at column 0 (or one indent level inside a class) and ends at
the matching closing brace; lambdas count toward the function that holds them. Prints the
functions longer than --max-lines and the files longer than --max-file-lines, and exits 1 if any
(lessons' main() is exempt: a lesson is a page read top to bottom)."""
import argparse, os, re, sys

OPEN = re.compile(r'^(?:[A-Za-z_][\w:<>,\s\*&~]*\s)?[~A-Za-z_][\w:~]*\s*\(.*\)\s*(?:const)?\s*(?:override)?\s*(?:noexcept)?\s*(?::.*)?\{\s*(?://.*)?$')
SKIP = re.compile(r'^\s*(namespace|struct|class|enum|union|extern|if|for|while|switch|else|do|try|catch)\b')

RAW = re.compile(r'R"([^(\s]*)\((.*?)\)\1"', re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/', re.S)

def code_only(text):
    """The text with raw strings, strings, characters and comments blanked (lines kept): braces
    inside them do not count."""
    blank = lambda m: re.sub(r'[^\n]', ' ', m.group(0))
    text = RAW.sub(blank, text)
    out, i = [], 0
    for m in re.finditer(STRING.pattern + '|' + COMMENT.pattern, text, re.S):
        out.append(text[i:m.start()])
        out.append(blank(m))
        i = m.end()
    out.append(text[i:])
    return ''.join(out)

def functions(path):
    lines = code_only(open(path, encoding='utf-8', errors='replace').read()).split('\n')
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        # a definition's head may span lines: join up to 4 lines until a '{' ends one
        head, j = stripped, i
        while '{' not in head and '}' not in head and j < i + 4 and j + 1 < len(lines) and indent <= 2 and stripped and \
                not stripped.endswith(';') and not stripped.startswith(('//', '#')) and '(' in head:
            j += 1
            head += ' ' + lines[j].strip()
        if indent <= 2 and head.endswith('{') and '(' in head and not SKIP.match(head) and not head.startswith(('//', '#')) \
                and '=' not in head.split('(')[0]:
            depth, k = 0, i
            for k in range(i, len(lines)):
                depth += lines[k].count('{') - lines[k].count('}')
                if depth == 0 and k >= j:
                    break
            name = head.split('(')[0].split()[-1] if head.split('(')[0].split() else '?'
            yield name, i + 1, k - i + 1
            i = k + 1
            continue
        i += 1

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--max-lines', type=int, default=80)
    ap.add_argument('--max-file-lines', type=int, default=300)
    ap.add_argument('dirs', nargs='+', help='folders or files')
    a = ap.parse_args()
    bad = 0
    counted_files = counted_functions = 0
    for d in a.dirs:
        walk = [(os.path.dirname(d), None, [os.path.basename(d)])] if os.path.isfile(d) else os.walk(d)
        for root, _, files in walk:
            for f in sorted(files):
                if not f.endswith(('.cpp', '.h', '.cu')):
                    continue
                p = os.path.join(root, f)
                counted_files += 1
                n = sum(1 for _ in open(p, encoding='utf-8', errors='replace'))
                if n > a.max_file_lines:
                    print(f'{p}: {n} lines (file)'); bad = 1
                for name, start, length in functions(p):
                    counted_functions += 1
                    if length > a.max_lines and not (p.startswith('lessons') and name == 'main'):
                        print(f'{p}:{start}: {name} is {length} lines'); bad = 1
    if not bad:
        print(f'function_sizes: {counted_files} files, {counted_functions} functions under {" ".join(a.dirs)}: '
              f'none over {a.max_lines} lines, no file over {a.max_file_lines}')
    sys.exit(bad)

if __name__ == '__main__':
    main()
