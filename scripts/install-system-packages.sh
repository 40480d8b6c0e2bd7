#!/usr/bin/env bash
# Installs the Debian packages the test suite drives for real, where they are missing:
# Chromium and ChromeDriver (browser tests of the viewer and /docs) and a Java 17 runtime
# (ScienceWorld's simulator is a jar). Serving Crafter, TextCraft or BabyAI needs none of them.
set -euo pipefail

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-packages: no apt-get here; install ${missing[*]} by hand" >&2
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-system-packages: installing ${missing[*]}" >&2
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
