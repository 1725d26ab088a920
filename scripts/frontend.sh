#!/usr/bin/env bash
# Installs the browser libraries pinned in package.json / package-lock.json from the npm registry (`npm ci`) and
# copies the files the pages load into static/vendor/ (ignored by git; shipped in the wheel). Pages never load a
# library from a CDN, and no library file is copied into the repository by hand.
#
# Cached: node_modules/ and static/vendor/ each carry a stamp, the hash of the lock file and of this script; when
# a stamp matches, that step is skipped, so a second run makes no network call.
#
# Usage: scripts/frontend.sh          # install and copy what is missing or stale
#        scripts/frontend.sh --check  # exit 1 (and say why) when static/vendor/ is missing or stale
set -euo pipefail
cd "$(dirname "$0")/.."

VENDOR=static/vendor
# What the pages load: <package>/<path inside the package> -> static/vendor/<package>/<file name>.
FILES=(
  bootstrap/dist/css/bootstrap.min.css
  bootstrap/dist/css/bootstrap.min.css.map
  bootstrap/LICENSE
  chart.js/dist/chart.umd.min.js
  chart.js/dist/chart.umd.min.js.map
  chart.js/LICENSE.md
  socket.io-client/dist/socket.io.min.js
  socket.io-client/dist/socket.io.min.js.map
  socket.io-client/LICENSE
)

stamp=$(cat package-lock.json "$0" | sha256sum | cut -d' ' -f1)

vendor_current() {
  [[ -f $VENDOR/.stamp && "$(cat $VENDOR/.stamp)" == "$stamp" ]] || return 1
  local file
  for file in "${FILES[@]}"; do
    [[ -f $VENDOR/${file%%/*}/$(basename "$file") ]] || return 1
  done
}

if [[ "${1:-}" == "--check" ]]; then
  vendor_current || { echo "frontend: $VENDOR is missing or stale; run scripts/frontend.sh" >&2; exit 1; }
  exit 0
fi

if vendor_current; then
  touch "$VENDOR/.stamp"  # newer than its inputs, so make sees it done
  exit 0
fi

if ! command -v npm >/dev/null; then
  # Debian's own Node.js and npm (npm 7 or later reads the lock file; Debian 12 has npm 9).
  echo "frontend: installing nodejs and npm"
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "frontend: need npm, or root (or sudo) to install it" >&2; exit 1; }
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends nodejs npm
fi

if [[ ! -f node_modules/.memplugin-stamp || "$(cat node_modules/.memplugin-stamp)" != "$stamp" ]]; then
  echo "frontend: npm ci"
  # --ignore-scripts: the libraries need no install scripts, so none of their code runs at set-up.
  npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
  echo "$stamp" > node_modules/.memplugin-stamp
fi

# Build the folder aside and swap it in, so an interrupted run never leaves a half-filled static/vendor/.
rm -rf "$VENDOR.tmp"
for file in "${FILES[@]}"; do
  package=${file%%/*}
  mkdir -p "$VENDOR.tmp/$package"
  cp "node_modules/$file" "$VENDOR.tmp/$package/"
done
echo "$stamp" > "$VENDOR.tmp/.stamp"
rm -rf "$VENDOR"
mv "$VENDOR.tmp" "$VENDOR"
echo "frontend: copied ${#FILES[@]} files into $VENDOR"
