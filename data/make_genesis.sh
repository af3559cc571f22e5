#!/bin/sh
# Writes data/genesis.txt: the Book of Genesis in the King James Version (1611, public domain), one
# verse per line without its reference, from Debian's bible-kjv and bible-kjv-text packages
# (`apt-get install bible-kjv bible-kjv-text`).
set -eu
bible -f "Genesis 1:1-50:26" | sed -E 's/^Ge[0-9]+:[0-9]+ //' >"$(dirname "$0")/genesis.txt"
