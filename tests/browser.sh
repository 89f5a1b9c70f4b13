#!/usr/bin/env bash
# Debian's Chromium for the report test (tests/test_report.py renders the HTML report headless). Installs it when
# missing and this user may (root, apt); otherwise says so, and that one test is skipped.
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null && exit 0
fi
echo "tests/browser.sh: Chromium not installed (needs root and apt); the report's browser test will be skipped" >&2
exit 0
