#!/usr/bin/env bash
# Set up linvit (idempotent) and run it:
#   bash setup.sh run     set up, then run the default grid end to end (report/README.md at the end;
#                         the committed reference run is report/reference/, which no rule writes)
#   bash setup.sh test    set up, then run the test suite
#   bash setup.sh mini_paper   set up, make the mini paper grid's inputs (JPEG folders, a teacher
#                         file), then run workflow/config/mini_paper.yaml end to end
#   bash setup.sh decide  set up, then run the default grid with its sequential plan (linvit decide: seeds
#                         added look by look only where a claim is undecided; workflow/config/decide.yaml);
#                         other arguments go to Snakemake (--configfile FILES replaces the two default files)
#   bash setup.sh         set up only
# Needs Python 3.11 and, for Fashion-MNIST, Debian's dataset-fashion-mnist (installed here when
# running as root; otherwise give datasets.fashion_mnist.path in the config).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.linvit-installed

ensure_dataset() {
  [ -d /usr/share/datasets/fashion-mnist ] && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's dataset-fashion-mnist"
    apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    echo "setup: /usr/share/datasets/fashion-mnist is missing; run 'sudo apt-get install dataset-fashion-mnist'" \
         "or set datasets.fashion_mnist.path in the config" >&2
  fi
}

ensure_venv() {
  local want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    return
  fi
  echo "setup: creating $VENV and installing linvit with its pinned dependencies"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[test]"
  echo "$want" > "$STAMP"
}

ensure_dataset
ensure_venv
export PATH="$PWD/$VENV/bin:$PATH"   # the workflow's rules call the `linvit` command

case "${1:-setup}" in
  setup) echo "setup: done; activate with 'source $VENV/bin/activate'" ;;
  run)   shift; snakemake --cores "${CORES:-all}" "$@" && echo "setup: report in report/README.md" ;;
  test)  shift; python -m pytest -q "$@" ;;
  decide) shift; linvit decide --cores "${CORES:-all}" "$@" && echo "setup: report in report/README.md" ;;
  mini_paper)
         shift; linvit mini-paper-inputs --config workflow/config/mini_paper.yaml
         snakemake --cores "${CORES:-all}" --configfile workflow/config/mini_paper.yaml "$@" \
           && echo "setup: report in report/README.md" ;;
  *)     echo "usage: bash setup.sh [setup|run|decide|test|mini_paper]" >&2; exit 2 ;;
esac
