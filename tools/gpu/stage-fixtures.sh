#!/usr/bin/env bash
# Copies the part of the fixture tree that check.sh's parity tests read on the GPU machine into
# tools/gpu/fixtures/ (git-ignored; the run call carries it): the tiny-flux-dev pipeline's
# transformer, VAE and T5 encoder, its cases, and a manifest.json that lists only that pipeline.
# The whole tree (57 MiB) does not fit beside the .deb files in the 64 MiB the run tool carries.
#
#   tools/gpu/stage-fixtures.sh [FIXTURE_ROOT]     (default ../shared/fixtures)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=${1:-$here/../../../shared/fixtures}
root=$(cd "$root" && pwd)
out=$here/fixtures
pipe=tiny-flux-dev
[ -e "$root/manifest.json" ] || { echo "stage-fixtures.sh: no manifest.json in $root" >&2; exit 2; }
rm -rf "$out"; mkdir -p "$out/$pipe" "$out/cases"
cp "$root/$pipe/model_index.json" "$out/$pipe/"
for d in scheduler transformer vae text_encoder_2; do cp -r "$root/$pipe/$d" "$out/$pipe/"; done
cp -r "$root/cases/$pipe" "$out/cases/"
python3 - "$root/manifest.json" "$out/manifest.json" "$pipe" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["pipelines"] = {k: v for k, v in m["pipelines"].items() if k == sys.argv[3]}
json.dump(m, open(sys.argv[2], "w"), indent=1)
PY
chmod -R u+w "$out"
echo "stage-fixtures.sh: $(du -sh "$out" | cut -f1) in $out ($pipe: transformer, vae, text_encoder_2 and its cases)"
