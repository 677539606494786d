#!/usr/bin/env bash
# tools/check_docs.sh — the book's links hold. Checks, from the repository root:
#   1. every relative link and image in README.md and docs/**/*.md, [text](target), ![alt](target) and
#      reference definitions [name]: target,
#      resolves to a file or folder that exists (relative to the page; a #anchor suffix is dropped;
#      http(s)://, mailto: and #anchor-only links are not checked);
#   2. every lesson lessons/NN_*.cpp has a page docs/lessons/NN-*.md.
# Prints each broken link as file:line: target, and exits 1 on any failure. Links inside fenced code
# blocks (```) and inline code spans are not links and are skipped.
set -u
cd "$(dirname "$0")/.."
failures=0 links=0
pages=$( { echo README.md; find docs -name '*.md' 2>/dev/null | sort; } )
for page in $pages; do
  dir=$(dirname "$page")
  # One line per link: line number, a tab, the target. awk drops fenced blocks and `code` spans first.
  while IFS=$'\t' read -r line target; do
    [ -n "$target" ] || continue
    links=$((links + 1))
    case "$target" in
      http://*|https://*|mailto:*|\#*) continue;;
    esac
    path=${target%%#*}
    path=${path%% *}            # [text](path "title")
    if [ ! -e "$dir/$path" ]; then
      echo "$page:$line: broken link: $target"
      failures=$((failures + 1))
    fi
  done < <(awk '
    /^[[:space:]]*```/ { fenced = !fenced; next }
    fenced { next }
    match($0, /^[ ]*\[[^]]+\]:[ ]*[^ ]+/) {   # a reference-style definition: [name]: target
      definition = substr($0, RSTART, RLENGTH)
      sub(/^[ ]*\[[^]]+\]:[ ]*/, "", definition)
      printf "%d\t%s\n", NR, definition
      next
    }
    {
      text = $0
      gsub(/`[^`]*`/, "", text)
      while (match(text, /\]\([^)]*\)/)) {
        target = substr(text, RSTART + 2, RLENGTH - 3)
        printf "%d\t%s\n", NR, target
        text = substr(text, RSTART + RLENGTH)
      }
    }' "$page")
done
lessons=0
for source in lessons/[0-9][0-9]_*.cpp; do
  number=$(basename "$source" | cut -c1-2)
  lessons=$((lessons + 1))
  if ! ls docs/lessons/"$number"-*.md >/dev/null 2>&1; then
    echo "$source: no page docs/lessons/$number-*.md"
    failures=$((failures + 1))
  fi
done
echo "check_docs: $(wc -w <<<"$pages") pages, $links links, $lessons lessons"
if [ "$failures" -ne 0 ]; then
  echo "check_docs: $failures FAILED"
  exit 1
fi
echo "check_docs: OK"
