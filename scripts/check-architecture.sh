#!/usr/bin/env bash
# Fails when ARCHITECTURE.md names a repository path that does not exist.
#
#   scripts/check-architecture.sh [FILE]      (default: ARCHITECTURE.md)
#
# What counts as a path: every word of every `inline code` span, and every word inside a
# ``` fenced block, that contains a `/` or ends in .rs, .md, .toml or .sh. Then:
# - words starting with crates/, tests/, docs/, scripts/, config/, fuzz/ or .ci/ must exist
#   (relative to the repository root; a trailing `/` requires a directory), and must name one
#   path, not a pattern (no `*`, `?`, `{…}`, `<…>`);
# - a bare name ending in .rs/.md/.toml/.sh (no `/`) is a root file and must exist at the root,
#   so `lib.rs` alone is an error: name such files by their full path;
# - any other word ending in .rs/.md/.toml/.sh but containing a `/` (say `server/chat.rs`) is an
#   error too: write paths from the repository root;
# - not paths, and skipped: URLs and routes (starting with `/` or containing `://`), `$VAR/…`
#   and `~/…`, option-like words (`--x`), and other slashed words without those extensions
#   (`text/event-stream`, `owner/repo`, `target/debug/…`: build outputs are not in a clone).
# `word=value` is checked as `value`. Leading ( [ " ' ` and trailing ) ] " ' ` , ; : . are stripped.
set -euo pipefail
if [[ $# -gt 0 ]]; then
  # A file given on the command line is relative to the caller's directory.
  doc="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
fi
cd "$(dirname "$0")/.."
doc="${doc:-ARCHITECTURE.md}"
if [[ ! -f "$doc" ]]; then
  echo "check-architecture: $doc does not exist" >&2
  exit 1
fi

# One "LINE<TAB>WORD" per word of every code span and fenced line. An inline span may continue
# onto the next line; it is reported at the line where it opens.
words() {
  awk '
    function emit(text, line,   n, i, parts) {
      n = split(text, parts, /[ \t]+/)
      for (i = 1; i <= n; i++) if (parts[i] != "") printf "%d\t%s\n", line, parts[i]
    }
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { emit($0, NR); next }
    {
      s = $0
      if (open) { span = span " "; start_line = open_line } else { span = ""; start_line = NR }
      while (length(s) > 0) {
        i = index(s, "`")
        if (i == 0) { if (open) span = span s; break }
        if (open) {
          span = span substr(s, 1, i - 1)
          emit(span, start_line)
          open = 0; span = ""
        } else {
          open = 1; open_line = NR; start_line = NR; span = ""
        }
        s = substr(s, i + 1)
      }
    }
    END { if (open) printf "%d\t%s\n", open_line, "\001unclosed" }
  ' "$doc"
}

lead='^[(["'"'"'`]'
trail='[])"'"'"'`,;:.]$'
pattern='[*?{}<>]'
checked=0
failures=()
fail() { failures+=("$doc:$1: \`$2\` $3"); }

while IFS=$'\t' read -r line word; do
  if [[ "$word" == $'\001unclosed' ]]; then
    failures+=("$doc:$line: a \` code span is never closed")
    continue
  fi
  w="$word"
  # option=value → value
  [[ "$w" == *=* ]] && w="${w##*=}"
  # strip surrounding punctuation
  while [[ "$w" =~ $lead ]]; do w="${w:1}"; done
  while [[ "$w" =~ $trail ]]; do w="${w%?}"; done
  [[ -z "$w" ]] && continue
  # not paths
  [[ "$w" == /* || "$w" == *://* || "$w" == \$* || "$w" == \~* || "$w" == -* ]] && continue
  has_ext=0
  [[ "$w" =~ \.(rs|md|toml|sh)$ ]] && has_ext=1
  [[ "$w" != */* && $has_ext -eq 0 ]] && continue

  case "$w" in
    crates/* | tests/* | docs/* | scripts/* | config/* | fuzz/* | .ci/*)
      checked=$((checked + 1))
      if [[ "$w" =~ $pattern ]]; then
        fail "$line" "$word" "is a pattern: name each path"
      elif [[ "$w" == */ ]]; then
        [[ -d "$w" ]] || fail "$line" "$word" "is not a directory of the repository"
      else
        [[ -e "$w" ]] || fail "$line" "$word" "does not exist"
      fi
      ;;
    */*)
      if [[ $has_ext -eq 1 ]]; then
        checked=$((checked + 1))
        fail "$line" "$word" "is not a path from the repository root"
      fi
      ;;
    *)
      checked=$((checked + 1))
      [[ -f "$w" ]] || fail "$line" "$word" "is not a file at the repository root (name it by its full path)"
      ;;
  esac
done < <(words)

if ((${#failures[@]})); then
  printf '%s\n' "${failures[@]}" >&2
  echo "check-architecture: ${#failures[@]} of $checked paths in $doc are wrong" >&2
  exit 1
fi
echo "check-architecture: all $checked paths in $doc exist"
